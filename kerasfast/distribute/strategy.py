"""Choosing and creating the tf.distribute strategy.

`resolve_strategy()` turns `strategy="auto" | "none" | "mirrored" |
"multi_worker" | <tf.distribute.Strategy>` into a `Distribution`: the
strategy object (None for one device), its name, the number of replicas,
this process's worker index and why it was chosen.

MultiWorkerMirroredStrategy must exist before TensorFlow's runtime starts
(collective ops are configured at start-up). TensorFlow allows one per
process, so it is created once and reused: call
`kerasfast.distribute.setup()` at the top of a multi-worker script.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os

from kerasfast.distribute import ray_train
from kerasfast.errors import PlanError
from kerasfast.hardware import Hardware

STRATEGIES = ("auto", "none", "mirrored", "multi_worker")
# A collective that has not completed in this time means a peer is gone
# (override with the KERASFAST_COLLECTIVE_TIMEOUT environment variable).
DEFAULT_COLLECTIVE_TIMEOUT_S = 120

_MULTI_WORKER = {}  # the process's one MultiWorkerMirroredStrategy, as TF allows only one


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """This process's place in a multi-worker job, from `TF_CONFIG`.

    Attributes:
        workers: Worker addresses ("host:port").
        index: This worker's index (0 is the chief).
    """

    workers: tuple[str, ...] = ()
    index: int = 0

    @property
    def num_workers(self) -> int:
        return max(1, len(self.workers))

    @property
    def is_chief(self) -> bool:
        return self.index == 0


def cluster_from_env(environ=None) -> ClusterSpec:
    """Reads `TF_CONFIG` (as Kubeflow TFJob, Vertex AI, SageMaker and `kerasfast launch` set it).

    Raises:
        PlanError: For a `TF_CONFIG` that is not valid JSON or lacks the task.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get("TF_CONFIG")
    if not raw:
        return ClusterSpec()
    try:
        config = json.loads(raw)
        cluster = config.get("cluster", {})
        workers = tuple(cluster.get("chief", [])) + tuple(cluster.get("worker", []))
        task = config.get("task", {})
        index = int(task.get("index", 0))
        if task.get("type", "worker") == "worker" and cluster.get("chief"):
            index += 1
    except (ValueError, TypeError, AttributeError) as error:
        raise PlanError(
            f"TF_CONFIG is not valid ({error}): it must be JSON like "
            '{"cluster": {"worker": ["host0:port", "host1:port"]}, "task": {"type": "worker", "index": 0}}.'
        ) from error
    if workers and not 0 <= index < len(workers):
        raise PlanError(f"TF_CONFIG task index {index} is outside the {len(workers)} workers of the cluster.")
    return ClusterSpec(workers, index)


@dataclasses.dataclass(frozen=True)
class Distribution:
    """The resolved distribution set-up.

    Attributes:
        strategy: A `tf.distribute.Strategy`, or None for one device.
        name: "none", "mirrored", "multi_worker" or the strategy's class name.
        num_replicas: Replicas in sync over the whole job.
        cluster: This process's place in the job.
        reason: Why this strategy, for the plan.
    """

    strategy: object
    name: str
    num_replicas: int
    cluster: ClusterSpec
    reason: str

    @property
    def is_chief(self) -> bool:
        return self.cluster.is_chief


def scope_of(strategy):
    """`strategy.scope()`, or a block that does nothing for None (one device).

    >>> with scope_of(None):
    ...     pass
    """
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def _runtime_started() -> bool:
    from kerasfast.threads import runtime_started

    return runtime_started()


def _default_timeout() -> int:
    return int(os.environ.get("KERASFAST_COLLECTIVE_TIMEOUT", DEFAULT_COLLECTIVE_TIMEOUT_S))


_MIRRORED: dict = {}
# Where kerasfast's strategies number their collective operations from: far
# from the 0 every other MirroredStrategy in the process starts at, and
# apart for each set of devices.
COLLECTIVE_KEY_BASE = 1_000_000
COLLECTIVE_KEYS_PER_STRATEGY = 100_000


def _mirrored(devices):
    """One MirroredStrategy per set of devices for the whole process.

    Each new strategy numbers its collective operations from the same start,
    and TensorFlow keeps the first shapes seen under a number: a second
    strategy training another model in the same process would all-reduce
    mismatched tensors ("Shape mismatch in the collective instance"). So
    kerasfast makes one per set of devices, numbered apart from the ones the
    user makes (`_compat.mirrored_strategy`).
    """
    from kerasfast import _compat  # here: the launcher imports this module without Keras installed

    key = tuple(devices)
    if key not in _MIRRORED:
        base = COLLECTIVE_KEY_BASE + COLLECTIVE_KEYS_PER_STRATEGY * len(_MIRRORED)
        _MIRRORED[key] = _compat.mirrored_strategy(devices, base)
    return _MIRRORED[key]


