"""The optimizer a plan asks for: its learning rate or schedule, dynamic
loss scaling (Keras's own `LossScaleOptimizer`) for float16, and Adam's
update as one fused op per weight.

Gradient accumulation is not the optimizer's here: Keras's
`gradient_accumulation_steps` fails under tf.distribute (keras issue
20582), so kerasfast's step functions accumulate in per-replica variables
and apply the sum (`kerasfast/training/step_functions.py`).
"""

from __future__ import annotations

import contextlib
import math
import weakref

import keras

from kerasfast import _compat
from kerasfast.plan import DEFAULT_LEARNING_RATE, HOLD_FRACTION, Plan
from kerasfast.training.schedules import OneCycle, StartingAt, WarmupHoldCosine, warmup_cosine

# AdamW's decoupled weight decay for the default optimizer (Loshchilov &
# Hutter use 1e-2 with Adam's defaults).
DEFAULT_WEIGHT_DECAY = 0.01
# Keras's own Adam family (not subclasses, which may change the update): the
# moments and bias-corrected step of their `update_step` are what
# TensorFlow's ResourceApplyAdam kernel computes, for these weight dtypes.
FUSED_UPDATE_CLASSES = (keras.optimizers.Adam, keras.optimizers.AdamW)
FUSED_UPDATE_DTYPES = ("float32", "float64")
# The optimizers kerasfast made (`default_optimizer`), told apart from the
# user's when a model trained by kerasfast comes back to fit.
_KERASFASTS_OWN = weakref.WeakSet()


def own_optimizers(model) -> dict:
    """The optimizers a model holds besides `model.optimizer`, which its own
    train_step uses (keras.io's GAN, WGAN and CycleGAN examples keep one per
    sub-model, as `self.d_optimizer`, `self.g_optimizer`).

    Args:
        model: A Keras model.

    Returns:
        `{attribute name: optimizer}`, in the order the attributes were set
        (the model's constructor and compile: the same in every run), each
        optimizer once.
    """
    found, seen = {}, {id(getattr(model, "optimizer", None))}
    for name, value in vars(model).items():
        if isinstance(value, keras.optimizers.Optimizer) and id(value) not in seen:
            seen.add(id(value))
            found[name] = value
    return found


def unwrap(optimizer):
    """The optimizer inside a `LossScaleOptimizer`, or the optimizer itself."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


def constant_learning_rate(optimizer) -> float | None:
    """The optimizer's learning rate if it is a constant, else None."""
    rate = _compat.learning_rate_store(unwrap(optimizer))
    if isinstance(rate, keras.Variable):
        return float(keras.ops.convert_to_numpy(rate))
    return float(rate) if isinstance(rate, (int, float)) else None


def learning_rate_schedule(plan: Plan):
    """The learning rate (a float or a schedule) the plan describes."""
    if plan.lr_schedule == "warmup_cosine":
        return warmup_cosine(plan.learning_rate, plan.total_steps, plan.warmup_steps)
    if plan.lr_schedule == "warmup_hold_cosine":
        return WarmupHoldCosine(plan.learning_rate, plan.total_steps, plan.warmup_steps,
                                max(plan.warmup_steps, int(plan.total_steps * HOLD_FRACTION)))
    if plan.lr_schedule == "one_cycle":
        return OneCycle(plan.learning_rate, plan.total_steps)
    return plan.learning_rate


def default_optimizer():
    """kerasfast's optimizer for a model compiled without one: AdamW, whose
    learning rate becomes the plan's once the run is planned (`take_plans_rate`)."""
    optimizer = keras.optimizers.AdamW(learning_rate=DEFAULT_LEARNING_RATE, weight_decay=DEFAULT_WEIGHT_DECAY)
    _KERASFASTS_OWN.add(optimizer)
    return optimizer


def is_kerasfasts_own(optimizer) -> bool:
    """Whether `optimizer` is one kerasfast made for a model compiled without one
    (a later fit plans its learning rate afresh, as for an uncompiled model)."""
    return isinstance(optimizer, keras.optimizers.Optimizer) and unwrap(optimizer) in _KERASFASTS_OWN


def take_plans_rate(optimizer, plan: Plan) -> None:
    """Gives kerasfast's own optimizer (`default_optimizer`) the plan's learning rate or schedule, for good."""
    _compat.replace_learning_rate(unwrap(optimizer), learning_rate_schedule(plan))


def settle_after_run(optimizer, plan: Plan) -> None:
    """kerasfast's own optimizer after its run keeps the run's peak rate as a
    constant: the run's schedule has ended (warm-up and cosine end at 0), and
    a later `model.fit` must train, and a callback set the rate, as after
    Keras's own compile."""
    inner = unwrap(optimizer)
    if not isinstance(_compat.learning_rate_store(inner), keras.Variable):
        _compat.replace_learning_rate(inner, plan.learning_rate)


def copy_of(optimizer):
    """A fresh optimizer of the same class and configuration (no state)."""
    return copier(optimizer)()


