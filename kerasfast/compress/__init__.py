"""Model compression native to Keras 3: magnitude pruning without wrapper layers.

High level:

    result = kerasfast.compress.prune(model, (x, y), target_sparsity=0.8, epochs=2)

Low level (what `kerasfast.fit(..., prune=...)` uses):

    plan = apply_pruning(model, PruningConfig(target_sparsity=0.8, end_step=1000))
    model.fit(...)
    summary = finalize_pruning(model)
"""

from kerasfast.compress.config import PRUNABLE_LAYER_TYPES, PruningConfig
from kerasfast.compress.masks import m_by_n_mask, magnitude_mask
from kerasfast.compress.prune import PruneResult, prune, pruning_for_run, schedule_steps
from kerasfast.compress.attach import (
    apply_pruning,
    finalize_pruning,
    format_pruning_summary,
    measure_sparsity,
    overall_sparsity,
)
from kerasfast.compress.schedules import ConstantSparsity, PolynomialDecay

__all__ = [
    "pruning_for_run",
    "schedule_steps",
    "PRUNABLE_LAYER_TYPES",
    "ConstantSparsity",
    "PolynomialDecay",
    "PruneResult",
    "PruningConfig",
    "apply_pruning",
    "finalize_pruning",
    "format_pruning_summary",
    "m_by_n_mask",
    "magnitude_mask",
    "measure_sparsity",
    "overall_sparsity",
    "prune",
]
