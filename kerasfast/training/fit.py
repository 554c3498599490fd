"""`kerasfast.fit`: a drop-in for `model.fit` that trains the fast way.

`fit` checks its arguments, then runs one pass over the phases of a run
(`kerasfast.training.run`), each in its own module, as Keras's trainer
runs `fit` as one forward pass:

facts -> data -> model -> searches -> plan (resolved once, checked) ->
tuning -> training -> finish.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import textwrap

import keras
import numpy as np

from kerasfast import _compat
from kerasfast._checks import is_int, is_number
from kerasfast.data import service
from kerasfast.data.validation import ON_ERROR
from kerasfast.distribute.failures import lost_peer_errors
from kerasfast.errors import PlanError
from kerasfast.plan import Overrides, Plan
from kerasfast.training import facts, feed, finish, model_setup, planning, searches, trainer
from kerasfast.training.backup import DEFAULT_EVERY_STEPS
from kerasfast.training.guard import ON_NAN
from kerasfast.training.loop import RunHistory
from kerasfast.training.run import Arguments, Feed, Run
from kerasfast.training.session import borrowed
from kerasfast.training.throughput import Throughput, input_advice
from kerasfast.training.tune import tune as tune_plan
from kerasfast.training.tuning import TUNE_MODES


@dataclasses.dataclass
class FitResult:
    """What `kerasfast.fit` returns.

    Attributes:
        history: The run's metrics `{name: [value per epoch]}`, which also
            answer as Keras's `History` (`.history`, `.epoch`, `.params`):
            a `RunHistory`. So `history.history["loss"]` works on
            `history = kerasfast.fit(...)` as on `model.fit`'s return.
        plan: The resolved `Plan`.
        throughput: Measured `Throughput` (samples/s, steps/s, first
            execution time).
        model: The trained model: the user's own model object when one was
            passed, else the model the builder made.
        train_model: The model that trained: `model` itself, or (only under
            a strategy the model was not created in) its copy rebuilt in the
            strategy's scope.
        run_dir: The run folder, or None when disabled.
        data: One line describing the training data.
        model_preparation: One line saying how the model was trained (in
            place, built by your function, or rebuilt in a strategy's scope).
        pruning: Per-layer pruning summary, or None: a row a layer, each
            with layer, type, weight, shape, params, pruned, target_sparsity,
            sparsity (measured) and structured; dense layers also with the
            reason.
        input_report: Whether training waited for its input, measured
            during the run, and what to do about it.
        recoveries: Each divergence the run recovered from (`on_nan`):
            `{"epoch", "step", "problem"}`.
        timeline: Throughput over the run (`ThroughputMeter.timeline()`:
            cumulative steps, samples, seconds and input wait), as saved in
            `timeline.json` and plotted in the run report.
        report: The run folder's `report.html`, or None (no run folder, or
            writing it failed: a warning then says why).
    """

    history: RunHistory
    plan: Plan
    throughput: Throughput
    model: keras.Model
    train_model: keras.Model
    run_dir: pathlib.Path | None
    data: str
    model_preparation: str
    pruning: list | None = None
    input_report: str = ""
    recoveries: list = dataclasses.field(default_factory=list)
    timeline: dict | None = None
    report: pathlib.Path | None = None

    @property
    def epoch(self) -> list:
        """The epochs run, as Keras's `History.epoch`."""
        return self.history.epoch

    @property
    def params(self) -> dict:
        """Keras's `History.params` (verbose, epochs, steps)."""
        return self.history.params

    def summary(self) -> dict:
        """The result as JSON-ready data (what `result.json` holds)."""
        return {
            "data": self.data,
            "model_preparation": self.model_preparation,
            "throughput": self.throughput.to_dict(),
            "input": self.input_report,
            "final_metrics": {k: v[-1] for k, v in self.history.history.items() if v},
            "epochs": len(self.history.epoch),
            "recoveries": self.recoveries,
        }



