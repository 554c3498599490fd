"""Measuring training speed from inside `fit`.

`ThroughputMeter` is a Keras callback that times training executions. The
first execution of a run includes tracing and compilation, so it is reported
apart (`first_execution_s`) and left out of the steady-state rates.
Validation time is excluded: the clock stops at the last training batch of
each epoch.

The meter also keeps a timeline (`ThroughputMeter.timeline()`): cumulative
steps, samples, seconds and input wait at the end of executions, from which
the run report plots samples/s and the input-wait fraction over the run.
Recording one point costs a few Python operations and one read of the
input-wait counter; the timeline holds at most `2 * TIMELINE_POINTS` points
(past that, every other point is dropped and points are taken half as often),
so its cost stays negligible however long the run.
"""

from __future__ import annotations

import dataclasses
import time

import keras

from kerasfast import _compat

# The timeline keeps between TIMELINE_POINTS and twice as many points.
TIMELINE_POINTS = 1000


@dataclasses.dataclass(frozen=True)
class Throughput:
    """Steady-state training speed.

    Attributes:
        samples_per_second: Training samples per second after the first
            execution (None if the run was too short to tell).
        steps_per_second: Training steps per second, same window.
        first_execution_s: Seconds of the first execution (tracing +
            compilation + its steps).
        measured_steps: Steps in the steady-state window.
        measured_seconds: Seconds in the steady-state window.
        input_wait_fraction: Share of the steady-state time the steps spent
            waiting for their next batch (None when not measured).
    """

    samples_per_second: float | None
    steps_per_second: float | None
    first_execution_s: float | None
    measured_steps: int
    measured_seconds: float
    input_wait_fraction: float | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class ThroughputMeter(keras.callbacks.Callback):
    """Times training batches; read `.result()` after `fit`.

    Args:
        samples_in_steps: `f(first_step, last_step)` giving the number of
            samples in that inclusive range of steps, counted from the start
            of training (see `samples_counter`).
        steps_per_epoch: Steps per epoch when known (to number steps across
            epochs of a repeated data stream), else None.
        first_step: Steps of the first epoch already done before this run
            (a resumed run).
        input_wait_seconds: `f()` returning the seconds the train steps have
            waited for input so far (see `StepFunctions`), or None.
        steps_done: `f()` giving the train steps run so far (see
            `StepFunctions.micro_steps`), or None. When epochs have no set
            length, Keras numbers an epoch's last, shorter execution as a
            whole one; with it, the steps counted are those that ran.

    Example:

    >>> x, y = np.zeros((128, 4), "float32"), np.zeros((128, 1), "float32")
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> meter = ThroughputMeter(lambda a, b: (b - a + 1) * 32)  # 32 samples per step
    >>> _ = model.fit(x, y, batch_size=32, callbacks=[meter], verbose=0)
    >>> meter.result().samples_per_second > 0
    True
    >>> meter.timeline()["step"][:3]  # steps done at the first executions' ends
    [1, 2, 3]
    """

    def __init__(self, samples_in_steps, steps_per_epoch: int | None = None, first_step: int = 0,
                 input_wait_seconds=None, steps_done=None):
        super().__init__()
        self._steps_done_now = steps_done
        self._steps_done_before = None
        self._input_wait_seconds = input_wait_seconds
        self._wait_start = None
        self._wait_end = None
        self._samples_in_steps = samples_in_steps
        self._steps_per_epoch = steps_per_epoch
        self._offset = first_step
        self._epoch_start = 0
        self._first_execution_s = None
        self._steps = 0
        self._samples = 0
        self._seconds = 0.0
        self._last_end = None
        self._last_step = -1
        self._epoch = 0
        self._executions = 0  # steady-state executions since the first
        self._stride = 1  # a timeline point every this many executions
        self._points = []  # (epoch, steps done, seconds, samples, input wait seconds)
        self._recorded_last = True
        self._steps_done = 0
        self._counted = 0

    @property
    def steps_ended(self) -> int:
        """The train steps whose batch ended in this call (0 until the first execution ends)."""
        return self._counted

    def on_epoch_begin(self, epoch, logs=None):
        if self._last_step >= 0:  # a later epoch: only the first one is resumed mid-way
            self._offset = 0
        self._epoch_start = epoch * self._steps_per_epoch + self._offset if self._steps_per_epoch else 0
        self._epoch = epoch
        self._last_end = None
        self._last_step = -1

    def on_train_batch_begin(self, batch, logs=None):
        if self._last_end is None:
            self._last_end = time.perf_counter()
        if self._steps_done_now is not None:
            self._steps_done_before = self._steps_done_now()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        first, last = self._last_step + 1, batch
        if self._steps_per_epoch:
            # Keras numbers an epoch's last, shorter execution as a whole one.
            last = min(last, self._steps_per_epoch - self._offset - 1)
        elif self._steps_done_before is not None:
            last = first + self._steps_done_now() - self._steps_done_before - 1  # the steps that ran
            batch = last
        self._counted += last - first + 1
        # Steps done since the start of training (counted here when epochs have no set length).
        self._steps_done = self._epoch_start + last + 1 if self._steps_per_epoch else self._counted
        if self._first_execution_s is None:
            self._first_execution_s = now - self._last_end
            if self._input_wait_seconds is not None:
                self._wait_start = self._input_wait_seconds()
            # The timeline's origin: where the steady-state window starts.
            self._points.append((self._epoch, self._steps_done, 0.0, 0, self._wait_start))
        else:
            self._steps += last - first + 1
            self._samples += self._samples_in_steps(self._epoch_start + first, self._epoch_start + last)
            self._seconds += now - self._last_end
            self._executions += 1
            self._recorded_last = self._executions % self._stride == 0
            if self._recorded_last:
                self._record(self._steps_done)
        self._last_end = now
        self._last_step = batch

    def _record(self, steps_done: int) -> None:
        wait = self._input_wait_seconds() if self._input_wait_seconds is not None else None
        self._points.append((self._epoch, steps_done, self._seconds, self._samples, wait))
        if len(self._points) > 2 * TIMELINE_POINTS:
            # Keep the origin and the points at multiples of twice the stride.
            self._points = self._points[:1] + self._points[2::2]
            self._stride *= 2

    def on_train_end(self, logs=None):
        if self._input_wait_seconds is not None and self._wait_start is not None:
            self._wait_end = self._input_wait_seconds()
        if not self._recorded_last and self._points:
            # The last executions since the latest point (a fit call's end).
            self._record(self._steps_done)
            self._recorded_last = True

    def result(self) -> Throughput:
        if self._steps == 0 or self._seconds <= 0:
            return Throughput(None, None, self._first_execution_s, 0, 0.0)
        wait = None
        if self._wait_end is not None:
            wait = min(1.0, max(0.0, (self._wait_end - self._wait_start) / self._seconds))
        return Throughput(
            samples_per_second=self._samples / self._seconds,
            steps_per_second=self._steps / self._seconds,
            first_execution_s=self._first_execution_s,
            measured_steps=self._steps,
            measured_seconds=self._seconds,
            input_wait_fraction=wait,
        )

    def timeline(self) -> dict:
        """The run's throughput over time, as JSON-ready lists of equal length.

        Returns:
            `{"epoch", "step", "seconds", "samples", "input_wait_seconds"}`:
            at the end of the first execution (the origin: seconds and samples 0)
            and of later executions, the epoch, the steps done since the
            start of training, and the cumulative steady-state seconds,
            samples and seconds spent waiting for input (None when not
            measured). Samples/s between two points is the difference of
            `samples` over that of `seconds`. Empty lists when the run had
            only its first execution.
        """
        points = self._points if len(self._points) > 1 else []
        names = ("epoch", "step", "seconds", "samples", "input_wait_seconds")
        return {name: [point[index] for point in points] for index, name in enumerate(names)}


