"""Running the planned epochs with Keras's `fit`, resumable at any update.

When the epoch length is known, the training data is one repeated,
deterministic stream and an epoch is `plan.steps_per_epoch` steps of it. A
run resumed from a backup at (epoch e, step s) skips the e·S + s batches it
already trained on and runs in at most two Keras `fit` calls: the rest of
epoch e (its metrics continue from the saved state), then the remaining
epochs. Their histories are merged into one.
"""

from __future__ import annotations

import keras

from kerasfast import _compat
from kerasfast.training.backup import Backup, BackupCallback, Progress


class _RestoreCallbackState(keras.callbacks.Callback):
    """Puts back what Keras's own callbacks had counted when the backup was saved (`backup.callbacks_state`),
    right after their `on_train_begin` started it again."""

    def __init__(self, callbacks, state: dict):
        super().__init__()
        self._callbacks, self._state = list(callbacks), state

    def on_train_begin(self, logs=None):
        for key, values in self._state.items():
            position, _, kind = key.partition(":")
            callback = self._callbacks[int(position)] if int(position) < len(self._callbacks) else None
            if callback is not None and type(callback).__name__ == kind:
                for name, value in values.items():
                    setattr(callback, name, value)


class _RestoreMetrics(keras.callbacks.Callback):
    """Puts back the saved metric state of a partly finished epoch.

    Keras resets metrics when an epoch begins; this runs right after, so the
    resumed epoch's logs cover all its steps, as in an uninterrupted run.
    """

    def __init__(self, values):
        super().__init__()
        self._values = values

    def on_epoch_begin(self, epoch, logs=None):
        if self._values is not None:
            for variable, value in self._values:
                variable.assign(value)
            self._values = None


