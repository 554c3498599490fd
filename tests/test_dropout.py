"""Dropout masks from a counter hash (`kerasfast.training.dropout`): Keras's
dropout with another random stream, in kerasfast's train steps on a CPU."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasfast
from kerasfast import _compat
from kerasfast.errors import PlanError
from kerasfast.hardware import GPU, Hardware
from kerasfast.plan import DROPOUT_HASHED, DROPOUT_KERAS, RECORDED_REASON, ModelFacts, resolve_dropout
from kerasfast.training.dropout import hashed_dropout, keep_mask, substituting_dropout


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_the_mask_drops_the_rate_of_values_and_its_positions_are_independent(rate):
    kept = keep_mask(tf.constant([1000, 1000]), tf.constant([12, 34]), rate).numpy()
    n = kept.size
    sigma = np.sqrt(rate * (1 - rate) / n)
    assert abs((1 - kept.mean()) - rate) < 5 * sigma
    # Neighbours along either axis are no more alike than two independent draws.
    for a, b in ((kept[:, 1:], kept[:, :-1]), (kept[1:], kept[:-1])):
        both = (a & b).mean()
        assert abs(both - (1 - rate) ** 2) < 6 * np.sqrt((1 - rate) ** 2 / n)


def test_masks_far_apart_in_memory_are_no_more_alike_than_independent_ones():
    # One hash round left positions 4,096 and 16,384 apart correlated (z about 25 over 16M values at rate 0.1).
    for seed in ([1, 2], [5, 9]):
        kept = keep_mask(tf.constant([1 << 22]), tf.constant(seed), 0.1).numpy().astype("float64")
        for stride in (1, 256, 4096, 16384, 65536):
            a, b = kept[stride:], kept[:-stride]
            correlation = np.corrcoef(a, b)[0, 1]
            assert abs(correlation) * np.sqrt(len(a)) < 5, (seed, stride, correlation)


def test_one_seed_gives_one_mask_and_another_seed_another():
    first = keep_mask(tf.constant([256, 256]), tf.constant([1, 2]), 0.5).numpy()
    assert np.array_equal(first, keep_mask(tf.constant([256, 256]), tf.constant([1, 2]), 0.5).numpy())
    for other in ([1, 3], [2, 2], [0, 0]):
        agree = (first == keep_mask(tf.constant([256, 256]), tf.constant(other), 0.5).numpy()).mean()
        assert 0.48 < agree < 0.52, other  # half, as for independent masks


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_kept_values_are_scaled_as_keras_scales_them_and_the_rest_are_zero(dtype):
    x = tf.cast(tf.random.stateless_normal((64, 300), seed=[0, 1]), dtype)
    out = hashed_dropout(x, 0.3, seed=keras.random.SeedGenerator(5))
    kept = out.numpy() != 0
    expected = (x * tf.cast(1 / 0.7, dtype)).numpy()
    np.testing.assert_array_equal(out.numpy()[kept], expected[kept])
    assert out.dtype == x.dtype and 0.6 < kept.mean() < 0.8
    assert hashed_dropout(x, 0.0, seed=1) is x
    assert not np.any(hashed_dropout(x, 1.0, seed=1).numpy())


def test_a_noise_shape_shares_one_draw_along_its_axes_of_one():
    x = tf.ones((8, 50, 16))
    out = hashed_dropout(x, 0.5, noise_shape=(None, 1, 16), seed=keras.random.SeedGenerator(3)).numpy()
    assert np.array_equal(out, np.broadcast_to(out[:, :1, :], out.shape))  # one mask for all 50 steps
    assert 0.3 < (out[:, 0, :] != 0).mean() < 0.7


def test_lengths_unknown_when_traced_keep_keras_draw():
    # XLA would compile the hashed mask again at each new sequence length (30 lengths: 4.5 s against 0.08 s);
    # an unknown rank made the hashed path fail.
    layer = keras.layers.Dropout(0.5, seed=2)

    def run(x):
        with substituting_dropout():
            return layer(x, training=True)

    for spec in (tf.TensorSpec((4, None)), tf.TensorSpec((None, None)), tf.TensorSpec(None)):
        traced = tf.function(run, input_signature=[spec], autograph=False)
        assert "StatelessRandomUniformV2" in _random_ops(run, spec), spec
        assert set(np.unique(traced(tf.ones((4, 10))).numpy())) <= {0.0, 2.0}
    for spec in (tf.TensorSpec((4, 10)), tf.TensorSpec((None, 10))):  # a batch of unknown size is hashed
        assert "StatelessRandomUniformV2" not in _random_ops(run, spec), spec


def test_a_spatial_dropout_of_a_batch_of_unknown_size_is_traced():
    # Its noise shape holds the batch size as a tensor: Keras's draw takes it; a known one is hashed.
    layer = keras.layers.SpatialDropout1D(0.5, seed=2)

    def run(x):
        with substituting_dropout():
            return layer(x, training=True)

    unknown = tf.function(run, input_signature=[tf.TensorSpec((None, 10, 4))], autograph=False)
    for out in (unknown(tf.ones((8, 10, 4))), tf.function(run, autograph=False)(tf.ones((8, 10, 4)))):
        out = out.numpy()
        assert np.array_equal(out, np.broadcast_to(out[:, :1, :], out.shape))  # one draw along the steps


def test_inputs_of_changing_shapes_are_masked_without_retracing_warnings(caplog):
    layer = keras.layers.Dropout(0.5, seed=2)
    for length in range(3, 12):
        out = hashed_dropout(tf.ones((2, length)), 0.5, seed=layer.seed_generator).numpy()
        assert out.shape == (2, length) and set(np.unique(out)) <= {0.0, 2.0}
    assert "retracing" not in caplog.text


def test_the_layers_seed_generator_advances_as_for_keras_own_draw():
    ours, keras_own = keras.random.SeedGenerator(7), keras.random.SeedGenerator(7)
    x = tf.ones((4, 10))
    for _ in range(3):
        hashed_dropout(x, 0.5, seed=ours)
        keras.random.dropout(x, 0.5, seed=keras_own)
    np.testing.assert_array_equal(ours.state.numpy(), keras_own.state.numpy())
    first = hashed_dropout(x, 0.5, seed=keras.random.SeedGenerator(7)).numpy()
    assert not np.array_equal(first, hashed_dropout(x, 0.5, seed=ours).numpy())  # a new mask for each call


def test_the_gradient_is_the_mask_and_scale_of_the_forward_pass():
    layer = keras.layers.Dropout(0.25, seed=11)
    x = tf.random.stateless_normal((32, 64), seed=[2, 3])
    weights = tf.random.stateless_normal((32, 64), seed=[4, 5])

    @tf.function(autograph=False)
    def step(x):
        with substituting_dropout(), tf.GradientTape() as tape:
            tape.watch(x)
            out = layer(x, training=True)
            loss = tf.reduce_sum(out * weights)
        return out, tape.gradient(loss, x)

    out, gradient = step(x)
    kept = out.numpy() != 0
    np.testing.assert_allclose(gradient.numpy(), np.where(kept, weights.numpy() / 0.75, 0.0), rtol=1e-6)


def _random_ops(function, *args):
    graph = tf.function(function, autograph=False).get_concrete_function(*args).graph
    return sorted({op.type for op in graph.get_operations() if "Random" in op.type})


def test_the_substitution_reaches_every_dropout_and_ends_with_its_block():
    module = _compat.tensorflow_random_module()
    keras_dropout = module.dropout
    attention = keras.layers.MultiHeadAttention(2, 8, dropout=0.5, seed=3)
    recurrent = keras.layers.GRU(4, dropout=0.5, recurrent_dropout=0.5, seed=4)
    dropout = keras.layers.Dropout(0.5, seed=1)
    x = tf.random.stateless_normal((2, 6, 16), seed=[0, 0])

    def train_pass(x):
        return dropout(attention(x, x, training=True), training=True), recurrent(x, training=True)

    assert "StatelessRandomUniformV2" in _random_ops(train_pass, x)  # Keras's draws
    with substituting_dropout():
        assert module.dropout is not keras_dropout
        with substituting_dropout():  # nested: one substitution
            pass
        assert module.dropout is not keras_dropout
        assert _random_ops(train_pass, x) == []  # every mask is hashed
    assert module.dropout is keras_dropout
    assert "StatelessRandomUniformV2" in _random_ops(train_pass, x)


def test_the_plan_hashes_masks_of_models_with_dropout_on_a_cpu_and_keeps_keras_stream_when_asked():
    cpu, gpu = Hardware(), Hardware(gpus=(GPU("H200", (9, 0)),))
    with_dropout = ModelFacts(random_layers=("dropout",))
    assert resolve_dropout("auto", cpu, with_dropout)[0] == DROPOUT_HASHED
    assert resolve_dropout("auto", cpu, ModelFacts()) == (DROPOUT_KERAS, "n/a: no dropout or other random layers")
    assert resolve_dropout("auto", gpu, with_dropout)[0] == DROPOUT_KERAS
    assert resolve_dropout("keras", cpu, with_dropout) == (DROPOUT_KERAS, "requested")
    with pytest.raises(PlanError, match="dropout='fast' is not known"):
        resolve_dropout("fast", cpu, with_dropout)


def _encoder():
    keras.utils.set_random_seed(0)
    tokens = keras.Input((32,), dtype="int32")
    x = keras.layers.Embedding(64, 16)(tokens)
    x = keras.layers.MultiHeadAttention(2, 8, dropout=0.1)(x, x)
    x = keras.layers.Dropout(0.2)(keras.layers.GlobalAveragePooling1D()(x))
    return keras.Model(tokens, keras.layers.Dense(4)(x))


def _tokens():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 64, size=(256, 32)).astype("int32")
    return x, (x[:, 0] % 4).astype("int32")


_FIT = dict(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), batch_size=32, epochs=3,
            shuffle=False, run_dir=False, verbose=0, tune="off", optimizer="adam")


def test_fit_trains_with_hashed_masks_reproducibly_and_with_keras_stream_when_asked():
    x, y = _tokens()
    first = kerasfast.fit(_encoder(), x, y, **_FIT)
    assert first.plan.dropout == DROPOUT_HASHED
    assert first.history.history["loss"][-1] < first.history.history["loss"][0]
    again = kerasfast.fit(_encoder(), x, y, **_FIT)
    for a, b in zip(first.model.get_weights(), again.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    keras_stream = kerasfast.fit(_encoder(), x, y, dropout="keras", **_FIT)
    assert keras_stream.plan.dropout == DROPOUT_KERAS and "dropout" in keras_stream.plan.overridden
    assert not all(np.array_equal(a, b) for a, b in zip(first.model.get_weights(), keras_stream.model.get_weights(),
                                                        strict=True))
    assert _compat.tensorflow_random_module().dropout.__module__ == "keras.src.backend.tensorflow.random"


class _CrashInEpoch(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 1 and batch == 3:
            raise RuntimeError("simulated crash")


def test_a_run_with_hashed_masks_resumes_exactly(tmp_path):
    x, y = _tokens()
    options = {**_FIT, "backup_every": 2, "steps_per_execution": 1}
    whole = kerasfast.fit(_encoder(), x, y, **{**options, "run_dir": tmp_path / "whole"})
    with pytest.raises(RuntimeError, match="simulated crash"):
        kerasfast.fit(_encoder(), x, y, callbacks=[_CrashInEpoch()], **{**options, "run_dir": tmp_path / "cut"})
    resumed = kerasfast.fit(_encoder(), x, y, **{**options, "run_dir": tmp_path / "cut"})
    assert resumed.plan.dropout == DROPOUT_HASHED
    assert resumed.history.history == whole.history.history
    for a, b in zip(whole.model.get_weights(), resumed.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def _without_recorded_dropout(state_file):
    """The backup as a run from before the plan's `dropout` field wrote it."""
    with np.load(state_file, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    meta = json.loads(str(arrays["meta"]))
    del meta["plan"]["dropout"]
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(state_file, **arrays)


def test_a_resume_keeps_the_masks_its_backup_trained_with(tmp_path):
    # Resumed without the argument, a run keeps the stream it began with, also from a backup written before
    # the plan recorded one (Keras's, then), instead of changing stream mid-run.
    x, y = _tokens()
    options = {**_FIT, "backup_every": 2, "steps_per_execution": 1}
    whole = kerasfast.fit(_encoder(), x, y, dropout="keras", **{**options, "run_dir": tmp_path / "whole"})
    for name in ("recorded", "older"):
        with pytest.raises(RuntimeError, match="simulated crash"):
            kerasfast.fit(_encoder(), x, y, dropout="keras", callbacks=[_CrashInEpoch()],
                          **{**options, "run_dir": tmp_path / name})
    _without_recorded_dropout(tmp_path / "older" / "backup" / "state.npz")
    for name in ("recorded", "older"):
        resumed = kerasfast.fit(_encoder(), x, y, **{**options, "run_dir": tmp_path / name})
        assert resumed.plan.dropout == DROPOUT_KERAS
        assert resumed.plan.reasons["dropout"] == RECORDED_REASON
        assert resumed.history.history == whole.history.history
        for a, b in zip(whole.model.get_weights(), resumed.model.get_weights(), strict=True):
            np.testing.assert_array_equal(a, b)
