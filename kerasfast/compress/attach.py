"""Attaching pruning masks to a model's kernels, and folding them in at the end.

(`prune.py` is the high-level `prune()`, which fine-tunes with these; the
masks' arithmetic is in `masks.py`.)

The two functions here are the pieces `kerasfast.fit(..., prune=...)` and
`kerasfast.compress.prune` build on; neither trains anything itself:

    rows = apply_pruning(model, config)     # before (re)compiling / fitting
    model.fit(...)                           # masks hold through each step
    summary = finalize_pruning(model)        # plain Keras model again
"""

from __future__ import annotations

import contextlib
import warnings

import keras
import numpy as np
import tensorflow as tf

from kerasfast import _compat
from kerasfast.compress.config import PruningConfig, all_layers, prunable_weight_name
from kerasfast.compress.constraint import PruningMaskConstraint
from kerasfast.compress.masks import pruned_count
from kerasfast.errors import ModelError, PlanError


def _strategy_scope_for(variable):
    """The scope of the strategy `variable` was created under, if any.

    Masks must be created under the same strategy as their kernel so that
    every replica gets its own (identical) copy.
    """
    strategy = _compat.variable_strategy(variable)
    if strategy is None or tf.distribute.has_strategy():
        return contextlib.nullcontext()
    return strategy.scope()


def _optimizer_step_fn(model):
    def step():
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise ModelError(
                "Pruning reads the optimizer's step counter, but the model has no optimizer. "
                "Compile the model before training, or pass step_fn= to apply_pruning."
            )
        # `iterations` counts real updates: with gradient accumulation Keras
        # divides the micro-step counter by the accumulation steps.
        return optimizer.iterations

    return step


def pruning_constraints(model) -> list[tuple[object, PruningMaskConstraint]]:
    """`(variable, constraint)` for every kernel of `model` being pruned now."""
    found, seen = [], set()
    for layer in all_layers(model):
        for variable in layer.weights:
            if id(variable) in seen:
                continue
            seen.add(id(variable))
            if isinstance(getattr(variable, "constraint", None), PruningMaskConstraint):
                found.append((variable, variable.constraint))
    return found


def apply_pruning(model, config: PruningConfig, *, step_fn=None) -> list[dict]:
    """Starts magnitude pruning of `model`'s kernels during the next training.

    Sets a mask-applying constraint on each selected kernel. Call it before
    `model.compile`/`model.fit` (or recompile): it also drops an already
    traced train function so that the next `fit` traces the constraints in.

    Args:
        model: a built Keras 3 model.
        config: a `PruningConfig`.
        step_fn: zero-argument callable returning the current optimizer step
            as a tensor. Defaults to `model.optimizer.iterations`, read when
            the train step is traced (so compiling after this call is fine).

    Returns:
        One plain dict per prunable layer: `layer`, `type`, `weight`, `shape`,
        `params`, `pruned` (bool), `target_sparsity`, and `reason` when the
        layer is left dense.

    Raises:
        PlanError: see `PruningConfig.select_targets`.
        ModelError: the model is not built or is already being pruned.

    Example:

    >>> x = np.random.default_rng(0).normal(size=(256, 16)).astype("float32")
    >>> y = x[:, :4].sum(axis=1, keepdims=True)
    >>> model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
    ...                           keras.layers.Dense(1)])
    >>> rows = apply_pruning(model, PruningConfig(target_sparsity=0.8, end_step=8, frequency=4))
    >>> model.compile(optimizer="adam", loss="mse")
    >>> _ = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    >>> [round(row["sparsity"], 1) for row in finalize_pruning(model)]  # 32x1 kernel: 26 of 32 zeros
    [0.8, 0.8]
    """
    if not isinstance(config, PruningConfig):
        raise PlanError(f"config must be a kerasfast.compress.PruningConfig, got {type(config).__name__}.")
    if pruning_constraints(model):
        raise ModelError(
            "This model is already being pruned (its kernels carry pruning masks). "
            "Call kerasfast.compress.finalize_pruning(model) before applying pruning again."
        )
    targets, skipped = config.select_targets(model)
    _warn_about_kernels_too_small(targets, config)
    step_fn = step_fn or _optimizer_step_fn(model)
    rows = []
    for target in targets:
        variable = target.variable
        with _strategy_scope_for(variable):
            mask = keras.Variable(
                np.ones(variable.shape, dtype="float32"),
                trainable=False,
                dtype="float32",
                name=f"{target.layer.name}_{target.weight_name}_pruning_mask",
                # Replicas compute identical masks from identical weights;
                # taking the first replica's makes that a guarantee.
                aggregation="only_first_replica",
            )
        variable.constraint = PruningMaskConstraint(
            mask,
            config.schedule_object,
            step_fn,
            m_by_n=config.m_by_n,
            structured_axis=target.structured_axis,
            original_constraint=variable.constraint,
            layer_name=target.layer.name,
            weight_name=target.weight_name,
        )
        rows.append({**target.to_dict(), "pruned": True, "target_sparsity": config.target_sparsity})
    for row in skipped:
        layer = next(l for l in all_layers(model) if l.name == row["layer"])
        weight = getattr(layer, prunable_weight_name(layer))
        shape = [int(d) for d in weight.shape]
        rows.append(
            {**row, "weight": prunable_weight_name(layer), "shape": shape, "params": int(np.prod(shape)),
             "pruned": False, "target_sparsity": 0.0}
        )
    _forget_traced_train_step(model)
    return rows


