"""Each precision policy trains a real model on real data (scikit-learn digits)."""

import keras
import numpy as np
import pytest

import kerasfast
from tests.helpers import TrainingProbe, small_convnet

# bf16 has 8 bits of mantissa, fp16 10: after the same training the test loss
# of a mixed-precision run lands within this absolute distance of float32's.
LOSS_TOLERANCE = 0.15


def _train(digits, precision, **options):
    (x, y), (x_test, y_test) = digits
    keras.utils.set_random_seed(1)
    model = small_convnet()
    model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    probe = TrainingProbe(x[:4])
    result = kerasfast.fit(model, (x, y), epochs=4, batch_size=64, precision=precision, seed=1,
                           run_dir=False, verbose=0, callbacks=[probe], **options)
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    result.probe = probe.seen
    return result, model, loss, accuracy


@pytest.fixture(scope="module")
def float32_run(digits):
    return _train(digits, "float32")


def test_float32_trains_well_above_chance(float32_run):
    result, model, loss, accuracy = float32_run
    assert result.plan.precision == "float32"
    assert accuracy > 0.8  # chance is 0.1
    assert all(layer.compute_dtype == "float32" for layer in model.layers)


@pytest.mark.parametrize("precision, compute_dtype", [("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float16")])
def test_mixed_precision_computes_in_low_precision_and_matches_float32(digits, float32_run, precision, compute_dtype):
    result, user_model, loss, accuracy = _train(digits, precision)
    assert result.plan.precision == precision
    assert accuracy > 0.8
    assert abs(loss - float32_run[2]) < LOSS_TOLERANCE
    # While training, the user's own model object computed its hidden layers
    # in the low precision (float32 variables) and its output layer in float32.
    seen = result.probe
    weighted = [i for i, layer in enumerate(user_model.layers) if layer.weights]
    assert all(seen["compute_dtypes"][i] == compute_dtype for i in weighted[:-1])
    assert all(seen["variable_dtypes"][i] == "float32" for i in weighted)
    assert seen["compute_dtypes"][-1] == "float32" and seen["output_dtype"] == "float32"
    assert seen["activation_dtype"] == compute_dtype  # intermediate activations really are low precision
    # Afterwards it is a float32 model again, holding the trained weights.
    assert result.train_model is user_model
    assert all(layer.compute_dtype == "float32" for layer in user_model.layers)
    assert keras.config.dtype_policy().name == "float32"


def test_mixed_float16_scales_the_loss_around_the_users_optimizer(digits):
    """A loss 2**-30 times smaller leaves float16 gradients at zero unless the
    loss is scaled: kerasfast's dynamic loss scaling keeps them alive, and
    the user's own optimizer (not a wrapper) is what the model holds afterwards."""
    (x, y), _ = digits
    tiny = keras.losses.SparseCategoricalCrossentropy()

    def scaled_down(y_true, y_pred):
        return tiny(y_true, y_pred) * 2.0**-30

    keras.utils.set_random_seed(1)
    model = small_convnet()
    # SGD with the learning rate scaled up by the same 2**30: a normal-sized update, if the gradient survives.
    sgd = keras.optimizers.SGD(0.05 * 2.0**30)
    model.compile(sgd, scaled_down)
    before = [w.copy() for w in model.get_weights()]
    kerasfast.fit(model, (x, y), epochs=1, batch_size=64, precision="mixed_float16", run_dir=False, verbose=0)
    assert model.optimizer is sgd and not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert int(sgd.iterations) > 0
    # Unscaled, float16 gradients of ~1e-12 underflow to zero and nothing would move.
    assert max(float(np.abs(a - b).max()) for a, b in zip(before, model.get_weights(), strict=True)) > 1e-3


def test_mixed_bfloat16_has_no_loss_scaling(digits):
    result, _, _, _ = _train(digits, "mixed_bfloat16")
    assert not isinstance(result.train_model.optimizer, keras.optimizers.LossScaleOptimizer)


