"""`kerasfast.fit`: a drop-in for `model.fit` that trains the fast way.

`fit` is a short orchestrator over named phases, in the manner of Keras's
own trainer:

1. `_start`: hardware, the early plan (thread pools must be sized before
   TensorFlow starts), the strategy, a backup to resume from, the seed;
2. `prepare_data`: every data form Keras takes, as one batched stream;
3. `prepare_model`: the user's model object (or a builder's), never
   called directly when it brings its own `train_step`;
4. `_plan_run`: the plan, resolved once from facts about model and data;
5. `_compile_for_run`: the user's compile settings, kept (compiled only
   when the model is not, or when fit is given loss / optimizer / metrics);
6. `_tuned` and `_train`, in one `session.borrowed` block: candidate
   plans timed, then kerasfast's steps (those tuning compiled for the
   chosen plan) installed and Keras's own loop run over them;
7. `_finish`: pruning folded in, weights carried back, the run folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import shutil
import tempfile
import warnings

import keras
import numpy as np
import tensorflow as tf

from kerasfast import _compat, costs, threads
from kerasfast._atomic import replace_durably
from kerasfast.data import service
from kerasfast._checks import is_int, is_number
from kerasfast.distribute import resolve_strategy
from kerasfast.distribute.consensus import check_same_plan, chief_value, on_every_worker
from kerasfast.distribute.failures import lost_peer_errors
from kerasfast.errors import PlanError, RunFolderWarning
from kerasfast.hardware import detect_hardware
from kerasfast.plan import (
    COMPUTATION_FIELDS, ModelFacts, Overrides, Plan, RunFacts, candidate_plans, compute_dtype, resolve_plan,
)
from kerasfast.runs import DEFAULT_ROOT, new_run_dir, save_model, write_json
from kerasfast.training import optimizers
from kerasfast.training.backup import DEFAULT_EVERY_STEPS, Backup, training_variables
from kerasfast.training.batch_callbacks import per_batch_callbacks
from kerasfast.training.guard import ON_NAN, DivergenceGuard, check_finite
from kerasfast.training.data_errors import damage_named, errors_naming_the_data
from kerasfast.training.inputs import (check_inputs_match, prepare_data, sharded_tfrecord_stream, split_validation,
                                       unpacked, validation_arguments)
from kerasfast.training.loop import RunHistory, run_epochs, stream_factory
from kerasfast.training.lr_finder import find_learning_rate, plot_finding
from kerasfast.training.models import PreparedModel, copy_optimizer_state, copy_weights, prepare_model
from kerasfast.training.precision import graph_precision
from kerasfast.training.session import borrowed, in_precision
from kerasfast.training.step_functions import StepFunctions
from kerasfast.training.throughput import Throughput, ThroughputMeter, input_advice, samples_counter
from kerasfast.training.xla import xla_problem


@dataclasses.dataclass
class FitResult:
    """What `kerasfast.fit` returns.

    Attributes:
        history: The run's metrics `{name: [value per epoch]}`, which also
            answer as Keras's `History` (`.history`, `.epoch`, `.params`):
            a `RunHistory`. So `history.history["loss"]` works on
            `history = kerasfast.fit(...)` as on `model.fit`'s return.
        plan: The resolved `Plan`.
        throughput: Measured `Throughput` (samples/s, steps/s, first
            execution time).
        model: The trained model: the user's own model object when one was
            passed, else the model the builder made.
        train_model: The model that trained: `model` itself, or (only under
            a strategy the model was not created in) its copy rebuilt in the
            strategy's scope.
        run_dir: The run folder, or None when disabled.
        data: One line describing the training data.
        model_preparation: One line saying how the model was trained (in
            place, built by your function, or rebuilt in a strategy's scope).
        pruning: Per-layer pruning summary (layer, shape, params, achieved
            sparsity; dense layers with the reason), or None.
        input_report: Whether training waited for its input, measured
            during the run, and what to do about it.
        recoveries: Each divergence the run recovered from (`on_nan`):
            `{"epoch", "step", "problem"}`.
        timeline: Throughput over the run (`ThroughputMeter.timeline()`:
            cumulative steps, samples, seconds and input wait), as saved in
            `timeline.json` and plotted in the run report.
        report: The run folder's `report.html`, or None (no run folder, or
            writing it failed: a warning then says why).
    """

    history: RunHistory
    plan: Plan
    throughput: Throughput
    model: keras.Model
    train_model: keras.Model
    run_dir: pathlib.Path | None
    data: str
    model_preparation: str
    pruning: list | None = None
    input_report: str = ""
    recoveries: list = dataclasses.field(default_factory=list)
    timeline: dict | None = None
    report: pathlib.Path | None = None

    @property
    def epoch(self) -> list:
        """The epochs run, as Keras's `History.epoch`."""
        return self.history.epoch

    @property
    def params(self) -> dict:
        """Keras's `History.params` (verbose, epochs, steps)."""
        return self.history.params

    def summary(self) -> dict:
        """The result as JSON-ready data (what `result.json` holds)."""
        return {
            "data": self.data,
            "model_preparation": self.model_preparation,
            "throughput": self.throughput.to_dict(),
            "input": self.input_report,
            "final_metrics": {k: v[-1] for k, v in self.history.history.items() if v},
            "epochs": len(self.history.epoch),
            "recoveries": self.recoveries,
        }


def _describe_pruning(config) -> str:
    structured = f", {config.structured} structured" if config.structured else ""
    if config.schedule == "polynomial":
        when = f"from {config.initial_sparsity:g} at update {config.begin_step} to update {config.end_step}"
    else:
        when = f"{config.schedule} from update {config.begin_step}"
    return f"magnitude pruning {when}, masks every {config.frequency} updates{structured}"


def _jit_blockers(model) -> tuple[str, ...]:
    return tuple(layer.name for layer in _compat.flatten_layers(model, include_self=True)
                 if not getattr(layer, "supports_jit", True))


def _draws_random_numbers(layer) -> bool:
    """Dropout, noise and random augmentation layers (each holds a Keras
    seed generator), unless their rate or deviation is 0."""
    if not any(isinstance(value, keras.random.SeedGenerator) for value in vars(layer).values()):
        return False
    return all(getattr(layer, name, 1) != 0 for name in ("rate", "stddev"))


def _sample_shape(sample):
    import tensorflow as tf

    shapes = tf.nest.map_structure(lambda t: tuple(t.shape[1:]), sample)
    dtypes = tf.nest.map_structure(lambda t: t.dtype, sample)
    return shapes, dtypes


def _check_run_arguments(epochs, initial_epoch, validation_freq, steps_per_epoch, validation_steps, resume) -> None:
    if resume not in RESUME_MODES:
        raise PlanError(f"resume={resume!r} is not valid: use one of {', '.join(map(repr, RESUME_MODES))}.")
    for name, value, low in (("epochs", epochs, 1), ("initial_epoch", initial_epoch, 0)):
        if not is_int(value) or value < low:
            raise PlanError(f"{name}={value!r} is not valid: use an integer >= {low}.")
    if initial_epoch >= epochs:
        raise PlanError(
            f"initial_epoch={initial_epoch} leaves nothing to train with epochs={epochs}: epochs is the index of "
            "the last epoch (as in Keras), so pass epochs > initial_epoch."
        )
    for name, value in (("steps_per_epoch", steps_per_epoch), ("validation_steps", validation_steps)):
        if value is not None and (not is_int(value) or value < 1):
            raise PlanError(f"{name}={value!r} is not valid: use an integer >= 1 or None.")
    if not (is_int(validation_freq) and validation_freq >= 1) and not (
            isinstance(validation_freq, (list, tuple, set)) and all(is_int(v) for v in validation_freq)):
        raise PlanError(f"validation_freq={validation_freq!r} is not valid: use an integer >= 1 or a list of epochs.")


RESUME_MODES = ("auto", "force", "fresh")
# Overrides a resumed run takes from the plan its backup recorded, unless the
# user sets them: the choices kerasfast makes from measurements or the machine.
_RECORDED_CHOICES = {"precision": "precision", "jit_compile": "jit_compile",
                     "steps_per_execution": "steps_per_execution"}


