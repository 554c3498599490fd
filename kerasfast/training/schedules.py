"""Learning-rate schedules: linear warm-up + cosine decay, warm-up + hold +
cosine decay, and one-cycle.

All are ordinary `keras.optimizers.schedules.LearningRateSchedule`s, so
they work with any Keras optimizer and save with the model. Warm-up + cosine
is Keras's own `CosineDecay` with a warm-up target; warm-up + hold + cosine
(a "warmup-stable-decay" schedule, what a pruning fine-tune runs at) and
one-cycle (Smith & Topin, 2018), which Keras lacks, are small serialisable
schedules here.
"""

from __future__ import annotations

import math

import keras
from keras import ops


def warmup_cosine(peak_learning_rate: float, total_steps: int, warmup_steps: int, *, final_fraction: float = 0.0):
    """Linear warm-up from 0 to `peak_learning_rate`, then cosine decay.

    Args:
        peak_learning_rate: Learning rate reached at the end of warm-up.
        total_steps: Steps the whole schedule spans (warm-up included).
        warmup_steps: Steps of the linear warm-up.
        final_fraction: Learning rate at the end, as a fraction of the peak.

    Returns:
        A `keras.optimizers.schedules.CosineDecay`.

    Example:

    >>> schedule = warmup_cosine(1e-3, total_steps=1000, warmup_steps=50)
    >>> round(float(schedule(50)), 6)  # float32 arithmetic
    0.001
    """
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(f"warmup_steps={warmup_steps} must be in [0, total_steps={total_steps}).")
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        decay_steps=total_steps - warmup_steps,
        alpha=final_fraction,
        warmup_target=peak_learning_rate,
        warmup_steps=warmup_steps,
    )


@keras.saving.register_keras_serializable(package="kerasfast")
class WarmupHoldCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to the peak, the peak held, then cosine decay to 0.

    Args:
        peak_learning_rate: The learning rate held after warm-up.
        total_steps: Steps the whole schedule spans.
        warmup_steps: Steps of the linear warm-up (from 0).
        hold_steps: The step where the decay begins (at least `warmup_steps`).

    Example:

    >>> schedule = WarmupHoldCosine(1e-3, total_steps=100, warmup_steps=10, hold_steps=50)
    >>> [round(float(schedule(step)), 6) for step in (0, 10, 49, 75, 100)]
    [0.0, 0.001, 0.001, 0.0005, 0.0]
    """

    def __init__(self, peak_learning_rate: float, total_steps: int, warmup_steps: int, hold_steps: int):
        if not 0 <= warmup_steps <= hold_steps < total_steps:
            raise ValueError(f"need 0 <= warmup_steps ({warmup_steps}) <= hold_steps ({hold_steps}) < total_steps "
                             f"({total_steps}).")
        self.peak_learning_rate = float(peak_learning_rate)
        self.total_steps, self.warmup_steps, self.hold_steps = int(total_steps), int(warmup_steps), int(hold_steps)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        rising = self.peak_learning_rate * step / max(self.warmup_steps, 1)
        progress = ops.clip((step - self.hold_steps) / (self.total_steps - self.hold_steps), 0.0, 1.0)
        falling = self.peak_learning_rate * 0.5 * (1.0 + ops.cos(math.pi * progress))
        return ops.where(step < self.warmup_steps, rising, falling)

    def get_config(self):
        return {"peak_learning_rate": self.peak_learning_rate, "total_steps": self.total_steps,
                "warmup_steps": self.warmup_steps, "hold_steps": self.hold_steps}


@keras.saving.register_keras_serializable(package="kerasfast")
class OneCycle(keras.optimizers.schedules.LearningRateSchedule):
    """One-cycle learning rate: cosine rise to a peak, then cosine fall.

    Starts at `peak_learning_rate / div_factor`, rises over the first
    `pct_start` of `total_steps` to the peak, then anneals to the start value
    divided by `final_div_factor`, as PyTorch's `OneCycleLR` and optax's
    `cosine_onecycle_schedule` do (defaults alike: 0.1 peaks after 30 of 100
    steps and ends at 0.1 / 25 / 1e4). Steps past the end hold the final
    value.

    Args:
        peak_learning_rate: The highest learning rate.
        total_steps: Steps the cycle spans.
        pct_start: Fraction of the steps spent rising.
        div_factor: Start value is `peak / div_factor`.
        final_div_factor: End value is `peak / div_factor / final_div_factor`.

    Example:

    >>> schedule = OneCycle(0.1, total_steps=100)
    >>> round(float(schedule(30)), 6)
    0.1
    """

    def __init__(self, peak_learning_rate, total_steps, pct_start=0.3, div_factor=25.0, final_div_factor=1e4):
        if total_steps < 2:
            raise ValueError(f"total_steps={total_steps} must be >= 2 for a one-cycle schedule.")
        if not 0 < pct_start < 1:
            raise ValueError(f"pct_start={pct_start} must be in (0, 1).")
        self.peak_learning_rate = float(peak_learning_rate)
        self.total_steps = int(total_steps)
        self.pct_start = float(pct_start)
        self.div_factor = float(div_factor)
        self.final_div_factor = float(final_div_factor)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        peak = self.peak_learning_rate
        start = peak / self.div_factor
        end = start / self.final_div_factor
        rise_steps = max(1.0, math.floor(self.pct_start * self.total_steps))
        fall_steps = max(1.0, self.total_steps - rise_steps)

        def cosine(begin, finish, fraction):
            fraction = ops.clip(fraction, 0.0, 1.0)
            return finish + (begin - finish) * 0.5 * (1.0 + ops.cos(math.pi * fraction))

        rising = cosine(start, peak, step / rise_steps)
        falling = cosine(peak, end, (step - rise_steps) / fall_steps)
        return ops.where(step < rise_steps, rising, falling)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "total_steps": self.total_steps,
            "pct_start": self.pct_start,
            "div_factor": self.div_factor,
            "final_div_factor": self.final_div_factor,
        }


@keras.saving.register_keras_serializable(package="kerasfast")
class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`schedule(step) * scale`, with `scale` a variable that can be lowered
    after the schedule was traced (how a run recovers from a divergence).

    Args:
        schedule: A `LearningRateSchedule`.
        scale: Initial multiplier.
    """

    def __init__(self, schedule, scale: float = 1.0):
        self.schedule = schedule
        self.scale = keras.Variable(scale, dtype="float32", trainable=False, name="learning_rate_scale")

    def __call__(self, step):
        return ops.cast(self.schedule(step), "float32") * self.scale

    def get_config(self):
        return {"schedule": keras.saving.serialize_keras_object(self.schedule),
                "scale": float(ops.convert_to_numpy(self.scale))}

    @classmethod
    def from_config(cls, config):
        return cls(keras.saving.deserialize_keras_object(config["schedule"]), config["scale"])