def _warn_about_kernels_too_small(targets, config: PruningConfig) -> None:
    """Warns when the target sparsity would zero every weight of a kernel (one is kept instead)."""
    if config.m_by_n is not None:
        return
    sparsity = config.target_sparsity
    too_small = [f"'{t.layer.name}' ({t.params} weights: {t.params - 1} zeros, sparsity "
                 f"{(t.params - 1) / t.params:.3f})" for t in targets
                 if t.params and np.round(np.float32(sparsity) * np.float32(t.params)) >= t.params]
    if too_small:
        warnings.warn(
            f"target_sparsity={sparsity} would zero every weight of {', '.join(too_small)}, making the layer's "
            "output a constant; one weight of each is kept instead, so their sparsity ends below the target. "
            "Exclude these layers (exclude=[...] or min_size=...) or lower target_sparsity.",
            stacklevel=3,
        )


def detach_pruning(model) -> None:
    """Removes every pruning mask without folding it in: the kernels keep their current values.

    For a pruning run that failed before `finalize_pruning`, so that the model
    can be pruned again (`apply_pruning` refuses a model carrying masks).
    """
    for variable, constraint in pruning_constraints(model):
        variable.constraint = constraint.original_constraint
    _forget_traced_train_step(model)


def _forget_traced_train_step(model):
    # Constraints are read when the train step is traced; a cached train
    # function would keep running without (or with stale) masks.
    if getattr(model, "train_function", None) is not None:
        model.train_function = None


def _target_sparsity(constraint: PruningMaskConstraint) -> float:
    if constraint.m_by_n is not None:
        kept, group = constraint.m_by_n
        return (group - kept) / group
    return float(constraint.schedule.final_sparsity)


def _expected_zeros(constraint, size):
    return pruned_count(_target_sparsity(constraint), size)


