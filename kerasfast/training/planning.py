"""The plan phase: `resolve_plan`, once, from the run's facts and findings,
and the one check of the plan that trains (XLA on this model, a resumed
backup's choices, the same plan on every worker)."""

from __future__ import annotations

import dataclasses
import json
import re

import keras

from kerasfast.distribute.consensus import check_same_plan
from kerasfast.distribute.strategy import scope_of
from kerasfast.errors import PlanError
from kerasfast.plan import COMPUTATION_FIELDS, RUN_LENGTH_SCHEDULES, Plan, resolve_attention, resolve_plan
from kerasfast.training import model_setup
from kerasfast.training.run import Run
from kerasfast.training.xla import xla_problem


def plan_run(run: Run) -> None:
    """`run.plan`: every choice resolved once, then checked (`check`)."""
    args, distribution = run.args, run.distribution
    overrides, fine_tune = args.overrides, _fine_tune(run)
    if fine_tune is not None:
        overrides = fine_tune.applied_to(overrides)
    plan = resolve_plan(run.hardware, model=run.model_facts, data=run.train_data.facts, run=run.run_facts,
                        overrides=overrides, num_replicas=distribution.num_replicas, strategy_name=distribution.name,
                        strategy_reason=distribution.reason, found=run.findings)
    if fine_tune is not None:
        plan = fine_tune.described(plan)
    if args.prune is not None:
        plan = _with_pruning(plan, args.prune, run.model_facts)
    model_setup.compile_once(run)
    run.plan = check(run, plan)
    model_setup.take_plan(run)


def _fine_tune(run: Run):
    """Pruning a trained model fine-tunes it at its own learning rate (`kerasfast.compress.finetune`)."""
    args = run.args
    if args.prune is None or args.find_rate:
        return None
    from kerasfast.compress.finetune import fine_tune_rate

    optimizer = args.optimizer if args.optimizer is not None else getattr(run.prepared.user_model, "optimizer", None)
    return fine_tune_rate(optimizer, learning_rate=args.overrides.learning_rate,
                          lr_schedule=args.overrides.lr_schedule)


def _with_pruning(plan: Plan, prune, model_facts) -> Plan:
    if plan.train_step != "kerasfast":
        raise PlanError(
            f"prune= follows the updates of kerasfast's own train step, but {model_facts.custom_train_step or 'your model'} "
            "runs its own: prune after training with kerasfast.compress.prune(model, ...), or drop prune=."
        )
    from kerasfast.compress import pruning_for_run

    if not plan.total_steps:
        raise PlanError("prune= needs the run's length: pass steps_per_epoch= for a dataset of unknown length.")
    config = pruning_for_run(prune, plan.total_steps)
    return plan.with_choice("prune", config.target_sparsity, describe_pruning(config), yours=True)


def describe_pruning(config) -> str:
    structured = f", {config.structured} structured" if config.structured else ""
    if config.schedule == "polynomial":
        when = f"from {config.initial_sparsity:g} at update {config.begin_step} to update {config.end_step}"
    else:
        when = f"{config.schedule} from update {config.begin_step}"
    return f"magnitude pruning {when}, masks every {config.frequency} updates{structured}"


def check(run: Run, plan: Plan) -> Plan:
    """The one check of the plan that trains: XLA on this model (off, with
    the reason, when chosen automatically and it cannot compile), a resumed
    backup's computation, and every worker's plan alike.

    Raises:
        PlanError: For XLA the user asked for that cannot compile the model,
            a resumed backup whose plan computes differently (unless
            `resume="force"`), or workers whose plans differ.
    """
    _check_against_the_optimizer(plan, run.train_model.optimizer)
    if plan.jit_compile and plan.train_step == "kerasfast":
        with scope_of(run.strategy):
            plan = checked_jit(plan, run.train_model, run.train_data.sample_inputs)
    plan = plan.with_choice("attention", *resolve_attention(plan.jit_compile, run.hardware, run.run_facts))
    if run.progress is not None:
        _check_resumable(run, plan)
    check_same_plan(run.distribution, plan)
    return plan


def _check_against_the_optimizer(plan: Plan, optimizer) -> None:
    """Refuses the plan's clipping or accumulation where the optimizer does its own of the same kind: the run
    would silently set the optimizer's aside (Keras allows one clipping per optimizer) or multiply the two
    accumulations (a larger effective batch than the plan states)."""
    if optimizer is None:
        return
    from kerasfast.training.optimizers import unwrap

    inner = unwrap(optimizer)
    own_clipping = [f"{name}={getattr(inner, name)}" for name in ("clipnorm", "clipvalue", "global_clipnorm")
                    if getattr(inner, name, None) is not None]
    if plan.clipnorm is not None and own_clipping:
        raise PlanError(
            f"clipnorm={plan.clipnorm} clips the gradient's global norm, but the optimizer {inner.name!r} clips it "
            f"already ({', '.join(own_clipping)}); Keras allows one clipping per optimizer. Pass clipnorm= to fit, "
            "or keep the optimizer's own clipping and leave fit's clipnorm= out.")
    own_accumulation = getattr(inner, "gradient_accumulation_steps", None) or 1
    if plan.grad_accum_steps > 1 and own_accumulation > 1:
        raise PlanError(
            f"grad_accum_steps={plan.grad_accum_steps} accumulates gradients, and the optimizer {inner.name!r} does "
            f"too (gradient_accumulation_steps={own_accumulation}): together they would update every "
            f"{plan.grad_accum_steps * own_accumulation} steps. Pass grad_accum_steps= to fit (it works under "
            "every strategy), or keep the optimizer's own and leave fit's out.")