# Below this share of step time spent waiting for input, the input pipeline
# keeps up; above INPUT_BOUND it is what limits training.
INPUT_OK, INPUT_BOUND = 0.05, 0.2


def input_advice(fraction: float | None, source: str, plan=None, dataset=None) -> str:
    """One line saying whether training waited for input, and what to do.

    Args:
        fraction: `Throughput.input_wait_fraction`.
        source: "arrays", "tfrecords", "dataset" (a `tf.data.Dataset`) or
            "python" (a `PyDataset` or a generator).
        plan: The run's `Plan`, if known: advice to lengthen the executions
            is left out once they span the whole epoch (they cannot grow).
        dataset: The user's `tf.data.Dataset` (source "dataset"), if known:
            the advice names what its pipeline lacks.

    Returns:
        The line, e.g. `"not input-bound: 3% of step time waiting for input"`.

    Example:

    >>> input_advice(0.4, "arrays")
    'input-bound: 40% of step time waiting for input; the in-memory pipeline cannot feed the model: use a larger batch_size or steps_per_execution'
    """
    if fraction is None:
        return "input wait not measured (run too short)"
    share = f"{fraction:.0%} of step time waiting for input"
    if fraction < INPUT_OK:
        return f"not input-bound: {share}"
    at_cap = plan is not None and plan.steps_per_epoch and plan.steps_per_execution >= plan.steps_per_epoch
    larger = "use a larger batch_size" + (
        f" (steps_per_execution already spans the epoch's {plan.steps_per_epoch} steps)" if at_cap
        else " or steps_per_execution")
    tips = {
        "arrays": f"the in-memory pipeline cannot feed the model: {larger}",
        "tfrecords": "raise parallelism (num_parallel_reads / parse_parallelism), cache='memory' if the data "
                     "fits, write more shards, or use a faster disk",
        "dataset": _dataset_tips(dataset),
        "python": "its batches come from Python code, one at a time: give a keras.utils.PyDataset workers= (and "
                  "use_multiprocessing=True for CPU-heavy code), or write the data as TFRecords "
                  "(kerasfast.data.write_tfrecords) and pass the folder",
    }
    level = "input-bound" if fraction >= INPUT_BOUND else "partly input-bound"
    return f"{level}: {share}; {tips.get(source, tips['dataset'])}"


