"""The learning rate of a pruning fine-tune.

Pruning a trained model fine-tunes it while the masks grow. Reusing the
training optimizer as it stands is what made the quickstart lose six points:
its rate was either a constant at the training peak (too high for a model
that is already at a minimum: the loss jumps each time the mask grows) or a
finished schedule (zero: nothing recovers). A pruning fine-tune therefore
gets its own policy, unless the user chose a schedule:

- peak: `PRUNE_LR_FRACTION` of the peak the optimizer trained at (or the
  `learning_rate=` given for the fine-tune),
- a linear warm-up over the first 5% of the updates (the plan's
  `WARMUP_FRACTION`: the first masks are applied while the rate is low),
- the peak held while the sparsity ramp grows (the first half of the run,
  `kerasfast.plan.HOLD_FRACTION`, where `kerasfast.compress.schedule_steps`
  ends it by default),
- cosine decay to zero over the second half, counted from the fine-tune's
  first update, so the last updates settle the pruned weights.

This is `lr_schedule="warmup_hold_cosine"` in the plan.

A model trained from scratch with `prune=` (its optimizer has made no
update yet) follows the ordinary plan.
"""

from __future__ import annotations

import dataclasses

import keras

from kerasfast.plan import HOLD_FRACTION, WARMUP_FRACTION
from kerasfast.training.schedules import WarmupHoldCosine, peak_of

# Fine-tune peak as a fraction of the training peak. Measured with
# `kerasfast.compress.prune` on tests/test_export_formats.py's convnet
# (digits, Adam 1e-3, 80% sparsity), test accuracy after 2 / 6 fine-tune
# epochs (dense 0.986), with warm-up then cosine decay: fraction 0.1:
# 0.800 / 0.942; 0.3: 0.928 / 0.958; 0.5: 0.944 / 0.972; 1.0: 0.953 / 0.981
# (the optimizer's own constant rate: 0.975 / 0.989). Lower fractions recover
# less in a short fine-tune, so the peak is the training peak. Holding it
# while the sparsity ramp grows then decaying (the policy) gave 0.975 / 0.981,
# and 0.825 on the 600-sample split where cosine alone gave 0.745 and the
# constant rate 0.840. See docs/compression.md.
PRUNE_LR_FRACTION = 1.0


@dataclasses.dataclass(frozen=True)
class FineTuneRate:
    """The learning rate a pruning fine-tune runs at.

    Attributes:
        peak: Peak learning rate of the fine-tune.
        warmup_fraction: Share of the updates spent warming up.
        reasons: Plan reasons for `learning_rate` and `lr_schedule`.
        user_set: The plan fields the user set themselves.
    """

    peak: float
    warmup_fraction: float
    reasons: dict
    user_set: tuple = ()

    def applied_to(self, overrides):
        """`overrides` with the fine-tune's rate and schedule."""
        return dataclasses.replace(overrides, learning_rate=self.peak, lr_schedule="warmup_hold_cosine",
                                   warmup_steps="auto")

    def described(self, plan):
        """`plan` with the fine-tune policy in its reasons (and not marked as set by the user)."""
        reasons = dict(self.reasons)
        if plan.reasons.get("learning_rate") != "requested":  # e.g. rescaled for a searched batch size
            reasons["learning_rate"] = plan.reasons.get("learning_rate")
        if plan.warmup_steps is not None:
            reasons["warmup_steps"] = f"{plan.reasons.get('warmup_steps', '')} of the pruning fine-tune"
        for name in ("learning_rate", "lr_schedule", "warmup_steps"):
            plan = plan.with_choice(name, getattr(plan, name), reasons.get(name), yours=name in self.user_set)
        return plan

    def schedule(self, total_steps: int, start_step: int = 0):
        """The schedule for a fine-tune of `total_steps` updates, started at `start_step`."""
        from kerasfast.training.schedules import StartingAt

        total_steps = max(total_steps, 2)
        hold = max(1, int(total_steps * HOLD_FRACTION))
        warmup = min(max(1, int(total_steps * self.warmup_fraction)), hold)
        rate = WarmupHoldCosine(self.peak, total_steps, warmup, hold)
        return StartingAt(rate, start_step) if start_step else rate


def trained_updates(optimizer) -> int:
    """Updates `optimizer` has made (0 for None or a string)."""
    if optimizer is None or isinstance(optimizer, str):
        return 0
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


def fine_tune_rate(optimizer, *, learning_rate=None, lr_schedule="auto") -> FineTuneRate | None:
    """The learning-rate policy of a pruning fine-tune, or None when it does not apply.

    Args:
        optimizer: The model's optimizer (the one training continues with).
        learning_rate: The `learning_rate=` the user gave, or None.
        lr_schedule: The `lr_schedule=` the user gave ("auto" when not).

    Returns:
        None when the user chose a schedule, or when the optimizer has made
        no update (pruning from scratch follows the ordinary plan), or when
        neither a rate was given nor the training peak can be read;
        otherwise the `FineTuneRate`.

    Example:

    >>> fine_tune_rate(keras.optimizers.Adam(3e-3)) is None  # no update yet: the ordinary plan applies
    True
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="mse")
    >>> _ = model.fit(np.ones((8, 2)), np.ones((8, 1)), verbose=0)
    >>> round(fine_tune_rate(model.optimizer).peak, 6)  # a trained model: its training peak
    0.003
    """
    from kerasfast.training.optimizers import unwrap

    if lr_schedule != "auto":
        return None
    updates = trained_updates(optimizer)
    if updates == 0:
        return None
    schedule_reason = ("pruning fine-tune: linear warm-up, the peak held while the sparsity ramp grows (the first "
                       f"{HOLD_FRACTION:.0%} of the updates), then cosine decay to 0 (pass lr_schedule= for another)")
    if learning_rate is not None:
        return FineTuneRate(float(learning_rate), WARMUP_FRACTION,
                            {"learning_rate": "requested: the pruning fine-tune's peak",
                             "lr_schedule": schedule_reason}, user_set=("learning_rate",))
    trained_peak = peak_of(unwrap(optimizer)._learning_rate, updates)
    if not trained_peak or trained_peak <= 0:
        return None
    peak = PRUNE_LR_FRACTION * trained_peak
    return FineTuneRate(peak, WARMUP_FRACTION,
                        {"learning_rate": f"pruning fine-tune: {PRUNE_LR_FRACTION:g} x {trained_peak:.3g}, the peak "
                                          f"this optimizer trained at over {updates} updates (learning_rate= to set it)",
                         "lr_schedule": schedule_reason})