def _check_divergence_arguments(on_nan, max_recoveries, loss_upper_bound) -> None:
    if on_nan not in ON_NAN:
        raise PlanError(f"on_nan={on_nan!r} is not valid: use one of {', '.join(map(repr, ON_NAN))}.")
    if not is_int(max_recoveries) or max_recoveries < 0:
        raise PlanError(f"max_recoveries={max_recoveries!r} is not valid: use an integer >= 0.")
    if loss_upper_bound is not None and (isinstance(loss_upper_bound, bool)
                                         or not isinstance(loss_upper_bound, (int, float)) or loss_upper_bound <= 0):
        raise PlanError(f"loss_upper_bound={loss_upper_bound!r} is not valid: use a positive number or None.")


@dataclasses.dataclass
class _Start:
    """What `_start` resolved before any data or model is touched."""

    hardware: object
    early: Plan
    distribution: object
    backup: Backup | None
    progress: object
    seed: int
    runtime_started: bool
    threads: tuple[int, int]
    backup_every: int = DEFAULT_EVERY_STEPS
    force_resume: bool = False


def _start(overrides: Overrides, *, strategy, run_dir, backup_dir, backup_every, seed, resume) -> _Start:
    """Hardware, thread pools, strategy, backup and seed: decided once, first."""
    hardware = detect_hardware()
    # Thread pools can only be sized before TensorFlow's runtime starts, i.e.
    # before preparing data or model.
    started = threads.runtime_started()
    current = threads.current_threads()
    # The schedule needs the run's length, known only once the data is read.
    early_overrides = dataclasses.replace(overrides, lr_schedule="auto", warmup_steps="auto", scale_lr=False)
    early = resolve_plan(hardware, overrides=early_overrides, run=RunFacts(
        tf_runtime_started=started, current_intra_op_threads=current[0], current_inter_op_threads=current[1]))
    if not started:
        threads.configure_threads(early.intra_op_threads, early.inter_op_threads)
    distribution = resolve_strategy(strategy, hardware)
    if backup_dir is None and run_dir not in (None, False):
        backup_dir = pathlib.Path(run_dir) / "backup"
    backup = Backup(backup_dir, is_chief=distribution.is_chief) if backup_dir not in (None, False) else None
    if resume == "fresh" and backup is not None:
        backup.clear()
    progress = backup.progress() if backup is not None and not (resume == "fresh") else None
    if progress is not None:
        seed = progress.seed  # the resumed run must see the same data order
    elif seed is None:
        # Every worker must shuffle identically (or sharding by data would
        # give workers overlapping samples), and a resumable run must be able
        # to replay its order: both need a fixed seed. Drawn from NumPy's
        # global generator, so `keras.utils.set_random_seed` fixes it.
        seed = 0 if distribution.name == "multi_worker" else int(np.random.randint(2**31 - 1))
    return _Start(hardware, early, distribution, backup, progress, seed, started, current, backup_every,
                  resume == "force")


def _names_of(layers, layer_class) -> tuple[str, ...]:
    return tuple(layer.name for layer in layers if isinstance(layer, layer_class))


def _model_facts(model, train_data, optimizer) -> ModelFacts:
    """What the plan needs to know about the model and its compile settings."""
    settings = _compat.compile_config(model)
    user_optimizer = optimizer if optimizer is not None else (model.optimizer if model.compiled else None)
    template = keras.optimizers.get(user_optimizer) if isinstance(user_optimizer, str) else user_optimizer
    own_step = _compat.overridden_step(model, "train_step")
    flops = None
    if own_step is None:
        shapes, dtypes = _sample_shape(train_data.sample_inputs)
        flops = costs.forward_flops(model, shapes, dtypes)
    spe = settings.get("steps_per_execution", 1)
    layers = _compat.flatten_layers(model, include_self=False)
    return ModelFacts(
        layers_without_jit=_jit_blockers(model),
        forward_flops_per_sample=flops.total if flops else None,
        depthwise_conv_flops=flops.by_op_type.get("DepthwiseConv2dNative", 0) if flops else 0,
        recurrent_layers=_names_of(layers, keras.layers.RNN),
        layer_norm_layers=_names_of(layers, keras.layers.LayerNormalization),
        batch_norm_layers=_names_of(layers, keras.layers.BatchNormalization),
        random_layers=tuple(layer.name for layer in layers if _draws_random_numbers(layer)),
        conv_flops=sum(count for op, count in flops.by_op_type.items() if op.startswith(("Conv", "DepthwiseConv")))
        if flops else 0,
        user_optimizer=type(optimizers.unwrap(template)).__name__ if template is not None else None,
        user_learning_rate=optimizers.constant_learning_rate(template) if template is not None else None,
        custom_train_step=own_step,
        compile_jit_compile=settings.get("jit_compile", "auto"),
        compile_steps_per_execution=spe if is_int(spe) else 1,
        run_eagerly=bool(settings.get("run_eagerly")),
        loss_scaled=isinstance(template, keras.optimizers.LossScaleOptimizer),
        built_under=_mixed_policy(layers),
    )


def _mixed_policy(layers) -> str | None:
    """The mixed dtype policy most of the layers were built under, if any."""
    mixed = [layer.dtype_policy.name for layer in layers
             if getattr(layer, "dtype_policy", None) is not None and layer.dtype_policy.name.startswith("mixed_")]
    return max(set(mixed), key=mixed.count) if mixed else None


def _plan_run(start: _Start, overrides: Overrides, model_facts: ModelFacts, train_data, *, epochs, callbacks,
              prune) -> tuple[Plan, RunFacts]:
    """The plan, resolved once (pruning placed in the run's updates), and
    the run's facts it was resolved with."""
    distribution = start.distribution
    run_facts = RunFacts(
        epochs=epochs, tf_runtime_started=start.runtime_started, current_intra_op_threads=start.threads[0],
        current_inter_op_threads=start.threads[1], op_determinism=_compat.op_determinism_enabled(),
        user_batch_callbacks=per_batch_callbacks(callbacks),
    )

    recorded = start.progress.plan if start.progress is not None else {}
    from_backup = [name for name in _RECORDED_CHOICES
                   if _RECORDED_CHOICES[name] in recorded and name not in overrides.user_set()]
    if from_backup:
        overrides = dataclasses.replace(overrides, **{name: recorded[_RECORDED_CHOICES[name]] for name in from_backup})

    def plan_with(run: RunFacts) -> Plan:
        return resolve_plan(start.hardware, model=model_facts, data=train_data.facts, run=run, overrides=overrides,
                            num_replicas=distribution.num_replicas, strategy_name=distribution.name,
                            strategy_reason=distribution.reason)

    if overrides.steps_per_execution == "auto":
        # The peak FLOP/s (which sizes steps per execution) is measured in the
        # precision the plan picks; a timing differs between workers, so the
        # chief's keeps their plans equal.
        peak = costs.measure_peak_flops(compute_dtype(plan_with(run_facts).precision))
        run_facts = dataclasses.replace(run_facts, peak_flops=chief_value(distribution, peak))
    plan = plan_with(run_facts)
    if from_backup:
        fields = [_RECORDED_CHOICES[name] for name in from_backup]
        plan = dataclasses.replace(
            plan, overridden=tuple(name for name in plan.overridden if name not in fields),
            reasons={**plan.reasons, **{name: "as recorded by the backup this run resumes" for name in fields}})
    check_same_plan(distribution, plan)
    if prune is None:
        return plan, run_facts
    if plan.train_step != "kerasfast":
        raise PlanError(
            f"prune= follows the updates of kerasfast's own train step, but {model_facts.custom_train_step or 'your model'} "
            "runs its own: prune after training with kerasfast.compress.prune(model, ...), or drop prune=."
        )
    from kerasfast.compress import pruning_for_run

    if not plan.total_steps:
        raise PlanError("prune= needs the run's length: pass steps_per_epoch= for a dataset of unknown length.")
    config = pruning_for_run(prune, plan.total_steps)
    return dataclasses.replace(
        plan, prune=config.target_sparsity, overridden=plan.overridden + ("prune",),
        reasons={**plan.reasons, "prune": _describe_pruning(config)},
    ), run_facts