@keras.saving.register_keras_serializable(package="kerasfast")
class StartingAt(keras.optimizers.schedules.LearningRateSchedule):
    """`schedule(step - start_step)`: a schedule that spans one run of an
    optimizer which already made `start_step` updates in earlier runs
    (before `start_step` it holds the schedule's value at 0).

    Args:
        schedule: A `LearningRateSchedule` counted from 0.
        start_step: The optimizer's update count when the run starts.

    Example:

    >>> shifted = StartingAt(warmup_cosine(1e-3, total_steps=100, warmup_steps=10), start_step=500)
    >>> round(float(shifted(510)), 6)  # float32 arithmetic
    0.001
    """

    def __init__(self, schedule, start_step: int):
        self.schedule = schedule
        self.start_step = int(start_step)

    def __call__(self, step):
        return self.schedule(ops.maximum(ops.cast(step, "int64") - self.start_step, 0))

    def get_config(self):
        return {"schedule": keras.saving.serialize_keras_object(self.schedule), "start_step": self.start_step}

    @classmethod
    def from_config(cls, config):
        return cls(keras.saving.deserialize_keras_object(config["schedule"]), config["start_step"])


def peak_of(rate, steps: int) -> float | None:
    """The highest learning rate `rate` (a number, variable or schedule)
    gave over its first `steps` updates, or None when it cannot be read.

    Example:

    >>> peak_of(warmup_cosine(3e-3, total_steps=100, warmup_steps=10), steps=100)
    0.003
    """
    if isinstance(rate, (ScaledSchedule, StartingAt)):
        return peak_of(rate.schedule, steps)
    if isinstance(rate, keras.optimizers.schedules.CosineDecay):
        return float(rate.warmup_target if rate.warmup_target is not None else rate.initial_learning_rate)
    if isinstance(rate, OneCycle):
        return rate.peak_learning_rate
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        count = max(int(steps), 1)
        probes = sorted({int(round(i * (count - 1) / 255)) for i in range(256)})
        try:
            values = [float(ops.convert_to_numpy(rate(step))) for step in probes]
        except Exception:  # a schedule that cannot be called outside its optimizer
            return None
        # The maximum of the schedule at a few hundred steps: a warm-up's peak
        # falls between probes by at most one probe's slope.
        return max(values) if values else None
    try:
        return float(ops.convert_to_numpy(rate))
    except Exception:
        return None
