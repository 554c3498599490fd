"""`batch_size="auto"`: the batch a run should use, found with real train steps.

On a GPU the largest global batch that fits in its memory is the fastest
(the accelerator is only full with enough work per step): batches are
doubled until a step runs out of memory, caught as TensorFlow's
`ResourceExhaustedError`. On a CPU a bigger batch past the point where the
cores are busy only costs updates per epoch, so the finder keeps the
smallest batch whose measured samples/s is within `RATE_MARGIN` of the best,
among the batches whose estimated memory fits the bound (half of the memory
the machine has free, or `memory_limit_bytes`).

Each candidate runs a few real steps of the run's own train function from
`kerasfast.training.tuning`, and the model's weights, optimizer state and
metrics are restored afterwards. The learning rate is scaled from the batch
it was chosen for (Keras's default, 32): linearly for SGD, by the square
root for adaptive optimizers (Adam and the like), the rules of Goyal et al.
2017 and Malladi et al. 2022.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time

from kerasfast.errors import PlanError
from kerasfast.plan import FIRST_BATCH, learning_rate_factor  # noqa: F401 - the search's learning-rate rule

MAX_BATCH = 8192
CPU_MEMORY_SHARE = 0.5  # of the memory the machine has available
# A train step holds the forward pass's tensors, their gradients and the
# kernels' workspace: about three times the forward pass's tensors.
TRAIN_MEMORY_FACTOR = 3
# Measured rates vary by ~5% between short timings on a shared CPU: a batch
# within this margin of the fastest counts as as fast.
RATE_MARGIN = 1.05
# On a CPU, stop doubling after this many batches that were no faster.
PATIENCE = 2
SEARCH_BUDGET_S = 60.0
# A batch is at most this share of the data, so that every epoch makes at
# least this many updates: samples/s alone would favour one update per epoch.
MIN_STEPS_PER_EPOCH = 8


@dataclasses.dataclass
class BatchTrial:
    """One batch size tried: its measured rate, estimated memory and verdict."""

    batch_size: int
    samples_per_second: float = 0.0
    estimated_bytes: int | None = None
    verdict: str = ""


@dataclasses.dataclass
class BatchSizeFinding:
    """What `find_batch_size` chose, and why.

    Attributes:
        batch_size: The global batch size to train with.
        reason: One line for the plan.
        trials: Every batch size tried, in order.
    """

    batch_size: int
    reason: str
    trials: list[BatchTrial]


def cpu_memory_bound() -> int | None:
    """The memory a CPU run's batch may use: `$KERASFAST_MEMORY_LIMIT_BYTES`
    if set, else `CPU_MEMORY_SHARE` of what is free (the less of Linux's
    MemAvailable and the container's cgroup limit); None when unknown.

    Raises:
        PlanError: For a `KERASFAST_MEMORY_LIMIT_BYTES` that is not a positive integer.
    """
    import os

    given = os.environ.get("KERASFAST_MEMORY_LIMIT_BYTES")
    if given:
        if not given.isdigit() or int(given) < 1:
            raise PlanError(f"KERASFAST_MEMORY_LIMIT_BYTES={given!r} is not valid: use a positive number of bytes.")
        return int(given)
    free = []
    try:
        with open("/proc/meminfo") as meminfo:
            free += [int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:  # a container's limit, which /proc/meminfo does not show (cgroup v2)
        limit = pathlib.Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            free.append(int(limit) - int(pathlib.Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return int(CPU_MEMORY_SHARE * min(free)) if free else None


def candidate_batches(num_samples: int | None, num_replicas: int = 1) -> list[int]:
    """Doubling global batches from `FIRST_BATCH`, each a multiple of the
    replicas and small enough for `MIN_STEPS_PER_EPOCH` steps per epoch.

    Raises:
        PlanError: When the data is too small for even the first batch.

    Example:

    >>> candidate_batches(2400)
    [32, 64, 128, 256]
    """
    first = math.ceil(max(FIRST_BATCH, num_replicas) / num_replicas) * num_replicas
    if num_samples is not None and num_samples < first * MIN_STEPS_PER_EPOCH:
        raise PlanError(
            f"batch_size='auto' tries batches from {first} samples up, keeping at least {MIN_STEPS_PER_EPOCH} steps "
            f"per epoch, but the data holds only {num_samples} samples: pass batch_size= yourself (e.g. "
            f"{max(1, num_samples // MIN_STEPS_PER_EPOCH)})."
        )
    ceiling = min(MAX_BATCH, num_samples // MIN_STEPS_PER_EPOCH) if num_samples is not None else MAX_BATCH
    batches, batch = [], first
    while batch <= ceiling:
        batches.append(batch)
        batch *= 2
    return batches


def find_batch_size(model, computation_at, strategy, make_batches, *, num_samples: int | None, accelerator: str,
                    num_replicas: int = 1, bytes_per_sample: int | None = None, memory_limit_bytes: int | None = None,
                    budget_s: float = SEARCH_BUDGET_S, agree=None) -> BatchSizeFinding:
    """Tries doubling batch sizes with real train steps and picks one.

    Args:
        model: The compiled, built model (its state is restored afterwards).
        computation_at: `f(global_batch) -> kerasfast.plan.Computation`: how
            the run's steps would compute at that batch (precision, XLA,
            steps per execution), which each candidate runs.
        strategy: The `tf.distribute.Strategy` (the default one on one device).
        make_batches: `f(batch_size) -> tf.data.Dataset` of a few batches of
            that size, from the run's own data.
        num_samples: Samples in the data (the largest batch), if known.
        accelerator: "gpu" (largest batch that fits) or "cpu" (fastest
            within the memory bound).
        bytes_per_sample: Memory a sample's forward pass holds
            (`kerasfast.costs.activation_bytes_per_sample`), for the bound.
        memory_limit_bytes: The memory bound; None: on a CPU
            `cpu_memory_bound()`, on a GPU whatever runs without running out.
        num_replicas: Replicas sharing each global batch.
        budget_s: Seconds the search may take.
        agree: `f(flag) -> flag` making a yes/no decision the chief's on every
            worker; None on one process.

    Returns:
        A `BatchSizeFinding`.

    Raises:
        PlanError: When not even the first batch fits or runs.
    """
    import tensorflow as tf

    from kerasfast.training import tuning
    from kerasfast.training.session import borrowed

    if memory_limit_bytes is None and accelerator == "cpu":
        memory_limit_bytes = cpu_memory_bound()
    trials, functions, started, slower_in_a_row = [], {}, time.perf_counter(), 0

    def decided(flag: bool) -> bool:
        return agree(flag) if agree is not None else flag

    for index, batch in enumerate(candidate_batches(num_samples, num_replicas)):
        trial = BatchTrial(batch)
        trials.append(trial)
        if bytes_per_sample:
            trial.estimated_bytes = TRAIN_MEMORY_FACTOR * bytes_per_sample * batch
        if decided(bool(memory_limit_bytes and trial.estimated_bytes and trial.estimated_bytes > memory_limit_bytes)):
            trial.verdict = (f"over the memory bound: ~{_megabytes(trial.estimated_bytes)} estimated, bound "
                             f"{_megabytes(memory_limit_bytes)}")
            break
        if index and decided(time.perf_counter() - started > budget_s):
            trial.verdict = "not tried: search budget spent"
            break
        candidate = computation_at(batch)
        try:
            with borrowed(model, None), tuning.state_restored(model):
                trial.samples_per_second = tuning.measure(
                    model, candidate, strategy, make_batches(batch), functions, index,
                    fixed_executions=tuning.FIXED_EXECUTIONS if agree is not None else None).samples_per_second
        except tf.errors.ResourceExhaustedError:
            trial.verdict = "out of memory"
        failed = decided(trial.verdict == "out of memory")
        if failed:
            trial.verdict = trial.verdict or "out of memory on another worker"
            break
        previous_best = max((t.samples_per_second for t in trials[:-1]), default=0.0)
        slower_in_a_row = 0 if trial.samples_per_second > RATE_MARGIN * previous_best else slower_in_a_row + 1
        if accelerator != "gpu" and decided(slower_in_a_row >= PATIENCE):
            break
    ran = [trial for trial in trials if trial.samples_per_second > 0]
    if not ran:
        raise PlanError(
            f"batch_size='auto' found no batch that runs: {trials[0].batch_size} samples failed "
            f"({trials[0].verdict}). Pass a smaller batch_size= yourself, or use remat=True or grad_accum_steps= to "
            "save memory."
        )
    if accelerator == "gpu":
        chosen = max(ran, key=lambda trial: trial.batch_size)
        why = "the largest that fits in GPU memory" + (
            "" if any(t.verdict for t in trials) else f" up to the data's {num_samples} samples or {MAX_BATCH}")
    else:
        fastest = max(trial.samples_per_second for trial in ran)
        chosen = min((trial for trial in ran if RATE_MARGIN * trial.samples_per_second >= fastest),
                     key=lambda trial: trial.batch_size)
        why = f"the smallest within {RATE_MARGIN - 1:.0%} of the fastest"
    for trial in ran:
        trial.verdict = "chosen" if trial is chosen else "ran"
    tried = ", ".join(f"{t.batch_size}: {t.samples_per_second:,.0f}/s" if t.samples_per_second
                      else f"{t.batch_size}: {t.verdict}" for t in trials)
    bound = f"; memory bound {_megabytes(memory_limit_bytes)}" if memory_limit_bytes else ""
    return BatchSizeFinding(chosen.batch_size, f"{chosen.batch_size}: batch_size='auto', {why} "
                            f"(samples/s measured: {tried}{bound})", trials)


def _megabytes(count: int | None) -> str:
    return f"{count / 2**20:,.0f} MiB" if count else "?"
