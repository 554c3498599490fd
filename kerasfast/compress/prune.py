"""`prune(model, data, ...)`: fine-tune a trained model into a sparse one."""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np
import tensorflow as tf

from kerasfast._checks import is_number
from kerasfast.compress.config import PruningConfig
from kerasfast.compress.finetune import fine_tune_rate
from kerasfast.compress.attach import apply_pruning, detach_pruning, finalize_pruning, format_pruning_summary
from kerasfast.errors import DataError, PlanError
from kerasfast.training.session import optimizer_settings


# Where the sparsity ramp ends by default, as a fraction of the run: the
# second half recovers at the final mask (0.7 left too few updates to
# recover from the last, largest pruning steps at 80% sparsity).
RAMP_END_FRACTION = 0.5


@dataclasses.dataclass
class PruneResult:
    """What `prune` did.

    Attributes:
        history: the `keras.callbacks.History` of the fine-tuning run.
        summary: one plain dict per pruned kernel (see `finalize_pruning`).
        plan: one plain dict per prunable layer, pruned or left dense with
            the reason (see `apply_pruning`).
        config: the resolved `PruningConfig`.
        learning_rate: how the fine-tune's learning rate was set, and why.
    """

    history: keras.callbacks.History
    summary: list
    plan: list
    config: PruningConfig
    learning_rate: str = "the optimizer's own"

    def table(self) -> str:
        """Markdown table: achieved sparsity per pruned layer, then dense ones."""
        dense = [row for row in self.plan if not row["pruned"]]
        return format_pruning_summary(self.summary + dense)


def _steps_per_epoch(data, batch_size, steps_per_epoch):
    if steps_per_epoch is not None:
        return int(steps_per_epoch)
    if isinstance(data, tf.data.Dataset):
        cardinality = int(data.cardinality())
        if cardinality < 0:
            raise PlanError(
                "The dataset's length is unknown or infinite, so the pruning schedule cannot be "
                "placed; pass steps_per_epoch=..."
            )
        if cardinality == 0:
            raise DataError("The dataset passed to prune() is empty.")
        return cardinality
    if isinstance(data, (tuple, list)) and len(data) >= 2:
        num_samples = len(data[0]) if not isinstance(data[0], dict) else len(next(iter(data[0].values())))
        if num_samples == 0:
            raise DataError("The arrays passed to prune() hold no samples.")
        num_labels = _length(data[1])
        if num_labels is not None and num_labels != num_samples:
            # Checked here, before any mask is attached: model.fit would only fail after.
            raise DataError(
                f"prune() got {num_samples} inputs but {num_labels} labels in data=(x, y); pass one label per "
                "input sample."
            )
        return math.ceil(num_samples / (batch_size or 32))
    raise DataError(
        f"prune() takes data as a tf.data.Dataset of (x, y) batches or an (x, y) tuple of arrays; "
        f"got {type(data).__name__}."
    )


def _length(labels) -> int | None:
    """Number of label samples (of the first array of a dict/list of label arrays), or None."""
    if isinstance(labels, dict):
        labels = next(iter(labels.values()), None)
    elif isinstance(labels, (list, tuple)) and labels and hasattr(labels[0], "shape"):
        labels = labels[0]
    shape = getattr(labels, "shape", None)
    if shape is None or len(shape) == 0:
        return None
    return int(shape[0])


