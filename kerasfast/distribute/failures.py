"""Turning a lost peer into a clear, bounded failure.

A worker whose peer died sees a collective fail (the peer's connection is
gone) or time out (`DEFAULT_COLLECTIVE_TIMEOUT_S`), deep inside TensorFlow.
`lost_peer_errors()` re-raises that as a `KerasfastError` that says which
worker was lost and what to do.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable

from kerasfast.errors import LostWorkerError


def _lost_tasks(message: str) -> list[int]:
    return sorted({int(task) for task in re.findall(r"/job:worker/(?:replica:\d+/)?task:(\d+)", message)})


@contextlib.contextmanager
def lost_peer_errors(distribution_of: Callable[[], object | None]):
    """Re-raises a collective failure of a multi-worker run as `LostWorkerError`.

    Args:
        distribution_of: Returns the run's distribution (None before it is
            resolved), read when an error comes: a peer can be lost in any
            phase whose collectives wait for it (the plan's agreement, the
            first weights' broadcast, training, the end of the run), e.g. a
            worker that exited before its first step.
    """
    import tensorflow as tf

    try:
        yield
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError,
            tf.errors.AbortedError, tf.errors.InternalError) as error:
        distribution = distribution_of()
        if distribution is None or distribution.name != "multi_worker":
            raise
        me = distribution.cluster.index
        lost = [task for task in _lost_tasks(str(error)) if task != me]
        who = f"worker(s) {', '.join(map(str, lost))}" if lost else "a peer worker"
        raise LostWorkerError(
            f"worker {me} lost contact with {who} ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:300]}). The job cannot continue without every worker: restart all "
            "workers with the same command; with backup_dir= (on by default inside run_dir) training resumes "
            "from the last backup."
        ) from error