def _check_resumable(plan: Plan, start: _Start) -> None:
    """Refuses to resume a backup whose recorded plan computes differently.

    Raises:
        PlanError: Listing each difference, unless `resume="force"`.
    """
    recorded = start.progress.plan
    if not recorded:
        return
    differences = [f"{name} {getattr(plan, name)!r} (the backup's run: {recorded[name]!r})"
                   for name in COMPUTATION_FIELDS if name in recorded and recorded[name] != getattr(plan, name)]
    if not differences:
        return
    message = (f"this run would resume the backup in {start.backup.directory}, but its arguments change what "
               f"training computes: {'; '.join(differences)}")
    if start.force_resume:
        if start.distribution.is_chief:
            print(f"kerasfast: resume='force': {message}. Resuming anyway.")
        return
    raise PlanError(f"{message}. Re-run with the same arguments to resume exactly, resume='force' to resume anyway, "
                    "or resume='fresh' to start again.")


def _tuned(plan: Plan, model, train_data, start: _Start, model_facts, run_facts, overrides: Overrides, *, mode,
           budget_s) -> tuple[Plan, StepFunctions | None]:
    """The fastest candidate plan, measured on the model (or cached); the
    plan as it is when tuning is not worth its time. With it, the steps
    tuning compiled for the chosen plan (None when nothing was measured)."""
    from kerasfast.training import tuning

    distribution = start.distribution
    user_set = set(overrides.user_set()) | set(plan.overridden)
    if run_facts.user_batch_callbacks:
        user_set.add("steps_per_execution")  # those callbacks must see every batch, whatever was tuned before
    user_set = tuple(user_set)
    if all(field in user_set for field in tuning.TUNED_FIELDS):
        return plan, None
    key = tuning.cache_key(model, train_data.sample_inputs, plan, start.hardware)
    cached = tuning.cached_choice(key) if distribution.is_chief else None
    if distribution.name == "multi_worker":
        cached = _chiefs_choice(distribution, cached)  # workers' caches may differ: the chief's decides
    if cached is not None:
        choices, path = cached
        fields = [name for name in tuning.TUNED_FIELDS if name not in user_set]
        return dataclasses.replace(plan, **{name: choices[name] for name in fields},
                                   reasons={**plan.reasons, **{name: f"tuned earlier: cached in {path}"
                                                               for name in fields}}), None
    budget = tuning.budget_seconds(mode, _estimated_run_seconds(plan, model_facts, run_facts), budget_s)
    if budget is None:
        return plan, None
    candidates = candidate_plans(plan, start.hardware, model_facts, run_facts, mode=mode, user_set=user_set)
    if len(candidates) == 1:
        return plan, None
    strategy = distribution.strategy or tf.distribute.get_strategy()
    with strategy.scope():
        _build_state(model, plan, train_data.sample_batch)  # so that tuning restores the optimizer's state too
    batches = train_data.dataset.take(2 * max(c.steps_per_execution for c in candidates)).cache()
    agree = (lambda flag: chief_value(distribution, float(flag)) > 0.5) if distribution.name == "multi_worker" else None
    tuned = tuning.tune_plan(model, candidates, strategy, batches, samples_per_step=plan.global_batch_size,
                             budget_s=budget, agree=agree)
    table = tuned.table
    # Timings differ between workers: the chief's choice is everyone's.
    index = int(round(chief_value(distribution, float(candidates.index(tuned.plan)))))
    chosen = candidates[index]
    measured = tuned.compiled.get(index)
    if distribution.name == "multi_worker" and not on_every_worker(distribution, measured is not None):
        measured = None  # workers must compile alike, or their collectives would not pair up
    if distribution.is_chief:
        tuning.store_choice(key, table[index], table)
    reason = (f"tuned: {table[index].samples_per_second:,.0f} samples/s, fastest of {len(candidates)} candidates "
              "measured on your model")
    fields = [name for name in tuning.TUNED_FIELDS if name not in user_set]
    return dataclasses.replace(chosen, reasons={**chosen.reasons, **{name: reason for name in fields}},
                               tuning=tuple(dataclasses.asdict(row) for row in table),
                               tuning_seconds=tuned.seconds), measured


def _tuned_and_shown(plan: Plan, prepared, train_data, start: _Start, model_facts, run_facts, overrides: Overrides, *,
                     tune, tune_budget_s, data_service, verbose) -> tuple[Plan, StepFunctions | None]:
    """The plan as it trains (tuned, with its notes), printed; and the steps
    tuning compiled for it, if any. Runs inside the run's `borrowed` block."""
    measured = None
    train_model = prepared.train_model
    if tune != "off" and plan.train_step == "kerasfast" and start.progress is None:
        plan, measured = _tuned(plan, train_model, train_data, start, model_facts, run_facts, overrides, mode=tune,
                                budget_s=tune_budget_s)
    if data_service is not None:
        train_data.description += f"; {service.describe(data_service)}"
    if plan.num_replicas > 1:
        from kerasfast.distribute import scaling

        plan = scaling.with_plan_note(plan, train_model, forward_flops_per_sample=model_facts.forward_flops_per_sample,
                                      peak_flops=run_facts.peak_flops, accelerator=start.hardware.accelerator)
    if verbose != 0 and start.distribution.is_chief:
        print(plan)
        print(f"  data: {train_data.description}; model: {prepared.how}")
    return plan, measured


def _chiefs_choice(distribution, cached):
    """The chief's cached tuning choice `(choices, path)` on every worker, or None.

    Each value crosses as a number through `chief_value` (a collective:
    every worker makes the same calls).
    """
    from kerasfast.plan import PRECISIONS

    if chief_value(distribution, float(cached is not None)) < 0.5:
        return None
    choices = cached[0] if cached is not None else {"precision": PRECISIONS[0], "jit_compile": False,
                                                      "steps_per_execution": 1}
    precision = PRECISIONS[int(round(chief_value(distribution, float(PRECISIONS.index(choices["precision"])))))]
    jit_compile = chief_value(distribution, float(bool(choices["jit_compile"]))) > 0.5
    steps = int(round(chief_value(distribution, float(choices["steps_per_execution"]))))
    path = cached[1] if cached is not None else "the chief's cache"
    return {"precision": precision, "jit_compile": jit_compile, "steps_per_execution": steps}, path


def _with_found_batch(plan: Plan, model, train_data, start: _Start, model_facts: ModelFacts, overrides: Overrides, *,
                      data: dict, validation: dict, epochs, callbacks, prune):
    """`batch_size="auto"`: the batch measured best, the data batched with
    it, and the plan resolved again for it (learning rate scaled).

    Returns:
        `(batch_size, train_data, validation, plan, overrides, run_facts)`.
    """
    from kerasfast.training import batch_size as batch_search

    if train_data.facts.batch_size is not None:
        raise PlanError(f"batch_size='auto' cannot re-batch {train_data.description}, which comes batched: pass "
                        "unbatched data (arrays, TFRecords, or dataset.unbatch()) or leave batch_size out.")
    if plan.train_step != "kerasfast":
        raise PlanError(f"batch_size='auto' measures kerasfast's own train step, but {plan.reasons['train_step']}: "
                        "pass batch_size= yourself.")
    distribution = start.distribution
    recorded = start.progress.plan if start.progress is not None else {}
    if "global_batch_size" in recorded:
        found = batch_search.BatchSizeFinding(int(recorded["global_batch_size"]),
                                              "as recorded by the backup this run resumes", [])
    else:
        strategy = distribution.strategy or tf.distribute.get_strategy()
        with strategy.scope():
            _build_state(model, plan, train_data.sample_batch)  # restored after each candidate, like the weights

        def make_batches(batch):
            return prepare_data(data["x"], data["y"], data["sample_weight"], batch_size=batch,
                                class_weight=data["class_weight"], shuffle=False, seed=start.seed, repeat=True,
                                on_error=data["on_error"]).dataset.take(2).cache()

        shapes, dtypes = _sample_shape(train_data.sample_inputs)
        agree = (lambda flag: chief_value(distribution, float(flag)) > 0.5) \
            if distribution.name == "multi_worker" else None
        found = batch_search.find_batch_size(
            model, plan, strategy, make_batches, num_samples=train_data.facts.num_samples,
            accelerator=start.hardware.accelerator,
            bytes_per_sample=costs.activation_bytes_per_sample(model, shapes, dtypes), agree=agree)
        found.batch_size = int(round(chief_value(distribution, float(found.batch_size))))
    # A learning rate the user passed is theirs; the optimizer's own or
    # kerasfast's default was meant for Keras's default batch and is scaled.
    learning_rate_reason = None
    if overrides.learning_rate is None and not overrides.scale_lr and plan.learning_rate is not None:
        factor, rule = batch_search.learning_rate_factor(plan.optimizer, found.batch_size)
        overrides = dataclasses.replace(overrides, learning_rate=plan.learning_rate * factor)
        learning_rate_reason = (f"{plan.learning_rate:g} x {factor:.3g}: {rule} from batch "
                                f"{batch_search.FIRST_BATCH} to the {found.batch_size} batch_size='auto' chose")
    elif plan.learning_rate is None:
        learning_rate_reason = ("not scaled for batch_size='auto': your optimizer's learning rate is a schedule "
                                "(pass learning_rate= to set its peak)")
    overrides = dataclasses.replace(overrides, batch_size=found.batch_size)
    train_data = prepare_data(data["x"], data["y"], data["sample_weight"], batch_size=found.batch_size,
                              class_weight=data["class_weight"], shuffle=data["shuffle"], seed=start.seed,
                              repeat=True, on_error=data["on_error"])
    keras_validation = validation_arguments(
        validation["validation_data"], validation["batch_size"] or found.batch_size, validation["steps"],
        validation["freq"], train_data, data["on_error"])
    plan, run_facts = _plan_run(start, overrides, model_facts, train_data, epochs=epochs, callbacks=callbacks,
                                prune=prune)
    reasons = {**plan.reasons, "global_batch_size": found.reason}
    not_users = ("global_batch_size",)
    if learning_rate_reason:
        reasons["learning_rate"] = learning_rate_reason
        not_users += ("learning_rate",)
    plan = dataclasses.replace(plan, reasons=reasons,
                               overridden=tuple(name for name in plan.overridden if name not in not_users))
    return found.batch_size, train_data, keras_validation, plan, overrides, run_facts


