"""Non-finite values: named in array inputs before training; a diverging
loss caught during training and recovered (or stopped, or ignored as Keras
does); NaN weights never saved; every JSON file strict."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasfast
from kerasfast.errors import DataError, PlanError, TrainingError


def _regression(n=512, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1))).astype("float32")
    return x, y


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer=keras.optimizers.SGD(0.01))
    return model


def _with_poisoned_batches(x, y, batches, batch_size=32):
    """A dataset whose given batches make the loss overflow to infinity (finite inputs)."""
    x = x.copy()
    for batch in batches:
        x[batch * batch_size:(batch + 1) * batch_size] = 1e30
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)


def _weights_finite(model):
    return all(np.isfinite(w).all() for w in model.get_weights())


def _strict(path):
    def refuse(constant):
        raise ValueError(f"{path.name} holds {constant}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize("where", ["array", "dict"])
def test_nan_in_array_inputs_is_named_before_training(where):
    x, y = _regression()
    x[7, 3] = np.nan
    data = x if where == "array" else {"features": x}
    with pytest.raises(DataError, match=r"sample 7, position \(3,\)") as refused:
        kerasfast.fit(_model(), data, y, run_dir=False, verbose=0)
    assert ("x holds NaN" if where == "array" else "x['features'] holds NaN") in str(refused.value)
    assert "pass on_nan='ignore' to train on them" in str(refused.value)
    y[3] = np.inf
    with pytest.raises(DataError, match="y holds an infinite value at sample 3"):
        kerasfast.fit(_model(), np.nan_to_num(x), y, run_dir=False, verbose=0)


def test_a_model_that_fills_missing_values_itself_trains_on_them_with_on_nan_ignore():
    x, y = _regression()
    x[::5, 0] = np.nan
    keras.utils.set_random_seed(0)
    inputs = keras.Input((x.shape[1],))
    filled = keras.layers.Lambda(lambda t: keras.ops.where(keras.ops.isnan(t), 0.0, t))(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(filled))
    model.compile("sgd", "mse")
    result = kerasfast.fit(model, x, y, epochs=2, on_nan="ignore", run_dir=False, verbose=0)
    assert np.isfinite(result.history.history["loss"]).all() and _weights_finite(model)


def test_a_diverged_batch_is_rolled_back_and_skipped(tmp_path, capsys):
    x, y = _regression()
    model = _model()
    result = kerasfast.fit(model, _with_poisoned_batches(x, y, [9]), epochs=3, steps_per_execution=1,
                           backup_every=4, run_dir=tmp_path, verbose=1)
    assert [(r["epoch"], r["step"]) for r in result.recoveries] == [(1, 10), (2, 10), (3, 10)]
    assert "the loss became inf" in result.recoveries[0]["problem"]
    assert "rolled back to epoch 1, step 8" in capsys.readouterr().out
    assert _weights_finite(model)
    losses = result.history.history["loss"]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert model.optimizer.learning_rate.numpy() == pytest.approx(0.01)  # lowered for the run only
    assert (tmp_path / "model.keras").is_file()
    assert len(_strict(tmp_path / "result.json")["recoveries"]) == 3


class _Logged(keras.callbacks.Callback):
    """Keeps the logs callbacks are handed at each batch end, epoch end and train end."""

    def __init__(self):
        super().__init__()
        self.batches, self.epochs, self.at_end = [], [], None

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(dict(logs))

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))

    def on_train_end(self, logs=None):
        self.at_end = dict(logs)


@pytest.mark.parametrize("diverged_epoch", [1, 2])
def test_an_epoch_rolled_back_whole_logs_its_divergence_not_a_best_loss_of_zero(tmp_path, diverged_epoch):
    # The epoch's last batch diverges and the last good state is the end of
    # the epoch before (or the start): none of the epoch's batches remain in
    # its metrics, whose emptied means read 0.0, the best loss of all.
    x, y = _regression(n=2048)
    logged = _Logged()
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "best-{epoch}.weights.h5"), monitor="loss",
                                                 save_best_only=True, save_weights_only=True)
    stopping = keras.callbacks.EarlyStopping(monitor="loss", patience=2)
    result = kerasfast.fit(_model(), _with_poisoned_batches(x, y, [16 * diverged_epoch - 1]), epochs=4,
                           steps_per_epoch=16, steps_per_execution=1, backup_every=16, run_dir=False, verbose=0,
                           callbacks=[logged, checkpoint, stopping])
    assert [r["epoch"] for r in result.recoveries] == [diverged_epoch]
    losses = result.history.history["loss"]
    assert len(losses) == 4 and 0.0 not in losses
    assert np.isposinf(losses[diverged_epoch - 1])  # what Keras's fit logs for that epoch
    best = min(loss for loss in losses if np.isfinite(loss))
    assert stopping.best == checkpoint.best == best and stopping.best_epoch == losses.index(best)
    # (Keras's checkpoint saves any first epoch: it has nothing to compare with.)
    saved = {int(path.name.split("-")[1].split(".")[0]) for path in tmp_path.glob("best-*")}
    assert max(saved) == losses.index(best) + 1 and (diverged_epoch == 1 or diverged_epoch not in saved)
    assert [logs["loss"] for logs in logged.epochs] == losses and logged.at_end["loss"] == losses[-1]
    assert all(logs["loss"] != 0.0 for logs in logged.batches)


def test_an_epoch_rolled_back_to_its_start_logs_only_the_batches_trained_after():
    # The last good state is the one fit started from, whose metrics hold
    # what the model measured before (here an evaluate on targets 1000x
    # larger): the epoch's means must not fold that in.
    x, y = _regression()
    model = _model()
    model.evaluate(x, 1000 * y, verbose=0)
    logged = _Logged()
    result = kerasfast.fit(model, _with_poisoned_batches(x, y, [5]), steps_per_execution=1, backup_every=1000,
                           run_dir=False, verbose=0, callbacks=[logged])
    assert [(r["epoch"], r["step"]) for r in result.recoveries] == [(1, 6)]
    after = [logs["loss"] for logs in logged.batches[6:]]
    assert after[0] < 100 and result.history.history["loss"] == [after[-1]]


def test_more_divergences_than_allowed_stop_with_the_story(tmp_path):
    x, y = _regression()
    model = _model()
    with pytest.raises(TrainingError, match="diverged 2 times .* more than max_recoveries=1") as stopped:
        kerasfast.fit(model, _with_poisoned_batches(x, y, [3, 9]), steps_per_execution=1, max_recoveries=1,
                      run_dir=tmp_path, verbose=0)
    assert "the last good state" in str(stopped.value)
    assert _weights_finite(model)


def test_on_nan_stop_rolls_back_and_raises():
    x, y = _regression()
    model = _model()
    with pytest.raises(TrainingError, match="training diverged at epoch 1, step 6: the loss became inf"):
        kerasfast.fit(model, _with_poisoned_batches(x, y, [5]), steps_per_execution=1, on_nan="stop",
                      run_dir=False, verbose=0)
    assert _weights_finite(model)


def test_a_loss_above_the_bound_counts_as_a_divergence():
    x, y = _regression()
    x[64:96] *= 100  # finite, but a loss far above the others
    result = kerasfast.fit(_model(), tf.data.Dataset.from_tensor_slices((x, y)).batch(32), steps_per_execution=1,
                           loss_upper_bound=1e4, run_dir=False, verbose=0)
    assert len(result.recoveries) == 1 and "exceeded loss_upper_bound=10000" in result.recoveries[0]["problem"]


def test_a_schedule_is_lowered_during_recovery_and_given_back(capsys):
    x, y = _regression()
    model = _model()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=10, decay_rate=0.9)
    model.compile(loss="mse", optimizer=keras.optimizers.SGD(schedule))
    result = kerasfast.fit(model, _with_poisoned_batches(x, y, [9]), steps_per_execution=1, run_dir=False, verbose=1)
    assert len(result.recoveries) == 1 and _weights_finite(model)
    assert "learning rate now" in capsys.readouterr().out
    assert model.optimizer._learning_rate is schedule


def test_on_nan_ignore_trains_on_as_keras_but_never_saves_nan_weights(tmp_path, capsys):
    x, y = _regression()
    x[7, 3] = np.nan  # accepted: the user asked for Keras's behaviour
    model = _model()
    model.compile(loss="mse", optimizer=keras.optimizers.SGD(100.0))  # diverges within the first epoch
    result = kerasfast.fit(model, x, y, on_nan="ignore", epochs=2, run_dir=tmp_path, verbose=1)
    assert not _weights_finite(model) and result.recoveries == []
    assert "not saving model.keras" in capsys.readouterr().out
    assert not (tmp_path / "model.keras").exists()
    losses = _strict(tmp_path / "history.json")["loss"]
    assert losses[-1] is None and not np.isfinite(result.history.history["loss"][-1])  # NaN written as null


@pytest.mark.parametrize("options, message", [
    ({"on_nan": "retry"}, "on_nan='retry' is not valid"),
    ({"max_recoveries": -1}, "max_recoveries=-1 is not valid"),
    ({"loss_upper_bound": 0}, "loss_upper_bound=0 is not valid"),
])
def test_bad_divergence_arguments_are_refused(options, message):
    x, y = _regression()
    with pytest.raises(PlanError, match=message):
        kerasfast.fit(_model(), x, y, run_dir=False, verbose=0, **options)


def test_a_converged_models_wobble_is_not_a_blow_up():
    # Measured: a digits ResNet near loss 0.002 wobbled to 0.023 (11x) and was rolled back.
    from kerasfast.training.guard import SPIKE_FACTOR, blew_up

    assert not blew_up(0.0232, recent_level=0.00218, start_level=2.3)
    assert blew_up(5.0, recent_level=0.00218, start_level=2.3)  # back above the start: a blow-up
    assert not blew_up(SPIKE_FACTOR * 0.5, recent_level=0.5, start_level=2.3)  # exactly the factor: not above
    assert not blew_up(1.0, recent_level=0.0, start_level=2.3)


def _heavy_tailed_regression(n=480, seed=0):
    """Targets with 2% outliers (+40): a batch holding one spikes its loss alone."""
    x, y = _regression(n, seed)
    outliers = np.random.default_rng(seed).random(n) < 0.02
    outliers[:8] = False  # a first batch without one: the run's start level is the untrained model's
    y[outliers] += 40.0
    return x, y


def test_outlier_batches_are_trained_through_as_keras_does():
    # Measured: with one step per execution, batches holding an outlier were
    # rolled back one after another until the run raised TrainingError.
    x, y = _heavy_tailed_regression()

    def build():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
        model.compile(loss="mse", optimizer=keras.optimizers.Adam(0.01))
        return model

    (keras_loss, keras_model), (fast_loss, fast_model) = _beside_keras(build, x, y, steps_per_execution=1, epochs=3,
                                                                       batch_size=8)
    np.testing.assert_allclose(fast_loss, keras_loss, rtol=1e-4)
    assert float(fast_model.optimizer.learning_rate) == pytest.approx(float(keras_model.optimizer.learning_rate))


def _beside_keras(build, x, y, *, steps_per_execution, **options):
    """`[(losses, model)]` of `model.fit` then `kerasfast.fit` (which must not roll back) on `build()`'s model."""
    runs, options = [], dict(shuffle=False, verbose=0, **options)
    for trainer in ("keras", "kerasfast"):
        keras.utils.set_random_seed(0)
        model = build()
        if trainer == "keras":
            history = model.fit(x, y, **options).history
        else:
            result = kerasfast.fit(model, x, y, steps_per_execution=steps_per_execution, precision="float32",
                                   jit_compile=False, run_dir=False, **options)
            assert result.recoveries == []
            history = result.history.history
        runs.append((history["loss"], model))
    return runs