def fit(
    model,
    x=None,
    y=None,
    batch_size: int | str | None = None,
    epochs: int = 1,
    verbose="auto",
    callbacks=None,
    validation_split: float = 0.0,
    validation_data=None,
    shuffle=True,
    class_weight=None,
    sample_weight=None,
    initial_epoch: int = 0,
    steps_per_epoch: int | None = None,
    validation_steps: int | None = None,
    validation_batch_size: int | None = None,
    validation_freq=1,
    *,  # Keras's own fit arguments above, in its order (a script may pass them by position)
    loss=None,
    optimizer=None,
    metrics=None,
    seed: int | None = None,
    strategy="auto",
    prune=None,
    run_dir=None,
    backup_dir=None,
    backup_every: int = DEFAULT_EVERY_STEPS,
    resume="auto",
    on_nan="recover",
    max_recoveries: int = 3,
    loss_upper_bound=None,
    on_error="raise",
    tune="auto",
    tune_budget_s=None,
    save_model_file: bool = True,
    tensorboard: bool = False,
    data=None,
    data_service: str | None = None,
    **options,
) -> FitResult:
    """Trains a Keras 3 model the fast way: a drop-in for `model.fit`.

    `model.fit(...)` becomes `kerasfast.fit(model, ...)`: every argument of
    Keras 3's `fit` keeps its meaning, the model's own `compile`, `train_step`,
    `test_step`, `compute_loss` and `compute_metrics` are honoured, and
    afterwards the model is what Keras would have left (its optimizer object
    trained, nothing of kerasfast's installed). Every automatic decision is
    resolved once into a `Plan`, printed before training (unless
    `verbose=0`) and saved as `plan.json` in the run folder.

    Args:
        model: A Keras model (Sequential, functional or subclassed; compiled
            or not), or a zero-argument callable that builds one (called in
            the strategy's scope).
        x, y, sample_weight: As in Keras: arrays, tensors or pandas objects
            (dicts by input/output name, lists or tuples for several), a
            `tf.data.Dataset` yielding `x` or `(x, y[, sample_weight])`, a
            `keras.utils.PyDataset`, a generator; or a TFRecord file, folder
            or pattern written by `kerasfast.data.write_tfrecords`. A tuple
            `x` without `y` is read as `(x, y[, sample_weight])`, unless only
            the model's inputs can be meant, as Keras reads it (docs/fit.md).
        batch_size: As in Keras, or "auto": real train steps pick it (on a
            GPU the largest global batch that fits in memory, on a CPU the
            fastest within a memory bound; see
            `kerasfast.training.batch_size`), and the learning rate is scaled
            to match; the plan says by how much.
        epochs, verbose, callbacks, validation_split,
        validation_data, shuffle, class_weight, initial_epoch,
        steps_per_epoch, validation_steps, validation_batch_size,
        validation_freq: As in Keras 3's `fit` (see docs/fit.md for the
            few additions: `class_weight` multiplies into `sample_weight`).
        loss, optimizer, metrics: As in `model.compile`, merged into the
            model's own settings (the model stays compiled with them).
            Without any optimizer kerasfast uses AdamW with warm-up + cosine.
        seed: Shuffle seed (None: drawn from NumPy's global generator, so
            `keras.utils.set_random_seed` makes runs repeat exactly).
        strategy: "auto", "none", "mirrored", "multi_worker" or a
            `tf.distribute.Strategy` (see `kerasfast.distribute`).
        prune: Magnitude pruning during training: a target sparsity (e.g.
            0.8), a dict of `kerasfast.compress.PruningConfig` arguments or a
            `PruningConfig`.
        run_dir: Folder for the run's files; None makes a new one under
            `kerasfast_runs/`, False writes nothing (chief worker only).
        backup_dir: Folder for the training-state backup (shared by all
            workers); None: `run_dir/backup` when `run_dir` is given (off
            when a Keras `BackupAndRestore` among the callbacks resumes the
            run); False: off. A re-run with a backup there resumes exactly
            where it stopped.
        backup_every: Save the state every this many steps (and each epoch end).
        resume: What to do with a backup found in `backup_dir`: "auto"
            resumes it with the plan it recorded, refusing a run whose
            arguments change what training computes (batch size, epochs,
            learning rate, precision, ...); "force" resumes it anyway; "fresh"
            discards it and starts again.
        on_nan: When the loss becomes NaN/infinite or blows up (above
            `loss_upper_bound`, or 10x the recent median): "recover" rolls
            back to the last good state, halves the learning rate and goes on
            with the next batches; "stop" rolls back and raises
            `TrainingError`; "ignore" trains on, as Keras does. Array inputs
            holding NaN/infinity are refused before training unless "ignore".
        max_recoveries: Recoveries before the run stops with `TrainingError`.
        loss_upper_bound: A loss above this counts as a blow-up (None: off).
        on_error: For TFRecord data: "raise" names a damaged record (file,
            record, byte offset) in a `DataError`; "skip" leaves damaged
            records out and warns.
        tune: "auto" times candidate plans (precision, XLA, steps per
            execution) on the model before a run long enough to repay it
            (within 10% of its estimated time, at most 60 s) and keeps the
            fastest whose loss agrees with float32's; the choice is cached
            on disk. "full" tries every candidate whatever the cost; "off"
            (or False) keeps the rule-based plan.
        tune_budget_s: Seconds tuning may take (overrides the 10% rule).
        save_model_file: Save the trained model as `model.keras` in the run folder.
        tensorboard: Write TensorBoard logs into `run_dir/tensorboard` with
            Keras's `keras.callbacks.TensorBoard`: per-epoch scalars and a
            profile of a few steady-state executions. Needs a run folder.
        data: The training data by its older name (same as `x`).
        data_service: "grpc://HOST:PORT" of a tf.data service dispatcher
            (`kerasfast data-service dispatcher`): the training pipeline
            (reading, parsing, your dataset's maps) runs on its service
            workers, sharded DYNAMIC, one job per pass, so every record is
            seen once per epoch, in no reproducible order. Takes a TFRecord
            folder (split between training workers by file) or, on one
            training worker, a `tf.data.Dataset` of TensorFlow ops;
            validation stays local. A backup resumes only with
            `resume="force"` (from its step, not its batches). See
            `kerasfast.data.service` and docs/distributed.md.
        **options: kerasfast's overrides of its automatic choices
            (`kerasfast.plan.Overrides`): precision, jit_compile,
            steps_per_execution, grad_accum_steps, clipnorm, remat,
            learning_rate (a number, or "find": a learning-rate range test
            on the model picks it, see `kerasfast.find_learning_rate`),
            lr_schedule, warmup_steps, intra_op_threads, inter_op_threads,
            scale_lr, dropout ("keras": Keras's own random stream for
            dropout masks, where the plan would draw them from a hash).

    Returns:
        A `FitResult` with the Keras `History`, the plan and the throughput.

    Raises:
        PlanError: For a bad argument or a combination that cannot work,
            before any training step.
        DataError: For data that is malformed or does not fit the model.
        ModelError: For a model that cannot be prepared as planned. Errors
            raised by the model's own code keep their type.

    Example:

    >>> x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    >>> y = (x.sum(axis=1) > 0).astype("int32")
    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])
    >>> result = kerasfast.fit(model, x, y, epochs=3, batch_size=64, validation_split=0.1, run_dir=False,
    ...                        loss="sparse_categorical_crossentropy", verbose=0)
    >>> print(result.plan)  # every choice and why; the choices depend on the machine
    kerasfast plan
      strategy ...
    >>> len(result.history.history["val_loss"]), result.throughput.samples_per_second > 0
    (3, True)
    """
    if tune is False:  # as run_dir=False: the feature off
        tune = "off"
    given = dict(locals())  # fit's arguments, by name
    run = Run(model, _arguments(model, x, data, given, options), _feed(given, x, data))
    with lost_peer_errors(lambda: run.distribution), run.held:
        facts.start(run)
        feed.prepare(run, run.args.overrides.batch_size)
        model_setup.prepare(run)
        # As model.fit starts: an earlier run's stop is not this one's (the searches' and tuning's steps read it).
        run.train_model.stop_training = False
        searches.run_searches(run)
        planning.plan_run(run)
        with contextlib.ExitStack() as cleanup, finish.optimizer_settled_on_error(run):
            # Tuning and training in one borrowed block: training goes on with
            # the steps tuning compiled, which read the block's learning rate.
            with borrowed(run.train_model, run.plan) as rate_control:
                trainer.attach_pruning(run)
                tune_plan(run)
                _show_plan(run)
                trainer.open_run_folder(run, cleanup)
                trainer.train(run, rate_control)
            result = _result(run, finish.finish_model(run))
            finish.write_run_folder(run, result)
    finish.say_how_it_went(run, result)
    return result