def copier(optimizer):
    """A function making fresh copies of `optimizer` (`copy_of`), its configuration read now.

    Read it outside a strategy's scope when the copy is made inside one: an
    optimizer made under another strategy (the user's own MirroredStrategy)
    cannot have its variables read there ("Mixing different
    tf.distribute.Strategy objects").
    """
    template = keras.optimizers.get(optimizer) if isinstance(optimizer, str) else optimizer
    rate = _compat.learning_rate_store(unwrap(template))
    own = is_kerasfasts_own(template)
    if isinstance(rate, keras.Variable):
        config, schedule = template.get_config(), None
    else:
        # A schedule (or callable) is shared, not serialised: the user's own
        # schedule class need not have a get_config() for Keras to train with it.
        with _compat.learning_rate_hidden(unwrap(template)):
            config, schedule = template.get_config(), rate

    def copy():
        fresh = template.__class__.from_config(config)
        if schedule is not None:
            unwrap(fresh).learning_rate = schedule
        if own:
            _KERASFASTS_OWN.add(unwrap(fresh))
        return fresh

    return copy


def planned_learning_rate(plan: Plan, start_step: int = 0, optimizer=None):
    """The learning rate kerasfast sets on the user's optimizer, or None to keep its own.

    With the optimizer's own schedule, the plan's rate is set only when it
    differs from the optimizer's (the user's `learning_rate=`, or one scaled
    for `batch_size="auto"` or found by the range test). A planned schedule
    spans this run's updates: for an optimizer that already made
    `start_step` updates (an earlier fit of the same model) it starts at that
    step instead of running on from the earlier run's end.
    """
    if plan.lr_schedule == "optimizer's own":
        own = constant_learning_rate(optimizer) if optimizer is not None else None
        if plan.learning_rate is None or (own is not None and math.isclose(own, plan.learning_rate, rel_tol=1e-6)):
            return None
    rate = learning_rate_schedule(plan)
    if start_step and isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        return StartingAt(rate, start_step)
    return rate


def loss_scaling(optimizer, plan: Plan):
    """A dynamic `LossScaleOptimizer` around `optimizer` for a float16 plan, else None.

    It applies the user's optimizer (whose state keeps training) and is
    dropped after the run, so the model keeps the optimizer it was given.
    """
    if plan.precision != "mixed_float16" or optimizer is None:
        return None
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return None
    return keras.optimizers.LossScaleOptimizer(optimizer)


def fuses_update(optimizer) -> bool:
    """Whether `fused_update` runs `optimizer`'s per-weight update as one op:
    Keras's own Adam or AdamW (inside a `LossScaleOptimizer` too), without amsgrad."""
    inner = unwrap(optimizer)
    return type(inner) in FUSED_UPDATE_CLASSES and not inner.amsgrad


@contextlib.contextmanager
def fused_update(optimizer):
    """Inside the block, `optimizer` updates each weight with one `ResourceApplyAdam` op.

    Keras's Adam builds about fifteen graph ops per weight (moments, bias
    correction, the step), which every trace of a train step creates and
    every step without XLA runs one by one; TensorFlow's kernel does the same
    arithmetic in one op. The GPT recipe's first train step (54 weights)
    takes about 1.4 s less CPU (docs/benchmarks.md, "Start-up"). The results agree
    with Keras's update to float32 rounding (the kernel forms `1 - beta_1` in
    float32). Weight decay, clipping, loss scaling and the iteration count
    stay Keras's, around the update. Optimizers other than Keras's own Adam
    and AdamW (`fuses_update`), weights of other dtypes and sparse
    (embedding) gradients keep Keras's update; the optimizer is itself again after the block.

    Example:

    >>> with fused_update(model.optimizer):  # doctest: +SKIP
    ...     model.train_function = tf.function(train_step)
    """
    if optimizer is None or not fuses_update(optimizer) or "update_step" in vars(unwrap(optimizer)):
        yield  # not an Adam of Keras's, or its update_step already replaced (an outer block, or the user)
        return
    inner = unwrap(optimizer)
    inner.update_step = _fused_adam_step(inner)
    try:
        yield
    finally:
        del inner.update_step


def _fused_adam_step(optimizer):
    """Keras Adam's `update_step(gradient, variable, learning_rate)` as one `ResourceApplyAdam` op."""
    import tensorflow as tf

    ops = keras.ops
    keras_step = type(optimizer).update_step

    def update_step(gradient, variable, learning_rate):
        dtype = tf.as_dtype(variable.dtype).name
        if dtype not in FUSED_UPDATE_DTYPES or isinstance(gradient, tf.IndexedSlices):
            # Keras moves the moments of an embedding's sparse gradient on the rows it touches only.
            return keras_step(optimizer, gradient, variable, learning_rate)
        m, v = _compat.adam_moments(optimizer, variable)
        local_step = ops.cast(optimizer.iterations + 1, dtype)
        beta_1, beta_2 = ops.cast(optimizer.beta_1, dtype), ops.cast(optimizer.beta_2, dtype)
        # Under tf.distribute this runs in Strategy.update(): each handle is this replica's copy.
        return tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=m.value.handle, v=v.value.handle,
            beta1_power=ops.power(beta_1, local_step), beta2_power=ops.power(beta_2, local_step),
            lr=ops.cast(learning_rate, dtype), beta1=beta_1, beta2=beta_2, epsilon=ops.cast(optimizer.epsilon, dtype),
            grad=ops.cast(gradient, dtype))

    return update_step
