"""Each precision policy trains a real model on real data (scikit-learn digits)."""

import keras
import numpy as np
import pytest

import kerasfast
from tests.helpers import small_convnet

# bf16 has 8 bits of mantissa, fp16 10: after the same training the test loss
# of a mixed-precision run lands within this absolute distance of float32's.
LOSS_TOLERANCE = 0.15


def _train(digits, precision, **options):
    (x, y), (x_test, y_test) = digits
    keras.utils.set_random_seed(1)
    model = small_convnet()
    model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    result = kerasfast.fit(model, (x, y), epochs=4, batch_size=64, precision=precision, seed=1,
                           run_dir=False, verbose=0, **options)
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
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
    # The user's float32 model was rebuilt for training; the trained copy's
    # hidden layers computed in the low precision, its output layer in float32.
    trained = result_train_model(result)
    hidden = [layer for layer in trained.layers[:-1] if layer.weights]
    assert hidden and all(layer.compute_dtype == compute_dtype for layer in hidden)
    assert all(layer.variable_dtype == "float32" for layer in hidden)
    assert trained.layers[-1].compute_dtype == "float32"
    (x, _), _ = digits
    assert keras.ops.convert_to_numpy(trained(x[:4])).dtype == np.float32
    # Intermediate activations really are low precision.
    probe = keras.Model(trained.inputs[0], trained.layers[0].output)
    assert keras.backend.standardize_dtype(probe(x[:4]).dtype) == compute_dtype
    # The user's own model keeps its float32 layers and holds the trained weights.
    assert all(layer.compute_dtype == "float32" for layer in user_model.layers)
    for a, b in zip(user_model.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert keras.config.dtype_policy().name == "float32"


def result_train_model(result):
    """The model kerasfast actually trained (saved in the run for inspection)."""
    return result.train_model


def test_mixed_float16_uses_dynamic_loss_scaling(digits):
    result, _, _, _ = _train(digits, "mixed_float16")
    optimizer = result.train_model.optimizer
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    scale = float(keras.ops.convert_to_numpy(optimizer.dynamic_scale))
    # Dynamic scaling starts at 2**15 and moves by powers of two.
    assert scale > 1 and np.log2(scale) == int(np.log2(scale))
    assert int(optimizer.iterations) > 0
    # The loss Keras differentiates is multiplied by the current scale.
    scaled = float(keras.ops.convert_to_numpy(optimizer.scale_loss(keras.ops.convert_to_tensor(1.0))))
    assert scaled == scale


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