def _found_learning_rate(model, x, y, sample_weight, *, class_weight, start: _Start, batch_size):
    """`learning_rate="find"`: the range test's suggestion, or a refusal saying why there is none."""
    if start.distribution.name == "multi_worker":
        raise PlanError("learning_rate='find' runs the range test in one process: run "
                        "kerasfast.find_learning_rate(model, x, y) on one machine first and pass the rate it suggests.")
    finding = find_learning_rate(model, x, y, sample_weight=sample_weight, class_weight=class_weight,
                                 batch_size=batch_size, seed=start.seed)
    if finding.suggestion is None:
        raise PlanError(f"learning_rate='find' found no rate to suggest: {finding.reason} Pass learning_rate= "
                        "yourself, or run kerasfast.find_learning_rate with other min_lr/max_lr/num_steps.")
    return finding


def _estimated_run_seconds(plan: Plan, model_facts, run_facts) -> float | None:
    """The planned run's length from its FLOPs and the measured peak, if both are known."""
    flops, peak = model_facts.forward_flops_per_sample, run_facts.peak_flops
    if not (flops and peak and plan.total_steps and plan.global_batch_size):
        return None
    per_step = costs.TRAIN_STEP_FLOPS_PER_FORWARD * flops * plan.global_batch_size / peak
    return plan.total_steps * plan.grad_accum_steps * per_step


def _checked_jit(plan: Plan, model, sample_inputs) -> Plan:
    """The plan, with XLA off when it cannot compile the model (chosen
    automatically), or a refusal naming the op (asked for by the user)."""
    problem = xla_problem(model, sample_inputs)
    if problem is None:
        return plan
    if "jit_compile" in plan.overridden:
        raise PlanError(f"jit_compile=True cannot work: {problem}. Pass jit_compile=False (or 'auto'), or replace "
                        "the op with one XLA supports.")
    return dataclasses.replace(plan, jit_compile=False, reasons={**plan.reasons, "jit_compile": f"off: {problem}"})


def _compile_for_run(model, plan: Plan, *, loss, optimizer, metrics) -> None:
    """Compiles only what Keras would need compiled: an uncompiled model, or
    the compile arguments given to fit (merged into the model's own)."""
    given = {name: value for name, value in (("loss", loss), ("optimizer", optimizer), ("metrics", metrics))
             if value is not None}
    if model.compiled and not given:
        return
    own_compile = _compat.overridden_step(model, "compile")
    if own_compile is not None:
        if model.compiled:
            raise PlanError(
                f"{own_compile} takes its own arguments, so kerasfast cannot add {', '.join(given)}= to it: pass "
                "them to your compile() and call kerasfast.fit without them."
            )
        raise PlanError(f"{own_compile} must be called before kerasfast.fit (as before model.fit).")
    settings = _compat.compile_config(model)
    given_optimizer = given.get("optimizer")
    if isinstance(given_optimizer, keras.optimizers.Optimizer) and not given_optimizer.built \
            and tf.distribute.has_strategy() \
            and _compat.optimizer_strategy(given_optimizer) is not tf.distribute.get_strategy():
        # An optimizer object made outside the strategy's scope cannot create
        # its variables there; unbuilt, it has no state to lose in a copy.
        given["optimizer"] = optimizers.copy_of(given_optimizer)
    settings.update(given)
    if settings.get("loss") is None and plan.train_step == "kerasfast" and not _has_added_losses(model):
        raise PlanError(
            "no loss: the model is not compiled with one and fit got no loss=. Pass loss= (e.g. "
            "loss='sparse_categorical_crossentropy') or compile the model first."
        )
    if settings.get("optimizer") is None:
        settings["optimizer"] = optimizers.default_optimizer(plan)
    settings.setdefault("jit_compile", "auto")
    model.compile(**settings)


def _has_added_losses(model) -> bool:
    return _compat.layers_add_losses(model) or bool(getattr(model, "losses", []))


def _build_state(model, plan: Plan, sample_batch) -> None:
    """Creates model, loss, metric and optimizer variables before the first trace."""
    if plan.train_step == "yours":
        # Never call a model with its own train_step (it may have no call()).
        # On one device its optimizers build lazily in the first, loop-free
        # execution; a strategy cannot create variables there, so they are
        # built now, as Keras's own symbolic build would.
        if plan.strategy == "none":
            return
        if model.optimizer is not None and not model.optimizer.built and model.trainable_variables:
            model.optimizer.build(model.trainable_variables)
        unbuilt = [name for name, value in vars(model).items()
                   if isinstance(value, keras.optimizers.Optimizer) and value is not model.optimizer
                   and not value.built]
        if unbuilt:
            raise PlanError(
                f"under a {plan.strategy} strategy the optimizers your train_step uses must exist before training, "
                f"but {', '.join(unbuilt)} is not built yet: build it in your builder, e.g. "
                f"model.{unbuilt[0]}.build(model.<sub_model>.trainable_variables)."
            )
        return
    _compat.build_state(model, sample_batch)


def _train(model, plan: Plan, start: _Start, train_data, stream_from, *, epochs, initial_epoch, callbacks, verbose,
           validation, meter_factory, divergence: dict, rate_control, measured=None):
    """Runs the planned epochs on the model, inside the run's `borrowed`
    block (whose `rate_control` lowers the rate after a divergence), with
    the steps tuning `measured` for the plan when there are some."""
    distribution, progress, backup = start.distribution, start.progress, start.backup
    tf_strategy = distribution.strategy

    def scope():
        return tf_strategy.scope() if tf_strategy is not None else contextlib.nullcontext()

    # kerasfast's steps take the plan's precision while they are traced; a
    # model that runs eagerly (run_eagerly=True) takes it for the whole run.
    with in_precision(model, plan) if plan.train_step == "keras" else graph_precision(plan.precision):
        metric_values = None
        steps = None
        with scope():
            _build_state(model, plan, train_data.sample_batch)
            if progress is not None:
                progress, metric_values = backup.restore(model, plan, force=start.force_resume)
                if verbose != 0 and distribution.is_chief:
                    print(f"kerasfast: resuming from {backup.path} at epoch {progress.epoch + 1}, step {progress.step}")
            if plan.train_step != "keras":
                scaler = optimizers.loss_scaling(model.optimizer, plan) if measured is None else None
                if scaler is not None:
                    scaler.build(model.trainable_variables)
                _compat.detach_from_creation_strategy(model)
                model.steps_per_execution = plan.steps_per_execution
                done = progress.batches_done(plan.steps_per_epoch) if progress and plan.steps_per_epoch else 0
                steps = StepFunctions.prepare(
                    model, tf_strategy or tf.distribute.get_strategy(), plan, done, optimizer=scaler,
                    own_test_step=_compat.overridden_step(model, "test_step") is not None, measured=measured)
        meter = meter_factory(progress, steps.input_wait_seconds if steps is not None else None)
        guard = DivergenceGuard(**divergence, snapshot_every_steps=start.backup_every,
                                grad_accum_steps=plan.grad_accum_steps, learning_rate=rate_control,
                                variables=lambda: training_variables(model), is_chief=distribution.is_chief)
        with scope(), lost_peer_errors(distribution):
            history = run_epochs(
                model, stream_from, plan=plan, epochs=epochs, initial_epoch=initial_epoch,
                callbacks=callbacks + [meter], verbose=verbose if distribution.is_chief else 0,
                validation=validation, backup=backup, backup_every=start.backup_every,
                progress=progress, metric_values=metric_values, seed=start.seed, guard=guard,
            )
    return history, meter, guard


