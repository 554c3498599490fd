"""Making every worker of a job resolve the same plan.

Workers resolve their plans independently, and a plan that differs between
workers (one timed a matmul faster and chose other steps per execution, or
runs on other hardware) makes their collectives mismatch and the job die
with an obscure shape error. `chief_value` replaces a measured input of the
plan by the chief's, and `check_same_plan` refuses, on every worker and
before training, a plan that still differs.
"""

from __future__ import annotations

import hashlib
import json

from kerasfast.errors import PlanError


def _all_reduce(distribution, values, op):
    import tensorflow as tf

    strategy = distribution.strategy
    local = tf.constant(values, dtype=tf.float64)
    per_replica = strategy.run(lambda: tf.identity(local))
    return strategy.reduce(op, per_replica, axis=None).numpy()


def _local_replicas(distribution) -> int:
    return max(1, distribution.num_replicas // distribution.cluster.num_workers)


def chief_value(distribution, value: float) -> float:
    """The chief's `value`, on every worker (a collective: call it on all)."""
    import tensorflow as tf

    if distribution.name != "multi_worker":
        return value
    mine = [value if distribution.is_chief else 0.0]
    total = _all_reduce(distribution, mine, tf.distribute.ReduceOp.SUM)
    return float(total[0]) / _local_replicas(distribution)


def on_every_worker(distribution, flag: bool) -> bool:
    """Whether `flag` holds on every worker (a collective: call it on all)."""
    import tensorflow as tf

    if distribution.name != "multi_worker":
        return flag
    total = _all_reduce(distribution, [float(flag)], tf.distribute.ReduceOp.SUM)
    return float(total[0]) / _local_replicas(distribution) > distribution.cluster.num_workers - 0.5


def plan_fingerprint(plan) -> float:
    """A number that differs when two plans' values differ (reasons ignored)."""
    fields = {name: field["value"] for name, field in plan.to_dict()["fields"].items()
              if name not in ("intra_op_threads", "inter_op_threads")}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()
    return float(int(digest[:12], 16))  # exact in float64


def check_same_plan(distribution, plan) -> None:
    """Raises `PlanError` on every worker when the workers' plans differ.

    Thread counts may differ (they are local); every other field must match.
    """
    import tensorflow as tf

    if distribution.name != "multi_worker":
        return
    mine = plan_fingerprint(plan)
    differs = float(chief_value(distribution, mine) != mine)
    # Every worker learns whether any worker differs, so all stop together.
    if _all_reduce(distribution, [differs], tf.distribute.ReduceOp.SUM)[0] > 0:
        raise PlanError(
            f"the workers resolved different plans (worker {distribution.cluster.index}: precision="
            f"{plan.precision}, jit_compile={plan.jit_compile}, steps_per_execution={plan.steps_per_execution}, "
            f"global_batch_size={plan.global_batch_size}), so their collectives would not match. Are the "
            "machines different? Set precision=, jit_compile= and steps_per_execution= explicitly."
        )
