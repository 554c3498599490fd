"""Magnitude pruning on real Keras 3 models: exact sparsity, plain models after."""

import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_digits

from kerasfast.compress import (
    ConstantSparsity,
    PruningConfig,
    apply_pruning,
    finalize_pruning,
    measure_sparsity,
    prune,
)
from kerasfast.compress.constraint import PruningMaskConstraint
from kerasfast.errors import DataError, ModelError, PlanError


@pytest.fixture(scope="module")
def digits():
    data = load_digits()
    x = (data.images[:256] / 16.0).astype("float32")[..., None]
    return x, data.target[:256].astype("int32")


def digits_convnet(name_prefix=""):
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(8, 3, activation="relu", name=f"{name_prefix}conv1"),
            keras.layers.Conv2D(16, 3, activation="relu", name=f"{name_prefix}conv2"),
            keras.layers.Flatten(name=f"{name_prefix}flatten"),
            keras.layers.Dense(32, activation="relu", name=f"{name_prefix}dense"),
            keras.layers.Dense(10, name=f"{name_prefix}logits"),
        ]
    )


def compile_digits(model, **kwargs):
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        **kwargs,
    )
    return model


def expected_zeros(sparsity, size):
    return int(np.round(np.float32(sparsity) * np.float32(size)))


def assert_exact_sparsity(summary, model, sparsity):
    zeros = {row["layer"]: row for row in measure_sparsity(model)}
    for row in summary:
        assert zeros[row["layer"]]["zeros"] == expected_zeros(sparsity, row["params"]), row
        assert row["sparsity"] == pytest.approx(zeros[row["layer"]]["sparsity"])


def assert_plain_keras(model):
    for variable in model.weights:
        assert not isinstance(variable.constraint, PruningMaskConstraint), variable.path


def test_prune_with_xla_and_steps_per_execution_gives_exact_sparsity_and_plain_model(digits, tmp_path):
    x, y = digits
    legacy_flag = os.environ.get("TF_USE_LEGACY_KERAS")
    model = compile_digits(digits_convnet(), jit_compile=True, steps_per_execution=3)
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    result = prune(model, (x, y), target_sparsity=0.75, epochs=2, batch_size=32, verbose=0)

    assert [row["layer"] for row in result.summary] == ["conv1", "conv2", "dense", "logits"]
    assert_exact_sparsity(result.summary, model, 0.75)
    assert_plain_keras(model)
    assert "conv2" in result.table()
    assert len(result.history.history["loss"]) == 2
    # Still trainable after pruning, and a plain .keras round trip.
    path = tmp_path / "pruned.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    assert [type(l) for l in restored.layers] == [type(l) for l in model.layers]
    np.testing.assert_allclose(restored.predict(x[:16], verbose=0), model.predict(x[:16], verbose=0), atol=1e-6)
    # kerasfast never imported tfmot into this process or flipped tf.keras.
    assert os.environ.get("TF_USE_LEGACY_KERAS") == legacy_flag
    assert tf.keras.layers.Dense.__module__.startswith("keras.src")


def test_masks_hold_through_every_update_inside_a_compiled_loop(digits):
    x, y = digits
    model = compile_digits(digits_convnet(), jit_compile=True, steps_per_execution=4)
    # Mask computed once at step 0, then only held: any update leaking into
    # a pruned weight would show up as a changed zero pattern.
    config = PruningConfig(schedule=ConstantSparsity(0.5, begin_step=0, end_step=0, frequency=1))
    apply_pruning(model, config)
    model.fit(x[:32], y[:32], epochs=1, batch_size=32, verbose=0)
    first_zeros = {l.name: l.kernel.numpy() == 0 for l in model.layers if hasattr(l, "kernel")}
    model.fit(x, y, epochs=2, batch_size=16, verbose=0)  # 32 more updates, 4 per execution
    for layer in model.layers:
        if hasattr(layer, "kernel"):
            kernel = layer.kernel.numpy()  # before finalize: the live variable
            np.testing.assert_array_equal(kernel == 0, first_zeros[layer.name])
            assert (kernel == 0).sum() == expected_zeros(0.5, kernel.size)
    summary = finalize_pruning(model)
    assert_exact_sparsity(summary, model, 0.5)


