"""Sparsity schedules: how sparse each pruned kernel is at a given step.

The formulas and step semantics follow `tfmot.sparsity.keras.PolynomialDecay`
and `ConstantSparsity` (tensorflow-model-optimization 0.8.1), with one fix:
the schedule also fires exactly at `end_step`, so the final sparsity is always
reached even when `end_step - begin_step` is not a multiple of `frequency`
(tfmot's schedule silently stops short in that case).

They are re-implemented here (about 40 lines of TensorFlow) rather than
imported because importing any `tensorflow_model_optimization` module runs
the package `__init__`, which sets `TF_USE_LEGACY_KERAS=1` process-wide and
imports `tf_keras`; kerasfast must not change what `tf.keras` means in the
user's process. `tests/test_compress_schedules.py` checks both schedules
against tfmot's own in a separate process.

A schedule is a callable `step -> (should_update_mask, sparsity)`, both
tensors, so it runs inside the compiled train step (XLA included). Any object
with that call signature and `begin_step`, `end_step`, `frequency` and
`final_sparsity` attributes (a tfmot schedule, for instance) can be used.
"""

from __future__ import annotations

import numbers

import tensorflow as tf

from kerasfast._checks import is_int
from kerasfast.errors import PlanError


def _check_sparsity(value, name):
    # numbers.Real covers NumPy scalars (np.float32(0.5)) as well as int and float.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise PlanError(
            f"{name}={value!r} is not a number. Sparsity is the fraction of weights set to zero: "
            "pass a float in [0, 1), e.g. 0.8 for 80% zeros."
        )
    if not 0.0 <= float(value) < 1.0:
        raise PlanError(
            f"{name}={value!r} is outside [0, 1). Sparsity is the fraction of "
            "weights set to zero: pass e.g. 0.8 for 80% zeros (1.0 would "
            "remove every weight)."
        )


def _check_steps(begin_step, end_step, frequency, allow_forever):
    for name, value in (("begin_step", begin_step), ("end_step", end_step), ("frequency", frequency)):
        if not is_int(value):
            raise PlanError(f"{name} must be an int, got {value!r}.")
    if begin_step < 0:
        raise PlanError(f"begin_step={begin_step} must be >= 0.")
    if end_step == -1 and not allow_forever:
        raise PlanError(
            "end_step=-1 (prune forever) only makes sense for a constant "
            "schedule; a polynomial schedule needs the step at which it "
            "reaches its final sparsity."
        )
    if end_step != -1 and end_step < begin_step:
        raise PlanError(f"end_step={end_step} is before begin_step={begin_step}; pass end_step >= begin_step.")
    if frequency < 1:
        raise PlanError(f"frequency={frequency} must be >= 1 (the mask is updated every `frequency` steps).")


class _Schedule:
    begin_step: int
    end_step: int
    frequency: int
    final_sparsity: float

    def should_update(self, step):
        """Boolean tensor: whether the mask is recomputed at `step`."""
        step = tf.cast(step, tf.int64)
        begin = tf.constant(self.begin_step, tf.int64)
        end = tf.constant(self.end_step, tf.int64)
        forever = self.end_step == -1
        in_range = tf.logical_and(step >= begin, tf.constant(forever) | (step <= end))
        on_turn = tf.equal(tf.math.floormod(step - begin, self.frequency), 0)
        at_end = tf.logical_and(tf.constant(not forever), tf.equal(step, end))
        return tf.logical_and(in_range, tf.logical_or(on_turn, at_end))

    def sparsity_at(self, step):  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, step):
        return self.should_update(step), self.sparsity_at(step)


