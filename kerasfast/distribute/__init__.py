"""Data-parallel training over several devices and machines (tf.distribute)."""

from kerasfast.distribute.strategy import (
    ClusterSpec,
    Distribution,
    cluster_from_env,
    multi_worker_strategy,
    resolve_strategy,
    setup,
)

__all__ = [
    "ClusterSpec", "Distribution", "cluster_from_env", "multi_worker_strategy",
    "resolve_strategy", "setup",
]
