"""`batch_size="auto"`: real train steps pick the batch within the memory
bound, the learning rate is scaled to match, and nothing else changes."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasfast
from kerasfast import costs
from kerasfast.errors import PlanError
from kerasfast.training import batch_size as batch_search


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERASFAST_CACHE_DIR", str(tmp_path / "cache"))


def _data(n=4096, features=16):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, features)).astype("float32")
    return x, (x[:, :4].sum(axis=1) > 0).astype("int32")


def _mlp(optimizer=None):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=optimizer or keras.optimizers.Adam(1e-3))
    return model


class RateSeen(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self.rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))


FIT = dict(epochs=1, run_dir=False, verbose=0, tune="off")


def test_the_memory_bound_caps_the_batch(monkeypatch):
    x, y = _data()
    per_sample = costs.activation_bytes_per_sample(_mlp(), (16,), "float32")
    bound = batch_search.TRAIN_MEMORY_FACTOR * per_sample * 64 + 1  # 64 samples fit, 128 do not
    monkeypatch.setenv("KERASFAST_MEMORY_LIMIT_BYTES", str(bound))
    result = kerasfast.fit(_mlp(), x, y, batch_size="auto", **FIT)
    assert result.plan.global_batch_size in (32, 64)
    reason = result.plan.reasons["global_batch_size"]
    assert "batch_size='auto'" in reason and "128: over the memory bound" in reason
    assert result.history.history["loss"]  # it trained with the batch it chose
    assert result.plan.steps_per_epoch == -(-len(x) // result.plan.global_batch_size)


def test_the_chosen_batch_is_among_the_fastest_measured_and_keeps_steps_per_epoch():
    x, y = _data()
    result = kerasfast.fit(_mlp(), x, y, batch_size="auto", **FIT)
    batch = result.plan.global_batch_size
    assert batch in batch_search.candidate_batches(len(x))
    assert result.plan.steps_per_epoch >= batch_search.MIN_STEPS_PER_EPOCH
    assert "measured" in result.plan.reasons["global_batch_size"]
    assert "global_batch_size" not in result.plan.overridden  # kerasfast's choice, not the user's


@pytest.mark.parametrize("optimizer, scaling", [(lambda: keras.optimizers.Adam(1e-3), np.sqrt),
                                                (lambda: keras.optimizers.SGD(1e-2), lambda ratio: ratio)])
def test_the_learning_rate_is_scaled_with_the_batch(optimizer, scaling):
    x, y = _data()
    model = _mlp(optimizer())
    own = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
    seen = RateSeen()
    result = kerasfast.fit(model, x, y, batch_size="auto", callbacks=[seen], **FIT)
    expected = own * scaling(result.plan.global_batch_size / batch_search.FIRST_BATCH)
    assert result.plan.learning_rate == pytest.approx(expected, rel=1e-6)
    assert seen.rate == pytest.approx(expected, rel=1e-6)  # the optimizer trained with it
    assert "scaling" in result.plan.reasons["learning_rate"]
    assert float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)) == pytest.approx(own)  # given back


def test_a_learning_rate_the_user_passed_is_kept():
    x, y = _data()
    result = kerasfast.fit(_mlp(), x, y, batch_size="auto", learning_rate=3e-3, **FIT)
    assert result.plan.learning_rate == 3e-3


def test_the_search_never_changes_what_training_computes():
    x, y = _data()
    found = kerasfast.fit(_mlp(), x, y, batch_size="auto", steps_per_execution=4, **FIT)
    given = kerasfast.fit(_mlp(), x, y, batch_size=found.plan.global_batch_size,
                          learning_rate=found.plan.learning_rate, steps_per_execution=4, **FIT)
    for a, b in zip(found.model.get_weights(), given.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_data_too_small_for_a_search_is_refused():
    x, y = _data(n=200)
    with pytest.raises(PlanError, match=r"batch_size='auto'.*only 200 samples.*batch_size= yourself"):
        kerasfast.fit(_mlp(), x, y, batch_size="auto", **FIT)


def test_batched_data_is_refused():
    x, y = _data()
    batched = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
    with pytest.raises(PlanError, match=r"batch_size='auto' cannot re-batch"):
        kerasfast.fit(_mlp(), batched, batch_size="auto", **FIT)


@pytest.mark.parametrize("value", ["big", 0, -3, 2.5])
def test_other_batch_values_are_refused(value):
    x, y = _data()
    with pytest.raises(PlanError, match=r"batch_size=.* is not valid"):
        kerasfast.fit(_mlp(), x, y, batch_size=value, **FIT)


def test_a_bad_memory_limit_is_refused(monkeypatch):
    monkeypatch.setenv("KERASFAST_MEMORY_LIMIT_BYTES", "lots")
    with pytest.raises(PlanError, match="KERASFAST_MEMORY_LIMIT_BYTES='lots'"):
        batch_search.cpu_memory_bound()


def test_candidates_and_scaling_rules():
    assert batch_search.candidate_batches(4096) == [32, 64, 128, 256, 512]
    assert batch_search.candidate_batches(4096, num_replicas=3) == [33, 66, 132, 264]
    assert batch_search.learning_rate_factor("SGD", 256) == (8.0, "linear scaling (SGD)")
    assert batch_search.learning_rate_factor("AdamW", 128)[0] == pytest.approx(2.0)


@pytest.mark.gpu
@pytest.mark.skipif(not tf.config.list_physical_devices("GPU"), reason="needs an NVIDIA GPU (out-of-memory search)")
def test_on_a_gpu_the_largest_batch_that_fits_is_found():
    # Two 256-channel convolutions on 256x256 maps hold ~0.5 GiB per sample in
    # a train step: the doubling search runs out of GPU memory long before
    # the data's 16384 samples / 8 allow.
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (16_384, 256, 256, 3), dtype=np.uint8)
    y = rng.integers(0, 10, len(x)).astype("int32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((256, 256, 3), dtype="uint8"), keras.layers.Rescaling(1 / 255),
                              keras.layers.Conv2D(256, 3, padding="same"), keras.layers.Conv2D(256, 3, padding="same"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer="adam")
    result = kerasfast.fit(model, x, y, batch_size="auto", steps_per_epoch=2, **FIT)
    reason = result.plan.reasons["global_batch_size"]
    assert "largest that fits in GPU memory" in reason and "out of memory" in reason
