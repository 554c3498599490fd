"""A pruning fine-tune runs at its own learning rate and keeps its accuracy.

The rate is read from the optimizer during the run by a callback, and
checked against the policy: a fraction of the training peak, linear
warm-up, cosine decay to zero over the fine-tune's own updates.
"""

import math

import keras
import pytest

import kerasfast
from kerasfast import datasets
from kerasfast.compress import finetune
from kerasfast.training.schedules import StartingAt, WarmupHoldCosine, peak_of, warmup_cosine


class RateRecorder(keras.callbacks.Callback):
    """The optimizer's learning rate before each update (as Keras applies it)."""

    def __init__(self):
        super().__init__()
        self.rates, self.steps = [], []

    def on_train_batch_begin(self, batch, logs=None):
        optimizer = self.model.optimizer
        step = int(keras.ops.convert_to_numpy(optimizer.iterations))
        rate = optimizer._learning_rate
        value = rate(step) if callable(rate) else rate
        self.rates.append(float(keras.ops.convert_to_numpy(value)))
        self.steps.append(step)


def small_model():
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])


@pytest.fixture(scope="module")
def digits_flat():
    (x, y), (x_test, y_test) = datasets.digits()
    return (x.reshape(len(x), -1), y), (x_test.reshape(len(x_test), -1), y_test)


def test_fine_tune_learning_rate_follows_the_policy(digits_flat):
    (x, y), _ = digits_flat
    common = dict(batch_size=64, loss="sparse_categorical_crossentropy", verbose=0, seed=0, run_dir=False,
                  tune="off", steps_per_execution=1)
    trained = kerasfast.fit(small_model, (x, y), epochs=2, learning_rate=2e-3, **common)
    model = trained.model
    done = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    recorder = RateRecorder()
    result = kerasfast.fit(model, (x, y), epochs=2, prune=0.5, callbacks=[recorder], **common)
    plan = result.plan
    total = plan.total_steps
    # The policy, as the plan states it.
    assert plan.learning_rate == pytest.approx(finetune.PRUNE_LR_FRACTION * 2e-3)
    assert plan.lr_schedule == "warmup_hold_cosine"
    assert "pruning fine-tune" in plan.reasons["learning_rate"]
    assert "pruning fine-tune" in plan.reasons["lr_schedule"]
    assert "learning_rate" not in plan.overridden
    # The rates the optimizer applied: counted from the fine-tune's first update.
    assert recorder.steps[0] == done and len(recorder.rates) == total
    hold = total // 2
    expected = WarmupHoldCosine(plan.learning_rate, total, plan.warmup_steps, hold)
    for step, rate in zip(recorder.steps, recorder.rates, strict=True):
        assert rate == pytest.approx(float(expected(step - done)), rel=1e-4, abs=1e-9)
    peak = max(recorder.rates)
    assert peak == pytest.approx(plan.learning_rate, rel=1e-3)
    assert recorder.rates[0] < 0.2 * peak  # warm-up
    assert recorder.rates[hold - 1] == pytest.approx(peak)  # held while the sparsity ramp grows
    assert recorder.rates[-1] < 0.05 * peak  # decayed
    # The sparsity ramp ends at half the run, leaving the rest to recover.
    assert "to update {}".format(int(round(0.5 * (total - 1)))) in plan.reasons["prune"]
    # kerasfast's own optimizer keeps the fine-tune's peak, a constant, for whatever trains it next.
    assert float(model.optimizer.learning_rate) == pytest.approx(plan.learning_rate)


def test_compress_prune_fine_tunes_at_the_policy_too(digits_flat):
    (x, y), _ = digits_flat
    keras.utils.set_random_seed(0)
    model = small_model()
    model.compile(keras.optimizers.Adam(2e-3), "sparse_categorical_crossentropy")
    model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    done = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    recorder = RateRecorder()
    result = kerasfast.compress.prune(model, (x, y), target_sparsity=0.5, epochs=2, batch_size=64,
                                      callbacks=[recorder], verbose=0)
    total = len(recorder.rates)
    peak = finetune.PRUNE_LR_FRACTION * 2e-3
    schedule = WarmupHoldCosine(peak, total, max(1, int(total * 0.05)), total // 2)
    for step, rate in zip(recorder.steps, recorder.rates, strict=True):
        assert rate == pytest.approx(float(schedule(step - done)), rel=1e-4, abs=1e-9)
    assert "pruning fine-tune" in result.learning_rate
    # The optimizer's own constant rate is given back.
    assert float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)) == pytest.approx(2e-3)