def _dataset_tips(dataset) -> str:
    """What would feed a `tf.data` pipeline faster: what it lacks of parallel maps, a cache and a prefetch."""
    if dataset is None:
        return "add num_parallel_calls=tf.data.AUTOTUNE to its map()s, .cache() and .prefetch(tf.data.AUTOTUNE)"
    kinds = _compat.dataset_kinds(dataset)
    tips = []
    if "from_generator" in kinds:
        tips.append("its elements come from a Python generator (Dataset.from_generator), one at a time: build it "
                    "from tensors or files (kerasfast.data.write_tfrecords) instead")
    sequential = kinds.count("_MapDataset")  # the user's own: tf.data's inside unbatch() and the like are named apart
    if sequential:
        tips.append(f"add num_parallel_calls=tf.data.AUTOTUNE to its {sequential} map() call(s) without it")
    if "CacheDataset" not in kinds:
        tips.append(".cache() after its costly steps if the data fits in memory")
    if "_PrefetchDataset" not in kinds:
        tips.append("end it with .prefetch(tf.data.AUTOTUNE)")
    if tips:
        return "; ".join(tips)
    done = "its maps run in parallel, it is cached" if "_ParallelMapDataset" in kinds else "it is cached"
    return (f"{done} and it prefetches: the work per element is the limit: batch() before map() to work on whole "
            "batches, or a larger batch_size")


def samples_counter(batch_size: int, num_samples: int | None):
    """Returns `f(first_step, last_step)` counting the samples of those steps.

    Steps are numbered from the start of training over a data stream that
    repeats passes of `num_samples` samples; the last batch of each pass is
    partial. Without `num_samples` every step counts `batch_size`.
    """
    batches_per_pass = -(-num_samples // batch_size) if num_samples else None

    def count(first: int, last: int) -> int:
        total = 0
        for step in range(first, last + 1):
            if batches_per_pass and step % batches_per_pass == batches_per_pass - 1:
                total += num_samples - (batches_per_pass - 1) * batch_size
            else:
                total += batch_size
        return total

    return count
