"""The Keras callback that reports a run to Ray Train from inside a worker
(`kerasfast.distribute.ray_train`, which stays free of Keras so that the
launcher imports without it)."""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile

import keras

from kerasfast.distribute.ray_train import CHECKPOINT_FILE, train_context


def reporter(run):
    """A `RayReport` for this run inside a Ray Train worker, else None."""
    return RayReport(run) if train_context() is not None else None


def _as_metrics(epoch: int, logs) -> dict:
    return {"epoch": epoch + 1, **{name: float(value) for name, value in (logs or {}).items()}}


class RayReport(keras.callbacks.Callback):
    """Sends a run's per-epoch metrics, and its model at the end, to Ray Train.

    Every worker calls `ray.train.report` once per epoch (Ray needs as many
    reports from each); the chief's carry the checkpoints. The last
    epoch's report waits for the end of `fit` (`finish`, pushed onto
    `fit`'s clean-up stack), when the run folder holds `model.keras`.
    """

    def __init__(self, run):
        super().__init__()
        self.run = run
        self.pending = None  # the last epoch's metrics, reported with the model

    def on_epoch_end(self, epoch, logs=None):
        # Last also where a callback before this one stopped the run (EarlyStopping): its report carries the model.
        stopped = bool(getattr(self.model, "stop_training", False))
        self.epoch_ended(epoch, logs, last=stopped or epoch + 1 >= self.params.get("epochs", 0))

    def epoch_ended(self, epoch: int, logs, last: bool) -> None:
        if self.pending is not None:  # fit went on after an epoch it was told was the last
            self._report(self.pending, self._progress_file)
        self.pending = _as_metrics(epoch, logs)
        if not last:
            self._report(self.pending, self._progress_file)
            self.pending = None

    def finish(self, exc_type, exc, traceback) -> bool:
        """Reports the last epoch with `model.keras`, if `fit` trained to its end."""
        if exc_type is None and self.pending is not None:
            self._report(self.pending, self._model_file)
            self.pending = None
        return False  # an error goes on up

    def _report(self, metrics: dict, write) -> None:
        import ray.train

        if not self.run.is_chief:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="kerasfast-ray-checkpoint-") as folder:
            write(pathlib.Path(folder), metrics)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))

    def _progress_file(self, folder: pathlib.Path, metrics: dict) -> None:
        backup = self.run.backup
        (folder / CHECKPOINT_FILE).write_text(json.dumps({
            "epoch": metrics["epoch"], "run_dir": str(self.run.folder) if self.run.folder else None,
            "backup": str(backup.path) if backup is not None else None,
        }))

    def _model_file(self, folder: pathlib.Path, metrics: dict) -> None:
        self._progress_file(folder, metrics)
        written = self.run.folder / "model.keras" if self.run.folder is not None else None
        if written is not None and written.is_file():
            shutil.copyfile(written, folder / "model.keras")
        else:
            from kerasfast.runs import save_model

            save_model(self.run.train_model, folder / "model.keras")
