"""`kerasfast.fit` inside a Ray Train worker (`ray.train.tensorflow.TensorflowTrainer`).

Ray Train starts the workers on a cluster, sets `TF_CONFIG` on each (which
kerasfast's multi-worker path reads like any other), restarts the group
after a failure (`FailureConfig(max_failures=K)`), hands out Ray Data
shards and collects metrics and checkpoints. Inside a Ray Train worker,
`kerasfast.fit` also:

- puts its run folder, and so its backup, in the run's storage
  (`<storage_path>/<name>/kerasfast`, `RunConfig(storage_path=...)`) when
  `run_dir` is not given: a restarted group finds the backup there and
  resumes exactly where it stopped;
- reports each epoch's metrics with `ray.train.report` (the callback in
  `kerasfast.training.ray_report`), each with a small
  Ray checkpoint (`kerasfast.json`: the epoch and where kerasfast's backup
  is), as Ray Train keeps metrics only beside checkpoints; the last
  epoch's report carries the trained model, `model.keras`, saved by the
  chief after training.

`ray_dataset()` turns a worker's Ray Data shard into `fit`'s data;
`ray_runtime_env()` keeps the workers' consoles as quiet as any kerasfast
process; `run_on_ray_workers()` runs a training function on N workers
(`kerasfast recipe NAME --ray-workers N`).

Ray is imported only when a Ray Train worker has already imported it:
kerasfast imports and works without Ray installed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import sys
import warnings

from kerasfast.errors import DataError, PlanError

STORAGE_FOLDER = "kerasfast"  # the run folder's name inside the run's storage
CHECKPOINT_FILE = "kerasfast.json"


def train_context():
    """Ray Train's context when this process is a Ray Train worker, else None.

    Cheap outside Ray: a Ray Train worker has imported `ray.train` before
    running the user's function, so nothing is imported when it has not.

    >>> train_context() is None   # not a Ray Train worker
    True
    """
    if "ray.train" not in sys.modules:
        return None
    import ray.train

    try:
        return ray.train.get_context()
    except RuntimeError:  # imported, but this process runs no training function
        return None


# Ray Train 2.60 logs "Reporting training result N: TrainingReport(...)" at
# INFO, once per report and worker, through this module's logger (named by
# its file, so Ray's `LoggingConfig` level does not reach it).
_RAY_REPORT_LOGGER_MODULE = "ray.train.v2._internal.execution.context"


def quiet_worker_loggers() -> None:
    """In a Ray Train worker, Python notices at WARNING and above, as in any process.

    Ray sets a worker's root logger to INFO, so every line TensorFlow's
    `tensorflow` logger has at INFO ("Enabled multi-worker collective ops
    ...", "Collective all_reduce tensors ...") would reach the console,
    twice, and Ray Train prints a line per report and worker. A level the
    user set on those loggers is kept, and `KERASFAST_VERBOSE_TF=1` keeps
    them all.
    """
    from kerasfast._quiet import verbose_requested

    if verbose_requested() or train_context() is None:
        return
    report_module = sys.modules.get(_RAY_REPORT_LOGGER_MODULE)
    loggers = [logging.getLogger("tensorflow"), getattr(report_module, "logger", None)]
    for logger in loggers:
        if isinstance(logger, logging.Logger) and logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def quiet_worker() -> None:
    """Ray's `worker_process_setup_hook` for a quiet console (see `ray_runtime_env`).

    Runs as a Ray worker process starts, before Ray Train's worker imports
    TensorFlow (`ray.train.tensorflow` does), so TensorFlow's start-up lines
    (oneDNN, cudart, cuInit) are filtered as in any kerasfast process. A
    no-op with `KERASFAST_VERBOSE_TF=1`.
    """
    from kerasfast._quiet import quiet_tensorflow

    quiet_tensorflow()


def ray_runtime_env() -> dict:
    """A Ray `runtime_env` under which Ray Train workers print as any kerasfast process.

    - `worker_process_setup_hook`: `quiet_worker`, so TensorFlow's start-up
      lines are filtered in every worker (Ray's worker imports TensorFlow
      before the training function runs, so kerasfast cannot do it later).
    - `RAY_TRAIN_ENABLE_PRINT_PATCH=0`: Ray Train 2.60 turns each `print` of
      a worker into a log record and, since Ray wraps the worker's stdout,
      also prints it, so every line of kerasfast's plan and summary would
      appear twice.

    Pass it to `ray.init(runtime_env=...)` or `RunConfig(worker_runtime_env=...)`.

    Example:

    >>> sorted(ray_runtime_env())
    ['env_vars', 'worker_process_setup_hook']
    """
    return {"worker_process_setup_hook": f"{__name__}.{quiet_worker.__name__}",
            "env_vars": {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}}


def run_on_ray_workers(loop, config: dict, *, workers: int, storage, name: str) -> str | None:
    """Runs `loop(config)` on `workers` Ray Train workers and waits for them.

    Joins the Ray cluster that `RAY_ADDRESS` names, or starts a local one
    with this machine's CPUs, shared equally among the workers (on a
    cluster each worker takes Ray's default of one CPU). Workers print as
    any kerasfast process (`ray_runtime_env`), and Ray Train's own console
    lines are kept to warnings (one per report and worker otherwise).
    `kerasfast recipe NAME --ray-workers N` runs recipes this way.

    Args:
        loop: The training function (importable by the workers, e.g. a
            module-level function of an installed package).
        config: Its one argument, Ray's `train_loop_config`.
        workers: Number of Ray Train workers.
        storage: Ray's `RunConfig(storage_path=...)`: a folder every node sees.
        name: The run's name (its records go to `storage/name`).

    Returns:
        None when every worker finished, else the workers' error as text.

    Raises:
        PlanError: When Ray is not installed.
    """
    # Ray reads its authentication mode when imported: token authentication,
    # its default for a local cluster, chosen explicitly so that Ray does not
    # print a line saying it chose it.
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    try:
        import ray
        from ray.train import LoggingConfig, RunConfig, ScalingConfig
        from ray.train.tensorflow import TensorflowTrainer
    except ImportError as error:
        raise PlanError(f"Ray Train is not installed ({error}): pip install 'kerasfast[ray]'.") from error
    local = not os.environ.get("RAY_ADDRESS")
    cpus = os.cpu_count() or 1
    if not ray.is_initialized():
        # The job's environment also reaches Ray Train's controller, which imports TensorFlow too.
        ray.init(num_cpus=max(cpus, workers) if local else None, runtime_env=ray_runtime_env(),
                 logging_level=logging.WARNING)
    trainer = TensorflowTrainer(
        loop, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers,
                                     resources_per_worker={"CPU": max(1, cpus // workers) if local else 1}),
        # The workers' own environment too: a Ray the caller already started lacks the job's.
        run_config=RunConfig(name=name, storage_path=str(storage), worker_runtime_env=ray_runtime_env(),
                             logging_config=LoggingConfig(log_level="WARNING")))
    try:
        trainer.fit()
    except ray.train.TrainingFailedError as error:
        return str(error)
    return None


def run_storage(context) -> pathlib.Path | None:
    """`<storage_path>/<name>/kerasfast`: the run folder in the run's storage.

    None where that storage is not a folder of this machine's file system
    (e.g. `s3://`): kerasfast writes its files with plain file operations.
    """
    import pyarrow.fs

    try:
        storage = context.get_storage()
    except NotImplementedError:  # Ray Train's local mode has no storage
        return None
    if not isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem):
        warnings.warn(
            f"kerasfast: the Ray run's storage ({storage.storage_filesystem.type_name} file system) is not a "
            "local or mounted folder, so the run folder and backup are not kept there: pass fit run_dir= on "
            "storage every worker sees (e.g. a shared mount) for restarts to resume.", stacklevel=3)
        return None
    return pathlib.Path(storage.experiment_fs_path) / STORAGE_FOLDER


def with_run_storage(args):
    """`fit`'s arguments with `run_dir` in the Ray run's storage, when
    running in a Ray Train worker and `run_dir` was not given."""
    if args.run_dir is not None:
        return args
    context = train_context()
    folder = run_storage(context) if context is not None else None
    return args if folder is None else dataclasses.replace(args, run_dir=folder)


class RayShard:
    """One worker's share of a Ray Dataset, read into memory, as `fit`'s data.

    Made by `ray_dataset`. Under several workers each reads its own rows:
    a step takes the per-replica share of the global batch from each
    worker's rows (`strategy.distribute_datasets_from_function`), and an
    epoch is one pass over every worker's shard.

    Attributes:
        x, y, sample_weight: NumPy arrays (`x` a dict by column for several).
        num_rows: Rows in this worker's shard.
    """

    def __init__(self, x, y, sample_weight, num_rows: int):
        self.x, self.y, self.sample_weight, self.num_rows = x, y, sample_weight, num_rows

    def weighted(self, class_weight: dict | None) -> "RayShard":
        """This shard with `class_weight` turned into per-sample weights (multiplying its own, if any), as
        Keras applies `class_weight`; the shard itself when None."""
        if class_weight is None:
            return self
        import numpy as np

        from kerasfast.training.inputs import class_weights_for

        if self.y is None:
            raise DataError("class_weight= needs targets, and the Ray Data shard has none: pass y= to ray_dataset.")
        weights = class_weights_for(self.y, class_weight)
        if self.sample_weight is not None:
            weights = weights * np.asarray(self.sample_weight, "float32").reshape(weights.shape)
        return RayShard(self.x, self.y, weights, self.num_rows)

    def arrays(self) -> tuple:
        """`(x, y, sample_weight)`: the shard's columns."""
        return self.x, self.y, self.sample_weight

    def prepared(self, batch_size: int | None, num_workers: int, *, shuffle, seed: int | None):
        """kerasfast's `PreparedData` for the plan: this worker's rows, and
        the job's samples per epoch (every worker's shard, equal in size)."""
        import math

        from kerasfast.training.inputs import prepare_data

        prepared = prepare_data(self.x, self.y, self.sample_weight, batch_size=batch_size, shuffle=shuffle,
                                seed=seed, what="the Ray Data shard", repeat=True)
        samples = self.num_rows * num_workers
        prepared.facts = dataclasses.replace(prepared.facts, num_samples=samples,
                                             steps_per_epoch=math.ceil(samples / (batch_size or 32)))
        prepared.description = (f"Ray Data shard, {self.num_rows} rows on this worker; each of {num_workers} "
                                "worker(s) reads its own shard")
        prepared.remake = lambda new_batch_size, **changes: self.prepared(
            new_batch_size, num_workers, **{"shuffle": shuffle, "seed": seed, **changes})
        return prepared

    def stream(self, strategy, global_batch_size: int, *, shuffle, seed: int | None):
        """`f(batches_done)`: every worker's own rows, the per-replica share
        of the global batch per replica and step, endless passes shuffled by
        `(seed, pass)` (so a resumed run replays the same batches)."""
        import keras

        from kerasfast.data.arrays import array_dataset

        packed = keras.utils.pack_x_y_sample_weight(self.x, self.y, self.sample_weight)

        def stream_from(done: int):
            def worker_dataset(context):
                dataset = array_dataset(packed, None, batch_size=context.get_per_replica_batch_size(global_batch_size),
                                        shuffle=bool(shuffle), seed=seed, repeat=True)
                local_replicas = context.num_replicas_in_sync // context.num_input_pipelines
                return dataset.skip(done * local_replicas) if done else dataset

            return strategy.distribute_datasets_from_function(worker_dataset)

        return stream_from


def _columns(names, what: str):
    if names is None:
        return []
    names = [names] if isinstance(names, str) else list(names)
    if not names or not all(isinstance(name, str) for name in names):
        raise PlanError(f"ray_dataset({what}=...) takes a column name or a list of column names, not {names!r}.")
    return names


def ray_dataset(shard, x, y=None, sample_weight=None) -> RayShard:
    """A Ray Train worker's Ray Data shard as `kerasfast.fit`'s data.

    The shard (`ray.train.get_dataset_shard("train")`, a
    `ray.data.DataIterator`) is read into memory once, as NumPy arrays by
    column; each worker trains on its own shard (Ray splits the dataset
    into equal shards). `validation_split` is not taken: pass
    `validation_data=`.

    Args:
        shard: The worker's `ray.data.DataIterator`.
        x: The input column's name, or a list of names (a dict by name:
            one model input per column, named like it).
        y: The target column's name (or a list), or None.
        sample_weight: A column of per-sample weights, or None.

    Returns:
        A `RayShard` to pass to `fit` as its data.

    Raises:
        DataError: For a column the shard does not have, or an empty shard.

    Example:

    ```python
    def train_loop_per_worker(config):
        kerasfast.distribute.setup()
        data = kerasfast.distribute.ray_dataset(ray.train.get_dataset_shard("train"), x="x", y="y")
        kerasfast.fit(build_model(), data, epochs=3, batch_size=64)
    ```
    """
    import numpy as np

    wanted = {"x": _columns(x, "x"), "y": _columns(y, "y"), "sample_weight": _columns(sample_weight, "sample_weight")}
    if not wanted["x"]:
        raise PlanError("ray_dataset needs x=: the name of the input column (or a list of names).")
    names = [name for columns in wanted.values() for name in columns]
    parts = {name: [] for name in names}
    for batch in shard.iter_batches(batch_format="numpy", batch_size=4096):
        missing = [name for name in names if name not in batch]
        if missing:
            raise DataError(f"ray_dataset: the Ray Dataset has no column {', '.join(map(repr, missing))} (it has "
                            f"{', '.join(map(repr, sorted(batch)))}): name its columns in x=, y=, sample_weight=.")
        for name in names:
            parts[name].append(np.asarray(batch[name]))
    if not parts[names[0]]:
        raise DataError("ray_dataset: this worker's Ray Data shard is empty: give the dataset at least as many "
                        "rows as workers.")
    arrays = {name: np.concatenate(chunks) for name, chunks in parts.items()}

    def part(role):
        columns = wanted[role]
        if not columns:
            return None
        return arrays[columns[0]] if len(columns) == 1 else {name: arrays[name] for name in columns}

    return RayShard(part("x"), part("y"), part("sample_weight"), len(arrays[names[0]]))