class _ResumedProgbar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar for an epoch resumed at `first_step`: it shows
    the whole epoch's steps and the run's epochs, and counts on from there
    (Keras's own would show the rest of the epoch as a whole one: "122/122",
    in "Epoch 3/3" of a run of 4)."""

    def __init__(self, steps: int, first_step: int, epochs: int):
        super().__init__()
        self._steps, self._first_step, self._epochs = steps, first_step, epochs

    def set_params(self, params):
        super().set_params({**params, "steps": self._steps, "epochs": self._epochs})

    def _update_progbar(self, batch, logs=None):
        super()._update_progbar(batch + self._first_step, logs)


_HOOKS = ("on_epoch_begin", "on_epoch_end", "on_train_batch_begin", "on_train_batch_end", "on_batch_begin",
          "on_batch_end", "on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_batch_end",
          "on_predict_begin", "on_predict_end", "on_predict_batch_begin", "on_predict_batch_end")
_TRAIN_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


class _InSession(keras.callbacks.Callback):
    """A user's callback in one of the `fit` calls of a resumed run, to which
    those calls are one training session, as an uninterrupted run is.

    `on_train_begin` reaches it in the first call only and `on_train_end` in
    the last (a second begin would reopen a CSVLogger's file or reset
    EarlyStopping's patience). In an epoch resumed at `first_step` its batch
    hooks see the batch's index in the whole epoch; `params` hold the epoch's
    steps and the run's epochs in every call. Only the hooks the callback
    implements are passed on, so Keras dispatches the same hooks (and as
    asynchronously) as without it.
    """

    def __init__(self, callback, steps: int, first_step: int, epochs: int, *, begins: bool, ends: bool):
        super().__init__()
        self.callback, self._steps, self._first_step, self._epochs = callback, steps, first_step, epochs
        for hook in _HOOKS:
            if not getattr(getattr(callback, hook), "_is_default", False):  # Keras's mark of a hook left as is
                setattr(self, hook, self._passed_on(hook))
        if begins:
            self.on_train_begin = callback.on_train_begin
        if ends:
            self.on_train_end = callback.on_train_end

    def _passed_on(self, hook: str):
        target = getattr(self.callback, hook)
        if hook in _TRAIN_BATCH_HOOKS and self._first_step:
            return lambda batch, logs=None: target(batch + self._first_step, logs)
        return target

    def set_model(self, model):
        super().set_model(model)
        self.callback.set_model(model)

    def set_params(self, params):
        self.callback.set_params({**params, "steps": self._steps, "epochs": self._epochs})


def _session_callbacks(callbacks: list, verbose, steps: int, first_step: int, epochs: int, *, first: bool,
                       last: bool) -> list:
    """`callbacks` for one `fit` call of a run made of several (a resumed one):
    the user's see one training session (`_InSession`; kerasfast's own keep
    each call's hooks), and an epoch resumed at `first_step` gets a progress
    bar that counts on from there."""
    from kerasfast.training.batch_callbacks import DISPLAY_ONLY

    if first and last and not first_step:
        return callbacks

    def in_session(callback):
        if type(callback) is keras.callbacks.ProgbarLogger:  # the user's own bar, which holds no settings
            return _ResumedProgbar(steps, first_step, epochs)
        if isinstance(callback, DISPLAY_ONLY) or type(callback).__module__.startswith("kerasfast."):
            return callback
        return _InSession(callback, steps, first_step, epochs, begins=first, ends=last)

    session = [in_session(callback) for callback in callbacks]
    has_progbar = any(isinstance(callback, keras.callbacks.ProgbarLogger) for callback in callbacks)
    if verbose in (1, 2, "auto") and not has_progbar:
        session.append(_ResumedProgbar(steps, first_step, epochs))
    return session


def stream_factory(dataset, repeat: bool, autotune: bool = True, pass_length: int | None = None):
    """`f(batches_done)` over one batched dataset: repeated when the epoch
    length is known (epochs are counted in steps), with the first
    `batches_done` batches skipped.

    With `pass_length` (the dataset's batches, one epoch's steps), each epoch
    reads a pass of its own instead of one repeated stream, so no batch of
    the next epoch is read ahead of the callbacks that end this one (Keras
    starts a fresh iterator per epoch over a dataset of known length).

    `autotune=False` turns tf.data's autotuning off for the stream. With it
    on, TF 2.21's iterator teardown at the end of Keras's `fit` waits for the
    autotune thread's current optimisation period (up to 60 s) to run out:
    measured on the GPT recipe, ~18 s added to 2 of 3 calls after training
    ended. For in-memory arrays (one gather per batch) autotuning buys
    nothing: an MLP fed at batch 64 ran at 414-483k samples/s with it off,
    392-426k with it on.
    """
    import tensorflow as tf

    if not autotune:
        options = tf.data.Options()
        options.autotune.enabled = False
        dataset = dataset.with_options(options)

    def stream_from(done: int):
        if pass_length:
            stream, done = dataset.apply(tf.data.experimental.assert_cardinality(pass_length)), done % pass_length
        else:
            stream = dataset.repeat() if repeat else dataset
        return stream.skip(done) if done else stream

    return stream_from


class RunHistory(dict):
    """A run's metrics, `{name: [value per epoch]}`, that also answer as the
    Keras `History` holding them (`.history`, `.epoch`, `.params`, `.model`).

    `model.fit` returns a History, so scripts read `history.history["loss"]`
    or `pd.DataFrame(history.history)`; with `history = kerasfast.fit(...)`
    those lines reach `FitResult.history`, this object, and work unchanged,
    as does `result.history.history`.

    Example:

    >>> history = keras.callbacks.History()
    >>> history.history, history.epoch = {"loss": [0.9, 0.5]}, [0, 1]
    >>> run = RunHistory(history)
    >>> run["loss"], run.history["loss"], run.epoch
    ([0.9, 0.5], [0.9, 0.5], [0, 1])
    """

    def __init__(self, history: keras.callbacks.History):
        super().__init__(history.history)
        self.epoch = list(history.epoch)
        self.params = dict(history.params or {})
        self.model = history.model

    @property
    def history(self) -> "RunHistory":
        return self


def _merge(histories, earlier: dict, first_epoch: int, initial_epoch: int = 0) -> keras.callbacks.History:
    """One History: the epochs done before a resume (`initial_epoch` to `first_epoch`), then this run's."""
    merged = keras.callbacks.History()
    if histories:
        merged.set_model(histories[-1].model)
        merged.set_params(histories[-1].params)
    combined: dict[str, list] = {name: list(values) for name, values in earlier.items()}
    epochs: list[int] = list(range(initial_epoch, first_epoch))
    for history in histories:
        epochs += list(history.epoch)
        for name, values in history.history.items():
            combined.setdefault(name, []).extend(values)
    merged.history = combined
    merged.epoch = epochs
    return merged


def run_epochs(model, stream_from, *, plan, epochs: int, callbacks: list, verbose, validation: dict | None = None,
               initial_epoch: int = 0, backup: Backup | None = None, backup_every: int = 0,
               progress: Progress | None = None, metric_values=None, seed: int = 0, recorded: dict | None = None,
               guard: keras.callbacks.Callback | None = None) -> keras.callbacks.History:
    """Trains `model` (compiled, built) for the plan's epochs, saving backups and resuming.

    Args:
        model: The compiled model.
        stream_from: `f(batches_done)` returning the training stream with
            the first `batches_done` batches skipped (see `stream_factory`).
        plan: The resolved plan (its `steps_per_epoch` may be None: then
            epochs last until the data ends and resuming works per epoch).
        epochs: Total epochs of the run.
        callbacks: Callbacks for every `fit` call.
        verbose: Keras verbosity.
        validation: Keras's validation arguments for `model.fit`
            (validation_data, validation_steps, validation_batch_size,
            validation_freq), or None.
        initial_epoch: The epoch a fresh (not resumed) run starts at.
        backup: Where to save the state, or None.
        backup_every: Save every this many steps (plus at epoch ends).
        progress: Where a resumed run stands (None for a fresh run).
        metric_values: `(variable, value)` pairs restoring the metrics of a
            partly finished epoch.
        seed: The data seed to record in backups.
        recorded: The run's arguments a backup records beside the seed for a resume to check (see
            `planning.recorded_arguments`).
        guard: A callback that must see each execution before the backup is
            written, and each epoch's logs before the other callbacks and the
            History (the `DivergenceGuard`, which may correct them), or None.

    Returns:
        The Keras `History` of the whole run, epochs before a resume included.
    """
    steps = plan.steps_per_epoch
    epoch, step = (progress.epoch, progress.step) if progress else (initial_epoch, 0)
    phases = []
    if step:
        phases.append((epoch, epoch + 1, steps - step, step))
        epoch += 1
    if epoch < epochs or not phases:
        # A resumed run with no epoch left still is a training session to callbacks (on_train_begin and
        # on_train_end once), as model.fit with Keras's BackupAndRestore is.
        phases.append((epoch, max(epoch, epochs), steps, 0))
    histories = []
    earlier = dict(progress.history) if progress else {}
    # A Keras BackupAndRestore among the callbacks resumes inside model.fit, at the epoch it saved: the data
    # starts there too, with that epoch's order (kerasfast's own backup is off then).
    resumed_by_keras = _compat.keras_backup_epoch(callbacks) if progress is None else 0
    for index, (first_epoch, last_epoch, phase_steps, first_step) in enumerate(phases):
        done = max(first_epoch, resumed_by_keras) * steps + first_step if steps else 0
        before, after = [guard] if guard is not None else [], []
        if backup is not None:
            done_logs = _merge(histories, earlier, first_epoch).history if histories else earlier
            saving = BackupCallback(backup, plan, seed, backup_every, first_epoch, first_step, done_logs,
                                    recorded=recorded, callbacks=callbacks)
            before.append(saving)
            after.append(saving.after_callbacks())
            if index == 0 and progress is not None:
                after.append(_RestoreCallbackState(callbacks, backup.callbacks_state(progress)))
        if first_step and metric_values is not None:
            before.append(_RestoreMetrics(metric_values))
        phase_callbacks = _session_callbacks(callbacks, verbose, steps, first_step, epochs, first=index == 0,
                                             last=index == len(phases) - 1)
        histories.append(_compat.keras_fit(model)(
            stream_from(done),
            initial_epoch=first_epoch,
            epochs=last_epoch,
            steps_per_epoch=phase_steps,
            callbacks=before + phase_callbacks + after,
            verbose=verbose,
            shuffle=False,  # the dataset shuffles itself; Keras would only warn
            **(validation or {}),
        ))
        if model.stop_training:
            break  # a callback stopped the run; the next `fit` call would start it again
    return _merge(histories, earlier, progress.epoch if progress else initial_epoch, initial_epoch)
