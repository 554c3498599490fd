"""A model's own preprocessing of its batches (a keras-hub task's preprocessor), applied once where it can be.

`task.fit` on a keras-hub task maps the task's preprocessor (tokenising, packing, resizing) over every batch
of every epoch. kerasfast maps it in its own input pipeline (`inputs.prepare_data`) and, when the data are
arrays, the preprocessing draws no random number and changes no state (read off its traced graph), and its
output fits in memory, applies it to the whole arrays once before training instead: every epoch then reads
the same batches `task.fit` would have computed again each time. A preprocessor that draws random numbers
(a masked-LM preprocessor's masks, a random crop) is mapped per batch, so each epoch sees new draws.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time

import numpy as np

# Op types that make a preprocessing's output differ from one call to the next: random draws, shuffles, and
# assignments to state (a seed generator's counter).
_VARYING_OPS = re.compile(r"Random|Multinomial|Shuffle|Assign")
# Rows preprocessed per call when the whole arrays are preprocessed once.
ONCE_BATCH_ROWS = 1024
# The preprocessed arrays may take at most this share of the machine's memory, else the preprocessing is
# mapped per batch as in `task.fit`.
ONCE_MEMORY_SHARE = 0.25


@dataclasses.dataclass
class AppliedOnce:
    """Arrays preprocessed once, before training.

    Attributes:
        x, y, sample_weight: What the preprocessing returned for the whole arrays.
        description: One line for the plan's data report.
    """

    x: object
    y: object
    sample_weight: object
    description: str


def name(preprocess) -> str:
    """The class that preprocesses: a keras-hub task's preprocessor, or the model whose method it is."""
    owner = getattr(preprocess, "__self__", None)
    if owner is None:
        return getattr(preprocess, "__name__", "preprocessing")
    return type(getattr(owner, "preprocessor", None) or owner).__name__


def traced(preprocess, element_spec):
    """`preprocess` traced once for batches of `element_spec` (a concrete function), or None when it cannot be
    traced on its own (tf.data's map, which traces it its own way, then runs it per batch)."""
    import tensorflow as tf

    specs = element_spec if isinstance(element_spec, tuple) else (element_spec,)
    try:
        return tf.function(lambda *batch: preprocess(*batch)).get_concrete_function(*specs)
    except Exception:  # noqa: BLE001 - mapped per batch instead, where a real error shows as the user's
        return None


def varies(function) -> bool:
    """Whether two calls of a traced preprocessing on the same batch may differ: its graph (nested functions
    included) holds a random, shuffling or state-assigning op."""
    ops = {op.type for op in function.graph.get_operations()}
    for nested in function.graph.as_graph_def().library.function:
        ops |= {node.op for node in nested.node_def}
    return any(_VARYING_OPS.search(op) for op in ops)


def applied_once(x, y, sample_weight, preprocess) -> AppliedOnce | None:
    """`preprocess` applied to the whole arrays `(x, y, sample_weight)`, traced once and run on batches of
    `ONCE_BATCH_ROWS`, or None when it must be mapped per batch: it cannot be traced on its own (`traced`) or
    varies between calls (`varies`), its outputs are not dense arrays of one shape per row (ragged,
    or padded to each batch's longest), or they would take more than `ONCE_MEMORY_SHARE` of the memory."""
    import keras
    import tensorflow as tf

    start = time.perf_counter()
    packed = keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
    batches = tf.data.Dataset.from_tensor_slices(packed).batch(ONCE_BATCH_ROWS)
    function = traced(preprocess, batches.element_spec)
    if function is None or varies(function):
        return None
    budget = ONCE_MEMORY_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    parts, used = [], 0
    for batch in batches:
        part = keras.tree.map_structure(_numpy, function(*batch) if isinstance(batch, tuple) else function(batch))
        leaves = keras.tree.flatten(part)
        if not all(isinstance(leaf, np.ndarray) for leaf in leaves):
            return None  # ragged or sparse outputs: left to the per-batch map
        used += sum(leaf.nbytes for leaf in leaves)
        if used > budget:
            return None
        parts.append(part)
    try:
        whole = keras.tree.map_structure(lambda *leaves: np.concatenate(leaves), *parts)
    except ValueError:  # shapes that differ between batches (padding to each batch's longest)
        return None
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(whole)
    return AppliedOnce(x, y, sample_weight,
                       f"{name(preprocess)} applied once before training ({time.perf_counter() - start:.1f} s: "
                       "it draws no random number, so every epoch's batches are the same)")


def _numpy(tensor):
    """A dense tensor as a NumPy array; ragged or sparse ones as they are (they are not kept)."""
    return tensor.numpy() if hasattr(tensor, "numpy") else tensor