def _show_plan(run: Run) -> None:
    if run.plan.num_replicas > 1:
        from kerasfast.distribute import scaling

        run.plan = scaling.with_plan_note(
            run.plan, run.train_model, forward_flops_per_sample=run.model_facts.forward_flops_per_sample,
            peak_flops=run.run_facts.peak_flops_in(run.plan.precision), accelerator=run.hardware.accelerator)
    if run.talks:
        print(run.plan)
        print(f"  data: {feed.description(run)}\n  model: {run.prepared.how}")
        if run.train_data.pipeline is not None:
            print(textwrap.indent(str(run.train_data.pipeline), "  "))


def _result(run: Run, pruning) -> FitResult:
    """The run's `FitResult`; the user's model keeps Keras's `History` of it."""
    history = run.history
    run_history = RunHistory(history)
    # As Keras's fit leaves it: model.history is the History it returned, the
    # user's own when one was among the callbacks; one dict, result.history.
    own = [callback for callback in run.args.callbacks if isinstance(callback, keras.callbacks.History)]
    for keras_history in [history, *own[-1:]]:
        keras_history.history = run_history
    run.prepared.user_model.history = own[-1] if own else history
    throughput = run.meter.result()
    return FitResult(
        history=run_history, plan=run.plan, throughput=throughput, model=run.prepared.user_model,
        train_model=run.train_model, run_dir=run.folder, data=feed.description(run),
        model_preparation=run.prepared.how, pruning=pruning,
        input_report=input_advice(throughput.input_wait_fraction, run.train_data.source, run.plan,
                                  run.train_data.dataset),
        recoveries=run.guard.recoveries, timeline=run.meter.timeline(),
    )