def test_auto_precision_on_this_machine(digits):
    hardware = kerasfast.detect_hardware()
    result, _, _, _ = _train(digits, "auto")
    if hardware.accelerator == "cpu":
        expected = ("onednn_bfloat16", "float32") if hardware.cpu_has_bf16 else ("float32",)
        assert result.plan.precision in expected
    assert result.plan.precision != "mixed_float16"
    assert "precision" not in result.plan.overridden
    assert result.plan.reasons["precision"]


NEEDS_BF16_CPU = pytest.mark.skipif(
    not kerasfast.detect_hardware().cpu_has_bf16, reason="needs a CPU with AVX512_BF16 or AMX (bf16 matmuls)")

# 1 + 2**-10 is exact in float32 but rounds to 1.0 in bfloat16 (8-bit mantissa).
NOT_A_BFLOAT16 = 1 + 2**-10


@NEEDS_BF16_CPU
def test_onednn_bfloat16_rewrites_matmuls_and_convolutions_only_inside_its_block():
    import tensorflow as tf

    from kerasfast.training.precision import graph_precision

    x = tf.constant([[NOT_A_BFLOAT16, 0.0]])

    def matmul():
        return float(tf.function(lambda: tf.matmul(x, tf.ones((2, 1))))()[0, 0])

    def conv():
        return float(tf.function(lambda: tf.nn.conv2d(tf.reshape(x, (1, 1, 2, 1)), tf.ones((1, 1, 1, 1)), 1,
                                                      "SAME"))()[0, 0, 0, 0])

    assert matmul() == NOT_A_BFLOAT16
    with graph_precision("onednn_bfloat16"):
        assert matmul() == 1.0
        assert conv() == 1.0
    assert matmul() == NOT_A_BFLOAT16  # later functions are float32 again


@NEEDS_BF16_CPU
def test_onednn_bfloat16_fit_runs_the_step_in_bfloat16_on_a_float32_model():
    x = np.tile(np.array([[NOT_A_BFLOAT16, 0.0]], "float32"), (8, 1))
    y = np.zeros((8, 1), "float32")

    def build():
        return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])

    first_loss = {}
    for precision in ("float32", "onednn_bfloat16"):
        result = kerasfast.fit(build, (x, y), loss="mse", optimizer=keras.optimizers.SGD(1e-6), batch_size=8,
                               epochs=1, precision=precision, run_dir=False, verbose=0)
        first_loss[precision] = result.history.history["loss"][0]
        assert all(layer.compute_dtype == "float32" for layer in result.train_model.layers)
    assert first_loss["float32"] == pytest.approx(NOT_A_BFLOAT16**2, rel=1e-6)
    assert first_loss["onednn_bfloat16"] == 1.0


def test_onednn_bfloat16_trains_like_float32(digits, float32_run):
    result, user_model, loss, accuracy = _train(digits, "onednn_bfloat16")
    assert result.plan.precision == "onednn_bfloat16"
    assert accuracy > 0.8
    assert abs(loss - float32_run[2]) < LOSS_TOLERANCE
    # Nothing to rebuild or copy back: the model itself is float32 and trained in place.
    assert all(layer.compute_dtype == "float32" for layer in user_model.layers)
    assert result.model is user_model
    import tensorflow as tf

    assert tf.config.optimizer.get_experimental_options().get("auto_mixed_precision_onednn_bfloat16", False) is False


def test_a_model_built_under_a_mixed_policy_is_told_how_to_keep_it(digits):
    (x, y), _ = digits
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = small_convnet()
    finally:
        keras.config.set_dtype_policy("float32")
    model.compile("adam", "sparse_categorical_crossentropy")
    result = kerasfast.fit(model, (x, y), epochs=1, batch_size=64, run_dir=False, verbose=0)
    if result.plan.precision != "mixed_float16":  # never on a CPU
        assert "built under 'mixed_float16': pass precision='mixed_float16'" in result.plan.reasons["precision"]
    kept = kerasfast.fit(model, (x, y), epochs=1, batch_size=64, precision="mixed_float16", run_dir=False, verbose=0)
    assert kept.plan.precision == "mixed_float16" and "built under" not in kept.plan.reasons["precision"]
    assert model.layers[0].dtype_policy.name == "mixed_float16"  # the model's own policy, given back


