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

`ray_dataset()` turns a worker's Ray Data shard into `fit`'s data.

Ray is imported only when a Ray Train worker has already imported it:
kerasfast imports and works without Ray installed.
"""

from __future__ import annotations

import dataclasses
import logging
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


def quiet_tensorflow_logger() -> None:
    """In a Ray Train worker, TensorFlow's Python notices at WARNING and above, as in any process.

    Ray sets a worker's root logger to INFO, so every line TensorFlow's
    `tensorflow` logger has at INFO ("Enabled multi-worker collective ops
    ...", "Collective all_reduce tensors ...") would reach the console,
    twice. A level the user set on that logger is kept, and
    `KERASFAST_VERBOSE_TF=1` keeps them all.
    """
    from kerasfast._quiet import verbose_requested

    tf_logger = logging.getLogger("tensorflow")
    if tf_logger.level == logging.NOTSET and not verbose_requested() and train_context() is not None:
        tf_logger.setLevel(logging.WARNING)


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