def _arguments(model, x, data, given: dict, options: dict) -> Arguments:
    """`fit`'s arguments, checked, with Keras's counts as Python ints."""
    _one_training_data(x, data)
    ints = {name: _python_int(given[name]) for name in ("epochs", "initial_epoch", "batch_size", "steps_per_epoch",
                                                         "validation_steps", "validation_batch_size")}
    ints["validation_freq"] = _validation_freq(given["validation_freq"])
    strategy = given["strategy"]
    if strategy == "auto" and isinstance(model, keras.Model) and _compat.creation_strategy(model) is not None:
        strategy = _compat.creation_strategy(model)  # as Keras does: the strategy the model was created under
    _check_fit_arguments({**given, **ints})
    find_rate = isinstance(options.get("learning_rate"), str) and options["learning_rate"] == "find"
    auto_batch = isinstance(ints["batch_size"], str) and ints["batch_size"] == "auto"
    overrides = Overrides.from_options({**options, "learning_rate": None if find_rate else options.get("learning_rate"),
                                        "batch_size": None if auto_batch else ints["batch_size"],
                                        "steps_per_epoch": ints["steps_per_epoch"]})
    return Arguments(
        epochs=ints["epochs"], initial_epoch=ints["initial_epoch"], verbose=given["verbose"],
        # Keras also takes a single callback.
        callbacks=keras.tree.flatten(given["callbacks"]) if given["callbacks"] else [],
        validation_split=given["validation_split"], steps_per_epoch=ints["steps_per_epoch"],
        strategy=strategy, overrides=overrides, auto_batch=auto_batch, find_rate=find_rate,
        **{name: given[name] for name in (
            "loss", "optimizer", "metrics", "seed", "prune", "run_dir", "backup_dir", "backup_every", "resume",
            "on_nan", "max_recoveries", "loss_upper_bound", "tune", "tune_budget_s", "save_model_file",
            "tensorboard")},
    )


def _feed(given: dict, x, data) -> Feed:
    return Feed(x=_one_training_data(x, data), y=given["y"], sample_weight=given["sample_weight"],
                class_weight=given["class_weight"], shuffle=given["shuffle"], on_error=given["on_error"],
                validation_data=given["validation_data"],
                validation_batch_size=_python_int(given["validation_batch_size"]),
                validation_steps=_python_int(given["validation_steps"]),
                validation_freq=_validation_freq(given["validation_freq"]),
                data_service=given["data_service"])


def _check_run_arguments(epochs, initial_epoch, validation_freq, steps_per_epoch, validation_steps, resume) -> None:
    if resume not in RESUME_MODES:
        raise PlanError(f"resume={resume!r} is not valid: use one of {', '.join(map(repr, RESUME_MODES))}.")
    for name, value, low in (("epochs", epochs, 1), ("initial_epoch", initial_epoch, 0)):
        if not is_int(value) or value < low:
            raise PlanError(f"{name}={value!r} is not valid: use an integer >= {low}.")
    if initial_epoch >= epochs:
        raise PlanError(
            f"initial_epoch={initial_epoch} leaves nothing to train with epochs={epochs}: epochs is the index of "
            "the last epoch (as in Keras), so pass epochs > initial_epoch."
        )
    for name, value in (("steps_per_epoch", steps_per_epoch), ("validation_steps", validation_steps)):
        if value is not None and (not is_int(value) or value < 1):
            raise PlanError(f"{name}={value!r} is not valid: use an integer >= 1 or None.")
    if not (is_int(validation_freq) and validation_freq >= 1) and not (
            isinstance(validation_freq, list) and all(is_int(v) and v >= 1 for v in validation_freq)):
        raise PlanError(f"validation_freq={validation_freq!r} is not valid: use an integer >= 1, or a list of the "
                        "epochs (counted from 1) to validate after.")


RESUME_MODES = ("auto", "force", "fresh")