@pytest.mark.parametrize("steps_per_execution", [1, 8])
@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16", "onednn_bfloat16"])
def test_a_checkpoint_saved_mid_run_is_the_model_the_user_built(digits, tmp_path, precision, steps_per_execution):
    """What a callback saves during the run loads with the user's float32 policies and predicts as the
    trained model does, whatever precision the steps computed in."""
    (x, y), (x_test, _) = digits
    model = small_convnet()
    model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy")
    saved = tmp_path / "checkpoint.keras"
    seen = []
    callbacks = [keras.callbacks.ModelCheckpoint(str(saved)),
                 keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(
                     [layer.dtype_policy.name for layer in model.layers]))]
    result = kerasfast.fit(model, (x, y), epochs=2, batch_size=64, precision=precision, tune="off",
                           steps_per_execution=steps_per_execution, callbacks=callbacks, run_dir=False, verbose=0)
    assert result.plan.precision == precision
    assert seen and all(policies == ["float32"] * len(model.layers) for policies in seen)
    loaded = keras.models.load_model(saved)
    assert [layer.dtype_policy.name for layer in loaded.layers] == ["float32"] * len(model.layers)
    np.testing.assert_array_equal(loaded.predict(x_test, verbose=0), model.predict(x_test, verbose=0))


class _RecordsComputeDtype(keras.layers.Dense):
    seen = set()

    def call(self, inputs):
        _RecordsComputeDtype.seen.add(self.compute_dtype)
        return super().call(inputs)


def test_an_eager_model_computes_in_the_plans_precision_and_its_checkpoints_are_float32(digits, tmp_path):
    """run_eagerly=True: Keras's own steps run in the plan's precision one
    step at a time, and between steps (where callbacks save) the layers hold
    the user's float32 policies."""
    (x, y), (x_test, _) = digits
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), _RecordsComputeDtype(32),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", run_eagerly=True)
    saved, seen = tmp_path / "checkpoint.keras", []
    _RecordsComputeDtype.seen = set()
    callbacks = [keras.callbacks.ModelCheckpoint(str(saved), save_freq=5),
                 keras.callbacks.LambdaCallback(
                     on_train_begin=lambda logs: _RecordsComputeDtype.seen.clear(),
                     on_train_batch_end=lambda batch, logs: seen.append(
                         {layer.dtype_policy.name for layer in model.layers}))]
    result = kerasfast.fit(model, (x[:320], y[:320]), epochs=1, batch_size=32, precision="mixed_bfloat16",
                           callbacks=callbacks, run_dir=False, verbose=0)
    assert result.plan.train_step == "keras"
    assert _RecordsComputeDtype.seen == {"bfloat16"}  # every training step
    assert len(seen) == 10 and all(policies == {"float32"} for policies in seen)
    loaded = keras.models.load_model(saved, custom_objects={"_RecordsComputeDtype": _RecordsComputeDtype})
    assert {layer.dtype_policy.name for layer in loaded.layers} == {"float32"}
    np.testing.assert_array_equal(loaded.predict(x_test, verbose=0), model.predict(x_test, verbose=0))
    assert "train_step" not in vars(model)  # Keras's own step, given back