def test_user_schedule_or_rate_wins(digits_flat):
    (x, y), _ = digits_flat
    common = dict(batch_size=64, loss="sparse_categorical_crossentropy", verbose=0, seed=0, run_dir=False,
                  tune="off")
    model = kerasfast.fit(small_model, (x, y), epochs=1, learning_rate=2e-3, **common).model
    constant = kerasfast.fit(model, (x, y), epochs=1, prune=0.5, learning_rate=1e-4, lr_schedule="constant",
                             **common).plan
    assert constant.lr_schedule == "constant" and constant.learning_rate == 1e-4
    assert "pruning fine-tune" not in constant.reasons["lr_schedule"]
    peak = kerasfast.fit(model, (x, y), epochs=1, prune=0.5, learning_rate=1e-4, **common).plan
    assert peak.lr_schedule == "warmup_hold_cosine" and peak.learning_rate == 1e-4
    assert peak.reasons["learning_rate"] == "requested: the pruning fine-tune's peak"
    # Pruning from scratch (no update made yet) follows the ordinary plan.
    fresh = kerasfast.fit(small_model, (x, y), epochs=1, prune=0.5, **common).plan
    assert "pruning fine-tune" not in fresh.reasons["lr_schedule"]


def test_peak_of_reads_constants_and_schedules():
    assert peak_of(3e-3, 100) == pytest.approx(3e-3)
    assert peak_of(warmup_cosine(3e-3, 100, 10), 100) == pytest.approx(3e-3)
    assert peak_of(StartingAt(warmup_cosine(1e-3, 100, 10), 50), 100) == pytest.approx(1e-3)
    decay = keras.optimizers.schedules.ExponentialDecay(1e-2, decay_steps=10, decay_rate=0.5)
    assert peak_of(decay, 100) == pytest.approx(1e-2)
    assert math.isclose(float(StartingAt(warmup_cosine(1e-3, 100, 10), 500)(510)), 1e-3, rel_tol=1e-6)


def test_pruned_model_stays_within_a_point_of_the_dense_one():
    """A real run of the quickstart's convnet: 80% sparsity costs at most one point of test accuracy."""
    from kerasfast.quickstart import digits_convnet

    (x, y), (x_test, y_test) = datasets.digits()
    common = dict(batch_size=64, loss="sparse_categorical_crossentropy", metrics=["accuracy"], verbose=0, seed=0,
                  run_dir=False, tune="off")
    keras.utils.set_random_seed(0)
    model = kerasfast.fit(digits_convnet, (x, y), epochs=30, learning_rate=3e-3, **common).model
    dense = model.evaluate(x_test, y_test, verbose=0)[1]
    result = kerasfast.fit(model, (x, y), epochs=10, prune=0.8, **common)
    pruned = model.evaluate(x_test, y_test, verbose=0)[1]
    assert dense >= 0.98
    assert pruned >= dense - 0.01, (dense, pruned)
    assert all(abs(row["sparsity"] - 0.8) < 0.01 for row in result.pruning if row.get("sparsity") is not None)


def test_a_run_of_two_updates_prunes_during_training_without_the_end_fallback(recwarn):
    import numpy as np

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 16)).astype("float32"), rng.integers(0, 4, 64)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, name="d1"), keras.layers.Dense(4, name="d2")])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    result = kerasfast.fit(model, x, y, epochs=1, batch_size=32, prune=0.5, tune="off", run_dir=False, verbose=0)
    assert int(model.optimizer.iterations) == 2
    # The plan's schedule is one step long (update 0 to update 0): its final sparsity is reached there.
    assert not [w for w in recwarn if "pruned at the end without fine-tuning" in str(w.message)]
    for layer in ("d1", "d2"):
        kernel = model.get_layer(layer).kernel.numpy()
        assert np.mean(kernel == 0) == 0.5
    assert {row["layer"] for row in result.pruning if row.get("sparsity") == 0.5} == {"d1", "d2"}


def test_every_row_of_a_runs_pruning_summary_has_the_same_keys():
    import numpy as np

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(128, 10)).astype("float32"), rng.integers(0, 4, 128)
    # 2:4 leaves a kernel of 10 inputs dense (not a multiple of 4), with its reason.
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, name="d1"), keras.layers.Dense(4, name="d2")])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    result = kerasfast.fit(model, x, y, epochs=2, batch_size=32, prune=dict(structured="2:4"), tune="off",
                           run_dir=False, verbose=0)
    rows = {row["layer"]: row for row in result.pruning}
    assert rows["d1"]["pruned"] is False and rows["d2"]["pruned"] is True
    assert set(rows["d1"]) - {"reason"} == set(rows["d2"])
    assert rows["d1"]["sparsity"] == 0.0 and rows["d2"]["sparsity"] == 0.5