def _check_divergence_arguments(on_nan, max_recoveries, loss_upper_bound) -> None:
    if on_nan not in ON_NAN:
        raise PlanError(f"on_nan={on_nan!r} is not valid: use one of {', '.join(map(repr, ON_NAN))}.")
    if not is_int(max_recoveries) or max_recoveries < 0:
        raise PlanError(f"max_recoveries={max_recoveries!r} is not valid: use an integer >= 0.")
    if loss_upper_bound is not None and (isinstance(loss_upper_bound, bool)
                                         or not isinstance(loss_upper_bound, (int, float)) or loss_upper_bound <= 0):
        raise PlanError(f"loss_upper_bound={loss_upper_bound!r} is not valid: use a positive number or None.")


def _validation_freq(value):
    """`validation_freq` as Keras's fit takes it: an int, or a list of epochs (a tuple, set, range or NumPy
    array of them, which Keras refuses after the first epoch, becomes a sorted list)."""
    if isinstance(value, (tuple, set, frozenset, range, np.ndarray)):
        values = [_python_int(v) for v in np.asarray(list(value)).ravel().tolist()] if len(value) else []
        return sorted(values) if all(is_int(v) for v in values) else value
    return _python_int(value)


def _python_int(value):
    """A NumPy integer (a count read from an array or a config) as a Python int, as Keras takes it."""
    return int(value) if isinstance(value, np.integer) else value


def _one_training_data(x, data):
    """`x`, or `data=` (its older name); not both."""
    if data is None:
        return x
    if x is not None:
        raise PlanError("fit got both x= and data=: pass the training data once (x= is Keras's name).")
    return data


def _check_fit_arguments(given: dict) -> None:
    """Refuses a bad argument of `fit` (`given`: by name) before anything starts, naming it and the fix."""
    _check_run_arguments(*(given[name] for name in ("epochs", "initial_epoch", "validation_freq", "steps_per_epoch",
                                                    "validation_steps", "resume")))
    _check_divergence_arguments(given["on_nan"], given["max_recoveries"], given["loss_upper_bound"])
    tune, tune_budget_s, on_error = given["tune"], given["tune_budget_s"], given["on_error"]
    tensorboard, run_dir, data_service = given["tensorboard"], given["run_dir"], given["data_service"]
    if tune not in TUNE_MODES:
        raise PlanError(f"tune={tune!r} is not valid: use 'auto', 'off' or 'full'.")
    if tune_budget_s is not None and (not is_number(tune_budget_s) or tune_budget_s < 0):
        raise PlanError(f"tune_budget_s={tune_budget_s!r} is not valid: use a number of seconds >= 0 or None.")
    if on_error not in ON_ERROR:
        raise PlanError(f"on_error={on_error!r} is not valid: use 'raise' or 'skip'.")
    if not isinstance(tensorboard, bool):
        raise PlanError(f"tensorboard={tensorboard!r} is not valid: use True or False.")
    if tensorboard and run_dir is False:
        raise PlanError("tensorboard=True writes its logs into the run folder, but run_dir=False writes none: pass "
                        "run_dir= (a folder, or None for a new one under kerasfast_runs/), or drop tensorboard=True.")
    if tensorboard:
        from kerasfast.training.tensorboard import check_available

        check_available()
    if data_service is not None:
        service.parse_address(data_service)
    _check_folder("run_dir", run_dir, "None (a new folder under kerasfast_runs/) or False (no run folder)")
    _check_folder("backup_dir", given["backup_dir"], "None (run_dir/backup) or False (no backup)")
    backup_every = given["backup_every"]
    if not is_int(backup_every) or backup_every < 1:
        raise PlanError(f"backup_every={backup_every!r} is not valid: use an integer >= 1 (steps between saves of "
                        "the training state), or backup_dir=False for no backup.")


def _check_folder(name: str, folder, otherwise: str) -> None:
    """Refuses a folder argument that cannot be one before anything trains: not a path, a file's path, or a
    path under a file (None and False, the argument's other values, pass)."""
    if folder is None or folder is False:
        return
    if not isinstance(folder, (str, os.PathLike)):
        raise PlanError(f"{name}={folder!r} is not valid: pass a folder path, {otherwise}.")
    path = pathlib.Path(folder).expanduser()
    for part in (path, *path.parents):
        try:
            exists, is_dir = part.exists(), part.is_dir()
        except OSError as error:  # e.g. a name longer than the file system takes
            raise PlanError(f"{name}={str(folder)!r} cannot be a folder: {error.strerror or error}. Pass another "
                            f"{name}=, or {name}=False.") from error
        if exists:
            if not is_dir:
                raise PlanError(f"{name}={str(folder)!r} cannot be a folder: {part} is a file. Pass another "
                                f"{name}=, or {name}=False.")
            return
