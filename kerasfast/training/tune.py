"""The tuning phase: candidate plans timed on the model as it will train
(`kerasfast.training.tuning`), or the choice cached by an earlier run; the
steps tuning compiled for the chosen plan are the ones training runs."""

from __future__ import annotations

import dataclasses

from kerasfast import costs
from kerasfast.distribute.consensus import chief_value, on_every_worker
from kerasfast.plan import PRECISIONS, TUNED_FIELDS, Plan, candidate_plans, compute_dtype
from kerasfast.training import tuning
from kerasfast.training.run import Run


def tune(run: Run) -> None:
    """`run.plan` as it trains (tuned, or the cached choice) and the steps
    tuning compiled for it (`run.measured`). Runs inside the run's
    `session.borrowed` block, so that the steps read the run's learning rate."""
    args, plan = run.args, run.plan
    if args.tune == "off" or plan.train_step != "kerasfast" or run.progress is not None:
        return
    user_set = set(args.overrides.user_set()) | set(plan.overridden)
    if run.run_facts.user_batch_callbacks:
        user_set.add("steps_per_execution")  # those callbacks must see every batch, whatever was tuned before
    fields = [name for name in TUNED_FIELDS if name not in user_set]
    if not fields:
        return
    key = tuning.cache_key(run.train_model, run.train_data.sample_inputs, plan, run.hardware)
    cached = tuning.cached_choice(key) if run.is_chief else None
    if run.distribution.name == "multi_worker":
        cached = _chiefs_choice(run.distribution, cached)  # workers' caches may differ: the chief's decides
    if cached is not None:
        choices, path = cached
        run.plan = _chosen(plan, fields, _within_epoch(choices, plan.steps_per_epoch), f"tuned earlier: cached in {path}")
        return
    budget = tuning.budget_seconds(args.tune, _estimated_run_seconds(run), args.tune_budget_s)
    if budget is None:
        return
    candidates = candidate_plans(plan, run.hardware, run.model_facts, run.run_facts, mode=args.tune,
                                 user_set=tuple(user_set))
    if len(candidates) > 1:
        _measured(run, candidates, budget, key, fields)


def _measured(run: Run, candidates: list[Plan], budget: float, key: str, fields: list[str]) -> None:
    import tensorflow as tf

    distribution = run.distribution
    batches = _timing_batches(run.train_data, 2 * max(c.steps_per_execution for c in candidates))
    agree = (lambda flag: chief_value(distribution, float(flag)) > 0.5) if distribution.name == "multi_worker" else None
    tuned = tuning.tune_plan(run.train_model, candidates, run.strategy or tf.distribute.get_strategy(), batches,
                             budget_s=budget, agree=agree)
    table = tuned.table
    # Timings differ between workers: the chief's choice is everyone's.
    index = int(round(chief_value(distribution, float(candidates.index(tuned.plan)))))
    measured = tuned.compiled.get(index)
    if distribution.name == "multi_worker" and not on_every_worker(distribution, measured is not None):
        measured = None  # workers must compile alike, or their collectives would not pair up
    if run.is_chief:
        tuning.store_choice(key, table[index], table)
    reason = (f"tuned: {table[index].samples_per_second:,.0f} samples/s, fastest of {len(candidates)} candidates "
              "measured on your model")
    plan = _chosen(run.plan, fields, table[index].choices(), reason)
    plan = plan.with_choice("tuning", tuple(dataclasses.asdict(row) for row in table), None)
    run.plan = plan.with_choice("tuning_seconds", tuned.seconds, None)
    run.measured = measured


def _within_epoch(choices: dict, steps_per_epoch: int | None) -> dict:
    """A cached choice for this run: steps per execution at most its epoch's steps (the choice may come
    from a run with longer, or unknown, epochs), as the plan's own rule caps them."""
    spe = choices.get("steps_per_execution")
    if steps_per_epoch and spe and spe > steps_per_epoch:
        return {**choices, "steps_per_execution": steps_per_epoch}
    return choices


def _timing_batches(train_data, count: int):
    """`count` batches to time the candidates on, without taking any from a stream that is read once."""
    import tensorflow as tf

    if train_data.replayable:
        return train_data.dataset.take(count).cache()
    # A generator's batches are read once: time on its first batch (which Keras's adapter peeked and kept),
    # since every batch taken here would be one training never sees.
    return tf.data.Dataset.from_tensors(train_data.sample_batch).repeat(count)


def _chosen(plan: Plan, fields: list[str], choices: dict, reason: str) -> Plan:
    for name in fields:
        plan = plan.with_choice(name, choices[name], reason)
    return plan


def _chiefs_choice(distribution, cached):
    """The chief's cached tuning choice `(choices, path)` on every worker, or None.

    Each value crosses as a number through `chief_value` (a collective:
    every worker makes the same calls, in `TUNED_FIELDS`' order).
    """
    if chief_value(distribution, float(cached is not None)) < 0.5:
        return None
    choices = cached[0] if cached is not None else {}
    agreed = {name: _decoded(name, chief_value(distribution, _encoded(name, choices.get(name))))
              for name in TUNED_FIELDS}
    return agreed, cached[1] if cached is not None else "the chief's cache"


def _encoded(name: str, value) -> float:
    """A tuned field's value as a number (a worker without the choice sends 0)."""
    if value is None:
        return 0.0
    return float(PRECISIONS.index(value)) if name == "precision" else float(value)


def _decoded(name: str, number: float):
    if name == "precision":
        return PRECISIONS[int(round(number))]
    if name == "jit_compile":
        return number > 0.5
    return int(round(number))


def _estimated_run_seconds(run: Run) -> float | None:
    """The planned run's length from its FLOPs and the measured peak, if both are known."""
    plan = run.plan
    flops, peak = run.model_facts.forward_flops_per_sample, run.run_facts.peak_flops
    if callable(peak):  # a run whose plan did not need the peak is not timed for tuning alone
        peak = peak.measured(compute_dtype(plan.precision))
    if not (flops and peak and plan.total_steps and plan.global_batch_size):
        return None
    per_step = costs.TRAIN_STEP_FLOPS_PER_FORWARD * flops * plan.global_batch_size / peak
    return plan.total_steps * plan.grad_accum_steps * per_step
