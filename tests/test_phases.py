"""A run's phases one at a time, in seconds: the plan from synthetic facts and
findings, the one way a plan changes, the peak FLOP/s measured once, which
callbacks must see every batch; and, through whole fits, that the plan is
resolved exactly once per call."""

import keras
import numpy as np
import pytest

import kerasfast
from kerasfast import costs
from kerasfast.hardware import Hardware
from kerasfast.plan import (FIRST_BATCH, DataFacts, Findings, ModelFacts, Overrides, RunFacts, resolve_computation,
                            resolve_plan)
from kerasfast.training.batch_callbacks import per_batch_callbacks

CPU = Hardware(cpu_cores=2, cpu_flags=("avx2", "avx512f", "avx512_bf16"))
MLP = ModelFacts(forward_flops_per_sample=50_000, user_optimizer="SGD", user_learning_rate=0.1)
DATA = DataFacts(num_samples=4096)


def test_a_found_batch_is_the_plans_with_its_reason_and_the_rate_scaled_for_it():
    plan = resolve_plan(CPU, model=MLP, data=DATA, found=Findings(batch_size=128, batch_reason="128: measured"))
    assert plan.global_batch_size == 128 and plan.steps_per_epoch == 32
    assert plan.reasons["global_batch_size"] == "128: measured"
    assert plan.learning_rate == pytest.approx(0.1 * 128 / FIRST_BATCH)  # SGD scales linearly
    assert "linear scaling (SGD)" in plan.reasons["learning_rate"]
    assert not {"global_batch_size", "learning_rate"} & set(plan.overridden)


def test_a_rate_the_user_passed_is_not_scaled_for_a_found_batch():
    plan = resolve_plan(CPU, model=MLP, data=DATA, overrides=Overrides(learning_rate=0.05),
                        found=Findings(batch_size=128, batch_reason="found"))
    assert plan.learning_rate == 0.05 and "learning_rate" in plan.overridden


def test_a_found_rate_is_taken_as_found_not_as_the_users():
    plan = resolve_plan(CPU, model=MLP, data=DATA, overrides=Overrides(batch_size=64),
                        found=Findings(learning_rate=0.02, learning_rate_reason="steepest descent"))
    assert plan.learning_rate == 0.02 and plan.reasons["learning_rate"] == "found: steepest descent"
    assert "learning_rate" not in plan.overridden


def test_a_resumed_run_keeps_the_choices_its_backup_recorded_unless_the_user_sets_them():
    recorded = {"precision": "mixed_bfloat16", "jit_compile": True, "steps_per_execution": 3}
    plan = resolve_plan(CPU, model=MLP, data=DATA, overrides=Overrides(batch_size=64, steps_per_execution=5),
                        found=Findings(recorded=recorded))
    assert (plan.precision, plan.jit_compile, plan.steps_per_execution) == ("mixed_bfloat16", True, 5)
    assert plan.reasons["precision"] == "as recorded by the backup this run resumes"
    assert "precision" not in plan.overridden and "steps_per_execution" in plan.overridden


def test_the_computation_a_search_measures_is_the_plans_at_that_batch():
    facts = dict(model=MLP, data=DATA, run=RunFacts(peak_flops=1e11), overrides=Overrides(),
                 num_replicas=1, strategy_name="none")
    for batch in (32, 512):
        computation = resolve_computation(CPU, global_batch=batch, **facts)
        plan = resolve_plan(CPU, model=MLP, data=DATA, run=RunFacts(peak_flops=1e11), batch_size=batch)
        assert (computation.precision, computation.jit_compile, computation.steps_per_execution) == \
            (plan.precision, plan.jit_compile, plan.steps_per_execution)


def test_a_plan_changes_only_through_with_choice():
    plan = resolve_plan(CPU, model=MLP, data=DATA, batch_size=64, jit_compile=True)
    assert "jit_compile" in plan.overridden
    changed = plan.with_choice("jit_compile", False, "off: an op XLA cannot compile")
    assert (changed.jit_compile, changed.reasons["jit_compile"]) == (False, "off: an op XLA cannot compile")
    assert "jit_compile" not in changed.overridden and plan.jit_compile is True  # a new plan; the old one stands
    assert plan.with_choice("prune", 0.5, "pruning", yours=True).overridden[-1] == "prune"
    with pytest.raises(kerasfast.PlanError, match="no field 'precsion'"):
        plan.with_choice("precsion", "float32", "typo")


def test_the_peak_is_measured_once_per_precision_and_only_when_the_plan_asks(monkeypatch):
    measured = []
    monkeypatch.setattr(costs, "measure_peak_flops", lambda dtype: measured.append(dtype) or 1e11)
    peak = costs.PeakFlops()
    run = RunFacts(peak_flops=peak)
    resolve_plan(CPU, model=MLP, data=DATA, run=run, batch_size=64, steps_per_execution=4)
    assert measured == []  # steps per execution given: nothing needs the peak
    for _ in range(3):
        resolve_plan(CPU, model=MLP, data=DATA, run=run, batch_size=64, precision="float32")
    assert measured == ["float32"]
    assert peak.measured("float32") == 1e11 and peak.measured("bfloat16") is None