def fit(
    model,
    x=None,
    y=None,
    batch_size: int | str | None = None,
    epochs: int = 1,
    verbose="auto",
    callbacks=None,
    validation_split: float = 0.0,
    validation_data=None,
    shuffle=True,
    class_weight=None,
    sample_weight=None,
    initial_epoch: int = 0,
    steps_per_epoch: int | None = None,
    validation_steps: int | None = None,
    validation_batch_size: int | None = None,
    validation_freq=1,
    *,  # Keras's own fit arguments above, in its order (a script may pass them by position)
    loss=None,
    optimizer=None,
    metrics=None,
    seed: int | None = None,
    strategy="auto",
    prune=None,
    run_dir=None,
    backup_dir=None,
    backup_every: int = DEFAULT_EVERY_STEPS,
    resume="auto",
    on_nan="recover",
    max_recoveries: int = 3,
    loss_upper_bound=None,
    on_error="raise",
    tune="auto",
    tune_budget_s=None,
    save_model_file: bool = True,
    tensorboard: bool = False,
    data=None,
    data_service: str | None = None,
    **options,
) -> FitResult:
    """Trains a Keras 3 model the fast way: a drop-in for `model.fit`.

    `model.fit(...)` becomes `kerasfast.fit(model, ...)`: every argument of
    Keras 3's `fit` keeps its meaning, the model's own `compile`, `train_step`,
    `test_step`, `compute_loss` and `compute_metrics` are honoured, and
    afterwards the model is what Keras would have left (its optimizer object
    trained, nothing of kerasfast's installed). Every automatic decision is
    resolved once into a `Plan`, printed before training (unless
    `verbose=0`) and saved as `plan.json` in the run folder.

    Args:
        model: A Keras model (Sequential, functional or subclassed; compiled
            or not), or a zero-argument callable that builds one (called in
            the strategy's scope).
        x, y, sample_weight: As in Keras: arrays, tensors or pandas objects
            (dicts by input/output name, lists or tuples for several), a
            `tf.data.Dataset` yielding `x` or `(x, y[, sample_weight])`, a
            `keras.utils.PyDataset`, a generator; or a TFRecord file, folder
            or pattern written by `kerasfast.data.write_tfrecords`. A tuple
            `x` without `y` is read as `(x, y[, sample_weight])`.
        batch_size: As in Keras, or "auto": real train steps pick it (on a
            GPU the largest global batch that fits in memory, on a CPU the
            fastest within a memory bound; see
            `kerasfast.training.batch_size`), and the learning rate is scaled
            to match; the plan says by how much.
        epochs, verbose, callbacks, validation_split,
        validation_data, shuffle, class_weight, initial_epoch,
        steps_per_epoch, validation_steps, validation_batch_size,
        validation_freq: As in Keras 3's `fit` (see docs/fit.md for the
            few additions: `class_weight` multiplies into `sample_weight`).
        loss, optimizer, metrics: As in `model.compile`, merged into the
            model's own settings (the model stays compiled with them).
            Without any optimizer kerasfast uses AdamW with warm-up + cosine.
        seed: Shuffle seed (None: drawn from NumPy's global generator, so
            `keras.utils.set_random_seed` makes runs repeat exactly).
        strategy: "auto", "none", "mirrored", "multi_worker" or a
            `tf.distribute.Strategy` (see `kerasfast.distribute`).
        prune: Magnitude pruning during training: a target sparsity (e.g.
            0.8), a dict of `kerasfast.compress.PruningConfig` arguments or a
            `PruningConfig`.
        run_dir: Folder for the run's files; None makes a new one under
            `kerasfast_runs/`, False writes nothing (chief worker only).
        backup_dir: Folder for the training-state backup (shared by all
            workers); None: `run_dir/backup` when `run_dir` is given; False:
            off. A re-run with a backup there resumes exactly where it stopped.
        backup_every: Save the state every this many steps (and each epoch end).
        resume: What to do with a backup found in `backup_dir`: "auto"
            resumes it with the plan it recorded, refusing a run whose
            arguments change what training computes (batch size, epochs,
            learning rate, precision, ...); "force" resumes it anyway; "fresh"
            discards it and starts again.
        on_nan: When the loss becomes NaN/infinite or blows up (above
            `loss_upper_bound`, or 10x the recent median): "recover" rolls
            back to the last good state, halves the learning rate and goes on
            with the next batches; "stop" rolls back and raises
            `TrainingError`; "ignore" trains on, as Keras does. Array inputs
            holding NaN/infinity are refused before training unless "ignore".
        max_recoveries: Recoveries before the run stops with `TrainingError`.
        loss_upper_bound: A loss above this counts as a blow-up (None: off).
        on_error: For TFRecord data: "raise" names a damaged record (file,
            record, byte offset) in a `DataError`; "skip" leaves damaged
            records out and warns.
        tune: "auto" times candidate plans (precision, XLA, steps per
            execution) on the model before a run long enough to repay it
            (within 10% of its estimated time, at most 60 s) and keeps the
            fastest whose loss agrees with float32's; the choice is cached
            on disk. "full" tries every candidate whatever the cost; "off"
            keeps the rule-based plan.
        tune_budget_s: Seconds tuning may take (overrides the 10% rule).
        save_model_file: Save the trained model as `model.keras` in the run folder.
        tensorboard: Write TensorBoard logs into `run_dir/tensorboard` with
            Keras's `keras.callbacks.TensorBoard`: per-epoch scalars and a
            profile of a few steady-state executions. Needs a run folder.
        data: The training data by its older name (same as `x`).
        data_service: "grpc://HOST:PORT" of a tf.data service dispatcher
            (`kerasfast data-service dispatcher`): the training pipeline
            (reading, parsing, your dataset's maps) runs on its service
            workers, sharded DYNAMIC, one job per pass, so every record is
            seen once per epoch, in no reproducible order. Takes a TFRecord
            folder (split between training workers by file) or, on one
            training worker, a `tf.data.Dataset` of TensorFlow ops;
            validation stays local. A backup resumes only with
            `resume="force"` (from its step, not its batches). See
            `kerasfast.data.service` and docs/distributed.md.
        **options: kerasfast's overrides of its automatic choices
            (`kerasfast.plan.Overrides`): precision, jit_compile,
            steps_per_execution, grad_accum_steps, clipnorm, remat,
            learning_rate (a number, or "find": a learning-rate range test
            on the model picks it, see `kerasfast.find_learning_rate`),
            lr_schedule, warmup_steps, intra_op_threads, inter_op_threads,
            scale_lr.

    Returns:
        A `FitResult` with the Keras `History`, the plan and the throughput.

    Raises:
        PlanError: For a bad argument or a combination that cannot work,
            before any training step.
        DataError: For data that is malformed or does not fit the model.
        ModelError: For a model that cannot be prepared as planned. Errors
            raised by the model's own code keep their type.

    Example:

    >>> x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    >>> y = (x.sum(axis=1) > 0).astype("int32")
    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])
    >>> result = kerasfast.fit(model, x, y, epochs=3, batch_size=64, validation_split=0.1, run_dir=False,
    ...                        loss="sparse_categorical_crossentropy", verbose=0)
    >>> print(result.plan)  # every choice and why; the choices depend on the machine
    kerasfast plan
      strategy ...
    >>> len(result.history.history["val_loss"]), result.throughput.samples_per_second > 0
    (3, True)
    """
    x = _one_training_data(x, data)
    if strategy == "auto" and isinstance(model, keras.Model) and _compat.creation_strategy(model) is not None:
        strategy = _compat.creation_strategy(model)  # as Keras does: the strategy the model was created under
    callbacks = keras.tree.flatten(callbacks) if callbacks else []  # Keras also takes a single callback
    epochs, initial_epoch, batch_size, steps_per_epoch, validation_steps, validation_batch_size = (
        _python_int(value) for value in (epochs, initial_epoch, batch_size, steps_per_epoch, validation_steps,
                                         validation_batch_size))
    _check_fit_arguments(epochs=epochs, initial_epoch=initial_epoch, validation_freq=validation_freq,
                         steps_per_epoch=steps_per_epoch, validation_steps=validation_steps, resume=resume,
                         on_nan=on_nan, max_recoveries=max_recoveries, loss_upper_bound=loss_upper_bound, tune=tune,
                         tune_budget_s=tune_budget_s, on_error=on_error, tensorboard=tensorboard, run_dir=run_dir,
                         data_service=data_service)
    request = _Request.of(options, batch_size=batch_size, steps_per_epoch=steps_per_epoch)
    overrides = request.overrides
    start = _start(overrides, strategy=strategy, run_dir=run_dir, backup_dir=backup_dir, backup_every=backup_every,
                   seed=seed, resume=resume)
    tf_strategy = start.distribution.strategy

    # Data.
    feed = _Feed(x, y, sample_weight, class_weight=class_weight, shuffle=shuffle, on_error=on_error,
                 validation_data=validation_data, validation_batch_size=validation_batch_size,
                 validation_steps=validation_steps, validation_freq=validation_freq, data_service=data_service)
    train_data, validation = _prepared_feed(feed, start, batch_size=request.batch_size,
                                            validation_split=validation_split, on_nan=on_nan,
                                            steps_per_epoch=steps_per_epoch)

    # Model.
    prepared, model_facts = _prepared_model(model, train_data, optimizer, tf_strategy)
    train_model = prepared.train_model

    # Plan.
    fine_tune = None
    if prune is not None and not request.find_rate:
        # Pruning a trained model: its own learning rate (kerasfast.compress.finetune).
        from kerasfast.compress.finetune import fine_tune_rate

        fine_tune = fine_tune_rate(optimizer if optimizer is not None else getattr(prepared.user_model, "optimizer", None),
                                   learning_rate=overrides.learning_rate, lr_schedule=overrides.lr_schedule)
        if fine_tune is not None:
            overrides = fine_tune.applied_to(overrides)
    run = dict(epochs=epochs, callbacks=callbacks, prune=prune)
    plan, run_facts = _plan_run(start, overrides, model_facts, train_data, **run)
    if start.progress is not None:
        _check_resumable(plan, start)
    plan = _compiled_for_plan(prepared, plan, train_data, tf_strategy, loss=loss, optimizer=optimizer,
                              metrics=metrics)
    if request.auto_batch:
        _, train_data, validation, plan, overrides, run_facts = _with_found_batch(
            plan, train_model, train_data, start, model_facts, overrides,
            data=dict(x=feed.x, y=feed.y, sample_weight=feed.sample_weight, class_weight=class_weight,
                      shuffle=shuffle, on_error=on_error),
            validation=dict(validation_data=feed.validation_data, batch_size=validation_batch_size,
                            steps=validation_steps, freq=validation_freq), **run)
    finding = None
    if request.find_rate:
        plan, run_facts, finding = _with_found_learning_rate(plan, train_model, feed, start, model_facts, overrides,
                                                             train_data, **run)
    if fine_tune is not None:
        plan = fine_tune.described(plan)
    # Tuning and training, in one borrowed block: training goes on with the
    # steps tuning compiled, which read the block's learning rate.
    with contextlib.ExitStack() as cleanup:
        with borrowed(train_model, plan) as rate_control:
            plan, measured = _tuned_and_shown(plan, prepared, train_data, start, model_facts, run_facts, overrides,
                                              tune=tune, tune_budget_s=tune_budget_s, data_service=data_service,
                                              verbose=verbose)
            folder = _run_folder(run_dir, start.distribution, cleanup)
            _write_plan_files(folder, plan, start, finding)
            pruned_layers = None
            if plan.prune is not None:
                pruned_layers = _pruned_for_run(train_model, plan, prune, tf_strategy)
                measured = None  # compiled for the layers pruning has now wrapped
            stream_from = _training_stream(feed, train_data, plan, start)

            def meter_factory(progress, input_wait):
                return ThroughputMeter(samples_counter(plan.global_batch_size, train_data.facts.num_samples),
                                       plan.steps_per_epoch, first_step=progress.step if progress else 0,
                                       input_wait_seconds=input_wait)

            if tensorboard and folder is not None and start.distribution.is_chief:
                from kerasfast.training.tensorboard import tensorboard_callback

                callbacks = callbacks + [tensorboard_callback(folder, plan)]
            with errors_naming_the_data(feed.x, feed.y, feed.validation_data, feed.validation_steps):
                history, meter, guard = _train(
                    train_model, plan, start, train_data, stream_from, epochs=epochs, initial_epoch=initial_epoch,
                    callbacks=callbacks, verbose=verbose, validation=validation, meter_factory=meter_factory,
                    divergence=dict(on_nan=on_nan, max_recoveries=max_recoveries, loss_upper_bound=loss_upper_bound),
                    rate_control=rate_control, measured=measured)
        return _finish(prepared, plan, start, train_data, history, meter, folder, pruned_layers,
                       save_model_file=save_model_file, verbose=verbose, recoveries=guard.recoveries)


