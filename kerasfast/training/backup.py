"""Fault-tolerant training: save the training state, resume exactly.

A `Backup` keeps one file, `backup_dir/state.npz`, holding every variable
that training changes (model, optimizer, metrics) and where training stood
(epochs done, steps into the current epoch, the data-shuffling seed). It is
written atomically and durably (temporary file, flushed, then renamed) by the chief only, every
`every_steps` steps at an update boundary and at every epoch end, and
removed when training completes.

A re-run of the same command finds the file, restores the variables and
skips exactly the batches already trained on: the data stream of a run is
one deterministic sequence over all epochs (fixed shuffle seed), so the
resumed run sees the same batches in the same order as an uninterrupted one.

One run at a time uses a backup folder: the chief holds an exclusive lock on
`backup_dir/.lock` from before it reads the backup until `fit` returns, and
a second run started on the same folder (the same command in two terminals,
a scheduler starting a job twice) is refused naming the process that holds
it, instead of both resuming from one state and overwriting each other's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import itertools
import json
import os
import pathlib
import socket
import zipfile

import keras
import numpy as np

from numpy.lib import format as npy_format

from kerasfast import _compat
from kerasfast._atomic import replace_durably
from kerasfast.errors import PlanError
from kerasfast.training.optimizers import own_optimizers, unwrap

STATE_FILE = "state.npz"
LOCK_FILE = ".lock"
DEFAULT_EVERY_STEPS = 100
# What Keras's own callbacks count across epochs (their on_train_begin starts it again): backed up with the
# run, so that a resumed run stops early, lowers its rate and keeps its best checkpoint as an uninterrupted one.
CALLBACK_STATE = (
    (keras.callbacks.EarlyStopping, ("wait", "stopped_epoch", "best", "best_epoch")),
    (keras.callbacks.ReduceLROnPlateau, ("wait", "cooldown_counter", "best")),
    (keras.callbacks.ModelCheckpoint, ("best",)),
)
# The arrays among it, kept in the state file beside the variables: the weights an EarlyStopping with
# restore_best_weights=True puts back at the end (without them a resumed run ends on other weights).
CALLBACK_ARRAYS = ((keras.callbacks.EarlyStopping, "best_weights"),)
_CALLBACK_ARRAY_PREFIX = "callback"


def callbacks_state(callbacks) -> dict:
    """`{"position:class": {attribute: value}}` of the `CALLBACK_STATE` of the run's callbacks (the class
    name, so that a resume with other callbacks puts nothing where it does not belong)."""
    state = {}
    for position, callback in enumerate(callbacks):
        names = next((names for kind, names in CALLBACK_STATE if isinstance(callback, kind)), ())
        values = {name: getattr(callback, name, None) for name in names}
        values = {name: value.item() if isinstance(value, np.generic) else value for name, value in values.items()
                  if isinstance(value, (int, float, np.generic)) and not isinstance(value, bool)}
        if values:
            state[f"{position}:{type(callback).__name__}"] = values
    return state


def callbacks_arrays(callbacks) -> dict[str, np.ndarray]:
    """The `CALLBACK_ARRAYS` the run's callbacks hold, as `savez` entries named
    `callback.{position}.{class}.{attribute}.{index}`."""
    arrays = {}
    for position, callback in enumerate(callbacks):
        for kind, name in CALLBACK_ARRAYS:
            values = getattr(callback, name, None) if isinstance(callback, kind) else None
            for index, value in enumerate(values or ()):
                arrays[f"{_CALLBACK_ARRAY_PREFIX}.{position}.{type(callback).__name__}.{name}.{index}"] = np.asarray(
                    value)
    return arrays


def _callbacks_arrays_from(data) -> dict:
    """`{"position:class": {attribute: [arrays]}}` of the `callbacks_arrays` entries in a state file."""
    found = {}
    for entry in sorted(data.files):
        prefix, _, rest = entry.partition(".")
        if prefix != _CALLBACK_ARRAY_PREFIX:
            continue
        position, kind, name, index = rest.split(".")
        found.setdefault(f"{position}:{kind}", {}).setdefault(name, {})[int(index)] = data[entry]
    return {key: {name: [values[i] for i in sorted(values)] for name, values in attributes.items()}
            for key, attributes in found.items()}


# The state file entry naming the dtypes of entries stored as raw unsigned integers (`_storable`).
_DTYPES_ENTRY = "dtypes"


def _survives_npy(dtype: np.dtype) -> bool:
    try:
        return npy_format.descr_to_dtype(npy_format.dtype_to_descr(dtype)) == dtype
    except (TypeError, ValueError):
        return False


def _storable(arrays: dict) -> dict:
    """`arrays` as `np.savez` keeps them: the ml_dtypes types NumPy writes as raw void bytes that no cast
    reads back (bfloat16, float8, int4: a model built with `dtype="bfloat16"`) as unsigned integers of
    their width, their dtypes named in the `_DTYPES_ENTRY` entry."""
    stored, dtypes = {}, {}
    for name, value in arrays.items():
        if not _survives_npy(value.dtype):
            dtypes[name] = value.dtype.name
            value = value.view(f"u{value.dtype.itemsize}")
        stored[name] = value
    if dtypes:
        stored[_DTYPES_ENTRY] = np.array(json.dumps(dtypes))
    return stored


class _StateEntries:
    """The arrays of an opened state file, each in the dtype it was saved from (see `_storable`)."""

    def __init__(self, data):
        self._data = data
        self._dtypes = json.loads(str(data[_DTYPES_ENTRY])) if _DTYPES_ENTRY in data.files else {}
        self.files = [name for name in data.files if name != _DTYPES_ENTRY]

    def __getitem__(self, name: str) -> np.ndarray:
        value = self._data[name]
        return value.view(np.dtype(self._dtypes[name])) if name in self._dtypes else value


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where a run stood when its state was saved.

    Attributes:
        epoch: Epochs fully done.
        step: Steps done in the current (unfinished) epoch.
        seed: The data-shuffling seed of the run.
        signature: What the state was saved for (variable shapes, batch,
            steps per epoch); a resume must match it.
        history: Logs of the epochs already done (Keras `History` form).
        plan: The run's resolved plan (`Plan.values()`): a resumed run uses
            its choices instead of measuring again.
        callbacks: The state of Keras's own callbacks (`callbacks_state`).
    """

    epoch: int
    step: int
    seed: int
    signature: dict
    history: dict = dataclasses.field(default_factory=dict)
    plan: dict = dataclasses.field(default_factory=dict)
    callbacks: dict = dataclasses.field(default_factory=dict)

    def batches_done(self, steps_per_epoch: int) -> int:
        return self.epoch * steps_per_epoch + self.step


