"""`PruningMaskConstraint`: keeps a kernel pruned through every optimizer update.

Keras 3 optimizers apply `variable.constraint` right after each update inside
the compiled train step (`BaseOptimizer.apply`). A mask-applying constraint
on each pruned kernel therefore holds the mask through every step, including
steps run inside one `steps_per_execution` loop, under XLA, and on every
replica of a tf.distribute strategy, where a callback (run once per
`steps_per_execution` block, on the host) could not.

The mask lives in a non-trainable variable that is not tracked by the layer,
so it is never saved with the model. On the steps the schedule selects, the
mask is recomputed from the magnitudes of the freshly updated weights.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from kerasfast.compress.masks import m_by_n_mask, magnitude_mask


class PruningMaskConstraint(keras.constraints.Constraint):
    """Constraint that multiplies a kernel by its pruning mask.

    Not meant to be built by hand: `kerasfast.compress.apply_pruning` sets
    one on each selected kernel and `finalize_pruning` removes it.

    Args:
        mask: non-trainable float32 `keras.Variable` of the kernel's shape.
        schedule: callable `step -> (update_mask, sparsity)`.
        step_fn: zero-argument callable returning the current optimizer step
            (read when the train step is traced).
        m_by_n: None, or `(kept, group)` for structured sparsity.
        structured_axis: axis the structured groups run along.
        original_constraint: the kernel's constraint before pruning, applied
            first and restored by `finalize_pruning`.
        layer_name, weight_name: for summaries and error messages.
    """

    def __init__(
        self,
        mask,
        schedule,
        step_fn,
        *,
        m_by_n=None,
        structured_axis=None,
        original_constraint=None,
        layer_name="",
        weight_name="kernel",
    ):
        self.mask = mask
        self.schedule = schedule
        self.step_fn = step_fn
        self.m_by_n = m_by_n
        self.structured_axis = structured_axis
        self.original_constraint = original_constraint
        self.layer_name = layer_name
        self.weight_name = weight_name

    def compute_mask(self, weights, sparsity):
        """Mask for `weights` at `sparsity` (ignored for structured masks)."""
        magnitudes = tf.abs(tf.cast(weights, tf.float32))
        if self.m_by_n is not None:
            kept, group = self.m_by_n
            return m_by_n_mask(magnitudes, zeros_per_group=group - kept, group_size=group, axis=self.structured_axis)
        return magnitude_mask(magnitudes, sparsity)

    def __call__(self, w):
        weights = w.value if isinstance(w, keras.Variable) else tf.convert_to_tensor(w)
        if self.original_constraint is not None:
            weights = tf.convert_to_tensor(self.original_constraint(weights))
        update_mask, sparsity = self.schedule(self.step_fn())
        # The cond only computes; the assignment stays outside it, because a
        # synchronised (mirrored) variable cannot be written inside a cond
        # branch in a replica context (merge_call in a nested graph).
        new_mask = tf.cond(
            tf.convert_to_tensor(update_mask),
            lambda: self.compute_mask(weights, sparsity),
            lambda: tf.identity(self.mask.value),
        )
        self.mask.assign(new_mask)
        return weights * tf.cast(new_mask, weights.dtype)

    def get_config(self):
        # Never serialised: finalize_pruning removes it before any save. A
        # model saved mid-training stores no constraint for this kernel.
        return {}