def finalize_pruning(model) -> list[dict]:
    """Folds the masks into the kernels and removes every pruning constraint.

    If training stopped before the schedule reached its final sparsity, the
    remaining smallest weights are pruned now (without fine-tuning) so that
    each kernel still ends at exactly its target sparsity; a warning names
    the layers concerned.

    Args:
        model: a model prepared with `apply_pruning`.

    Returns:
        One plain dict per pruned kernel: `layer`, `type`, `weight`, `shape`,
        `params`, `target_sparsity`, `sparsity` (achieved, zeros / params),
        `structured`. The model is a plain Keras model again (saves and
        loads as `.keras` with no custom objects).

    Raises:
        ModelError: the model has no pruning masks.
    """
    found = pruning_constraints(model)
    if not found:
        raise ModelError(
            "finalize_pruning found no pruning masks on this model; call "
            "kerasfast.compress.apply_pruning(model, config) (or prune()) first."
        )
    layer_of = {}  # the innermost layer holding each variable (a nested model holds its layers' too)
    for layer in all_layers(model):
        for variable in layer.weights:
            holder = layer_of.get(id(variable))
            if holder is None or len(layer.weights) <= len(holder.weights):  # a parent comes before its layers
                layer_of[id(variable)] = layer
    rows, finished_early = [], []
    for variable, constraint in found:
        weights = tf.convert_to_tensor(variable.value)
        mask = tf.convert_to_tensor(constraint.mask.value)
        size = int(np.prod(variable.shape))
        target = _target_sparsity(constraint)
        if constraint.m_by_n is not None:
            kept, group = constraint.m_by_n
            complete = int(tf.reduce_sum(mask)) == size * kept // group
        else:
            complete = size - int(tf.reduce_sum(mask)) == _expected_zeros(constraint, size)
        if not complete:
            finished_early.append(constraint.layer_name)
            mask = constraint.compute_mask(weights * tf.cast(mask, weights.dtype), target)
        variable.assign(weights * tf.cast(mask, weights.dtype))
        variable.constraint = constraint.original_constraint
        layer = layer_of.get(id(variable))
        final = variable.numpy()
        rows.append(
            {
                "layer": constraint.layer_name,
                "type": type(layer).__name__ if layer is not None else "",
                "weight": constraint.weight_name,
                "shape": [int(d) for d in variable.shape],
                "params": size,
                "target_sparsity": target,
                "sparsity": float(np.count_nonzero(final == 0) / size),
                "structured": None if constraint.m_by_n is None else f"{constraint.m_by_n[0]}:{constraint.m_by_n[1]}",
            }
        )
    if finished_early:
        warnings.warn(
            f"Training ended before the pruning schedule reached its final sparsity for {finished_early}; "
            "the remaining smallest weights were pruned at the end without fine-tuning. Train for more "
            "steps than end_step (or lower end_step) to let the model recover.",
            stacklevel=2,
        )
    _forget_traced_train_step(model)
    return rows


def measure_sparsity(model) -> list[dict]:
    """Fraction of zero weights in each prunable kernel of `model`.

    Args:
        model: any built Keras model, pruned or not.

    Returns:
        One dict per prunable kernel: `layer`, `type`, `weight`, `shape`,
        `params`, `zeros`, `sparsity`.
    """
    rows = []
    for layer in all_layers(model):
        weight_name = prunable_weight_name(layer)
        if weight_name is None:
            continue
        weight = getattr(layer, weight_name, None)
        if weight is None:
            continue
        values = np.asarray(weight.numpy() if hasattr(weight, "numpy") else weight)
        rows.append(
            {
                "layer": layer.name,
                "type": type(layer).__name__,
                "weight": weight_name,
                "shape": list(values.shape),
                "params": int(values.size),
                "zeros": int(np.count_nonzero(values == 0)),
                "sparsity": float(np.count_nonzero(values == 0) / max(values.size, 1)),
            }
        )
    return rows


def overall_sparsity(model) -> float:
    """Zeros over all weights of the prunable kernels of `model` (0.0 if none)."""
    rows = measure_sparsity(model)
    params = sum(r["params"] for r in rows)
    return float(sum(r["zeros"] for r in rows) / params) if params else 0.0


def format_pruning_summary(rows: list[dict]) -> str:
    """Markdown table of `finalize_pruning` / `apply_pruning` rows."""
    lines = ["| layer | type | shape | params | target | sparsity |", "|---|---|---|---:|---:|---:|"]
    for row in rows:
        achieved = row.get("sparsity")
        achieved_text = "" if achieved is None else f"{achieved:.3f}"
        if row.get("pruned") is False:
            achieved_text = f"dense ({row.get('reason', '')})"
        lines.append(
            f"| {row['layer']} | {row['type']} | {'x'.join(str(d) for d in row['shape'])} | {row['params']} | "
            f"{row.get('target_sparsity', 0.0):.3f} | {achieved_text} |"
        )
    return "\n".join(lines)
