"""Data-parallel training over several devices and machines (tf.distribute)."""

from kerasfast.distribute.strategy import (
    ClusterSpec,
    Distribution,
    cluster_from_env,
    multi_worker_strategy,
    resolve_strategy,
    setup,
)
from kerasfast.distribute.ray_train import ray_dataset, ray_runtime_env

__all__ = [
    "ClusterSpec", "Distribution", "cluster_from_env", "multi_worker_strategy",
    "ray_dataset", "ray_runtime_env", "resolve_strategy", "setup",
]
