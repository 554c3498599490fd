"""Models whose own train_step trains with optimizers of their own (keras.io's
GAN, WGAN and CycleGAN keep `self.d_optimizer`, `self.g_optimizer`), not
`model.optimizer`: their state is backed up and resumed exactly, and a
divergence rolls it back and lowers their learning rates."""

import json
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasfast
from kerasfast import _compat
from kerasfast.training.backup import signature

LATENT = 4


class _GAN(keras.Model):
    """keras.io's GAN, tiny: a discriminator and a generator, each trained by its own optimizer."""

    def __init__(self, activation="relu"):
        super().__init__()
        self.discriminator = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation=activation),
                                               keras.layers.Dense(1)])
        self.generator = keras.Sequential([keras.Input((LATENT,)), keras.layers.Dense(16, activation=activation),
                                           keras.layers.Dense(8)])
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def train_step(self, real):
        size = tf.shape(real)[0]
        fake = self.generator(keras.random.normal((size, LATENT), seed=self.seed_generator))
        labels = tf.concat([tf.ones((size, 1)), tf.zeros((size, 1))], 0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(tf.concat([fake, real], 0)))
        weights = self.discriminator.trainable_weights
        self.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, weights), weights, strict=True))
        latent = keras.random.normal((size, LATENT), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(tf.zeros((size, 1)), self.discriminator(self.generator(latent)))
        weights = self.generator.trainable_weights
        self.g_optimizer.apply_gradients(zip(tape.gradient(g_loss, weights), weights, strict=True))
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


def _gan(activation="relu", g_rate=1e-3):
    keras.utils.set_random_seed(1)
    model = _GAN(activation)
    model.compile(keras.optimizers.Adam(1e-3), keras.optimizers.Adam(g_rate))
    return model


class _Interrupted(Exception):
    pass


class _CrashOnce(keras.callbacks.Callback):
    """Raises once, at the given step of epoch 2: the first call crashes, the same call again resumes."""

    def __init__(self, step):
        super().__init__()
        self.step, self.armed, self.epoch = step, True, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.armed and self.epoch == 1 and batch + 1 == self.step:
            self.armed = False
            raise _Interrupted("simulated crash")


def _optimizer_state(model):
    return {name: [v.numpy() for v in getattr(model, name).variables] for name in ("d_optimizer", "g_optimizer")}


def test_a_gan_interrupted_mid_epoch_resumes_as_an_uninterrupted_run(tmp_path):
    x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    options = dict(epochs=2, batch_size=32, shuffle=False, verbose=0, seed=0, backup_every=4, tune="off",
                   precision="float32", steps_per_execution=1)
    uninterrupted = _gan()
    with pytest.warns(kerasfast.RunFolderWarning):  # the GAN itself is never called, so never built or saved
        kerasfast.fit(uninterrupted, x, run_dir=tmp_path / "a", **options)

    crash = _CrashOnce(step=6)
    with pytest.raises(_Interrupted):
        kerasfast.fit(_gan(), x, run_dir=tmp_path / "b", callbacks=[crash], **options)
    with np.load(tmp_path / "b" / "backup" / "state.npz") as data:
        meta = json.loads(str(data["meta"]))
    assert (meta["epoch"], meta["step"]) == (1, 4)
    # Which variables each optimizer was built for: the resumed run builds them for those before restoring.
    # model.optimizer (compile's default, which this train_step never uses) is recorded too, unbuilt.
    built_for = meta["signature"]["own_optimizers"]
    assert list(built_for) == ["optimizer", "d_optimizer", "g_optimizer"] and built_for["optimizer"] is None

    resumed = _gan()  # a new process's model: its own optimizers are not built yet
    with pytest.warns(kerasfast.RunFolderWarning):
        kerasfast.fit(resumed, x, run_dir=tmp_path / "b", callbacks=[crash], **options)

    assert int(resumed.d_optimizer.iterations.numpy()) == int(resumed.g_optimizer.iterations.numpy()) == 16
    # Exact: the resumed run replays the same batches (and random draws: the seed generator's state is
    # restored) onto the same restored variables, so every operation repeats bit for bit.
    for expected, got in zip(uninterrupted.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_array_equal(got, expected)
    expected, got = _optimizer_state(uninterrupted), _optimizer_state(resumed)
    for name in expected:
        for a, b in zip(expected[name], got[name], strict=True):
            np.testing.assert_array_equal(b, a, err_msg=name)


def test_a_model_without_optimizers_of_its_own_keeps_its_backup_signature():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    plan = types.SimpleNamespace(global_batch_size=8, steps_per_epoch=3, grad_accum_steps=1)
    assert list(signature(model, plan)) == ["shapes", "global_batch_size", "steps_per_epoch", "grad_accum_steps"]


class _Rates(keras.callbacks.Callback):
    """At the end of each epoch: d_optimizer's rate, and g_optimizer's as a share of its schedule's."""

    def __init__(self, schedule):
        super().__init__()
        self.schedule, self.d, self.g = schedule, [], []

    def on_epoch_end(self, epoch, logs=None):
        g_optimizer = self.model.g_optimizer
        self.d.append(float(self.model.d_optimizer.learning_rate))
        self.g.append(float(g_optimizer.learning_rate) / float(self.schedule(g_optimizer.iterations)))


def test_a_gan_recovers_from_a_nan_batch_with_each_of_its_optimizers_rates_halved(capsys):
    x = np.random.default_rng(0).normal(size=(512, 8)).astype("float32")
    x[192:224] = np.nan  # batch 7 of 16, in both epochs
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-3, decay_steps=100, decay_rate=0.9)
    model = _gan("tanh", g_rate=schedule)
    rates = _Rates(schedule)
    result = kerasfast.fit(model, tf.data.Dataset.from_tensor_slices(x).batch(32), epochs=2, verbose=0,
                           run_dir=False, steps_per_execution=1, callbacks=[rates])

    assert [(r["epoch"], r["step"]) for r in result.recoveries] == [(1, 7), (2, 7)]
    printed = capsys.readouterr().out
    assert "learning rates now d_optimizer 0.0005, g_optimizer" in printed
    assert "learning rates now d_optimizer 0.00025, g_optimizer" in printed
    assert all(np.isfinite(w).all() for w in model.get_weights())
    assert all(np.isfinite(v).all() for state in _optimizer_state(model).values() for v in state)
    assert all(np.isfinite(result.history.history[name]).all() for name in ("d_loss", "g_loss"))
    # Each recovery halved both rates (the schedule's by a factor on its value) ...
    np.testing.assert_allclose(rates.d, [5e-4, 2.5e-4], rtol=1e-6)
    np.testing.assert_allclose(rates.g, [0.5, 0.25], rtol=1e-5)
    # ... for the run only: each optimizer's own rate comes back, as model.optimizer's does.
    assert float(model.d_optimizer.learning_rate) == pytest.approx(1e-3)
    assert _compat.learning_rate_store(model.g_optimizer) is schedule


class OwnStepModel(keras.Model):
    """A subclassed model with its own train_step using model.optimizer, unbuilt before fit."""

    def __init__(self):
        super().__init__()
        self.hidden, self.out = keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)
        self.tracker = keras.metrics.Mean(name="loss")

    def call(self, x, training=False):
        return self.out(self.hidden(x))

    @property
    def metrics(self):
        return [self.tracker]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, self(x, training=True),
                                                                             from_logits=True))
        weights = self.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights, strict=True))
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}