def test_a_callbacks_own_predict_runs_in_float32_under_onednn_bfloat16(digits):
    """The oneDNN bfloat16 graph rewrite applies to kerasfast's steps only: a
    `model.predict` a callback runs during the run computes in float32, as
    under model.fit (it differed by ~1e-2 when the rewrite covered the run)."""
    (x, y), (x_test, _) = digits
    x, x_test = x.reshape(len(x), 64), x_test.reshape(len(x_test), 64)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    gaps = []

    def compare(epoch, logs):
        (w1, b1), (w2, b2) = (layer.get_weights() for layer in model.layers)
        by_hand = np.maximum(x_test @ w1 + b1, 0) @ w2 + b2
        gaps.append(np.abs(model.predict(x_test, verbose=0) - by_hand).max())

    result = kerasfast.fit(model, (x, y), epochs=2, batch_size=64, precision="onednn_bfloat16", tune="off",
                           callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=compare)], run_dir=False, verbose=0)
    assert result.plan.precision == "onednn_bfloat16"
    assert len(gaps) == 2 and max(gaps) < 1e-4, gaps


class ScaleF32(keras.layers.Layer):
    """The TF tutorials' `d_model` scaling: a float32 constant, whatever the input's dtype."""

    def call(self, x):
        import tensorflow as tf

        return x * tf.math.sqrt(tf.cast(6, tf.float32))


def _halving_lambda():
    import tensorflow as tf

    return keras.layers.Lambda(lambda t: t / tf.constant(2.0), name="halve")


@pytest.mark.parametrize("make_layer, named", [(lambda: ScaleF32(name="scale"), "ScaleF32 layer 'scale'"),
                                               (_halving_lambda, "Lambda layer 'halve'")], ids=["custom", "lambda"])
def test_an_asked_mixed_precision_a_layer_mixes_float32_into_is_refused_before_training(make_layer, named):
    """A layer computing with a float32 constant fails under a mixed policy
    in TensorFlow's first step; asked for, the precision is refused before
    it, naming the layer, the dtypes and the fix, and the model is left as
    it was, for model.fit to train (in float32, as it would)."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(128, 6)).astype("float32"), rng.integers(0, 3, size=128)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.BatchNormalization(), make_layer(), keras.layers.Dense(3)])
    before = [w.copy() for w in model.get_weights()]  # BatchNormalization's statistics among them
    begun = []
    with pytest.raises(kerasfast.PlanError) as refused:
        kerasfast.fit(model, x, y, epochs=1, batch_size=32, precision="mixed_bfloat16", tune="off", run_dir=False,
                      verbose=0, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer="adam",
                      callbacks=[keras.callbacks.LambdaCallback(on_train_begin=lambda logs: begun.append(1))])
    message = str(refused.value)
    assert named in message and "float32 into bfloat16" in message
    assert "keras.ops.cast(c, x.dtype)" in message and "precision='float32'" in message
    assert not begun and not model.compiled
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
    assert {layer.dtype_policy.name for layer in model.layers} == {"float32"}
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    assert np.isfinite(history.history["loss"][0])


class _SeesDtype(keras.layers.Layer):
    """Records the dtype of what reaches it in the traced steps."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen = []

    def call(self, x):
        self.seen.append(keras.backend.standardize_dtype(x.dtype))
        return x


@pytest.mark.parametrize("precision", ["auto", "mixed_bfloat16"])
def test_layers_computing_in_float64_keep_float64_and_the_plan_says_so(precision):
    # Was: the plan's policy replaced the float64 one for the run, so a model built in float64 for its
    # numerics trained in float32 (or bfloat16) without a word.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4))
    keras.utils.set_random_seed(0)
    sees = _SeesDtype(dtype="float64")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, dtype="float64", name="precise"), sees,
                              keras.layers.Dense(1)])
    result = kerasfast.fit(model, x, x.sum(axis=1, keepdims=True), loss="mse", optimizer="sgd", epochs=1,
                           batch_size=16, precision=precision, jit_compile=False, tune="off", run_dir=False,
                           verbose=0)
    assert set(sees.seen) == {"float64"}
    assert model.layers[0].compute_dtype == "float64" and model.layers[0].kernel.dtype == "float64"
    assert "2 layer(s) computing in float64 as built ('precise', " in result.plan.reasons["precision"]
    assert result.plan.reasons["precision"].endswith("keep float64")