def mixed_layer_models():
    keras.utils.set_random_seed(1)
    image = keras.Input((8, 8, 4))
    h = keras.layers.DepthwiseConv2D(3, padding="same", name="depthwise")(image)
    h = keras.layers.SeparableConv2D(8, 3, name="separable")(h)
    h = keras.layers.Conv2D(8, 3, name="conv2d")(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.EinsumDense("ab,bc->ac", output_shape=16, name="einsum")(h)
    image_model = keras.Model(image, keras.layers.Dense(3, name="head")(h))

    tokens = keras.Input((12,), dtype="int32")
    t = keras.layers.Embedding(50, 8, name="embedding")(tokens)
    t = keras.layers.Conv1D(8, 3, name="conv1d")(t)
    t = keras.layers.GlobalAveragePooling1D()(t)
    text_model = keras.Model(tokens, keras.layers.Dense(3, name="text_head")(t))

    volume = keras.Input((4, 4, 4, 2))
    v = keras.layers.Conv3D(4, 2, name="conv3d")(volume)
    v = keras.layers.Flatten()(v)
    volume_model = keras.Model(volume, keras.layers.Dense(3, name="volume_head")(v))
    rng = np.random.default_rng(0)
    return [
        (image_model, rng.standard_normal((64, 8, 8, 4)).astype("float32")),
        (text_model, rng.integers(0, 50, (64, 12)).astype("int32")),
        (volume_model, rng.standard_normal((64, 4, 4, 4, 2)).astype("float32")),
    ]


def test_every_supported_layer_type_reaches_exact_sparsity():
    pruned_types = set()
    for model, x in mixed_layer_models():
        y = np.arange(len(x)) % 3
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        result = prune(model, (x, y), target_sparsity=0.6, epochs=2, batch_size=16, verbose=0)
        assert_exact_sparsity(result.summary, model, 0.6)
        assert_plain_keras(model)
        pruned_types |= {row["type"] for row in result.summary}
    assert pruned_types >= {
        "DepthwiseConv2D", "SeparableConv2D", "Conv2D", "EinsumDense", "Dense", "Embedding", "Conv1D", "Conv3D",
    }


def test_layers_of_a_nested_model_are_reported_as_their_own_type():
    keras.utils.set_random_seed(1)
    inner = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, name="inner_dense")], name="inner")
    inputs = keras.Input((16,))
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(inner(inputs)))
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).normal(size=(64, 16)).astype("float32")
    result = prune(model, (x, np.arange(64) % 3), target_sparsity=0.5, epochs=1, batch_size=16, verbose=0)
    assert {row["layer"]: row["type"] for row in result.summary} == {"inner_dense": "Dense", "head": "Dense"}


def test_mixed_bfloat16_model_prunes_float32_master_weights(digits):
    x, y = digits
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = compile_digits(digits_convnet())
    finally:
        keras.config.set_dtype_policy("float32")
    assert model.layers[0].compute_dtype == "bfloat16"
    result = prune(model, (x, y), target_sparsity=0.7, epochs=2, batch_size=32, verbose=0)
    assert_exact_sparsity(result.summary, model, 0.7)
    assert all(layer.kernel.dtype == "float32" for layer in model.layers if hasattr(layer, "kernel"))