def _python_int(value):
    """A NumPy integer (a count read from an array or a config) as a Python int, as Keras takes it."""
    return int(value) if isinstance(value, np.integer) else value


def _one_training_data(x, data):
    """`x`, or `data=` (its older name); not both."""
    if data is None:
        return x
    if x is not None:
        raise PlanError("fit got both x= and data=: pass the training data once (x= is Keras's name).")
    return data


def _check_fit_arguments(*, epochs, initial_epoch, validation_freq, steps_per_epoch, validation_steps, resume,
                         on_nan, max_recoveries, loss_upper_bound, tune, tune_budget_s, on_error, tensorboard,
                         run_dir, data_service) -> None:
    """Refuses a bad argument of `fit` before anything starts, naming it and the fix."""
    _check_run_arguments(epochs, initial_epoch, validation_freq, steps_per_epoch, validation_steps, resume)
    _check_divergence_arguments(on_nan, max_recoveries, loss_upper_bound)
    if tune not in ("auto", "off", "full"):
        raise PlanError(f"tune={tune!r} is not valid: use 'auto', 'off' or 'full'.")
    if tune_budget_s is not None and (not is_number(tune_budget_s) or tune_budget_s < 0):
        raise PlanError(f"tune_budget_s={tune_budget_s!r} is not valid: use a number of seconds >= 0 or None.")
    if on_error not in ("raise", "skip"):
        raise PlanError(f"on_error={on_error!r} is not valid: use 'raise' or 'skip'.")
    if not isinstance(tensorboard, bool):
        raise PlanError(f"tensorboard={tensorboard!r} is not valid: use True or False.")
    if tensorboard and run_dir is False:
        raise PlanError("tensorboard=True writes its logs into the run folder, but run_dir=False writes none: pass "
                        "run_dir= (a folder, or None for a new one under kerasfast_runs/), or drop tensorboard=True.")
    if tensorboard:
        from kerasfast.training.tensorboard import check_available

        check_available()
    if data_service is not None:
        service.parse_address(data_service)


