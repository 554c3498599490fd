"""Pruning masks computed from weight magnitudes, in TensorFlow ops only.

Both functions have static output shapes and no data-dependent shapes
(sorting instead of `top_k` with a dynamic `k`), so they compile under XLA
and run inside the train step on every replica.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def pruned_count(sparsity, size: int) -> int:
    """Entries `magnitude_mask` zeroes in a kernel of `size` weights at `sparsity`.

    `round(sparsity * size)` in float32 (the mask's own arithmetic), but never
    every weight: a kernel with no weight left makes its layer's output a
    constant, so at least one is kept.
    """
    return int(min(np.round(np.float32(sparsity) * np.float32(size)), max(size - 1, 0)))


def magnitude_mask(magnitudes, sparsity):
    """Mask that zeroes exactly `pruned_count(sparsity, size)` smallest entries.

    Ties are broken by position (stable sort), so the count of zeros is exact
    even when many magnitudes are equal (e.g. already-pruned zeros).

    Args:
        magnitudes: tensor of absolute weight values, any shape.
        sparsity: scalar float tensor or float in [0, 1).

    Returns:
        A float32 tensor of the same shape with 0.0 for pruned and 1.0 for
        kept entries.

    Example:

    >>> mask = magnitude_mask(tf.constant([[0.1, 0.4], [0.3, 0.2]]), 0.5)
    >>> mask.numpy().tolist()
    [[0.0, 1.0], [1.0, 0.0]]
    """
    magnitudes = tf.convert_to_tensor(magnitudes)
    shape = tf.shape(magnitudes)
    flat = tf.reshape(tf.cast(magnitudes, tf.float32), [-1])
    size = tf.size(flat)
    num_pruned = tf.cast(tf.round(tf.cast(sparsity, tf.float32) * tf.cast(size, tf.float32)), tf.int32)
    # Never the whole kernel (see pruned_count).
    num_pruned = tf.clip_by_value(num_pruned, 0, tf.maximum(size - 1, 0))
    order = tf.argsort(flat, stable=True)  # ascending: smallest first
    keep_in_sorted_order = tf.cast(tf.range(size) >= num_pruned, tf.float32)
    mask = tf.scatter_nd(order[:, None], keep_in_sorted_order, tf.shape(flat))
    return tf.reshape(mask, shape)


def m_by_n_mask(magnitudes, *, zeros_per_group=2, group_size=4, axis=-2):
    """Structured mask: in every `group_size` consecutive weights along `axis`,
    the `zeros_per_group` smallest are zeroed (2:4 sparsity by default).

    `axis` is the input-channel (reduction) axis of the kernel, the axis along
    which sparse tensor cores and TFLite's sparse kernels expect the pattern
    (same convention as tfmot's `pruning_utils.generate_m_by_n_mask`).

    Args:
        magnitudes: tensor of absolute weight values; its size along `axis`
            must be a multiple of `group_size`.
        zeros_per_group: entries zeroed per group.
        group_size: entries per group.
        axis: the axis the groups run along.

    Returns:
        A float32 mask of the same shape as `magnitudes`.

    Example:

    >>> m_by_n_mask(tf.constant([[1.0], [4.0], [2.0], [3.0]]), axis=0).numpy().ravel().tolist()
    [0.0, 1.0, 0.0, 1.0]
    """
    magnitudes = tf.cast(tf.convert_to_tensor(magnitudes), tf.float32)
    rank = magnitudes.shape.rank
    axis = axis % rank
    # Move the grouped axis last, split it into (groups, group_size).
    perm = [i for i in range(rank) if i != axis] + [axis]
    inverse_perm = [perm.index(i) for i in range(rank)]
    moved = tf.transpose(magnitudes, perm)
    moved_shape = tf.shape(moved)
    grouped = tf.reshape(moved, [-1, group_size])
    # Rank of each entry inside its group, largest first; keep the top ones.
    order = tf.argsort(grouped, axis=-1, direction="DESCENDING", stable=True)
    ranks = tf.argsort(order, axis=-1, stable=True)
    keep = tf.cast(ranks < group_size - zeros_per_group, tf.float32)
    return tf.transpose(tf.reshape(keep, moved_shape), inverse_perm)
