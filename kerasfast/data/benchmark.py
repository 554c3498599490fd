"""`benchmark`: how fast an input pipeline delivers data, with no model attached."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from kerasfast.errors import DataError


@dataclasses.dataclass
class BenchmarkResult:
    """Throughput of a pipeline alone.

    Attributes:
        batches: batches timed (after warm-up).
        records: records in those batches.
        seconds: wall time of the timed part.
        records_per_second: records / seconds.
        mb_per_second: MB (1e6 bytes) of decoded tensors delivered per second.
        file_mb_per_second: MB of TFRecord files read per second, when known
            (kerasfast datasets with a schema); None otherwise.
        cpu_seconds: CPU time of all the process's threads in the timed
            part (the pipeline's own threads included), which unlike the
            wall time does not depend on how many cores are free.
    """

    batches: int
    records: int
    seconds: float
    records_per_second: float
    mb_per_second: float
    file_mb_per_second: float | None = None
    cpu_seconds: float | None = None

    def __str__(self) -> str:
        text = (f"{self.records_per_second:,.0f} records/s, {self.mb_per_second:,.1f} MB/s decoded "
                f"({self.records} records in {self.batches} batches, {self.seconds:.2f}s)")
        if self.file_mb_per_second is not None:
            text += f", {self.file_mb_per_second:,.1f} MB/s from files"
        return text


def _batch_size_and_bytes(batch):
    """(records, bytes) of one batch as tensors: records = first dimension of the first leaf."""
    import tensorflow as tf

    leaves = tf.nest.flatten(batch)
    first = leaves[0]
    records = tf.shape(first, out_type=tf.int64)[0] if first.shape.rank else tf.constant(1, tf.int64)
    nbytes = tf.constant(0, tf.int64)
    for t in leaves:
        if t.dtype == tf.string:
            nbytes += tf.reduce_sum(tf.cast(tf.strings.length(t), tf.int64))
        else:
            nbytes += tf.size(t, out_type=tf.int64) * t.dtype.size
    return records, nbytes


def _make_consumer():
    """A compiled loop that pulls up to n batches from an iterator, as a training step would.

    Pulling batches from Python costs ~0.1-0.5 ms each, which would cap the
    measured rate of a fast pipeline; a model's `fit` pulls them from a graph too.
    """
    import tensorflow as tf

    @tf.function
    def consume(iterator, n):
        batches = tf.constant(0, tf.int64)
        records = tf.constant(0, tf.int64)
        nbytes = tf.constant(0, tf.int64)
        while batches < n:
            optional = iterator.get_next_as_optional()
            if not optional.has_value():
                break
            r, b = _batch_size_and_bytes(optional.get_value())
            batches += 1
            records += r
            nbytes += b
        return batches, records, nbytes

    return consume


def benchmark(dataset: Any, steps: int | None = 100, warmup: int = 5) -> BenchmarkResult:
    """Times a dataset on its own: records/s and MB/s of the pipeline.

    Run it to see whether input can keep up with training: if the model
    trains at N records/s and the pipeline delivers less, training is
    input-bound.

    Args:
        dataset: a `tf.data.Dataset` (any kind; kerasfast's also report
            MB/s read from the files).
        steps: batches to time after the warm-up; None for the whole
            dataset (do not use None with an infinitely repeating dataset).
        warmup: batches read first and not timed (thread pools, autotuning,
            file opening).

    Returns:
        A `BenchmarkResult`.

    Example:

    >>> import numpy as np, kerasfast.data as kd
    >>> ds = kd.array_dataset(np.zeros((256, 4), "float32"), np.zeros(256), batch_size=32)
    >>> kd.benchmark(ds, steps=4, warmup=1).records
    128
    """
    if steps is not None and steps < 1:
        raise DataError(f"steps={steps!r}: pass a positive number of batches, or None for one full pass.")
    if warmup < 0:
        raise DataError(f"warmup={warmup!r} must be >= 0.")
    import tensorflow as tf

    consume = _make_consumer()
    iterator = iter(dataset)
    # Traced here, untimed: the timed call below reuses the graph (n is a tensor, so no retrace).
    consume.get_concrete_function(iterator, tf.TensorSpec([], tf.int64))
    if warmup:
        done, _, _ = consume(iterator, tf.constant(warmup, tf.int64))
        if int(done) < warmup:
            raise DataError(f"the dataset ended during the {warmup} warm-up batches; lower warmup= or use a "
                            f"larger (or repeated) dataset.")
    limit = -1 if steps is None else steps  # -1: until the dataset ends
    started, cpu_started = time.perf_counter(), time.process_time()
    batches, records, nbytes = (int(v) for v in consume(iterator, tf.constant(limit if limit > 0 else 2**62, tf.int64)))
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    if batches == 0:
        raise DataError("the dataset produced no batches after the warm-up; nothing to time.")
    file_rate = None
    info = getattr(dataset, "kerasfast_info", None)
    shards = getattr(getattr(info, "schema", None), "shards", None)
    if shards:
        total_records = sum(s.num_records for s in shards)
        if total_records:
            bytes_per_record = sum(s.num_bytes for s in shards) / total_records
            file_rate = records * bytes_per_record / seconds / 1e6
    return BenchmarkResult(batches, records, seconds, records / seconds, nbytes / seconds / 1e6, file_rate,
                           cpu_seconds)
