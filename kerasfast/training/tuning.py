"""Plans chosen by measurement: time candidate plans on the user's own model.

The plan's rules (a FLOPs threshold for bfloat16, XLA off on CPUs, steps
per execution from a cost estimate) miss on some models. `tune_plan` runs
each candidate plan for a few real train steps on the model and the first
batches of its data, compile time excluded, and keeps the fastest whose
loss agrees with float32's. Candidates are measured in two interleaved
rounds so that machine noise hits them alike. Weights, optimizer state and
metrics are put back afterwards: tuning never changes what training
computes.

The choice is cached on disk (`cache_dir()`), keyed by the model's
structure, the input shapes and dtypes, the batch, the strategy and the
machine, so re-running a script pays no tuning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import time
from typing import NamedTuple

import keras
import numpy as np

from kerasfast import _compat
from kerasfast.plan import TUNED_FIELDS, Measurement

TUNE_MODES = ("auto", "off", "full")
# Tuning may spend this share of the planned run's estimated time, at most
# `MAX_BUDGET_S`; a run too short to give a candidate `MIN_CANDIDATE_S` is not tuned.
BUDGET_SHARE = 0.10
MAX_BUDGET_S = 60.0
MIN_CANDIDATE_S = 1.5
# A candidate's mean loss over the measured steps may differ from float32's by
# this much (relative, plus an absolute floor for losses near zero): bfloat16
# keeps 8 bits of mantissa, and a few steps of training amplify rounding.
LOSS_RTOL, LOSS_ATOL = 0.05, 0.01
MEASURE_S = 0.4  # steady-state time measured per candidate per round
# A candidate replaces the rule-based plan only when it measured this much
# faster: short timings on a shared machine vary by ~15%, and a switch made
# on noise can make training slower than the rules would have.
WIN_MARGIN = 1.10
FIXED_EXECUTIONS = 4  # per candidate per round when workers must agree on the count


def cache_dir() -> pathlib.Path:
    """Where tuned plans are kept: `$KERASFAST_CACHE_DIR`, else `~/.cache/kerasfast/plans`."""
    root = os.environ.get("KERASFAST_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kerasfast")
    return pathlib.Path(root) / "plans"


def cache_key(model, sample_inputs, plan, hardware) -> str:
    """A digest of what decides the fastest plan (not the weights)."""
    structure = [type(model).__qualname__] + [
        (type(layer).__qualname__, _unnamed(_config(layer)), [list(v.shape) for v in layer.weights])
        for layer in _compat.flatten_layers(model)
    ]
    spec = keras.tree.map_structure(lambda t: [list(t.shape), str(t.dtype)], sample_inputs)
    import tensorflow as tf

    facts = {
        "model": structure, "inputs": spec, "batch": plan.global_batch_size, "strategy": plan.strategy,
        "replicas": plan.num_replicas, "grad_accum": plan.grad_accum_steps, "remat": plan.remat,
        "prune": plan.prune, "train_step": plan.train_step, "cpu": hardware.cpu_model, "flags": list(hardware.cpu_flags),
        "gpus": [gpu.name for gpu in hardware.gpus], "keras": keras.__version__, "tensorflow": tf.__version__,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _config(layer):
    try:
        return layer.get_config()
    except Exception:  # a custom layer without get_config: its class and weights identify it
        return None


def _unnamed(value):
    """A config without the names Keras numbers per session (`dense_3`)."""
    if isinstance(value, dict):
        return {key: _unnamed(item) for key, item in value.items() if key not in ("name", "inbound_nodes")}
    if isinstance(value, (list, tuple)):
        return [_unnamed(item) for item in value]
    return value


def cached_choice(key: str) -> tuple[dict, pathlib.Path] | None:
    path = cache_dir() / f"{key}.json"
    try:
        stored = json.loads(path.read_text())
        return {name: stored["chosen"][name] for name in TUNED_FIELDS}, path
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store_choice(key: str, chosen: Measurement, table: list[Measurement]) -> pathlib.Path | None:
    from kerasfast.runs import write_json

    try:
        return write_json(cache_dir() / f"{key}.json",
                          {"chosen": chosen.choices(), "table": [dataclasses.asdict(row) for row in table]})
    except OSError:
        return None  # a read-only home: tuning still worked, it is just not remembered


def budget_seconds(mode: str, estimated_run_s: float | None, budget_s: float | None) -> float | None:
    """Seconds tuning may take, or None when the run is not worth tuning."""
    if budget_s is not None:
        return float(budget_s)
    if mode == "full":
        return math.inf
    if estimated_run_s is None:
        return None
    budget = min(BUDGET_SHARE * estimated_run_s, MAX_BUDGET_S)
    return budget if budget >= 2 * MIN_CANDIDATE_S else None


def _variables(model) -> list:
    from kerasfast.training.backup import training_variables

    return training_variables(model)


def state_restored(model):
    """Puts every variable training changes (weights, optimizer, metrics,
    seed generators) back as it was when the block began."""
    return values_restored(_variables(model))


@contextlib.contextmanager
def values_restored(variables):
    """Puts `variables` back as they were when the block began."""
    saved = [np.array(keras.ops.convert_to_numpy(v)) for v in variables]
    try:
        yield
    finally:
        for variable, value in zip(variables, saved, strict=True):
            variable.assign(value)


class Timing(NamedTuple):
    """One measurement of a candidate (`measure`)."""

    samples_per_second: float
    loss: float  # the first execution's mean loss (NaN when any loss was not finite)
    compile_s: float  # the first execution's seconds beyond a steady one: tracing and compiling


class Tuned(NamedTuple):
    """What `tune_plan` found."""

    plan: object  # the chosen plan
    table: list  # one `Measurement` per candidate
    compiled: dict  # candidate index -> its compiled `StepFunctions`, for the candidates that ran
    seconds: float  # tuning's own cost: its time less the chosen plan's compilation, which training reuses


def tune_plan(model, candidates: list, strategy, batches, *, budget_s: float, reference_precision: str = "float32",
              agree=None) -> Tuned:
    """Measures `candidates` (plans differing in TUNED_FIELDS) and picks the fastest.

    Runs inside `session.borrowed(model, candidates[0])`, the block training
    then runs in: the chosen plan's compiled steps read the run's learning
    rate, so training goes on with them (`StepFunctions.prepare(measured=)`)
    instead of compiling them again. That compilation is therefore not
    counted against the budget.

    Args:
        model: The compiled, built model (its state is restored afterwards).
        candidates: Plans, the rule-based plan first; the first is also the
            fallback when nothing else can be measured.
        strategy: The `tf.distribute.Strategy` (the default one on one device).
        batches: A finite `tf.data.Dataset` of batches, repeated for each
            candidate so that all see the same data.
        budget_s: Seconds tuning may take; candidates not reached are listed
            as "not measured".
        reference_precision: Losses are compared with this precision's.
        agree: `f(flag) -> flag` making a yes/no decision the same on every
            worker (the chief's), so that all run the same candidates;
            None on one process.

    Returns:
        A `Tuned`: the chosen plan, one `Measurement` per candidate, the
        compiled `StepFunctions` of those that ran, and tuning's own cost.
    """
    table = [Measurement(p.precision, p.jit_compile, p.steps_per_execution) for p in candidates]
    functions = {}
    started = time.perf_counter()
    costs: list[float] = []  # seconds each measured candidate took in round one, compiling included
    saved_s = 0.0  # the rules' plan's compilation, which training would pay anyway

    def out_of_budget(predicted_s: float) -> bool:
        over = time.perf_counter() - started - saved_s + predicted_s > budget_s
        return agree(over) if agree is not None else over

    with state_restored(model):
        for round_ in range(2):
            if round_:
                # Round two re-uses the compiled functions: each costs about its timed span.
                measured = [i for i in functions if not table[i].verdict.startswith("rejected")]
                if out_of_budget(len(measured) * (MEASURE_S + 0.1)):
                    break
            for index, plan in enumerate(candidates):
                row = table[index]
                if row.verdict.startswith("rejected") or (round_ and index not in functions):
                    continue
                # A candidate is started only if one like the costliest so far still fits.
                if not round_ and index and out_of_budget(max(costs, default=0.0)):
                    row.verdict = "not measured: tuning budget spent"
                    continue
                began = time.perf_counter()
                with state_restored(model):
                    try:
                        timing = measure(model, plan, strategy, batches, functions, index,
                                         fixed_executions=FIXED_EXECUTIONS if agree is not None else None)
                    except Exception as error:  # a candidate that cannot run is rejected, not fatal
                        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
                        row.verdict = f"rejected: {type(error).__name__}: {(lines or [''])[-1][:160]}"
                        functions.pop(index, None)
                        continue
                    finally:
                        if not round_:
                            costs.append(time.perf_counter() - began)
                if not round_:
                    row.compile_s = timing.compile_s
                    saved_s = saved_s if index else timing.compile_s
                row.rates.append(timing.samples_per_second)
                row.samples_per_second = float(np.mean(row.rates))
                row.loss = timing.loss if row.loss is None else row.loss
    _judge(table, reference_precision)
    best = max((i for i, row in enumerate(table) if row.verdict == "ok"), key=lambda i: table[i].samples_per_second,
               default=0)
    if best and table[0].verdict == "ok" and \
            table[best].samples_per_second < WIN_MARGIN * table[0].samples_per_second:
        best = 0  # not clearly faster than the rules' plan
    for i, row in enumerate(table):
        if row.verdict == "ok":
            faster = row.samples_per_second > table[best].samples_per_second
            row.verdict = "chosen" if i == best else (
                f"faster by less than {WIN_MARGIN - 1:.0%}: the rules' plan is kept" if faster else "slower")
    if table[best].verdict != "chosen":
        table[best].verdict = "chosen (fallback: the rule-based plan)"
    reused_s = (table[best].compile_s or 0.0) if best in functions else 0.0
    return Tuned(candidates[best], table, functions, time.perf_counter() - started - reused_s)


def _judge(table: list[Measurement], reference_precision: str) -> None:
    """Rejects candidates whose loss is not finite or strays from the
    reference precision's on the same steps (same steps per execution)."""
    references = {}
    for row in table:
        if row.precision == reference_precision and row.loss is not None and math.isfinite(row.loss):
            references.setdefault(row.steps_per_execution, row.loss)
    for row in table:
        if row.verdict:
            continue
        reference = references.get(row.steps_per_execution)
        if row.loss is None or not math.isfinite(row.loss):
            row.verdict = f"rejected: loss {row.loss} is not finite"
        elif reference is not None and abs(row.loss - reference) > LOSS_RTOL * abs(reference) + LOSS_ATOL:
            row.verdict = (f"rejected: loss {row.loss:.4g} vs {reference_precision}'s {reference:.4g} "
                           f"(tolerance {LOSS_RTOL:.0%} + {LOSS_ATOL})")
        else:
            row.verdict = "ok"


def measure(model, plan, strategy, batches, functions: dict, index, *, fixed_executions: int | None = None) -> Timing:
    """Steady-state samples/s, and the first execution's loss, of `plan`'s
    train steps on `batches` (of `plan.global_batch_size` samples);
    `functions[index]` keeps the steps compiled.

    Runs for `MEASURE_S`, or `fixed_executions` executions when every worker
    must run the same number (each execution holds collectives). Call it
    inside `session.borrowed` and `state_restored`; a loss-scaling
    wrapper's own state is put back here.
    """
    from kerasfast.training.step_functions import StepFunctions
    from kerasfast.training import optimizers

    with strategy.scope():
        if index not in functions:
            scaler = optimizers.loss_scaling(model.optimizer, plan)
            if scaler is not None:
                scaler.build(model.trainable_variables)
            _compat.detach_from_creation_strategy(model)
            functions[index] = StepFunctions(model, strategy, steps_per_execution=plan.steps_per_execution,
                                             grad_accum_steps=plan.grad_accum_steps, jit_compile=plan.jit_compile,
                                             optimizer=scaler, precision=plan.precision, remat=plan.remat,
                                             clipnorm=plan.clipnorm, attention=plan.attention,
                                             dropout=plan.dropout)
        steps = functions[index]
        with values_restored(_own_variables(steps.optimizer, model.optimizer)):
            return _timed(steps, strategy, batches, plan.global_batch_size * plan.steps_per_execution, fixed_executions)


def _own_variables(optimizer, inner) -> list:
    """The variables of a loss-scaling wrapper that are not its inner optimizer's."""
    if optimizer is inner:
        return []
    inner_ids = {id(variable) for variable in inner.variables}
    return [variable for variable in optimizer.variables if id(variable) not in inner_ids]


def _timed(steps, strategy, batches, samples_per_execution: int, fixed_executions: int | None) -> Timing:
    train = steps.train_function()
    iterator = iter(strategy.experimental_distribute_dataset(batches.repeat()))
    began = time.perf_counter()
    first_loss = _loss(train(iterator))  # the first execution compiles (and is not timed)
    first_s = time.perf_counter() - began
    executions, finite = 0, True
    began = time.perf_counter()
    while True:
        finite = finite and math.isfinite(_loss(train(iterator)))
        executions += 1
        elapsed = time.perf_counter() - began
        if (executions >= fixed_executions) if fixed_executions else (elapsed >= MEASURE_S and executions >= 2):
            break
    return Timing(executions * samples_per_execution / elapsed, first_loss if finite else math.nan,
                  max(0.0, first_s - elapsed / executions))


def _loss(logs) -> float:
    value = logs.get("loss") if isinstance(logs, dict) else None
    return float(keras.ops.convert_to_numpy(value)) if value is not None else math.nan