def test_gradient_accumulation_counts_optimizer_updates_not_batches(digits):
    x, y = digits
    model = digits_convnet()
    model.compile(
        optimizer=keras.optimizers.Adam(gradient_accumulation_steps=2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    with warnings.catch_warnings():
        # finalize warns if the schedule did not finish inside training.
        warnings.simplefilter("error")
        result = prune(model, (x, y), target_sparsity=0.6, epochs=2, batch_size=32, verbose=0)
    assert result.config.end_step <= 256 // 32 * 2 // 2 - 1
    assert_exact_sparsity(result.summary, model, 0.6)


def test_structured_2_of_4_pattern_along_input_channels(digits):
    x, y = digits
    model = compile_digits(digits_convnet())
    result = prune(model, (x, y), structured="2:4", target_sparsity=None, epochs=1, batch_size=32, verbose=0)
    pruned = {row["layer"] for row in result.summary}
    # conv1 has 1 input channel: no 2:4 groups possible, left dense with a reason.
    assert pruned == {"conv2", "dense", "logits"}
    assert any(row["layer"] == "conv1" and "multiple of 4" in row["reason"] for row in result.plan)
    for layer in model.layers:
        if layer.name in pruned:
            kernel = layer.kernel.numpy()
            axis = 0 if isinstance(layer, keras.layers.Dense) else -2
            groups = np.moveaxis(kernel, axis, -1).reshape(-1, 4)
            assert ((groups != 0).sum(axis=1) <= 2).all(), layer.name


def test_include_exclude_and_min_size_select_layers(digits):
    x, y = digits
    model = compile_digits(digits_convnet())
    result = prune(
        model, (x, y), target_sparsity=0.5, epochs=1, batch_size=32, verbose=0,
        include=[keras.layers.Conv2D, "logits"], exclude=["conv2"], min_size=500,
    )
    # conv1 (72 weights) is below min_size, conv2 excluded, logits named
    # explicitly so pruned despite its 320 weights, dense not included.
    assert [row["layer"] for row in result.summary] == ["logits"]
    reasons = {row["layer"]: row["reason"] for row in result.plan if not row["pruned"]}
    assert reasons == {"conv1": "72 weights < min_size=500", "conv2": "in exclude", "dense": "not in include"}
    assert np.count_nonzero(model.get_layer("dense").kernel.numpy() == 0) == 0


def test_existing_kernel_constraint_is_applied_and_restored(digits):
    x, y = digits
    model = digits_convnet()
    max_norm = keras.constraints.MaxNorm(0.5)
    model.get_layer("dense").kernel.constraint = max_norm
    compile_digits(model)
    prune(model, (x, y), target_sparsity=0.5, epochs=1, batch_size=32, verbose=0, include=["dense"])
    kernel = model.get_layer("dense").kernel
    assert kernel.constraint is max_norm
    assert np.linalg.norm(kernel.numpy(), axis=0).max() <= 0.5 + 1e-5


def test_finalize_before_schedule_end_warns_and_still_reaches_target(digits):
    x, y = digits
    model = compile_digits(digits_convnet())
    apply_pruning(model, PruningConfig(target_sparsity=0.8, end_step=1000, frequency=2))
    model.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0)
    with pytest.warns(UserWarning, match="before the pruning schedule reached its final sparsity"):
        summary = finalize_pruning(model)
    assert_exact_sparsity(summary, model, 0.8)


def test_a_sparsity_that_would_empty_a_small_kernel_keeps_one_weight_and_warns():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(32, activation="relu", name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(hidden))
    model.compile("adam", "mse")
    # round(0.99 * 32) = 32: every weight of the 32x1 head would go.
    with pytest.warns(UserWarning, match=r"target_sparsity=0.99 would zero every weight of 'head' \(32 weights: "
                      r"31 zeros, sparsity 0.969\).*one weight of each is kept"):
        result = prune(model, (x, x[:, :1] * 2), target_sparsity=0.99, epochs=1, verbose=0)
    assert np.count_nonzero(model.get_layer("head").kernel.numpy()) == 1
    head = next(row for row in result.summary if row["layer"] == "head")
    assert head["sparsity"] == pytest.approx(31 / 32)
    assert np.count_nonzero(model.get_layer("hidden").kernel.numpy()) == 256 - expected_zeros(0.99, 256)


def test_labels_of_another_length_are_refused_before_any_mask_is_attached(digits):
    x, y = digits
    model = compile_digits(digits_convnet())
    with pytest.raises(DataError, match=r"prune\(\) got 256 inputs but 10 labels in data=\(x, y\)"):
        prune(model, (x, y[:10]), target_sparsity=0.5, epochs=1, verbose=0)
    assert_plain_keras(model)
    prune(model, (x, y), target_sparsity=0.5, epochs=1, verbose=0)  # the corrected retry


class StopAtSecondBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            raise RuntimeError("interrupted by the user's callback")


def test_a_fine_tune_that_fails_removes_the_masks_so_prune_can_run_again(digits):
    x, y = digits
    model = compile_digits(digits_convnet())
    with pytest.raises(RuntimeError, match="interrupted by the user's callback"):
        prune(model, (x, y), target_sparsity=0.5, epochs=1, verbose=0, callbacks=[StopAtSecondBatch()])
    assert_plain_keras(model)
    result = prune(model, (x, y), target_sparsity=0.5, epochs=1, verbose=0)
    assert_exact_sparsity(result.summary, model, 0.5)


@pytest.mark.parametrize("sparsity", [-0.2, 1.0, 3])
def test_target_sparsity_outside_unit_interval_is_refused(digits, sparsity):
    x, y = digits
    model = compile_digits(digits_convnet())
    with pytest.raises(PlanError, match=r"target_sparsity=.* is outside \[0, 1\)"):
        prune(model, (x, y), target_sparsity=sparsity, epochs=1, verbose=0)
    assert_plain_keras(model)


@pytest.mark.parametrize("argument", ["include", "exclude"])
def test_unknown_layer_name_is_refused_with_the_prunable_names(digits, argument):
    x, y = digits
    model = compile_digits(digits_convnet())
    with pytest.raises(PlanError, match=rf"{argument} names \['dense_typo'\].*Prunable layers of this model: "
                       r"\['conv1', 'conv2', 'dense', 'logits'\]"):
        prune(model, (x, y), epochs=1, verbose=0, **{argument: ["dense_typo"]})
    assert_plain_keras(model)


def test_other_bad_plans_are_refused_before_training(digits):
    x, y = digits
    model = compile_digits(digits_convnet())
    with pytest.raises(PlanError, match="include names layer 'flatten'.*no prunable kernel"):
        prune(model, (x, y), epochs=1, verbose=0, include=["flatten"])
    with pytest.raises(PlanError, match="conflicts with structured='2:4'"):
        PruningConfig(target_sparsity=0.8, structured="2:4", end_step=10)
    with pytest.raises(PlanError, match="not a valid N:M pattern"):
        PruningConfig(target_sparsity=0.5, structured="4:2", end_step=10)
    with pytest.raises(PlanError, match="needs end_step"):
        PruningConfig(target_sparsity=0.5)
    with pytest.raises(PlanError, match="end_step=100 is beyond the last step"):
        prune(model, (x, y), epochs=1, batch_size=32, end_step=100, verbose=0)
    with pytest.raises(PlanError, match="not compiled"):
        prune(digits_convnet(), (x, y), epochs=1, verbose=0)
    with pytest.raises(ModelError, match="no pruning masks"):
        finalize_pruning(model)
    apply_pruning(model, PruningConfig(target_sparsity=0.5, end_step=10))
    with pytest.raises(ModelError, match="already being pruned"):
        apply_pruning(model, PruningConfig(target_sparsity=0.5, end_step=10))