def multi_worker_strategy(timeout_seconds: int | None = None):
    """The process's MultiWorkerMirroredStrategy, created on first use.

    Args:
        timeout_seconds: Collective operations that take longer fail with an
            error naming the lost peer instead of hanging (default 120 s, or
            the KERASFAST_COLLECTIVE_TIMEOUT environment variable).

    Raises:
        PlanError: When TensorFlow started before the strategy was created.
    """
    import tensorflow as tf

    if "strategy" in _MULTI_WORKER:
        return _MULTI_WORKER["strategy"]
    if _runtime_started():
        raise PlanError(
            "MultiWorkerMirroredStrategy must be created before TensorFlow starts, but a model or tensor "
            "already exists. Call kerasfast.distribute.setup() at the top of the script, and pass fit a "
            "function that builds the model (or build it after setup())."
        )
    ray_train.quiet_worker_loggers()  # a Ray Train worker logs TensorFlow's and Ray's INFO lines
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        timeout_seconds=timeout_seconds or _default_timeout(),
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    _MULTI_WORKER["strategy"] = strategy
    return strategy


def setup(strategy="auto", timeout_seconds: int | None = None):
    """Creates the strategy a multi-worker script needs; call it first thing.

    In a single-process run this does nothing and returns None.

    Example:

    >>> import kerasfast
    >>> kerasfast.distribute.setup()   # top of train.py, before any model
    """
    cluster = cluster_from_env()
    if strategy in ("auto", "multi_worker") and cluster.num_workers > 1:
        return multi_worker_strategy(timeout_seconds)
    return None


def _local_devices():
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return [d.name for d in gpus], False
    return [d.name for d in tf.config.list_logical_devices("CPU")], True


def resolve_strategy(requested="auto", hardware: Hardware | None = None) -> Distribution:
    """Chooses the strategy for this process.

    Args:
        requested: "auto", "none", "mirrored", "multi_worker", or a
            `tf.distribute.Strategy` instance.
        hardware: The machine (for the reason text).

    Returns:
        A `Distribution`.

    Raises:
        PlanError: For an unknown name or a strategy that cannot be made here.
    """
    import tensorflow as tf

    cluster = cluster_from_env()
    if isinstance(requested, tf.distribute.Strategy):
        name = type(requested).__name__
        return Distribution(requested, name, requested.num_replicas_in_sync, cluster,
                            f"yours: {name} over {requested.num_replicas_in_sync} replica(s)")
    if requested not in STRATEGIES:
        raise PlanError(f"strategy={requested!r} is not known: use one of {', '.join(STRATEGIES)} or a "
                        "tf.distribute.Strategy.")
    if requested == "none":
        return Distribution(None, "none", 1, cluster, "requested: one device")
    if requested == "multi_worker" or (requested == "auto" and cluster.num_workers > 1):
        if cluster.num_workers < 2 and requested == "multi_worker":
            raise PlanError(
                "strategy='multi_worker' needs TF_CONFIG listing several workers: start the script with "
                "`kerasfast launch -n 2 -- python train.py` or set TF_CONFIG as your cluster does."
            )
        strategy = multi_worker_strategy()
        why = "requested" if requested == "multi_worker" else "auto"
        return Distribution(
            strategy, "multi_worker", strategy.num_replicas_in_sync, cluster,
            f"{why}: TF_CONFIG lists {cluster.num_workers} workers; this is worker {cluster.index}",
        )
    devices, on_cpu = _local_devices()
    if requested == "mirrored":
        if len(devices) < 2:
            raise PlanError(
                "strategy='mirrored' needs at least 2 devices, but TensorFlow sees "
                f"{len(devices)}: use strategy='none', or split a CPU with "
                "tf.config.set_logical_device_configuration before TensorFlow starts."
            )
        strategy = _mirrored(devices)
        return Distribution(strategy, "mirrored", len(devices), cluster,
                            f"requested: MirroredStrategy over {len(devices)} {'CPU' if on_cpu else 'GPU'} devices")
    if not on_cpu and len(devices) > 1:
        strategy = _mirrored(devices)
        return Distribution(strategy, "mirrored", len(devices), cluster,
                            f"auto: {len(devices)} GPUs on this machine")
    where = "GPU" if not on_cpu else "device"
    return Distribution(None, "none", 1, cluster, f"auto: one {where}")