class _BlowUpAt(keras.callbacks.Callback):
    """Scales the first layer's weights by 1000 at one step: the weights, not a batch, blow up."""

    def __init__(self, step):
        super().__init__()
        self.step, self.done = step, False

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.step and not self.done:
            self.done = True
            kernel = self.model.layers[0].kernel
            kernel.assign(kernel * 1000.0)


def test_weights_that_blew_up_are_rolled_back_once_the_jump_lasts(capsys):
    from kerasfast.training.guard import SPIKE_PERSISTENCE

    x, y = _regression()
    model = _model()
    model.compile(loss="mse", optimizer=keras.optimizers.Adam(0.01))
    result = kerasfast.fit(model, x, y, epochs=2, batch_size=8, shuffle=False, steps_per_execution=1,
                           backup_every=5, callbacks=[_BlowUpAt(40)], run_dir=False, verbose=1)
    assert [(r["epoch"], r["step"]) for r in result.recoveries] == [(1, 40 + SPIKE_PERSISTENCE)]
    assert f"stayed there for {SPIKE_PERSISTENCE} executions" in result.recoveries[0]["problem"]
    assert "rolled back to epoch 1, step 40" in capsys.readouterr().out
    losses = result.history.history["loss"]
    assert losses[-1] < losses[0] and _weights_finite(model)
    # Lowered for the run only: the optimizer's own rate comes back.
    assert float(model.optimizer.learning_rate) == pytest.approx(0.01)