# The signature's key, present only for a model with optimizers that build in its first step
# (`_lazily_built_optimizers`), so that every other model's backup stays as it was.
OWN_OPTIMIZERS = "own_optimizers"


def training_variables(model) -> list:
    """Every variable training changes, in a stable order: the pruning masks
    too, which are not the model's (`kerasfast.compress.apply_pruning`), and
    the state of the optimizers of the model's own (`own_optimizers`), which
    only after they are built holds their moments."""
    from kerasfast.compress.attach import pruning_constraints

    variables = list(model.variables) + [constraint.mask for _, constraint in pruning_constraints(model)]
    optimizer = model.optimizer
    if optimizer is not None:
        variables += list(optimizer.variables)
    for optimizer in own_optimizers(model).values():
        variables += list(optimizer.variables)
    for metric in model.metrics:
        variables += list(metric.variables)
    seen, unique = set(), []
    for variable in variables:
        key = id(variable)
        if key not in seen:
            seen.add(key)
            unique.append(variable)
    return unique


def signature(model, plan) -> dict:
    found = {
        "shapes": [list(v.shape) for v in training_variables(model)],
        "global_batch_size": plan.global_batch_size,
        "steps_per_epoch": plan.steps_per_epoch,
        "grad_accum_steps": plan.grad_accum_steps,
    }
    built_for = _lazy_optimizers_built_for(model)
    if built_for:
        found[OWN_OPTIMIZERS] = built_for
    return found


