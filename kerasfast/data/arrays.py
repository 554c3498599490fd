"""`array_dataset`: in-memory NumPy data -> a fast, batched `tf.data.Dataset`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from kerasfast._checks import is_int
from kerasfast.errors import DataError


@dataclasses.dataclass
class ArrayDatasetInfo:
    """Size and structure of a dataset built by `array_dataset`."""

    num_records: int
    batch_size: int
    steps_per_epoch: int
    shuffle: bool
    drop_remainder: bool
    label: str | None = "y"


def array_dataset(
    x: Any,
    y: Any = None,
    batch_size: int = 32,
    shuffle: bool = True,
    seed: int | None = None,
    *,
    drop_remainder: bool = False,
    repeat: bool = False,
):
    """Turns in-memory arrays into a shuffled, batched, prefetched dataset.

    Shuffling permutes *indices* (a full, uniform shuffle each epoch, with only
    one int64 per record of extra memory) and each batch is gathered with one
    vectorised `tf.gather`, instead of slicing records one by one.

    With `repeat=True` and a seed the result is an endless stream of passes
    whose order depends only on `(seed, pass number)` (a stateless shuffle),
    not on how many iterators were made before: a resumed run that skips the
    batches it already trained on sees exactly the batches an uninterrupted
    run would.

    Args:
        x: a NumPy array, or a dict / tuple / list of arrays (multi-input
            models), first dimension = records.
        y: the targets (array or structure of arrays), or None.
        batch_size: records per batch.
        shuffle: reshuffle every epoch.
        seed: seed of the shuffle.
        drop_remainder: drop the last short batch.
        repeat: make an endless stream of passes (each pass keeps its own
            short last batch).

    Returns:
        A `tf.data.Dataset` of `(x, y)` batches (or `x` when `y` is None), with
        a `kerasfast_info` attribute (`ArrayDatasetInfo`).

    Example:

    >>> import numpy as np, kerasfast.data as kd
    >>> ds = kd.array_dataset(np.zeros((100, 4), "float32"), np.arange(100), batch_size=32)
    >>> ds.kerasfast_info.steps_per_epoch
    4
    """
    import tensorflow as tf

    if not is_int(batch_size) or batch_size < 1:
        raise DataError(f"batch_size={batch_size!r}: pass a positive integer.")
    data = x if y is None else (x, y)
    leaves = tf.nest.flatten(data)
    if not leaves:
        raise DataError("x is empty; pass at least one array.")
    arrays = [np.asarray(a) for a in leaves]
    lengths = [a.shape[0] if a.ndim else None for a in arrays]
    if None in lengths or len(set(lengths)) != 1:
        raise DataError(f"x and y need the same number of records (first dimension), got {lengths}.")
    n = lengths[0]
    if n == 0:
        raise DataError("the arrays have no records.")
    tensors = tf.nest.pack_sequence_as(data, [tf.convert_to_tensor(a) for a in arrays])

    if repeat:
        def one_pass(pass_number):
            order = tf.range(n, dtype=tf.int64)
            if shuffle:
                pass_seed = tf.stack([tf.constant(seed or 0, tf.int64), pass_number])
                order = tf.random.experimental.stateless_shuffle(order, seed=pass_seed)
            return tf.data.Dataset.from_tensor_slices(order).batch(batch_size, drop_remainder=drop_remainder)

        batches = tf.data.Dataset.range(2**62).flat_map(one_pass)
    else:
        indices = tf.data.Dataset.range(n)
        if shuffle:
            indices = indices.shuffle(n, seed=seed, reshuffle_each_iteration=True)
        batches = indices.batch(batch_size, drop_remainder=drop_remainder)
    ds = batches.map(lambda idx: tf.nest.map_structure(lambda t: tf.gather(t, idx), tensors),
                     num_parallel_calls=tf.data.AUTOTUNE, deterministic=seed is not None or not shuffle)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    steps = n // batch_size if drop_remainder else math.ceil(n / batch_size)
    ds.kerasfast_info = ArrayDatasetInfo(n, batch_size, steps, bool(shuffle), bool(drop_remainder),
                                         None if y is None else "y")
    return ds
