"""`tune=`: candidate plans timed on the user's model; the state put back
exactly; the choice cached; slow and numerically wrong candidates lose."""

import json
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasfast
from kerasfast.plan import Plan
from kerasfast.training import tuning
from kerasfast.training.session import borrowed
from tests.helpers import CountsTrainingTraces


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERASFAST_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _data(n=1024, features=16):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, features)).astype("float32")
    return x, (x[:, :4].sum(axis=1) > 0).astype("int32")


def _mlp(width=64, extra=None):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((16,)), keras.layers.Dense(width, activation="relu"), keras.layers.Dropout(0.1)]
    layers += extra or []
    model = keras.Sequential(layers + [keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer="adam")
    return model


FIT = dict(epochs=2, batch_size=32, run_dir=False, verbose=0)


@pytest.mark.parametrize("options", [{"tune": "full"}, {"tune": "auto", "grad_accum_steps": 2}],
                         ids=["full", "accumulating"])
def test_tuning_never_changes_what_training_computes(options):
    """Training after tuning (with the steps tuning compiled, whose gradient
    accumulators tuning left part-filled) matches training untuned."""
    x, y = _data()
    extra = {name: value for name, value in options.items() if name != "tune"}
    tuned = kerasfast.fit(_mlp(), x, y, tune=options["tune"], tune_budget_s=60, **extra, **FIT)
    assert len(tuned.plan.tuning) > 1
    chosen = {name: getattr(tuned.plan, name) for name in tuning.TUNED_FIELDS}
    plain = kerasfast.fit(_mlp(), x, y, tune="off", **chosen, **extra, **FIT)
    for a, b in zip(tuned.model.get_weights(), plain.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert tuned.history.history == plain.history.history


def test_restarted_steps_train_as_fresh_ones_do():
    """Steps tuning left mid-accumulation (3 micro-steps, updates every 2),
    restarted after the state was put back, train exactly as new steps do."""
    from kerasfast.training.step_functions import StepFunctions

    x, y = _data(64)
    model = _mlp()
    model.optimizer.build(model.trainable_variables)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)

    def steps():
        return StepFunctions(model, tf.distribute.get_strategy(), steps_per_execution=3, grad_accum_steps=2,
                             jit_compile=False)

    def trained(train):
        iterator = iter(data)
        with tuning.state_restored(model):
            for _ in range(2):
                train(iterator)
            return [w.copy() for w in model.get_weights()]

    fresh = trained(steps().train_function())
    used = steps()
    with tuning.state_restored(model):
        used.train_function()(iter(data))
    used.restart(None)
    for a, b in zip(fresh, trained(used.train_function()), strict=True):
        np.testing.assert_array_equal(a, b)


def _fit_counting_training_traces(**options):
    """`(result, traces)`: the fit's result and how often its training (after
    the plan, tuning included) traced the model's training graph."""
    x, y = _data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"),
                              CountsTrainingTraces(2, activation=None)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer="adam")
    CountsTrainingTraces.traces = 0
    at_start = {}
    begun = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: at_start.setdefault("traces", CountsTrainingTraces.traces))
    result = kerasfast.fit(model, x, y, callbacks=[begun], **options, **FIT)
    return result, CountsTrainingTraces.traces - at_start["traces"]