def _lazily_built_optimizers(model) -> dict:
    """`{name: optimizer}` of the optimizers that build in the first train step that uses them, so that a resumed
    run, which restores before any step, may find them unbuilt: the model's own (`own_optimizers`) and, for a
    model with its own train_step or compiled with run_eagerly=True (whose state Keras builds only in its first
    step), `model.optimizer` as "optimizer"."""
    found = {}
    lazy = _compat.overridden_step(model, "train_step") is not None or getattr(model, "run_eagerly", False)
    if getattr(model, "optimizer", None) is not None and lazy:
        found["optimizer"] = model.optimizer
    return {**found, **own_optimizers(model)}


def _lazy_optimizers_built_for(model) -> dict:
    """`{name: positions in model.variables}` of the variables each lazily built optimizer
    (`_lazily_built_optimizers`) was built for (None: not built yet).

    On one device those optimizers build in the first train step, for the variables the train_step hands them
    (Keras keeps the list); a resumed run restores before any step, so it builds them from this record, in the
    same order, for their state to have a place to go.
    """
    positions = {id(variable): index for index, variable in enumerate(model.variables)}
    return {name: [positions.get(id(variable), -1) for variable in unwrap(optimizer)._trainable_variables]
            if optimizer.built else None
            for name, optimizer in _lazily_built_optimizers(model).items()}


def _build_lazy_optimizers(model, built_for: dict | None) -> None:
    """Builds each lazily built optimizer that the backup's run had built (`_lazy_optimizers_built_for`) and this
    one has not yet, for the same variables; the signature check then compares the rest."""
    variables = list(model.variables)
    for name, optimizer in _lazily_built_optimizers(model).items():
        positions = (built_for or {}).get(name)
        if optimizer.built or positions is None or not all(0 <= index < len(variables) for index in positions):
            continue  # nothing to build, or the model changed: the check says how
        optimizer.build([variables[index] for index in positions])


def _shapes_difference(saved: list, now: list) -> str:
    """How the variables a backup holds differ from this run's (the model's weights, then the optimizer's
    and the metrics' state): a changed model, optimizer or list of metrics."""
    if len(saved) != len(now):
        return (f"this run has {len(now)} variables (model weights, optimizer state, metrics), the backup "
                f"{len(saved)}: the model, the optimizer or the metrics changed")
    index = next(i for i, (a, b) in enumerate(zip(saved, now, strict=True)) if list(a) != list(b))
    return (f"variable {index} (in the order model weights, optimizer state, metrics) has shape {tuple(now[index])} "
            f"here, {tuple(saved[index])} in the backup: the model changed")