@dataclasses.dataclass(frozen=True)
class _Request:
    """The user's overrides, with the two choices made by measuring later:
    `batch_size="auto"` and `learning_rate="find"`."""

    overrides: Overrides
    batch_size: int | None
    auto_batch: bool
    find_rate: bool

    @classmethod
    def of(cls, options: dict, *, batch_size, steps_per_epoch) -> "_Request":
        find_rate = isinstance(options.get("learning_rate"), str) and options["learning_rate"] == "find"
        if find_rate:
            options = {**options, "learning_rate": None}  # planned once the range test has found it
        auto_batch = isinstance(batch_size, str) and batch_size == "auto"
        if auto_batch:
            batch_size = None  # planned once real steps have measured the candidates
        overrides = Overrides.from_options({**options, "batch_size": batch_size, "steps_per_epoch": steps_per_epoch})
        return cls(overrides, batch_size, auto_batch, find_rate)


@dataclasses.dataclass
class _Feed:
    """The training and validation data as the user passed them (after `validation_split`)."""

    x: object
    y: object
    sample_weight: object
    class_weight: object
    shuffle: object
    on_error: str
    validation_data: object
    validation_batch_size: int | None
    validation_steps: int | None
    validation_freq: object
    data_service: str | None


def _prepared_feed(feed: _Feed, start: _Start, *, batch_size, validation_split, on_nan, steps_per_epoch):
    """`(train_data, validation)`: the training data read (`prepare_data`) and Keras's validation arguments.

    Splits off `validation_split` (updating `feed`), refuses what the data
    path cannot serve, and checks arrays for NaN unless `on_nan="ignore"`.
    """
    distribution = start.distribution
    feed.x, feed.y, feed.sample_weight = unpacked(feed.x, feed.y, feed.sample_weight)
    if validation_split and feed.validation_data is None:
        (feed.x, feed.y, feed.sample_weight), feed.validation_data = split_validation(
            feed.x, feed.y, feed.sample_weight, validation_split)
    if feed.class_weight is not None and isinstance(feed.x, (str, os.PathLike)) \
            and distribution.name == "multi_worker":
        raise PlanError("class_weight= is not applied to TFRecords read per worker: write the weights into the "
                        "records (a sample_weight feature) or train on one machine.")
    if on_nan != "ignore":
        for what, value in (("x", feed.x), ("y", feed.y), ("sample_weight", feed.sample_weight)):
            check_finite(value, what)
    with damage_named(feed.x, feed.validation_data):
        train_data = prepare_data(feed.x, feed.y, feed.sample_weight, batch_size=batch_size,
                                  class_weight=feed.class_weight, shuffle=feed.shuffle, seed=start.seed, repeat=True,
                                  on_error=feed.on_error)
        validation = validation_arguments(feed.validation_data, feed.validation_batch_size or batch_size,
                                           feed.validation_steps, feed.validation_freq, train_data, feed.on_error)
    if feed.data_service is not None:
        service.check_servable(feed.data_service, feed.x, train_data, distribution, steps_per_epoch=steps_per_epoch,
                               resuming=start.progress is not None, force_resume=start.force_resume,
                               on_error=feed.on_error)
        service.check_reachable(*service.parse_address(feed.data_service))
    return train_data, validation


def _prepared_model(model, train_data, optimizer, tf_strategy) -> tuple[PreparedModel, ModelFacts]:
    """The model that trains (the user's, or its copy in the strategy's scope), checked against the data."""
    own_steps = isinstance(model, keras.Model) and _compat.overridden_step(model, "train_step") is not None
    if isinstance(model, keras.Model) and not own_steps:
        check_inputs_match(model, train_data.sample_inputs)
    prepared: PreparedModel = prepare_model(model, train_data.sample_inputs, strategy=tf_strategy, own_steps=own_steps)
    if _compat.overridden_step(prepared.train_model, "train_step") is None:
        check_inputs_match(prepared.train_model, train_data.sample_inputs)
    # A rebuilt copy is compiled later, like the user's model: the facts (compile settings included) are the user's.
    return prepared, _model_facts(prepared.user_model if prepared.rebuilt else prepared.train_model, train_data,
                                  optimizer)


def _compiled_for_plan(prepared: PreparedModel, plan: Plan, train_data, tf_strategy, *, loss, optimizer,
                       metrics) -> Plan:
    """Compiles the training model for `plan` in the strategy's scope; XLA is
    checked on the model (and turned off with the reason when it cannot run)."""
    scope = tf_strategy.scope if tf_strategy is not None else contextlib.nullcontext
    if prepared.rebuilt:
        _compile_copy(prepared.train_model, prepared.user_model, plan, scope, loss=loss, optimizer=optimizer,
                      metrics=metrics)
    with scope():
        if not prepared.rebuilt:
            _compile_for_run(prepared.train_model, plan, loss=loss, optimizer=optimizer, metrics=metrics)
        if plan.jit_compile and plan.train_step == "kerasfast":
            plan = _checked_jit(plan, prepared.train_model, train_data.sample_inputs)
    return plan


def _with_found_learning_rate(plan: Plan, model, feed: _Feed, start: _Start, model_facts: ModelFacts,
                              overrides: Overrides, train_data, **run):
    """`(plan, run_facts, finding)`: the plan re-resolved at the rate a range test found."""
    finding = _found_learning_rate(model, feed.x, feed.y, feed.sample_weight, class_weight=feed.class_weight,
                                   start=start, batch_size=plan.global_batch_size)
    overrides = dataclasses.replace(overrides, learning_rate=finding.suggestion)
    plan, run_facts = _plan_run(start, overrides, model_facts, train_data, **run)
    plan = dataclasses.replace(plan, reasons={**plan.reasons, "learning_rate": f"found: {finding.reason}"},
                               overridden=tuple(name for name in plan.overridden if name != "learning_rate"))
    return plan, run_facts, finding


def _write_plan_files(folder, plan: Plan, start: _Start, finding) -> None:
    if folder is None:
        return
    write_json(folder / "plan.json", {**plan.to_dict(), "hardware": start.hardware.to_dict()})
    if finding is not None and start.distribution.is_chief:
        plot_finding(finding, folder / "lr_find.png")
        write_json(folder / "lr_find.json", finding.summary())


def _pruned_for_run(train_model, plan: Plan, prune, tf_strategy) -> list:
    """Wraps the model's prunable layers for this run; returns the per-layer rows."""
    from kerasfast.compress import apply_pruning, pruning_for_run

    with tf_strategy.scope() if tf_strategy is not None else contextlib.nullcontext():
        config = pruning_for_run(prune, plan.total_steps)
        # The schedule counts the optimizer's updates, which carry on
        # from earlier fits of the same model: it starts at this run's first.
        done = int(keras.ops.convert_to_numpy(train_model.optimizer.iterations))
        if done and config.end_step is not None:
            config = dataclasses.replace(config, begin_step=config.begin_step + done,
                                         end_step=config.end_step + done)
        return apply_pruning(train_model, config)


def _training_stream(feed: _Feed, train_data, plan: Plan, start: _Start):
    """`f(batches_done)` giving the training batches: through tf.data service,
    per worker from TFRecords, or the prepared dataset repeated."""
    distribution = start.distribution
    if feed.data_service is not None:
        return service.service_stream(
            feed.data_service, feed.x, train_data, distribution.strategy, distribution,
            global_batch_size=plan.global_batch_size, steps_per_epoch=plan.steps_per_epoch, shuffle=feed.shuffle,
            on_error=feed.on_error, class_weight=feed.class_weight)
    if train_data.source == "tfrecords" and distribution.name == "multi_worker":
        return sharded_tfrecord_stream(os.fspath(feed.x), distribution.strategy,
                                       global_batch_size=plan.global_batch_size, shuffle=feed.shuffle,
                                       seed=start.seed, on_error=feed.on_error)
    return stream_factory(train_data.dataset, repeat=bool(plan.steps_per_epoch),
                          autotune=train_data.source != "arrays")


def _compile_copy(clone, user_model, plan, scope, *, loss, optimizer, metrics) -> None:
    """Compiles the copy rebuilt in the strategy's scope like the user's own model.

    The user's model, which gets the trained state back, is compiled outside
    the scope: Keras creates an optimizer's variables under the strategy in
    scope when the optimizer is made, and one made under the strategy
    cannot build later, outside its scope, for the user's plain variables.
    """
    settings = _compat.compile_config(user_model)
    given = {name: value for name, value in (("loss", loss), ("optimizer", optimizer), ("metrics", metrics))
             if value is not None}
    settings.update(given)
    if settings.get("loss") is None:
        raise PlanError("no loss: the model is not compiled with one and fit got no loss=. Pass loss= or compile it.")
    if settings.get("optimizer") is None:
        settings["optimizer"] = optimizers.default_optimizer(plan)
    if not user_model.compiled or given:
        user_model.compile(**{**settings, "optimizer": _optimizer_for_user_model(settings["optimizer"], user_model)})
    with scope():
        clone.compile(**{**settings, "optimizer": optimizers.copy_of(settings["optimizer"])})


