"""The optimizer a plan asks for.

Keras optimizers already implement gradient accumulation
(`gradient_accumulation_steps`), clipping (`global_clipnorm`) and dynamic
loss scaling (`LossScaleOptimizer`); this module only configures them from
the plan, so that the same settings hold whatever optimizer the user gave.
"""

from __future__ import annotations

import keras

from kerasfast.plan import Plan
from kerasfast.training.schedules import OneCycle, warmup_cosine

# AdamW's decoupled weight decay for the default optimizer (Loshchilov &
# Hutter use 1e-2 with Adam's defaults).
DEFAULT_WEIGHT_DECAY = 0.01


def unwrap(optimizer):
    """The optimizer inside a `LossScaleOptimizer`, or the optimizer itself."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


def constant_learning_rate(optimizer) -> float | None:
    """The optimizer's learning rate if it is a constant, else None."""
    optimizer = unwrap(optimizer)
    rate = optimizer.get_config().get("learning_rate")
    return float(rate) if isinstance(rate, (int, float)) else None


def learning_rate_schedule(plan: Plan):
    """The learning rate (a float or a schedule) the plan describes."""
    if plan.lr_schedule == "warmup_cosine":
        return warmup_cosine(plan.learning_rate, plan.total_steps, plan.warmup_steps)
    if plan.lr_schedule == "one_cycle":
        return OneCycle(plan.learning_rate, plan.total_steps)
    return plan.learning_rate


def build_optimizer(plan: Plan, user_optimizer=None, *, accumulate: bool = True):
    """Creates the optimizer for a run.

    The user's optimizer is re-created from its config (so that it is fresh
    and built for the model being trained) with the plan's accumulation,
    clipping and schedule; without one, AdamW with the plan's schedule.

    Args:
        plan: The resolved plan.
        user_optimizer: A Keras optimizer instance, its name (e.g. "adam"),
            or None.
        accumulate: Let the optimizer accumulate gradients (single device);
            False when kerasfast's distributed steps accumulate them.

    Returns:
        A Keras optimizer; wrapped in a dynamic `LossScaleOptimizer` when the
        plan's precision is mixed_float16.
    """
    if user_optimizer is None:
        optimizer = keras.optimizers.AdamW(learning_rate=learning_rate_schedule(plan), weight_decay=DEFAULT_WEIGHT_DECAY)
    else:
        template = keras.optimizers.get(user_optimizer) if isinstance(user_optimizer, str) else unwrap(user_optimizer)
        config = template.get_config()
        if plan.lr_schedule != "optimizer's own" or plan.learning_rate is not None and "learning_rate" in plan.overridden:
            config["learning_rate"] = learning_rate_schedule(plan)
        optimizer = template.__class__.from_config(config)
    optimizer.gradient_accumulation_steps = plan.grad_accum_steps if accumulate and plan.grad_accum_steps > 1 else None
    if plan.clipnorm is not None:
        optimizer.clipnorm = None
        optimizer.clipvalue = None
        optimizer.global_clipnorm = plan.clipnorm
    if plan.precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
