"""Turning what the user passes as data into a batched `tf.data.Dataset`.

`fit` accepts a `tf.data.Dataset`, `(x, y)` / `(x, y, sample_weight)` NumPy
arrays, or a TFRecord path or pattern written by `kerasfast.data`. This
module normalises all of them, reads off the facts the plan needs (batch
size, samples per epoch) and checks that the data fits the model's inputs
before any training step, so a mismatch is a clear error, not a trace.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from kerasfast.errors import DataError
from kerasfast.plan import DataFacts


@dataclasses.dataclass
class PreparedData:
    """A batched dataset plus what is known about it.

    Attributes:
        dataset: Batched `tf.data.Dataset` of `(x, y[, sample_weight])`.
        facts: `DataFacts` for the plan.
        sample_inputs: The `x` of one batch (to build and check the model).
        description: One line for the plan and the run folder.
        sample_batch: One whole batch `(x, y[, sample_weight])`.
        source: "arrays", "tfrecords" or "dataset" (for input advice).
    """

    dataset: object
    facts: DataFacts
    sample_inputs: object
    description: str
    sample_batch: object = None
    source: str = "dataset"


def _first_dim(structure) -> int | None:
    import tensorflow as tf

    for tensor in tf.nest.flatten(structure):
        return int(tensor.shape[0]) if tensor.shape.rank else None
    return None


def _arrays(data, batch_size: int, shuffle: bool, seed: int | None, what: str, repeat: bool) -> PreparedData:
    import tensorflow as tf

    if not isinstance(data, (tuple, list)) or len(data) not in (2, 3):
        raise DataError(
            f"{what} as arrays must be a tuple (x, y) or (x, y, sample_weight), got a {type(data).__name__} "
            f"of length {len(data) if hasattr(data, '__len__') else '?'}."
        )
    parts = [data[0], data[1]] + ([data[2]] if len(data) == 3 else [])
    names = ("x", "y", "sample_weight")
    lengths = {}
    for name, part in zip(names, parts):
        for leaf in tf.nest.flatten(part):
            array = np.asarray(leaf)
            if array.ndim == 0:
                raise DataError(f"{what}: {name} is a scalar; it must have one row per sample.")
            lengths[name] = len(array)
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{k} has {v} rows" for k, v in lengths.items())
        raise DataError(f"{what}: the arrays disagree on the number of samples ({detail}); they must match.")
    num_samples = next(iter(lengths.values()))
    if num_samples == 0:
        raise DataError(f"{what} is empty: give at least one sample.")
    from kerasfast.data import array_dataset

    # x as the whole (x, y[, w]) tuple makes every element that tuple. The
    # endless, stateless stream lets a resumed run replay the exact order.
    dataset = array_dataset(tuple(parts), None, batch_size=batch_size, shuffle=shuffle, seed=seed,
                            repeat=repeat)
    sample = tf.nest.map_structure(lambda a: np.asarray(a)[:batch_size], tuple(parts))
    facts = DataFacts(batch_size=None, num_samples=num_samples, steps_per_epoch=math.ceil(num_samples / batch_size))
    return PreparedData(dataset, facts, sample[0], f"NumPy arrays, {num_samples} samples", sample, "arrays")


def _dataset(dataset, what: str) -> PreparedData:
    import tensorflow as tf

    try:
        first = next(iter(dataset.take(1)))
    except StopIteration:
        raise DataError(f"{what} is an empty tf.data.Dataset: it yields no batch.") from None
    if not isinstance(first, (tuple, list)) or len(first) not in (2, 3):
        raise DataError(
            f"{what} must yield (x, y) or (x, y, sample_weight) batches, but yields a {type(first).__name__}: "
            "map it to a tuple, e.g. dataset.map(lambda d: (d['image'], d['label']))."
        )
    batch = _first_dim(first[0])
    cardinality = int(dataset.cardinality())
    steps = cardinality if cardinality > 0 else None
    if cardinality == tf.data.INFINITE_CARDINALITY:
        detail = "infinite"
    else:
        detail = f"{steps} batches" if steps else "unknown length"
    facts = DataFacts(batch_size=batch, steps_per_epoch=steps)
    return PreparedData(dataset, facts, first[0], f"tf.data.Dataset, {detail}, batch {batch}", tuple(first))


def _tfrecords(pattern: str, batch_size: int, shuffle: bool, seed: int | None, what: str) -> PreparedData:
    from kerasfast import data as kf_data

    dataset = kf_data.tfrecord_dataset(pattern, batch_size=batch_size, shuffle=shuffle, seed=seed)
    info = dataset.kerasfast_info
    prepared = _dataset(dataset, what)
    prepared.facts = DataFacts(batch_size=None, num_samples=info.num_records, steps_per_epoch=info.steps_per_epoch)
    records = f", {info.num_records} records" if info.num_records else ""
    prepared.description = f"TFRecords {pattern}{records}; pipeline: {info.settings}"
    prepared.source = "tfrecords"
    return prepared


def sharded_tfrecord_stream(pattern: str, strategy, *, global_batch_size: int, shuffle: bool, seed: int | None):
    """`f(batches_done)` giving a distributed TFRecord stream in which every
    worker reads its own files (kerasfast.data shards by file when there are
    enough, else by record, and says so)."""
    from kerasfast import data as kf_data

    def stream_from(done: int):
        def worker_dataset(context):
            dataset = kf_data.tfrecord_dataset(
                pattern, batch_size=context.get_per_replica_batch_size(global_batch_size), shuffle=shuffle,
                seed=seed, input_context=context,
            ).repeat()
            # Each step takes one batch per local replica from this worker's pipeline.
            local_replicas = context.num_replicas_in_sync // context.num_input_pipelines
            return dataset.skip(done * local_replicas) if done else dataset

        return strategy.distribute_datasets_from_function(worker_dataset)

    return stream_from


def prepare_data(data, *, batch_size: int | None, shuffle: bool = True, seed: int | None = None,
                 what: str = "data", repeat: bool = False) -> PreparedData:
    """Normalises `data` into a batched dataset and describes it.

    Args:
        data: A `tf.data.Dataset` (already batched), `(x, y[, w])` arrays, or
            a TFRecord file, folder or glob pattern written by kerasfast.
        batch_size: Batch size for arrays and TFRecords; must be None or the
            dataset's own for a `tf.data.Dataset`.
        shuffle: Shuffle arrays / TFRecords every epoch.
        seed: Shuffle seed.
        what: How to call the data in error messages ("data",
            "validation_data").
        repeat: For arrays, return an endless, reproducible stream of
            passes (training); other data is repeated by the caller.

    Returns:
        A `PreparedData`.

    Raises:
        DataError: For data that cannot be used, naming what is wrong.
    """
    import tensorflow as tf

    if isinstance(data, tf.data.Dataset):
        return _dataset(data, what)
    if isinstance(data, (str, os.PathLike)):
        return _tfrecords(os.fspath(data), batch_size, shuffle, seed, what)
    if isinstance(data, (tuple, list)):
        return _arrays(data, batch_size, shuffle, seed, what, repeat)
    raise DataError(
        f"{what} of type {type(data).__name__} is not supported: pass a tf.data.Dataset, (x, y) NumPy arrays, "
        "or a TFRecord path/pattern."
    )


def check_inputs_match(model, sample_inputs, what: str = "data") -> None:
    """Raises `DataError` when a batch's inputs cannot feed `model`'s inputs.

    Only checks what the model declares (`model.inputs`); models without
    declared inputs are checked by building them on the batch.
    """
    import tensorflow as tf

    declared = getattr(model, "inputs", None)
    if not declared:
        return
    given = tf.nest.flatten(sample_inputs)
    if len(given) != len(declared):
        raise DataError(
            f"{what} has {len(given)} input tensor(s) but model {model.name!r} takes {len(declared)} "
            f"({', '.join(getattr(t, 'name', '?') for t in declared)})."
        )
    for tensor, spec in zip(given, declared):
        shape = tuple(np.shape(tensor))
        expected = tuple(spec.shape)
        compatible = len(shape) == len(expected) and all(
            e is None or e == s for s, e in zip(shape[1:], expected[1:])
        )
        if not compatible:
            raise DataError(
                f"{what} has inputs of shape {('batch',) + shape[1:]} but model {model.name!r} input "
                f"{getattr(spec, 'name', '')!r} expects {('batch',) + expected[1:]}: reshape the data "
                f"(e.g. x.reshape(-1, {', '.join(str(d) for d in expected[1:])})) or change the model's Input."
            )
