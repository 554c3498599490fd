"""Errors kerasfast raises instead of failing deep inside TensorFlow.

Every error says what was wrong (argument, file, record, layer) and how to
fix it, so that a user never has to read a TensorFlow traceback to find out.
"""


class KerasfastError(Exception):
    """Base class of every error kerasfast raises on purpose."""


class PlanError(KerasfastError, ValueError):
    """An argument or a combination of arguments that cannot work.

    Raised while the plan is resolved, i.e. before any training step runs.
    """


class DataError(KerasfastError, ValueError):
    """Input data that is missing, malformed or does not match the model."""


class ModelError(KerasfastError, ValueError):
    """A model kerasfast cannot train or transform as asked."""


class ExportError(KerasfastError, RuntimeError):
    """An export that cannot be produced or failed its verification."""


class RunFolderError(KerasfastError, OSError):
    """A run's files could not be written (disk full, permissions).

    Raised after training; the training-state backup is kept, so re-running
    the same command restores the trained state and only redoes the writing.
    """


class RunFolderWarning(UserWarning):
    """A file of a finished run that could not be written (disk full,
    permissions, a model Keras cannot save).

    A warning, not an error: the trained model is returned all the same. It
    names each file not written; the training-state backup, when there is
    one, is kept, so re-running the same command only redoes the writing.
    """


class TrainingError(KerasfastError, RuntimeError):
    """Training that went wrong while running (e.g. a loss that diverged
    more often than it may be recovered); the model holds the last good state."""


class ReportError(KerasfastError, ValueError):
    """A run report that cannot be made: a folder without the files it is
    made from (the message names the missing file and how to get it)."""


class LostWorkerError(KerasfastError, RuntimeError):
    """A worker of a multi-worker job stopped answering (killed, crashed,
    unreachable): the job cannot go on without it; restarting every worker
    resumes from the last backup (`kerasfast launch --restarts`)."""