class ConstantSparsity(_Schedule):
    """Prunes to one fixed sparsity every `frequency` steps.

    Args:
        target_sparsity: fraction of weights set to zero, in [0, 1).
        begin_step: first optimizer step at which the mask is computed.
        end_step: last step at which the mask is recomputed; -1 keeps
            recomputing it until training ends.
        frequency: recompute the mask every `frequency` steps.

    Example:

    >>> schedule = ConstantSparsity(0.5, begin_step=0, frequency=10)
    >>> bool(schedule.should_update(10)), float(schedule(10)[1])
    (True, 0.5)
    """

    def __init__(self, target_sparsity: float, begin_step: int = 0, end_step: int = -1, frequency: int = 100):
        _check_sparsity(target_sparsity, "target_sparsity")
        _check_steps(begin_step, end_step, frequency, allow_forever=True)
        self.target_sparsity = float(target_sparsity)
        self.final_sparsity = float(target_sparsity)
        self.begin_step, self.end_step, self.frequency = begin_step, end_step, frequency

    def sparsity_at(self, step):
        return tf.constant(self.target_sparsity, tf.float32)

    def get_config(self):
        return {
            "class_name": "ConstantSparsity",
            "target_sparsity": self.target_sparsity,
            "begin_step": self.begin_step,
            "end_step": self.end_step,
            "frequency": self.frequency,
        }

    def __repr__(self):
        return (
            f"ConstantSparsity(target_sparsity={self.target_sparsity}, begin_step={self.begin_step}, "
            f"end_step={self.end_step}, frequency={self.frequency})"
        )


class PolynomialDecay(_Schedule):
    """Raises sparsity from `initial_sparsity` to `final_sparsity` polynomially.

    `sparsity(step) = final + (initial - final) * (1 - p) ** power` with
    `p = clip((step - begin_step) / (end_step - begin_step), 0, 1)`: sparsity
    grows fast at first and levels off, so the network has most of the run
    to recover from the last, most damaging pruning steps (Zhu & Gupta 2017).

    Args:
        initial_sparsity: sparsity at `begin_step`, in [0, 1).
        final_sparsity: sparsity from `end_step` on, in [0, 1).
        begin_step: first optimizer step at which the mask is computed.
        end_step: step at which `final_sparsity` is reached (the mask is
            always recomputed at this exact step).
        power: exponent of the decay (3, as in tfmot and the paper).
        frequency: recompute the mask every `frequency` steps.

    Example:

    >>> schedule = PolynomialDecay(0.0, 0.8, begin_step=0, end_step=1000)
    >>> round(float(schedule(500)[1]), 3)
    0.7
    """

    def __init__(
        self,
        initial_sparsity: float,
        final_sparsity: float,
        begin_step: int,
        end_step: int,
        power: float = 3,
        frequency: int = 100,
    ):
        _check_sparsity(initial_sparsity, "initial_sparsity")
        _check_sparsity(final_sparsity, "final_sparsity")
        _check_steps(begin_step, end_step, frequency, allow_forever=False)
        self.initial_sparsity = float(initial_sparsity)
        self.final_sparsity = float(final_sparsity)
        self.power = power
        self.begin_step, self.end_step, self.frequency = begin_step, end_step, frequency

    def sparsity_at(self, step):
        # A schedule of one step (begin_step == end_step, as fit plans for a run of one or two updates)
        # reaches its final sparsity at that step.
        span = self.end_step - self.begin_step
        progress = tf.cast(tf.cast(step, tf.int64) - self.begin_step + (1 if span == 0 else 0), tf.float32)
        progress = tf.clip_by_value(progress / float(max(span, 1)), 0.0, 1.0)
        decay = tf.pow(1.0 - progress, float(self.power))
        return self.final_sparsity + (self.initial_sparsity - self.final_sparsity) * decay

    def get_config(self):
        return {
            "class_name": "PolynomialDecay",
            "initial_sparsity": self.initial_sparsity,
            "final_sparsity": self.final_sparsity,
            "power": self.power,
            "begin_step": self.begin_step,
            "end_step": self.end_step,
            "frequency": self.frequency,
        }

    def __repr__(self):
        return (
            f"PolynomialDecay(initial_sparsity={self.initial_sparsity}, final_sparsity={self.final_sparsity}, "
            f"begin_step={self.begin_step}, end_step={self.end_step}, power={self.power}, "
            f"frequency={self.frequency})"
        )
