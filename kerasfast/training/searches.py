"""The searches: `batch_size="auto"` and `learning_rate="find"` measure the
model on the prepared data and give the plan a fact (`Findings`); they never
plan, and they re-batch the prepared data rather than read it again."""

from __future__ import annotations

import dataclasses

from kerasfast import costs
from kerasfast.distribute.consensus import chief_value
from kerasfast.errors import PlanError
from kerasfast.plan import resolve_computation
from kerasfast.training import feed, model_setup
from kerasfast.training.facts import sample_shape
from kerasfast.training.model_setup import kerasfasts_own_step
from kerasfast.training.run import Run


def run_searches(run: Run) -> None:
    """The batch size, then the learning rate at that batch, as the run asked."""
    if run.args.auto_batch or run.args.find_rate:
        model_setup.compile_once(run)  # both train real steps
    if run.args.auto_batch:
        _find_batch_size(run)
    if run.args.find_rate:
        _find_learning_rate(run)


def _find_batch_size(run: Run) -> None:
    from kerasfast.training import batch_size as batch_search

    train_data = run.train_data
    if train_data.facts.batch_size is not None:
        raise PlanError(f"batch_size='auto' cannot re-batch {train_data.description}, which comes batched: pass "
                        "unbatched data (arrays, TFRecords, or dataset.unbatch()) or leave batch_size out.")
    if not kerasfasts_own_step(run.model_facts):
        raise PlanError("batch_size='auto' measures kerasfast's own train step, but your model runs "
                        f"{run.model_facts.custom_train_step or 'eagerly'}: pass batch_size= yourself.")
    recorded = run.findings.recorded
    if "global_batch_size" in recorded:
        found = batch_search.BatchSizeFinding(int(recorded["global_batch_size"]),
                                              "as recorded by the backup this run resumes", [])
    else:
        found = _measured_batch_size(run)
    run.findings = dataclasses.replace(run.findings, batch_size=found.batch_size, batch_reason=found.reason)
    feed.rebatch(run, found.batch_size)


def _measured_batch_size(run: Run):
    from kerasfast.training import batch_size as batch_search

    distribution, model = run.distribution, run.train_model
    shapes, dtypes = sample_shape(run.train_data.sample_inputs)
    agree = (lambda flag: chief_value(distribution, float(flag)) > 0.5) \
        if distribution.name == "multi_worker" else None

    def computation_at(batch: int):
        return resolve_computation(run.hardware, model=run.model_facts, data=run.train_data.facts,
                                   run=run.run_facts, overrides=run.args.overrides,
                                   num_replicas=distribution.num_replicas, strategy_name=distribution.name,
                                   global_batch=batch)

    def make_batches(batch: int):
        return run.train_data.rebatched(batch, shuffle=False).dataset.take(2).cache()

    found = batch_search.find_batch_size(
        model, computation_at, run.strategy or _default_strategy(), make_batches,
        num_samples=run.train_data.facts.num_samples, accelerator=run.hardware.accelerator,
        num_replicas=distribution.num_replicas,
        bytes_per_sample=costs.activation_bytes_per_sample(model, shapes, dtypes), agree=agree)
    found.batch_size = int(round(chief_value(distribution, float(found.batch_size))))
    return found


def _default_strategy():
    import tensorflow as tf

    return tf.distribute.get_strategy()


def _find_learning_rate(run: Run) -> None:
    """`learning_rate="find"`: the range test's suggestion, or a refusal saying why there is none."""
    from kerasfast.training.lr_finder import find_learning_rate

    if run.distribution.name == "multi_worker":
        raise PlanError("learning_rate='find' runs the range test in one process: run "
                        "kerasfast.find_learning_rate(model, x, y) on one machine first and pass the rate it suggests.")
    if not run.train_data.replayable:
        raise PlanError("learning_rate='find' trains its range test on batches of the training data, and a Python "
                        "generator's batches are read once: training would never see them. Pass the data as arrays, "
                        "a tf.data.Dataset or a keras.utils.PyDataset, or run kerasfast.find_learning_rate(model, "
                        "other_generator) first and pass the rate it suggests as learning_rate=.")
    finding = find_learning_rate(run.train_model, run.train_data.dataset, seed=run.seed)
    if finding.suggestion is None:
        raise PlanError(f"learning_rate='find' found no rate to suggest: {finding.reason} Pass learning_rate= "
                        "yourself, or run kerasfast.find_learning_rate with other min_lr/max_lr/num_steps.")
    run.rate_finding = finding
    run.findings = dataclasses.replace(run.findings, learning_rate=finding.suggestion,
                                       learning_rate_reason=finding.reason)