def checked_jit(plan: Plan, model, sample_inputs) -> Plan:
    """The plan, with XLA off when it cannot compile the model (chosen
    automatically), or a refusal naming the op (asked for by the user)."""
    problem = xla_problem(model, sample_inputs)
    if problem is None:
        return plan
    if "jit_compile" in plan.overridden:
        raise PlanError(f"jit_compile=True cannot work: {problem}. Pass jit_compile=False (or 'auto'), or replace "
                        "the op with one XLA supports.")
    return plan.with_choice("jit_compile", False, f"off: {problem}")


def _check_resumable(run: Run, plan: Plan) -> None:
    """Refuses to resume a backup whose recorded plan computes differently."""
    recorded = run.progress.plan
    if not recorded:
        return
    changed = [name for name in COMPUTATION_FIELDS if name in recorded and recorded[name] != getattr(plan, name)]
    if "total_steps" in changed and plan.lr_schedule not in RUN_LENGTH_SCHEDULES and not plan.prune:
        changed.remove("total_steps")  # nothing follows the run's length: a longer run computes its steps alike
    differences = _epochs_difference(run, plan, changed)
    differences += [f"{name} {getattr(plan, name)!r} (the backup's run: {recorded[name]!r})" for name in changed]
    differences += _argument_differences(run)
    if not differences:
        return
    message = (f"this run would resume the backup in {run.backup.directory}, but its arguments change what "
               f"training computes: {'; '.join(differences)}")
    if run.args.resume == "force":
        if run.is_chief:
            print(f"kerasfast: resume='force': {message}. Resuming anyway.")
        return
    raise PlanError(f"{message}. Re-run with the same arguments to resume exactly, resume='force' to resume anyway, "
                    "or resume='fresh' to start again (command line: --resume force, --resume fresh).")


def _epochs_difference(run: Run, plan: Plan, changed: list[str]) -> list[str]:
    """`epochs`, named first where it is what moved the schedule's `total_steps`
    (the updates of the whole run, which a resumed schedule carries on)."""
    recorded = run.progress.plan
    same_epoch = all(recorded.get(name) == getattr(plan, name) for name in ("steps_per_epoch", "grad_accum_steps"))
    if "total_steps" not in changed or not same_epoch or not recorded.get("total_steps") or not plan.total_steps:
        return []
    recorded_epochs = round(recorded["total_steps"] * plan.grad_accum_steps / plan.steps_per_epoch)
    return [f"epochs {run.args.epochs} (the backup's run: {recorded_epochs}), which sets the schedule's length"]


def recorded_arguments(run: Run) -> dict:
    """What of the run's arguments a backup records beside the seed, for a resume to check: the data
    order (`shuffle`), the loss and the class weights (JSON values)."""
    class_weight = run.feed.class_weight
    return {"shuffle": run.feed.shuffle, "loss": _loss_description(run.train_model.loss),
            "class_weight": None if class_weight is None else
            {str(label): float(weight) for label, weight in sorted(class_weight.items())}}


def _loss_description(loss) -> str:
    """The loss as text that changes when what it computes does (a class and its settings, a function's name)."""
    if isinstance(loss, dict):
        return "{" + ", ".join(f"{name}: {_loss_description(part)}" for name, part in sorted(loss.items())) + "}"
    if isinstance(loss, (list, tuple)):
        return "[" + ", ".join(_loss_description(part) for part in loss) + "]"
    if isinstance(loss, keras.losses.Loss):
        settings = {key: value for key, value in loss.get_config().items() if key not in ("name", "dtype")}
        # An object's default text holds its address, which differs between the run and its resume.
        text = json.dumps(settings, sort_keys=True, default=lambda value: re.sub(r" at 0x[0-9a-fA-F]+", "", str(value)))
        return f"{type(loss).__name__}({text})"
    return getattr(loss, "__name__", None) or str(loss)


def _argument_differences(run: Run) -> list[str]:
    """The recorded arguments (its seed, `recorded_arguments`) this run changes; a backup that did not
    record one is not checked for it."""
    progress, differences = run.progress, []
    if run.args.seed is not None and run.args.seed != progress.seed:
        differences.append(f"seed {run.args.seed!r} (the backup's run: {progress.seed!r})")
    for name, value in recorded_arguments(run).items():
        recorded = progress.signature.get(name, value)
        if recorded != value:
            differences.append(f"{name} {value!r} (the backup's run: {recorded!r})")
    return differences


def pruning_start(run: Run):
    """The run's pruning configuration, counted from this run's first
    optimizer update (an optimizer carries its count over from earlier fits)."""
    from kerasfast.compress import pruning_for_run

    config = pruning_for_run(run.args.prune, run.plan.total_steps)
    done = int(keras.ops.convert_to_numpy(run.train_model.optimizer.iterations))
    if done and config.end_step is not None:
        config = dataclasses.replace(config, begin_step=config.begin_step + done, end_step=config.end_step + done)
    return config