def test_each_recovery_halves_the_rate_again_and_the_users_own_comes_back(capsys):
    x, y = _regression()
    model = _model()
    model.compile(loss="mse", optimizer=keras.optimizers.Adam(0.01))
    # Every rollback goes back to the start, to a snapshot taken before any recovery lowered the rate.
    result = kerasfast.fit(model, _with_poisoned_batches(x, y, [9]), epochs=3, steps_per_execution=1,
                           backup_every=1000, run_dir=False, verbose=1)
    assert len(result.recoveries) == 3
    printed = capsys.readouterr().out
    assert [f"learning rate now {rate:.3g}" in printed for rate in (0.005, 0.0025, 0.00125)] == [True] * 3
    assert float(model.optimizer.learning_rate) == pytest.approx(0.01)  # measured: 0.04 (0.005 / 0.5**3)


class _InputScale(keras.layers.Layer):
    """Multiplies its input by a non-trainable factor a callback can change."""

    def build(self, input_shape):
        self.factor = self.add_weight(shape=(), initializer="ones", trainable=False, name="factor")

    def call(self, x):
        return x * self.factor


class _ShiftedEpoch(keras.callbacks.Callback):
    """Scales the inputs by 1.8 for one epoch: the loss jumps far above the
    converged median, yet stays below where training started."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        scale = next(layer for layer in self.model.layers if isinstance(layer, _InputScale))
        scale.factor.assign(1.8 if epoch == self.epoch else 1.0)


def test_a_spike_below_the_starting_loss_is_trained_through_as_keras_does():
    # Measured on the image recipe's ResNet: Adam spikes (0.01 -> 0.2, starting
    # near 2.3) and a converged model's wobble were rolled back, halving the rate.
    x, y = _regression()

    def build():
        model = keras.Sequential([keras.Input((8,)), _InputScale(), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(loss="mse", optimizer=keras.optimizers.SGD(0.02))
        return model

    (keras_loss, keras_model), (fast_loss, fast_model) = _beside_keras(build, x, y, steps_per_execution=16, epochs=32,
                                                                       batch_size=32, callbacks=[_ShiftedEpoch(28)])
    keras_weights, fast_weights = keras_model.get_weights(), fast_model.get_weights()
    assert keras_loss[28] > 10 * np.median(keras_loss[20:28]) and keras_loss[28] < keras_loss[0]  # the spike
    np.testing.assert_allclose(fast_loss, keras_loss, rtol=1e-5)
    for a, b in zip(fast_weights, keras_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_callback_switching_on_a_loss_term_trains_on_as_keras_does():
    # KL annealing / an auxiliary loss switched on by a callback: the loss
    # jumps 100x on purpose. The spike check starts again from the new level,
    # and the variable the callback set is never rolled back.
    x = np.random.default_rng(0).normal(size=(512, 8)).astype("float32")
    y = 0.5 * x[:, :1]

    class Auxiliary(keras.layers.Layer):
        def build(self, input_shape):
            self.weight_of_term = self.add_weight(shape=(), initializer="zeros", trainable=False)

        def call(self, h):
            self.add_loss(self.weight_of_term * (50.0 + keras.ops.mean(keras.ops.square(h))))
            return h

    class SwitchOn(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                self.model.get_layer("auxiliary").weight_of_term.assign(1.0)

    def model():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((8,))
        hidden = Auxiliary(name="auxiliary")(keras.layers.Dense(16, activation="relu")(inputs))
        built = keras.Model(inputs, keras.layers.Dense(1)(hidden))
        built.compile(loss="mse", optimizer=keras.optimizers.SGD(0.01), steps_per_execution=1)
        return built

    keras_model, kerasfast_model = model(), model()
    expected = keras_model.fit(x, y, batch_size=32, epochs=5, shuffle=False, verbose=0, callbacks=[SwitchOn()])
    result = kerasfast.fit(kerasfast_model, x, y, batch_size=32, epochs=5, shuffle=False, callbacks=[SwitchOn()],
                           steps_per_execution=1,
                           tune="off", run_dir=False, verbose=0)
    assert result.recoveries == []
    assert expected.history["loss"][2] > 50 * expected.history["loss"][1]  # the jump happened
    np.testing.assert_allclose(result.history.history["loss"], expected.history["loss"], rtol=1e-5)
    assert float(kerasfast_model.get_layer("auxiliary").weight_of_term.numpy()) == 1.0


@pytest.mark.parametrize("hook", ["on_epoch_end", "on_epoch_begin"])
@pytest.mark.parametrize("start_trainable", [True, False])
def test_a_callback_freezing_or_unfreezing_a_layer_trains_on_as_keras_does(hook, start_trainable):
    # Fine-tuning's freeze/unfreeze from a callback moves the layer's variables between the trainable and
    # the non-trainable ones; Keras keeps the traced step, and so does kerasfast.
    x, y = _regression(n=256)

    class Toggle(keras.callbacks.Callback):
        pass

    def toggle(callback, epoch, logs=None):
        if epoch == (0 if hook == "on_epoch_end" else 1):
            callback.model.layers[0].trainable = not start_trainable

    setattr(Toggle, hook, toggle)

    def model():
        built = _model()
        built.layers[0].trainable = start_trainable
        built.compile(loss="mse", optimizer=keras.optimizers.SGD(0.01), steps_per_execution=1)
        return built

    keras_model, kerasfast_model = model(), model()
    expected = keras_model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0, callbacks=[Toggle()])
    result = kerasfast.fit(kerasfast_model, x, y, batch_size=32, epochs=3, shuffle=False, callbacks=[Toggle()],
                           steps_per_execution=1, tune="off", run_dir=False, verbose=0)
    assert result.recoveries == []
    assert kerasfast_model.layers[0].trainable is (not start_trainable)
    np.testing.assert_allclose(result.history.history["loss"], expected.history["loss"], rtol=1e-5)
    for got, want in zip(kerasfast_model.get_weights(), keras_model.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_rollback_goes_back_to_the_last_epoch_end_at_most(capsys):
    x, y = _regression(n=320)  # 10 batches an epoch; the backup interval is longer than the run
    poisoned = np.concatenate([x, x, x.copy()])
    poisoned[2 * 320 + 5 * 32] = 1e30  # epoch 3, batch 6
    data = tf.data.Dataset.from_tensor_slices((poisoned, np.concatenate([y, y, y]))).batch(32)
    model = _model()
    result = kerasfast.fit(model, data, epochs=3, steps_per_epoch=10, steps_per_execution=1, run_dir=False,
                           tune="off", verbose=1)
    assert [(r["epoch"], r["step"]) for r in result.recoveries] == [(3, 6)]
    assert "rolled back to epoch 2, step 10" in capsys.readouterr().out  # not to the untrained model


def test_a_bad_batch_every_pass_meets_stops_the_run_instead_of_returning_it_untrained():
    x, y = _regression(n=320)
    x = x.copy()
    x[150, 0] = np.inf
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)  # one execution holds the whole epoch
    model = _model()
    before = model.get_weights()
    with pytest.raises(TrainingError, match="no good step in between: rolling back cannot get past it"):
        kerasfast.fit(model, data, epochs=3, steps_per_execution=10, run_dir=False, tune="off", verbose=0)
    # Nothing was kept: the model is as it was, never NaN.
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))

    model = _model()
    with pytest.raises(TrainingError, match="kept none of its steps"):
        kerasfast.fit(model, data, epochs=1, steps_per_execution=10, run_dir=False, tune="off", verbose=0)


def test_a_rate_a_callback_set_after_a_recovery_is_the_rate_the_optimizer_keeps_as_in_keras(capsys):
    # The rate of epoch 2 blows the loss up; the recovery halves it, the scheduler sets 0.01 for epoch 3.
    x, y = _regression()
    rates = {}
    for fit in ("keras", "kerasfast"):
        model = _model()
        scheduler = keras.callbacks.LearningRateScheduler(lambda epoch, rate: 5.0 if epoch == 1 else 0.01)
        options = dict(epochs=3, batch_size=64, verbose=0, callbacks=[scheduler])
        model.fit(x, y, **options) if fit == "keras" else kerasfast.fit(model, x, y, run_dir=False, **options)
        rates[fit] = float(model.optimizer.learning_rate)
    assert "learning rate now 2.5" in capsys.readouterr().out
    assert rates["kerasfast"] == rates["keras"] == pytest.approx(0.01)  # was 0.02: 0.01 / 0.5


def test_terminate_on_nan_ends_the_run_as_model_fit_does_on_the_rolled_back_state(capsys):
    x, y = _regression()
    model = _model()
    model.compile(loss="mse", optimizer=keras.optimizers.SGD(5.0))
    before = model.get_weights()
    result = kerasfast.fit(model, x, y, epochs=3, batch_size=64, verbose=0, run_dir=False, tune="off",
                           callbacks=[keras.callbacks.TerminateOnNaN()])  # raised TrainingError: "kept none"
    printed = capsys.readouterr().out
    assert "rolled back to epoch 1, step 0" in printed and "Invalid loss, terminating training" in printed
    # The rollback's "skipping the batches in between" is followed by what became of the run.
    assert ("a callback stopped the run right after that rollback (TerminateOnNaN does, at a divergence), so it does "
            "not train on from there; the model holds the state it was rolled back to (epoch 1, step 0)") in printed
    assert result.history.epoch == [0] and not np.isfinite(result.history.history["loss"][0])  # Keras logs it
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))


def test_a_metric_that_is_nan_on_a_batch_is_not_a_divergence():
    """`PearsonCorrelation` over a single target per sample (its last axis) is NaN: the loss and the
    weights are sound, and `model.fit` trains on; so does kerasfast (its guard reads the losses, as
    TerminateOnNaN does)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(160, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32"))[:, None]

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.01), "mse", metrics=[keras.metrics.PearsonCorrelation(name="pearson")])
        return model

    keras_model, fast_model = build(), build()
    expected = keras_model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0).history
    assert np.isnan(expected["pearson"]).all()
    result = kerasfast.fit(fast_model, x, y, batch_size=32, epochs=3, shuffle=False, run_dir=False, verbose=0)
    assert result.recoveries == [] and np.isnan(result.history.history["pearson"]).all()
    assert int(fast_model.optimizer.iterations) == int(keras_model.optimizer.iterations) == 15
    np.testing.assert_allclose(result.history.history["loss"], expected["loss"], rtol=1e-4)
