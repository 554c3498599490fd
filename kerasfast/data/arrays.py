"""`array_dataset`: in-memory NumPy data -> a fast, batched `tf.data.Dataset`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from kerasfast import _compat
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


def _is_ragged(leaf) -> bool:
    import tensorflow as tf

    return isinstance(leaf, tf.RaggedTensor)


def num_rows(leaf) -> int | None:
    """Records in one array (NumPy, tensor, ragged or sparse): its first dimension; None for a scalar."""
    if _compat.is_sparse(leaf) or _is_ragged(leaf):
        return int(leaf.shape[0])
    return int(np.shape(leaf)[0]) if np.ndim(leaf) else None


def first_rows(leaf, count: int):
    """The first `count` records of one array, as a tensor (ragged and sparse kept so)."""
    import tensorflow as tf

    if _compat.is_sparse(leaf):
        return _compat.gather_sparse_rows(_compat.sparse_rows(leaf), tf.range(min(count, num_rows(leaf))))
    return leaf[:count] if _is_ragged(leaf) else tf.convert_to_tensor(leaf[:count])


def _rows(leaf):
    """`(source, take)`: the array in memory and `take(source, indices)` gathering records from it."""
    import tensorflow as tf

    if _compat.is_sparse(leaf):  # tf.gather does not take sparse tensors: Keras's row-split form does
        return _compat.sparse_rows(leaf), _compat.gather_sparse_rows
    source = leaf if _is_ragged(leaf) else tf.convert_to_tensor(np.asarray(leaf))
    return source, tf.gather


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
        x: a NumPy array (or a tensor, `tf.RaggedTensor`, `tf.SparseTensor`,
            SciPy sparse matrix), or a dict / tuple / list of them
            (multi-input models), first dimension = records.
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
    lengths = [num_rows(a) for a in leaves]
    if None in lengths or len(set(lengths)) != 1:
        raise DataError(f"x and y need the same number of records (first dimension), got {lengths}.")
    n = lengths[0]
    if n == 0:
        raise DataError("the arrays have no records.")
    rows = [_rows(a) for a in leaves]

    @tf.autograph.experimental.do_not_convert  # no control flow: tf.data need not convert it
    def gather(idx):
        return tf.nest.pack_sequence_as(data, [take(source, idx) for source, take in rows])

    if repeat:
        @tf.autograph.experimental.do_not_convert
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
    ds = batches.map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=seed is not None or not shuffle)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    steps = n // batch_size if drop_remainder else math.ceil(n / batch_size)
    ds.kerasfast_info = ArrayDatasetInfo(n, batch_size, steps, bool(shuffle), bool(drop_remainder),
                                         None if y is None else "y")
    return ds