def _own_step():
    keras.utils.set_random_seed(2)
    model = OwnStepModel()
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    return model


def _eager():
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"], run_eagerly=True,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.parametrize("make", [_own_step, _eager], ids=["own train_step, unbuilt", "run_eagerly"])
def test_a_model_whose_state_builds_in_its_first_step_resumes_exactly(tmp_path, make):
    # Its optimizer (and an eager model's compiled metrics) build in the first step, which a resume restores
    # before: every backup of such a run was refused as "saved for a different run".
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(256, 8)).astype("float32"), rng.integers(0, 3, 256)
    options = dict(epochs=2, batch_size=32, shuffle=False, verbose=0, seed=0, backup_every=4, tune="off",
                   precision="float32", steps_per_execution=1)
    uninterrupted = make()
    kerasfast.fit(uninterrupted, x, y, run_dir=tmp_path / "a", **options)
    crash = _CrashOnce(step=6)
    with pytest.raises(_Interrupted):
        kerasfast.fit(make(), x, y, run_dir=tmp_path / "b", callbacks=[crash], **options)
    resumed = make()
    result = kerasfast.fit(resumed, x, y, run_dir=tmp_path / "b", callbacks=[crash], **options)
    assert int(resumed.optimizer.iterations.numpy()) == 16
    for expected, got in zip(uninterrupted.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_array_equal(got, expected)
    assert len(result.history.history["loss"]) == 2