def schedule_steps(total_steps: int, begin_step: int = 0, end_step: int | None = None,
                   frequency: int | None = None) -> tuple[int, int]:
    """Places a pruning schedule in a run of `total_steps` optimizer updates.

    By default the final sparsity is reached at `RAMP_END_FRACTION` of the
    run, leaving the rest (while the fine-tune's learning rate decays) to
    recover at the final mask, and masks are updated ten times.

    Returns:
        `(end_step, frequency)`.

    Raises:
        PlanError: When `end_step` lies beyond the run's last update.
    """
    last_step = total_steps - 1  # the step counter seen by the last update
    if end_step is None:
        end_step = begin_step + int(round(RAMP_END_FRACTION * max(last_step - begin_step, 0)))
        end_step = min(end_step, last_step)
    if end_step > last_step:
        raise PlanError(
            f"end_step={end_step} is beyond the last step of this run ({last_step}: {total_steps} optimizer "
            "updates), so the target sparsity would never be reached while training. Lower end_step or train "
            "longer."
        )
    if frequency is None:
        frequency = max(1, (end_step - begin_step) // 10)
    return end_step, frequency


def pruning_for_run(prune, total_steps: int) -> PruningConfig:
    """Resolves `kerasfast.fit(..., prune=...)` for a run of `total_steps` updates.

    Args:
        prune: A target sparsity (e.g. 0.8), a dict of `PruningConfig`
            arguments, or a `PruningConfig`; `end_step` / `frequency` left
            unset are placed in the run by `schedule_steps`.
        total_steps: Optimizer updates of the run.

    Returns:
        A `PruningConfig`.
    """
    if isinstance(prune, PruningConfig):
        arguments = {field.name: getattr(prune, field.name) for field in dataclasses.fields(PruningConfig)}
    elif isinstance(prune, dict):
        arguments = dict(prune)
    elif is_number(prune):
        arguments = {"target_sparsity": float(prune)}
    else:
        raise PlanError(
            f"prune={prune!r} is not valid: pass a target sparsity such as 0.8, a dict of PruningConfig "
            "arguments, or a kerasfast.compress.PruningConfig."
        )
    schedule = arguments.get("schedule", "polynomial")
    if schedule == "polynomial" or arguments.get("frequency") is None:
        end_step, frequency = schedule_steps(total_steps, arguments.get("begin_step", 0),
                                             arguments.get("end_step"), arguments.get("frequency"))
        if schedule == "polynomial":
            arguments["end_step"] = end_step
        arguments["frequency"] = frequency
    return PruningConfig(**arguments)


def prune(
    model,
    data,
    *,
    target_sparsity: float | None = 0.8,
    schedule="polynomial",
    initial_sparsity: float = 0.0,
    epochs: int = 2,
    batch_size: int | None = None,
    steps_per_epoch: int | None = None,
    begin_step: int = 0,
    end_step: int | None = None,
    frequency: int | None = None,
    include=None,
    exclude=(),
    min_size: int = 0,
    structured: str | None = None,
    optimizer=None,
    loss=None,
    metrics=None,
    learning_rate=None,
    validation_data=None,
    callbacks=None,
    verbose="auto",
) -> PruneResult:
    """Prunes a trained model by magnitude while fine-tuning it on `data`.

    The model is changed in place and returned as a plain Keras model: no
    wrapper layers, and each pruned kernel has exactly `target_sparsity`
    zeros (but keeps at least one weight: a warning names a kernel too small
    for the target). If the model is compiled its compile settings, optimizer state
    and XLA/`steps_per_execution` choices are reused; pass `optimizer`/`loss`
    to compile it afresh (required for a model never compiled).

    Args:
        model: a built Keras 3 model, usually already trained.
        data: `tf.data.Dataset` of `(x, y)` batches or an `(x, y)` tuple.
        target_sparsity: final fraction of zeros per pruned kernel, [0, 1).
        schedule: "polynomial", "constant" or a schedule object.
        initial_sparsity: starting sparsity of the polynomial schedule.
        epochs: fine-tuning epochs.
        batch_size: batch size when `data` is arrays (Keras default 32).
        steps_per_epoch: needed for datasets of unknown length.
        begin_step: step at which pruning starts (counted from the start of
            this fine-tuning run).
        end_step: step at which the final sparsity is reached; defaults to
            half the run, leaving the rest to recover at the final mask.
        frequency: mask update period in steps; defaults to a tenth of
            `end_step - begin_step`.
        include, exclude, min_size, structured: see `PruningConfig`.
        optimizer, loss, metrics: compile the model with these instead of
            reusing its compile settings.
        learning_rate: peak learning rate of the fine-tune. A trained
            optimizer fine-tunes at its own policy either way: linear warm-up
            then cosine decay to 0, peaking at `learning_rate` or at the peak
            it trained at (`kerasfast.compress.finetune`); the
            optimizer's rate is given back afterwards.
        validation_data, callbacks, verbose: passed to `model.fit`.

    Returns:
        A `PruneResult` with `history`, per-layer `summary` and `plan`.

    Raises:
        PlanError, DataError: bad arguments or data (x and y of different
            lengths, among others), before the model is touched.
        Whatever `model.fit` raises: the pruning masks are removed first,
            so prune() can be called again; the weights are as the failed
            fit left them.

    Example:

    >>> x = np.random.default_rng(0).normal(size=(256, 16)).astype("float32")
    >>> y = (x[:, 0] > 0).astype("int32")
    >>> model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
    ...                           keras.layers.Dense(2, activation="softmax")])
    >>> model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    >>> _ = model.fit(x, y, epochs=3, verbose=0)
    >>> result = kerasfast.compress.prune(model, (x, y), target_sparsity=0.8, epochs=2, verbose=0)
    >>> print(result.table())  # doctest: +ELLIPSIS
    | layer | type | shape | params | target | sparsity |
    ...
    >>> model.save("pruned.keras")  # the pruned model, ready for export
    """
    total_steps = _optimizer_updates(model, data, optimizer, epochs, batch_size, steps_per_epoch)
    end_step, frequency = schedule_steps(total_steps, begin_step, end_step, frequency)
    config = PruningConfig(
        target_sparsity=target_sparsity,
        schedule=schedule,
        initial_sparsity=initial_sparsity,
        begin_step=begin_step,
        end_step=end_step,
        frequency=frequency,
        include=include,
        exclude=exclude,
        min_size=min_size,
        structured=structured,
    )
    _compile_for_pruning(model, optimizer, loss, metrics)
    # Count steps from the start of this run even when the optimizer
    # already trained the model (its counter is then far past 0).
    step_offset = int(np.asarray(model.optimizer.iterations))

    def step_fn():
        return tf.cast(model.optimizer.iterations, tf.int64) - step_offset

    fine_tune, how = _fine_tune_learning_rate(model.optimizer, learning_rate, total_steps, step_offset)
    plan = apply_pruning(model, config, step_fn=step_fn)
    fit_kwargs = dict(epochs=epochs, validation_data=validation_data, callbacks=callbacks, verbose=verbose)
    try:
        with optimizer_settings(model.optimizer, learning_rate=fine_tune):
            if isinstance(data, tf.data.Dataset):
                history = model.fit(data, steps_per_epoch=steps_per_epoch, **fit_kwargs)
            else:
                history = model.fit(data[0], data[1], batch_size=batch_size, steps_per_epoch=steps_per_epoch,
                                    **fit_kwargs)
    except BaseException:
        # Masks left attached would make the corrected retry fail as "already being pruned".
        detach_pruning(model)
        raise
    summary = finalize_pruning(model)
    return PruneResult(history=history, summary=summary, plan=plan, config=config, learning_rate=how)


def _optimizer_updates(model, data, optimizer, epochs, batch_size, steps_per_epoch) -> int:
    """Optimizer updates the fine-tune makes: the steps the pruning schedule is placed in."""
    batches_per_epoch = _steps_per_epoch(data, batch_size, steps_per_epoch)
    if not isinstance(epochs, int) or epochs < 1:
        raise PlanError(f"epochs={epochs!r} must be an int >= 1.")
    # With gradient accumulation the schedule counts optimizer updates, not
    # batches (Keras's `iterations` divides by the accumulation steps).
    source_optimizer = optimizer if optimizer is not None and not isinstance(optimizer, str) else None
    source_optimizer = source_optimizer or getattr(model, "optimizer", None)
    accumulation = getattr(source_optimizer, "gradient_accumulation_steps", None) or 1
    total_steps = batches_per_epoch * epochs // accumulation
    if total_steps < 1:
        raise PlanError(
            f"This run makes no optimizer update ({batches_per_epoch} batches per epoch, gradient accumulation "
            f"over {accumulation}); give prune() more data or epochs."
        )
    return total_steps


def _compile_for_pruning(model, optimizer, loss, metrics) -> None:
    """Compiles `model` afresh when asked to, keeping its XLA and steps-per-execution choices."""
    recompile = optimizer is not None or loss is not None or metrics is not None
    if not recompile and not getattr(model, "compiled", False):
        raise PlanError(
            "The model is not compiled, so prune() does not know its loss. Compile it first or pass "
            "loss=... (and optionally optimizer=..., metrics=...)."
        )
    if not recompile:
        return
    if loss is None and not getattr(model, "compiled", False):
        raise PlanError("prune() needs loss=... to compile a model that was never compiled.")
    compile_config = model.get_compile_config() if getattr(model, "compiled", False) else {}
    model.compile(
        optimizer=optimizer or "adam",
        loss=loss if loss is not None else model.loss,
        metrics=metrics,
        jit_compile=compile_config.get("jit_compile", "auto"),
        steps_per_execution=compile_config.get("steps_per_execution", 1),
    )


def _fine_tune_learning_rate(optimizer, learning_rate, total_steps, step_offset):
    """`(rate, how)`: the fine-tune's learning rate (or schedule) and the reason for the report."""
    # A trained optimizer's own rate is too high (a constant peak) or spent (a
    # finished schedule) for a fine-tune: see kerasfast.compress.finetune.
    rate = fine_tune_rate(optimizer, learning_rate=learning_rate)
    if rate is not None:
        how = f"{rate.reasons['learning_rate']}; {rate.reasons['lr_schedule']}"
        return rate.schedule(total_steps, step_offset), how
    how = "requested (constant)" if learning_rate is not None else "the optimizer's own (it had not trained yet)"
    return learning_rate, how