class _CountsTestBatches(keras.callbacks.Callback):
    def on_test_batch_end(self, batch, logs=None):
        pass


@pytest.mark.parametrize("callback, named", [
    (keras.callbacks.ModelCheckpoint("m.keras", save_freq=10), "ModelCheckpoint(save_freq=10)"),
    (keras.callbacks.BackupAndRestore("backup", save_freq=5), "BackupAndRestore(save_freq=5)"),
    (keras.callbacks.TerminateOnNaN(), "TerminateOnNaN(on_batch_end)"),
    (keras.callbacks.LambdaCallback(on_predict_batch_end=print), "LambdaCallback(on_predict_batch_end)"),
    (_CountsTestBatches(), "_CountsTestBatches(on_test_batch_end)"),
    (keras.callbacks.ModelCheckpoint("m.keras"), None),
    (keras.callbacks.BackupAndRestore("backup"), None),
    (keras.callbacks.EarlyStopping(), None),
    (keras.callbacks.CSVLogger("log.csv"), None),
    (keras.callbacks.ProgbarLogger(), None),
])
def test_callbacks_that_depend_on_every_batch_are_named(callback, named):
    assert per_batch_callbacks([callback]) == ((named,) if named else ())


@pytest.mark.parametrize("arguments", [{}, {"batch_size": "auto"}, {"learning_rate": "find"}],
                         ids=["default", "batch_size_auto", "learning_rate_find"])
def test_every_fit_resolves_its_plan_exactly_once(monkeypatch, arguments):
    from kerasfast.training import planning

    calls = []

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return resolve_plan(*args, **kwargs)

    monkeypatch.setattr(planning, "resolve_plan", counted)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
    options = {"batch_size": 32, **arguments}
    result = kerasfast.fit(model, x, y, epochs=1, run_dir=False, verbose=0, tune="off", **options)
    assert len(calls) == 1
    if "learning_rate" in arguments:
        assert result.plan.reasons["learning_rate"].startswith("found: ")
    if arguments.get("batch_size") == "auto":
        assert "batch_size='auto'" in result.plan.reasons["global_batch_size"]


def test_thread_pools_kept_at_tensorflows_default_say_what_0_means():
    """A plan made after TensorFlow started keeps its pools; a 0 there is
    TensorFlow's own sizing, and the reason says so (a bare 0 reads as a bug)."""
    from kerasfast.plan import resolve_threads

    values, reasons = resolve_threads("auto", "auto", CPU, RunFacts(tf_runtime_started=True))
    assert values == {"intra_op_threads": 0, "inter_op_threads": 0}
    assert all(reason.startswith("TensorFlow's default (0: it sizes the pool to the cores), kept")
               for reason in reasons.values())
    values, reasons = resolve_threads("auto", "auto", CPU, RunFacts(tf_runtime_started=True,
                                                                    current_intra_op_threads=2))
    assert values["intra_op_threads"] == 2 and reasons["intra_op_threads"].startswith("kept:")


class BranchingStep(keras.Model):
    """A model whose own `train_step` branches in Python on a tensor, which
    only runs in a graph once autograph converts it."""

    def train_step(self, data):
        import tensorflow as tf

        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x, y, self(x, training=True))
        if tf.math.is_finite(loss):
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}


def _converted_by_autograph(monkeypatch) -> list[str]:
    """The functions autograph converts from here on, as `module.qualname`."""
    from tensorflow.python.autograph.impl import api

    converted, convert = [], api._convert_actual

    def recording(entity, program_ctx):
        converted.append(f"{entity.__module__}.{entity.__qualname__}")
        return convert(entity, program_ctx)

    monkeypatch.setattr(api, "_convert_actual", recording)
    return converted


@pytest.mark.parametrize("jit_compile", [False, True])
def test_kerasfasts_own_steps_are_traced_as_written_and_a_models_own_step_is_converted(monkeypatch, jit_compile):
    """kerasfast's step functions have no Python control flow on tensors:
    converting them with autograph (as Keras's own steps are not) cost about
    2 s of a transformer's first step. A model's own `train_step` is still
    converted, so Python branches on tensors there keep working."""
    converted = _converted_by_autograph(monkeypatch)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x[:, :1] > 0).astype("float32")

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    kerasfast.fit(model, x, y, batch_size=32, epochs=1, validation_data=(x[:40], y[:40]), jit_compile=jit_compile,
                  run_dir=False, verbose=0, tune="off")
    assert not [name for name in converted if name.startswith("kerasfast.training.step_functions.StepFunctions._")]

    inputs = keras.Input((8,))
    own = BranchingStep(inputs, keras.layers.Dense(1)(inputs))
    own.compile(keras.optimizers.SGD(0.05), "mse")
    before = own.get_weights()[0].copy()
    result = kerasfast.fit(own, x, y, batch_size=32, epochs=1, jit_compile=jit_compile, run_dir=False, verbose=0,
                           tune="off")
    assert any(name.endswith("BranchingStep.train_step") for name in converted)
    assert np.isfinite(result.history["loss"][-1]) and not np.allclose(own.get_weights()[0], before)
