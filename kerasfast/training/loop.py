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

from kerasfast.training.backup import Backup, BackupCallback, Progress


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
    the whole epoch's steps and counts on from there (Keras's own would show
    the rest of the epoch as a whole one: "122/122")."""

    def __init__(self, steps: int, first_step: int):
        super().__init__()
        self._steps, self._first_step = steps, first_step

    def set_params(self, params):
        super().set_params({**params, "steps": self._steps})

    def _update_progbar(self, batch, logs=None):
        super()._update_progbar(batch + self._first_step, logs)


class _FromStep(keras.callbacks.Callback):
    """A user's callback in an epoch resumed at `first_step`: its batch hooks
    see the batch's index in the whole epoch and `params["steps"]` the
    epoch's steps, as in the uninterrupted run; every other hook as it is."""

    def __init__(self, callback, steps: int, first_step: int):
        super().__init__()
        self.callback, self._steps, self._first_step = callback, steps, first_step

    def set_model(self, model):
        super().set_model(model)
        self.callback.set_model(model)

    def set_params(self, params):
        self.callback.set_params({**params, "steps": self._steps})

    def on_train_batch_begin(self, batch, logs=None):
        self.callback.on_train_batch_begin(batch + self._first_step, logs)

    def on_train_batch_end(self, batch, logs=None):
        self.callback.on_train_batch_end(batch + self._first_step, logs)

    def on_batch_begin(self, batch, logs=None):
        self.callback.on_batch_begin(batch + self._first_step, logs)

    def on_batch_end(self, batch, logs=None):
        self.callback.on_batch_end(batch + self._first_step, logs)


# Its other hooks reach the callback unchanged.
for _hook in ("on_epoch_begin", "on_epoch_end", "on_train_begin", "on_train_end", "on_test_begin", "on_test_end",
              "on_test_batch_begin", "on_test_batch_end", "on_predict_begin", "on_predict_end",
              "on_predict_batch_begin", "on_predict_batch_end"):
    setattr(_FromStep, _hook, lambda self, *args, _hook=_hook, **kwargs: getattr(self.callback, _hook)(*args, **kwargs))


def _resumed_epoch_callbacks(callbacks: list, verbose, steps: int, first_step: int) -> list:
    """`callbacks` for an epoch resumed at `first_step`: the user's with batch
    hooks count its steps from there (kerasfast's own count them already),
    and a progress bar that does too."""
    from kerasfast.training.batch_callbacks import per_batch_callbacks

    resumed = [_FromStep(callback, steps, first_step)
               if per_batch_callbacks([callback]) and not type(callback).__module__.startswith("kerasfast.")
               else callback for callback in callbacks]
    has_progbar = any(isinstance(callback, keras.callbacks.ProgbarLogger) for callback in callbacks)
    if verbose in (1, "auto") and not has_progbar:
        resumed.append(_ResumedProgbar(steps, first_step))
    return resumed


def stream_factory(dataset, repeat: bool, autotune: bool = True):
    """`f(batches_done)` over one batched dataset: repeated when the epoch
    length is known (epochs are counted in steps), with the first
    `batches_done` batches skipped.

    `autotune=False` turns tf.data's autotuning off for the stream. With it
    on, TF 2.21's iterator teardown at the end of Keras's `fit` waits for the
    autotune thread's current optimisation period (up to 60 s) to run out:
    measured on the GPT recipe, ~18 s added to 2 of 3 calls after training
    ended. For in-memory arrays (one gather per batch) autotuning buys
    nothing: an MLP fed at batch 64 ran at 414-483k samples/s with it off,
    392-426k with it on.
    """
    if not autotune:
        import tensorflow as tf

        options = tf.data.Options()
        options.autotune.enabled = False
        dataset = dataset.with_options(options)

    def stream_from(done: int):
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


def _merge(histories, earlier: dict, first_epoch: int) -> keras.callbacks.History:
    """One History: the epochs done before a resume, then this run's."""
    merged = keras.callbacks.History()
    if histories:
        merged.set_model(histories[-1].model)
        merged.set_params(histories[-1].params)
    combined: dict[str, list] = {name: list(values) for name, values in earlier.items()}
    epochs: list[int] = list(range(first_epoch))
    for history in histories:
        epochs += list(history.epoch)
        for name, values in history.history.items():
            combined.setdefault(name, []).extend(values)
    merged.history = combined
    merged.epoch = epochs
    return merged


def run_epochs(model, stream_from, *, plan, epochs: int, callbacks: list, verbose, validation: dict | None = None,
               initial_epoch: int = 0, backup: Backup | None = None, backup_every: int = 0,
               progress: Progress | None = None, metric_values=None, seed: int = 0, shuffle=None,
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
        shuffle: The run's `shuffle` argument, recorded in backups beside the seed: together they fix the
            data order a resume must replay.
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
    if epoch < epochs:
        phases.append((epoch, epochs, steps, 0))
    histories = []
    earlier = dict(progress.history) if progress else {}
    for first_epoch, last_epoch, phase_steps, first_step in phases:
        done = first_epoch * steps + first_step if steps else 0
        extra = [guard] if guard is not None else []
        if backup is not None:
            done_logs = _merge(histories, earlier, first_epoch).history if histories else earlier
            extra.append(BackupCallback(backup, plan, seed, backup_every, first_epoch, first_step, done_logs,
                                        shuffle=shuffle))
        if first_step and metric_values is not None:
            extra.append(_RestoreMetrics(metric_values))
        phase_callbacks = _resumed_epoch_callbacks(callbacks, verbose, steps, first_step) if first_step else callbacks
        histories.append(model.fit(
            stream_from(done),
            initial_epoch=first_epoch,
            epochs=last_epoch,
            steps_per_epoch=phase_steps,
            callbacks=extra + phase_callbacks,
            verbose=verbose,
            shuffle=False,  # the dataset shuffles itself; Keras would only warn
            **(validation or {}),
        ))
        if model.stop_training:
            break  # a callback stopped the run; the next `fit` call would start it again
    return _merge(histories, earlier, progress.epoch if progress else 0)