class Backup:
    """The state file of one run.

    Args:
        directory: Folder of the state file (shared by all workers).
        is_chief: Only the chief writes.
    """

    def __init__(self, directory, is_chief: bool = True):
        self.directory = pathlib.Path(directory)
        self.path = self.directory / STATE_FILE
        self.is_chief = is_chief
        self._cleared = False  # the state file removed: its folder goes too once nothing else lives there
        self.made: list[pathlib.Path] = []  # the folders `held` made for the lock (this folder, new parents)

    def check_writable(self) -> None:
        """Refuses, before the run trains (chief only), a folder that could not be made or written at the
        first save; nothing is created here, so a run refused later leaves no empty folder behind.

        Raises:
            PlanError: Naming the folder and the remedy.
        """
        if not self.is_chief:
            return
        existing = next(path for path in (self.directory, *self.directory.parents) if path.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise PlanError(f"cannot make or write the backup folder {self.directory}: {existing} is not a folder "
                            "this process can write. Pass a backup_dir= you can write, or backup_dir=False for no "
                            "backup.")

    @contextlib.contextmanager
    def held(self):
        """Holds the folder for this run (chief only) until the block ends; the folders made for the lock are
        removed again when nothing else is left in them.

        An advisory `flock` on `LOCK_FILE`, which the system releases when
        the process dies, so a killed run never leaves the folder locked;
        the file names its holder for the refusal. Where the file system
        cannot lock (some network mounts), the run goes on without it.

        Raises:
            PlanError: When another process (or another call in this one)
                holds the folder, naming it and what to do.
        """
        if not self.is_chief:
            yield self
            return
        lock_path = self.directory / LOCK_FILE
        made = list(itertools.takewhile(lambda path: not path.exists(), (self.directory, *self.directory.parents)))
        self.made = made
        handle = self._locked(lock_path)
        try:
            if handle is not None:
                handle.seek(0)
                handle.truncate()
                started = datetime.datetime.now().isoformat(timespec="seconds")
                handle.write(f"process {os.getpid()} on {socket.gethostname()}, since {started}")
                handle.flush()
            yield self
        finally:
            # Removed while still locked: a run that opens it after this makes a new file and locks that one.
            lock_path.unlink(missing_ok=True)
            if handle is not None:
                handle.close()
            with contextlib.suppress(OSError):
                # The folders made for the lock, or the cleared backup's (a folder the user made stays).
                for folder in made or ([self.directory] if self._cleared else []):
                    folder.rmdir()  # only if nothing else lives there

    def _locked(self, lock_path: pathlib.Path):
        """The lock file, open and locked; None on a file system without locks."""
        import fcntl

        while True:
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                handle = open(lock_path, "a+", encoding="utf-8")  # noqa: SIM115 - held until `held` ends
            except FileNotFoundError:
                continue  # the folder's last run removed it as it let go
            except OSError as error:  # e.g. a lock file another user's killed run left
                raise PlanError(f"cannot open the backup folder's lock file {lock_path} ({error.strerror or error}): "
                                "remove it if no run uses the folder, or pass another run_dir= (or backup_dir=; "
                                "backup_dir=False for no backup).") from error
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                handle.close()
                raise PlanError(
                    f"the backup folder {self.directory} is in use by another run ({holder}): two runs on one "
                    "backup would each resume from it and overwrite each other's state. Wait for that run to end, "
                    "or pass another run_dir= (or backup_dir=; backup_dir=False for no backup).") from None
            except OSError as error:
                handle.close()
                if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP):
                    return None  # a file system without locks: run unlocked rather than not at all
                raise
            try:
                current = os.stat(lock_path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(handle.fileno()).st_ino:
                return handle
            handle.close()  # locked a file its holder removed as it let go: lock the one now there

    def progress(self) -> Progress | None:
        """The saved progress, or None when there is nothing to resume.

        Raises:
            PlanError: When the file is damaged, naming it and the remedy.
        """
        if not self.path.is_file():
            return None
        with self._entries() as data:
            meta = json.loads(str(data["meta"]))
            return Progress(meta["epoch"], meta["step"], meta["seed"], meta["signature"], meta.get("history", {}),
                            meta.get("plan", {}), meta.get("callbacks", {}))

    @contextlib.contextmanager
    def _entries(self):
        """The state file's `_StateEntries`; a file that cannot be read is a `PlanError` naming the remedy."""
        try:
            with np.load(self.path, allow_pickle=False) as data:
                yield _StateEntries(data)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
            raise PlanError(
                f"the training-state backup {self.path} cannot be read ({type(error).__name__}: {error}); it is "
                "damaged (e.g. a disk filled up or it was copied half-way). Pass resume='fresh' (command line: --resume "
                "fresh) to start the run again (the backup is replaced), or delete the file."
            ) from error

    def save(self, model, plan, progress: Progress, callback_arrays: dict | None = None) -> None:
        """Writes the state atomically (chief only; other workers return), with the callbacks' arrays
        (`callbacks_arrays`)."""
        # All workers read the variables (under MultiWorkerMirroredStrategy a
        # read may be a collective every worker must join); one writes.
        arrays = {f"v{i}": np.asarray(v.numpy()) for i, v in enumerate(training_variables(model))}
        if not self.is_chief:
            return
        arrays.update(callback_arrays or {})
        self.directory.mkdir(parents=True, exist_ok=True)
        meta = np.array(json.dumps(dataclasses.asdict(progress)))
        replace_durably(self.path, lambda temporary: np.savez(temporary, meta=meta, **_storable(arrays)), keep_suffix=True)

    def callbacks_state(self, progress: Progress) -> dict:
        """What the callbacks held when the state was saved: `progress.callbacks` with their arrays
        (`callbacks_arrays`) read from the file, in `callbacks_state`'s form."""
        with self._entries() as data:
            arrays = _callbacks_arrays_from(data)
        return {key: {**progress.callbacks.get(key, {}), **arrays.get(key, {})}
                for key in {**progress.callbacks, **arrays}}

    def restore(self, model, plan, *, force: bool = False) -> tuple[Progress, list]:
        """Loads the saved variables into `model` (built, compiled).

        Args:
            model: The model to restore into. Its own optimizers that the
                backup's run had built are built first, for the same
                variables (on one device they build only in the first step).
            plan: The run's plan.
            force: Only the variables' shapes must match (`resume="force"`);
                otherwise the batch and epoch layout must match too.

        Returns:
            `(progress, metric_values)`: where the run stood, and the
            `(variable, value)` pairs of the metrics, which Keras resets when
            the resumed epoch begins (see `loop.run_epochs`).

        Raises:
            PlanError: When the state was saved for a different model or plan.
        """
        progress = self.progress()
        _build_lazy_optimizers(model, progress.signature.get(OWN_OPTIMIZERS))
        expected = signature(model, plan)
        checked = ("shapes",) if force else tuple(expected)
        changed = [k for k in checked if progress.signature.get(k) != expected[k]]
        if changed:
            what = [_shapes_difference(progress.signature.get("shapes") or [], expected["shapes"]) if name == "shapes"
                    else f"the optimizers {', '.join(expected[name])} were built for other variables"
                    if name == OWN_OPTIMIZERS
                    else f"{name} {expected[name]!r} (the backup's run: {progress.signature.get(name)!r})"
                    for name in changed]
            raise PlanError(
                f"the backup in {self.directory} was saved for a different run: {'; '.join(what)}. Pass "
                "resume='fresh' (command line: --resume fresh) to start again (the backup is replaced), or another "
                "backup_dir=."
            )
        if plan.steps_per_epoch and progress.step >= plan.steps_per_epoch:  # only under force: else steps match
            raise PlanError(
                f"resume='force' cannot place the backup in {self.directory}: it was saved after step "
                f"{progress.step} of epoch {progress.epoch + 1}, and an epoch of this run has {plan.steps_per_epoch} "
                f"steps (the batch size or steps_per_epoch changed). Resume with the backup's global batch size "
                f"({progress.signature.get('global_batch_size')}) and steps_per_epoch "
                f"({progress.signature.get('steps_per_epoch')}), or pass resume='fresh' (command line: --resume fresh) to start again."
            )
        metric_variables = {id(v) for metric in model.metrics for v in metric.variables}
        metric_values = []
        with self._entries() as data:
            for index, variable in enumerate(training_variables(model)):
                value = data[f"v{index}"]
                variable.assign(value)
                if id(variable) in metric_variables:
                    metric_values.append((variable, value))
        return progress, metric_values

    def clear(self) -> None:
        """Removes the state file and what a save killed half-way left beside it."""
        if self.is_chief:
            self._cleared = True
            self.path.unlink(missing_ok=True)
            for leftover in self.directory.glob(f".tmp-*-{STATE_FILE}"):
                leftover.unlink(missing_ok=True)
            try:
                self.directory.rmdir()  # only if nothing else lives there
            except OSError:
                pass


class BackupCallback(keras.callbacks.Callback):
    """Saves the state every `every_steps` steps (at an update boundary) and at each epoch end.

    Args:
        backup: The `Backup`.
        plan: The run's plan.
        seed: The data seed to record.
        first_epoch, first_step: Where this (possibly resumed) fit starts.
        history: Logs of the epochs done before this fit.
        callbacks: The run's callbacks, whose `callbacks_state` is saved.
    """

    def __init__(self, backup: Backup, plan, seed: int, every_steps: int, first_epoch: int = 0, first_step: int = 0,
                 history: dict | None = None, recorded: dict | None = None, callbacks=()):
        super().__init__()
        self.recorded = dict(recorded or {})
        self.callbacks = list(callbacks)
        self._saved_logs = {}  # the logs of the last epoch-end save
        self._saved_callbacks = None  # and the callbacks' state (`_callbacks_now`)
        self.history = {name: list(values) for name, values in (history or {}).items()}
        self.backup = backup
        self.plan = plan
        self.seed = seed
        self.every_steps = every_steps
        self._epoch = first_epoch
        self._offset = first_step  # steps of the current epoch done before this fit
        self._last_saved = first_step

    def _progress(self, epoch, step):
        return Progress(epoch, step, self.seed, {**signature(self.model, self.plan), **self.recorded},
                        self.history, self.plan.values(), callbacks_state(self.callbacks))

    def on_epoch_begin(self, epoch, logs=None):
        if epoch != self._epoch:
            self._offset = 0
            self._last_saved = 0
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        step = self._offset + batch + 1
        at_update_boundary = step % self.plan.grad_accum_steps == 0
        # Data of unknown length (a generator, a filtered dataset) gets epoch-end backups only: a resume places
        # itself in an epoch by its step count, which such data does not have.
        within_epoch = self.plan.steps_per_epoch is not None and step < self.plan.steps_per_epoch
        if at_update_boundary and step - self._last_saved >= self.every_steps and within_epoch:
            self._save(self._progress(self._epoch, step))
            self._last_saved = step

    def on_epoch_end(self, epoch, logs=None):
        # Saved before the user's callbacks run, so an epoch one of them fails after is kept.
        self._saved_logs = {name: float(value) for name, value in (logs or {}).items()}
        self._saved_callbacks = self._callbacks_now()
        for name, value in self._saved_logs.items():
            self.history.setdefault(name, []).append(value)
        self._save(self._progress(epoch + 1, 0))
        self._offset = 0
        self._last_saved = 0

    def after_callbacks(self) -> keras.callbacks.Callback:
        """A callback to place after the user's: it saves the epoch again when they changed its logs
        (ReduceLROnPlateau adds its rate, and sets a new one) or their own state (`callbacks_state`: an
        EarlyStopping's patience counted), so a resume has the History, the rate and the state they leave."""
        return keras.callbacks.LambdaCallback(on_epoch_end=self._epoch_logs_final)

    def _epoch_logs_final(self, epoch, logs=None):
        final = {name: float(value) for name, value in (logs or {}).items()}
        same_logs = final.keys() == self._saved_logs.keys() and all(
            value == self._saved_logs[name] or value != value for name, value in final.items())  # NaN: no change
        if same_logs and self._callbacks_now() == self._saved_callbacks:
            return
        for name, value in final.items():
            if name in self._saved_logs:
                self.history[name][-1] = value
            else:
                self.history.setdefault(name, []).append(value)
        self._save(self._progress(epoch + 1, 0))

    def _save(self, progress: Progress) -> None:
        self.backup.save(self.model, self.plan, progress, callbacks_arrays(self.callbacks))

    def _callbacks_now(self):
        """The callbacks' state and which arrays they hold (a callback replaces its list when it takes new ones)."""
        held = [id(getattr(callback, name, None)) for callback in self.callbacks for kind, name in CALLBACK_ARRAYS
                if isinstance(callback, kind)]
        return callbacks_state(self.callbacks), held