@pytest.mark.parametrize("options", [{}, {"prune": 0.5}], ids=["dense", "pruned"])
def test_training_goes_on_with_the_steps_tuning_compiled(options):
    """The chosen plan's steps, compiled while tuning measured them, are the
    ones that train: training traces the model once less than the same
    plan does untuned (a trace is a compilation, seconds on a large model),
    and ends with the same weights. With `prune=`, the masks are on before
    tuning, so tuning times (and hands on) the steps of the pruned model."""
    tuned, traced_after_tuning = _fit_counting_training_traces(tune="auto", tune_budget_s=60, **options)
    assert len(tuned.plan.tuning) > 1
    chosen = {name: getattr(tuned.plan, name) for name in tuning.TUNED_FIELDS}
    plain, traced_alone = _fit_counting_training_traces(tune="off", **chosen, **options)
    assert traced_alone >= 1
    assert traced_after_tuning == traced_alone - 1, (traced_after_tuning, traced_alone, chosen)
    for a, b in zip(tuned.model.get_weights(), plain.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    if options:
        assert [round(row["sparsity"], 2) for row in tuned.pruning] == [0.5, 0.5]


def test_the_choice_is_cached_and_a_changed_model_or_batch_tunes_again(private_cache, capsys):
    x, y = _data()
    first = kerasfast.fit(_mlp(), x, y, tune="auto", tune_budget_s=3, **FIT)
    assert first.plan.tuning and len(list(private_cache.glob("plans/*.json"))) == 1
    again = kerasfast.fit(_mlp(), x, y, tune="auto", tune_budget_s=3, **FIT)
    assert again.plan.tuning == () and again.plan.tuning_seconds is None  # nothing measured this time
    assert "tuned earlier: cached in" in again.plan.reasons["steps_per_execution"]
    assert {f: getattr(again.plan, f) for f in tuning.TUNED_FIELDS} == \
        {f: getattr(first.plan, f) for f in tuning.TUNED_FIELDS}
    wider = kerasfast.fit(_mlp(width=96), x, y, tune="auto", tune_budget_s=3, **FIT)
    assert wider.plan.tuning
    other_batch = kerasfast.fit(_mlp(), x, y, tune="auto", tune_budget_s=3, **{**FIT, "batch_size": 64})
    assert other_batch.plan.tuning
    assert len(list(private_cache.glob("plans/*.json"))) == 3


def test_a_spent_budget_measures_only_the_rules_plan_and_the_plan_says_what_tuning_cost():
    x, y = _data()
    result = kerasfast.fit(_mlp(), x, y, tune="auto", tune_budget_s=0, **FIT)
    first, *others = result.plan.tuning
    assert first["verdict"].startswith("chosen") and first["compile_s"] >= 0 and len(first["rates"]) == 1
    assert others and all(row["verdict"] == "not measured: tuning budget spent" for row in others)
    assert result.plan.tuning_seconds >= 0
    assert f"took {result.plan.tuning_seconds:.1f} s" in str(result.plan)


def test_overrides_are_kept_and_tune_off_measures_nothing():
    x, y = _data()
    result = kerasfast.fit(_mlp(), x, y, tune="auto", tune_budget_s=5, precision="float32", **FIT)
    assert {row["precision"] for row in result.plan.tuning} == {"float32"}
    assert kerasfast.fit(_mlp(), x, y, tune="off", **FIT).plan.tuning == ()
    assert kerasfast.fit(_mlp(), x, y, tune=False, tune_budget_s=5, **FIT).plan.tuning == ()  # as run_dir=False


def test_a_short_run_is_not_tuned_on_auto():
    x, y = _data(256)
    assert kerasfast.fit(_mlp(), x, y, tune="auto", **FIT).plan.tuning == ()


class _Rigged(keras.layers.Layer):
    """Slow, or NaN, only when computing in bfloat16."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how

    def call(self, x):
        if self.compute_dtype != "bfloat16":
            return x
        if self.how == "nan":
            return x * float("nan")

        def slowly(value):
            time.sleep(0.02)
            return value

        return tf.ensure_shape(tf.numpy_function(slowly, [x], x.dtype, stateful=True), x.shape)


def _candidates(model, x, y):
    """The rule-based float32 plan and its mixed_bfloat16 twin."""
    result = kerasfast.fit(model, x, y, tune="off", precision="float32", steps_per_execution=4, epochs=1,
                           batch_size=32, run_dir=False, verbose=0)
    plan: Plan = result.plan
    import dataclasses

    return [plan, dataclasses.replace(plan, precision="mixed_bfloat16")]


@pytest.mark.parametrize("how, verdict", [("slow", "slower"), ("nan", "rejected: loss nan is not finite")])
def test_a_rigged_candidate_is_not_chosen(how, verdict):
    x, y = _data()
    model = _mlp(extra=[_Rigged(how)])
    candidates = _candidates(model, x, y)
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).take(16).cache()
    before = [w.copy() for w in model.get_weights()]
    with borrowed(model, candidates[0]):
        chosen, table, *_ = tuning.tune_plan(model, candidates, tf.distribute.get_strategy(), batches, budget_s=60)
    assert chosen.precision == "float32" and table[0].verdict == "chosen"
    assert table[1].verdict == verdict
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("options, message", [
    ({"tune": "yes"}, "tune='yes' is not valid"),
    ({"tune_budget_s": -1}, "tune_budget_s=-1 is not valid"),
])
def test_bad_tuning_arguments_are_refused(options, message):
    x, y = _data(64)
    with pytest.raises(kerasfast.PlanError, match=message):
        kerasfast.fit(_mlp(), x, y, **FIT, **options)


@pytest.mark.slow
def test_two_workers_train_with_the_chiefs_tuned_plan_and_reuse_the_chiefs_cache(tmp_path):
    import json
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(root)}
    for run in ("first", "second"):
        command = [sys.executable, "-m", "kerasfast.cli", "launch", "-n", "2", "--", sys.executable,
                   str(root / "tests" / "workers" / "tuned.py"), str(tmp_path), run]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        assert done.returncode == 0, done.stdout[-4000:]
    first = [json.loads((tmp_path / f"plan.first.worker{i}.json").read_text()) for i in range(2)]
    second = [json.loads((tmp_path / f"plan.second.worker{i}.json").read_text()) for i in range(2)]
    assert first[0]["measured"] > 1
    assert first[0]["chosen"] == first[1]["chosen"]
    assert first[0]["weights"] == first[1]["weights"]
    # Only the chief's cache holds the choice; the second run tunes nowhere and takes it everywhere.
    assert list((tmp_path / "cache0").rglob("*.json")) and not list((tmp_path / "cache1").rglob("*.json"))
    for worker in second:
        assert worker["measured"] == 0 and worker["chosen"] == first[0]["chosen"]
        assert worker["reason"].startswith("tuned earlier")


def _batches(x, y, batch=32):
    for start in range(0, len(x), batch):
        yield x[start:start + batch], y[start:start + batch]


def test_tuning_a_generator_leaves_training_every_batch():
    """A generator's batches are read once: tuning times the candidates on its first batch, and training
    still sees all 12 batches and computes what an untuned run of the chosen plan computes."""
    x, y = _data(384)
    options = dict(epochs=1, run_dir=False, verbose=0)
    tuned_model, plain_model = _mlp(), _mlp()
    tuned = kerasfast.fit(tuned_model, _batches(x, y), tune="full", tune_budget_s=3, **options)
    assert len(tuned.plan.tuning) > 1
    chosen = {name: getattr(tuned.plan, name) for name in tuning.TUNED_FIELDS}
    plain = kerasfast.fit(plain_model, _batches(x, y), tune="off", **chosen, **options)
    assert int(tuned_model.optimizer.iterations.numpy()) == int(plain_model.optimizer.iterations.numpy()) == 12
    assert tuned.history.history == plain.history.history


def test_a_cached_choice_runs_at_most_one_epoch_per_execution(private_cache):
    x, y = _data()
    kerasfast.fit(_mlp(), x, y, tune="auto", tune_budget_s=3, **FIT)
    (stored,) = private_cache.glob("plans/*.json")
    cached = json.loads(stored.read_text())
    cached["chosen"]["steps_per_execution"] = 64  # as tuned on a run with longer (or unknown) epochs
    stored.write_text(json.dumps(cached))
    short = kerasfast.fit(_mlp(), x[:96], y[:96], tune="auto", **FIT)  # 3 steps an epoch
    assert "tuned earlier: cached in" in short.plan.reasons["steps_per_execution"]
    assert short.plan.steps_per_execution == 3


@pytest.mark.parametrize("options", [{"tune": "full"}, {"tune": "full", "grad_accum_steps": 2},
                                     {"tune": "off", "grad_accum_steps": 2}], ids=["tuned", "tuned-accumulating",
                                                                                   "accumulating"])
def test_a_layer_frozen_in_on_train_begin_stays_frozen_as_in_model_fit(options):
    """`model.fit` traces its step at the first batch, after `on_train_begin`; tuning traced its steps,
    and accumulation made its gradient accumulators, before. A callback that freezes a layer there has
    training trace again, for the weights that train then, so the layer stays frozen."""

    class Freeze(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.model.layers[0].trainable = False

    x, y = _data()
    keras_model, fast_model = _mlp(), _mlp()
    frozen = keras_model.layers[0].kernel.numpy()
    keras_model.fit(x, y, callbacks=[Freeze()], epochs=2, batch_size=32, verbose=0)
    result = kerasfast.fit(fast_model, x, y, callbacks=[Freeze()], **options, **FIT)
    if options["tune"] == "full":
        assert len(result.plan.tuning) > 1  # tuning ran: the steps it compiled were there to reuse
    np.testing.assert_array_equal(keras_model.layers[0].kernel.numpy(), frozen)
    np.testing.assert_array_equal(fast_model.layers[0].kernel.numpy(), frozen)
    assert not np.array_equal(fast_model.layers[-1].kernel.numpy(), _mlp().layers[-1].kernel.numpy())