def _optimizer_for_user_model(optimizer, user_model):
    """The optimizer object itself, as Keras's compile keeps it, when it can
    hold the user's model's state (made outside any strategy, and unbuilt or
    already the model's); else a fresh copy. A name is made by compile."""
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer
    outside = _compat.optimizer_strategy(optimizer) in (None, tf.distribute.get_strategy())
    if outside and (not optimizer.built or optimizer is user_model.optimizer):
        return optimizer
    return optimizers.copy_of(optimizer)


def _run_folder(run_dir, distribution, cleanup):
    if run_dir is False:
        return None
    if distribution.is_chief:
        folder = pathlib.Path(run_dir) if run_dir is not None else new_run_dir(DEFAULT_ROOT)
    else:
        folder = pathlib.Path(tempfile.mkdtemp(prefix=f"kerasfast-worker{distribution.cluster.index}-"))
        # Removed when fit ends, whether it succeeds or fails.
        cleanup.callback(shutil.rmtree, folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _finish(prepared, plan, start, train_data, history, meter, folder, pruned_layers, *, save_model_file,
            verbose, recoveries) -> FitResult:
    """Folds pruning in, carries a copy's state back, writes the run folder,
    and only then clears the backup: a finished run is never lost."""
    distribution = start.distribution
    train_model = prepared.train_model
    pruning_summary = None
    if pruned_layers is not None:
        from kerasfast.compress import finalize_pruning

        with distribution.strategy.scope() if distribution.strategy is not None else contextlib.nullcontext():
            pruning_summary = finalize_pruning(train_model) + [row for row in pruned_layers if not row["pruned"]]
    if prepared.rebuilt:
        _carry_back(train_model, prepared.user_model)
    run_history = RunHistory(history)
    history.history = run_history  # one dict: model.history.history is result.history
    prepared.user_model.history = history  # as Keras's fit leaves it: the History it returned
    throughput = meter.result()
    result = FitResult(
        history=run_history, plan=plan, throughput=throughput, model=prepared.user_model, train_model=train_model,
        run_dir=folder, data=train_data.description, model_preparation=prepared.how, pruning=pruning_summary,
        input_report=input_advice(throughput.input_wait_fraction, train_data.source), recoveries=recoveries,
        timeline=meter.timeline(),
    )
    unwritten, failed_writes = [], False
    if folder is not None:
        broken = _non_finite_layers(train_model) if save_model_file else []
        if broken and distribution.is_chief:
            print(f"kerasfast: not saving model.keras: the weights of {', '.join(broken[:5])} are NaN or infinite "
                  "(on_nan='ignore' trained on a diverged loss).")
        unwritten, failed_writes = _write_run_files(folder, result,
                                                    train_model if save_model_file and not broken else None)
        if unwritten and distribution.is_chief:
            _warn_unwritten(folder, unwritten, start.backup if failed_writes else None)
        if distribution.is_chief:
            from kerasfast.reporting import report_or_warning

            result.report = report_or_warning(folder)  # a report that fails never loses the run
        if not distribution.is_chief:
            result.run_dir = None
    if start.backup is not None and not failed_writes:
        start.backup.clear()
    if verbose != 0 and distribution.is_chief:
        print(f"kerasfast: {result.input_report}")
        if throughput.samples_per_second:
            print(f"kerasfast: {throughput.samples_per_second:,.0f} samples/s, "
                  f"{throughput.steps_per_second:,.1f} steps/s after the first execution "
                  f"({throughput.first_execution_s:.1f} s incl. compilation)")
        else:
            print("kerasfast: run too short to measure throughput (only the first, compiling execution ran)")
        if result.report is not None:
            print(f"kerasfast: report: {result.report}")
    return result


def _carry_back(train_model, user_model) -> None:
    """Copies the trained copy's weights and optimizer state into the user's model.

    Training is over and its result is in `train_model` (the result's
    `train_model`), so a part that cannot be copied is a warning naming it,
    never an error that loses the run.
    """
    try:
        copy_weights(train_model, user_model)
    except Exception as error:  # noqa: BLE001 - whatever it is, the trained weights are still returned
        warnings.warn(
            f"kerasfast: training finished, but its weights could not be copied into your model {user_model.name!r} "
            f"({type(error).__name__}: {error}); the trained model is the result's train_model.", stacklevel=4)
        return
    user_optimizer, trained_optimizer = user_model.optimizer, train_model.optimizer
    if user_optimizer is None or trained_optimizer is None:
        return
    try:
        if not user_optimizer.built:
            user_optimizer.build(user_model.trainable_variables)
        copy_optimizer_state(trained_optimizer, user_optimizer)
    except Exception as error:  # noqa: BLE001 - the weights are in; only the optimizer's moments are missing
        warnings.warn(
            f"kerasfast: training finished and your model {user_model.name!r} holds the trained weights, but its "
            f"optimizer's state (step count, moments) was not copied ({type(error).__name__}: {error}); the "
            "result's train_model.optimizer holds it.", stacklevel=4)


def _non_finite_layers(model) -> list[str]:
    """Names of the layers holding a NaN or infinite weight."""
    return [layer.name for layer in model.layers or [model]
            if any(not np.isfinite(keras.ops.convert_to_numpy(w)).all() for w in layer.weights
                   if keras.backend.is_float_dtype(w.dtype))]


def _save_model_or_weights(model, folder) -> str | None:
    """model.keras; for a model Keras cannot serialise (a custom layer or
    schedule without get_config()), model.weights.h5, since training itself
    went as in Keras.

    Returns:
        None when model.keras was written, else what was not written and why.
    """
    if not model.built:
        # A model with its own train_step may never be called (keras.io's VAE
        # and GAN): Keras saves neither it nor its weights.
        return (f"model.keras (model {model.name!r} was never built: its own train_step never calls it, and Keras "
                "saves no unbuilt model; save the models it trains, or build it with model.build(input_shape))")
    try:
        save_model(model, folder / "model.keras")
        return None
    except OSError:
        raise
    except Exception as error:  # noqa: BLE001 - Keras raises several kinds when serialising
        weights = replace_durably(folder / "model.weights.h5", model.save_weights, keep_suffix=True)
        detail = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
        return (f"model.keras (Keras cannot save the model: {type(error).__name__}: {detail}; its trained weights "
                f"are in {weights.name}: give the object named there a get_config() to save the whole model)")


def _write_run_files(folder, result: FitResult, model) -> tuple[list[str], bool]:
    """history.json, result.json, timeline.json, pruning.json and model.keras,
    each durable (flushed, then renamed into place).

    Returns:
        What could not be written and why (disk full, permissions, a model
        Keras cannot save), each file tried whatever failed before it; and
        whether a write failed (which writing again may mend).
    """
    files = {"history.json": result.history.history, "result.json": result.summary(),
             "timeline.json": result.timeline, "pruning.json": result.pruning}
    unwritten = []
    for name, content in files.items():
        if content is None:
            continue
        try:
            write_json(folder / name, content)
        except OSError as error:
            unwritten.append(f"{name} ({error.strerror or error})")
    failed_writes = bool(unwritten)
    if model is not None:
        try:
            unwritten.append(_save_model_or_weights(model, folder))
        except OSError as error:
            unwritten.append(f"model.keras ({error.strerror or error})")
            failed_writes = True
    return [entry for entry in unwritten if entry is not None], failed_writes


def _warn_unwritten(folder, unwritten: list[str], backup) -> None:
    """A finished run keeps its result: what its folder lacks is a warning."""
    kept = (f"the trained state is kept in {backup.path}: re-run the same command to write the files again "
            "without retraining. Free space or fix permissions there, or pass another run_dir=")\
        if backup is not None and backup.path.is_file() else "the trained model is the one this call returned"
    warnings.warn(RunFolderWarning(
        f"kerasfast: training finished, but in {folder}: {'; '.join(unwritten)} not written; {kept}."), stacklevel=4)
