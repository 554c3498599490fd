"""The learning rate of a pruning fine-tune.

Pruning a trained model fine-tunes it while the masks grow. Reusing the
training optimizer as it stands is what made the quickstart lose six points:
its rate was either a constant at the training peak (too high for a model
that is already at a minimum: the loss jumps each time the mask grows) or a
finished schedule (zero: nothing recovers). A pruning fine-tune therefore
gets its own policy, unless the user chose a schedule:

- peak: `PRUNE_LR_FRACTION` of the peak the optimizer trained at (or the
  `learning_rate=` given for the fine-tune),
- a linear warm-up over the first `WARMUP_FRACTION` of the updates (the
  first masks are applied while the rate is still low),
- cosine decay to zero over the rest of the run, counted from the fine-tune's
  first update, so the last updates, after the sparsity ramp has ended
  (`kerasfast.compress.schedule_steps`), settle the pruned weights.

A model trained from scratch with `prune=` (its optimizer has made no
update yet) follows the ordinary plan.
"""

from __future__ import annotations

import dataclasses

import keras

from kerasfast.training.schedules import peak_of, warmup_cosine

# Fine-tune peak as a fraction of the training peak. Measured on the
# quickstart convnet (80% sparsity, 10 fine-tune epochs, one seed): 0.1 ended
# at the dense model's 0.9972 with a mid-run low of 0.986; the training
# peak as a constant ended the same but dipped to 0.983, and 0.3 dipped to
# 0.889. On the earlier, smaller quickstart model the constant training peak
# ended 6 points below the dense model (issue 13). See docs/compression.md.
PRUNE_LR_FRACTION = 0.1
# Warm-up share of the fine-tune's updates.
WARMUP_FRACTION = 0.1


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
        return dataclasses.replace(overrides, learning_rate=self.peak, lr_schedule="warmup_cosine",
                                   warmup_steps="auto")

    def described(self, plan):
        """`plan` with the fine-tune policy in its reasons (and not marked as set by the user)."""
        chosen = ("learning_rate", "lr_schedule", "warmup_steps")
        overridden = tuple(name for name in plan.overridden if name not in chosen or name in self.user_set)
        reasons = {**plan.reasons, **self.reasons}
        if plan.reasons.get("learning_rate") != "requested":  # e.g. rescaled for a searched batch size
            reasons["learning_rate"] = plan.reasons.get("learning_rate")
        if plan.warmup_steps is not None:
            reasons["warmup_steps"] = f"{plan.reasons.get('warmup_steps', '')} of the pruning fine-tune"
        return dataclasses.replace(plan, overridden=overridden, reasons=reasons)

    def schedule(self, total_steps: int, start_step: int = 0):
        """The schedule for a fine-tune of `total_steps` updates, started at `start_step`."""
        from kerasfast.training.schedules import StartingAt

        warmup = min(max(1, int(total_steps * self.warmup_fraction)), max(total_steps - 1, 0))
        rate = warmup_cosine(self.peak, max(total_steps, 1), warmup)
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

    >>> model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="mse"); model.fit(x, y)
    >>> fine_tune_rate(model.optimizer).peak
    0.0003
    """
    from kerasfast.training.optimizers import unwrap

    if lr_schedule != "auto":
        return None
    updates = trained_updates(optimizer)
    if updates == 0:
        return None
    schedule_reason = ("pruning fine-tune: linear warm-up then cosine decay to 0 over this run's updates "
                       "(pass lr_schedule= for another)")
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
