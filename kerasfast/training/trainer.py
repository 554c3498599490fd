"""The training phase: the planned epochs run through Keras's own loop over
kerasfast's steps (those tuning compiled for the plan, when there are),
with the divergence guard, the throughput meter and the backup."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import pathlib
import shutil
import tempfile

import keras
import numpy as np

from kerasfast import _compat
from kerasfast.distribute import worker_state
from kerasfast.distribute.strategy import scope_of
from kerasfast.errors import PlanError
from kerasfast.runs import DEFAULT_ROOT, new_run_dir, write_json
from kerasfast.training import feed, optimizers, planning
from kerasfast.training.backup import training_variables
from kerasfast.training.batch_callbacks import progress_bars, rate_setting_errors
from kerasfast.training.data_errors import errors_naming_the_data
from kerasfast.training.guard import DivergenceGuard
from kerasfast.training.loop import run_epochs
from kerasfast.training.ray_report import reporter
from kerasfast.training.run import Run
from kerasfast.training.session import eager_steps_in_precision
from kerasfast.training.step_functions import StepFunctions
from kerasfast.training.throughput import ThroughputMeter, samples_counter


def open_run_folder(run: Run, cleanup) -> None:
    """`run.folder` with plan.json (and the range test's curve), made by the
    chief; a worker's is temporary, removed by `cleanup` when fit ends."""
    ray_report = reporter(run)  # in a Ray Train worker: metrics and the model to Ray
    if ray_report is not None:
        run.args = dataclasses.replace(run.args, callbacks=[*run.args.callbacks, ray_report])
        cleanup.push(ray_report.finish)
    args, distribution = run.args, run.distribution
    if args.run_dir is False:
        return
    made = []  # the folders this call makes (the backup's lock made and removes its own)
    if not distribution.is_chief:
        folder = pathlib.Path(tempfile.mkdtemp(prefix=f"kerasfast-worker{distribution.cluster.index}-"))
        cleanup.callback(shutil.rmtree, folder, ignore_errors=True)
    elif args.run_dir is None:
        root = pathlib.Path(DEFAULT_ROOT)
        made = [] if root.exists() else [root]
        folder = new_run_dir(root)
        made.insert(0, folder)
    else:
        folder = pathlib.Path(args.run_dir)
        made = list(itertools.takewhile(lambda path: not path.exists(), (folder, *folder.parents)))
        if run.backup is not None and folder in run.backup.made:
            made = [folder]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PlanError(f"cannot make the run folder {folder}: {error.strerror or error}. Pass a run_dir= you can "
                        "write, or run_dir=False for no run folder.") from error
    run.folder = folder
    written = [folder / "plan.json"]
    write_json(written[0], {**run.plan.to_dict(), "hardware": run.hardware.to_dict()})
    if run.rate_finding is not None and distribution.is_chief:
        from kerasfast.training.lr_finder import plot_finding

        written += [folder / "lr_find.png", folder / "lr_find.json"]
        plot_finding(run.rate_finding, written[1])
        write_json(written[2], run.rate_finding.summary())
    if made:
        cleanup.push(_removed_unless_trained(run, written, made))


def _removed_unless_trained(run: Run, written: list, made: list):
    """An exit callback for `fit`'s block: when the call raises before its first update, the files it wrote
    and the folders it `made` are removed (the backup's lock removes its own after), so a call that failed at
    its start (a callback's error) leaves no run folder behind; once a step trained, or anything else was
    written there (a TensorBoard log), the folder is the run's record."""
    model = run.train_model
    optimizers_used = [model.optimizer, *optimizers.own_optimizers(model).values()]
    optimizers_used = [optimizer for optimizer in optimizers_used if optimizer is not None]

    def updates():
        # Read on this worker alone (a strategy's MirroredVariable has no int(); no collective is joined).
        return [int(np.asarray(keras.ops.convert_to_numpy(optimizer.iterations))) for optimizer in optimizers_used]

    try:
        updates_before = updates()
    except Exception:  # noqa: BLE001 - an optimizer whose steps cannot be read: its folder is always kept
        updates_before = None

    def on_exit(error_type, error, traceback) -> bool:
        if error_type is None or updates_before is None:
            return False
        try:
            trained = updates() != updates_before or (run.meter is not None and run.meter.steps_ended > 0)
            ours = {path.name for path in written} | ({run.backup.directory.name} if run.backup is not None
                                                       and run.backup.directory.parent == run.folder else set())
            if trained or any(path.name not in ours for path in run.folder.iterdir()):
                return False
        except Exception:  # noqa: BLE001 - the run's own error goes on; the folder is then kept
            return False
        with contextlib.suppress(OSError):
            for path in written:
                path.unlink(missing_ok=True)
            for folder in made:
                folder.rmdir()  # only if nothing else lives there
        return False  # the error goes on

    return on_exit


def train(run: Run, rate_control) -> None:
    """Runs the planned epochs (`run.history`, `run.meter`, `run.guard`),
    inside the run's `borrowed` block, whose `rate_control` lowers the
    learning rate after a divergence."""
    plan, model = run.plan, run.train_model
    if run.backup is not None and run.args.resume == "fresh":
        # Only now: a call refused before training (a typo, bad data) leaves the backup it was told to replace.
        run.backup.clear()
    # kerasfast's steps take the plan's precision while they are traced,
    # Keras's eager ones (run_eagerly=True) while each step runs.
    with eager_steps_in_precision(model, plan) if plan.train_step == "keras" else contextlib.nullcontext():
        metric_values, steps = _restored_and_prepared(run)
        steps_done = (lambda: steps.micro_steps) if steps is not None else None
        run.meter = ThroughputMeter(
            samples_counter(plan.global_batch_size, run.train_data.facts.num_samples), plan.steps_per_epoch,
            first_step=run.progress.step if run.progress else 0,
            input_wait_seconds=steps.input_wait_seconds if steps is not None else None, steps_done=steps_done)
        run.guard = DivergenceGuard(**run.args.divergence, snapshot_every_steps=run.args.backup_every,
                                    grad_accum_steps=plan.grad_accum_steps, learning_rate=rate_control,
                                    variables=lambda: training_variables(model), is_chief=run.is_chief)
        with scope_of(run.strategy), rate_setting_errors(plan, run.backup if run.progress is None else None), \
                errors_naming_the_data(run.feed.x, run.feed.y, run.feed.validation_data, run.feed.validation_steps):
            verbose = run.args.verbose if run.is_chief else 0
            run.history = run_epochs(
                model, feed.training_stream(run), plan=plan, epochs=run.args.epochs,
                initial_epoch=run.args.initial_epoch,
                callbacks=_callbacks(run) + [run.meter] + progress_bars(plan, run.args.callbacks, verbose, steps_done),
                verbose=verbose, validation=run.validation, backup=run.backup,
                backup_every=run.args.backup_every, progress=run.progress, metric_values=metric_values,
                seed=run.seed, recorded=planning.recorded_arguments(run), guard=run.guard,
            )


def _callbacks(run: Run) -> list:
    callbacks = list(run.args.callbacks)
    if run.args.tensorboard and run.folder is not None and run.is_chief:
        from kerasfast.training.tensorboard import tensorboard_callback

        callbacks.append(tensorboard_callback(run.folder, run.plan))
    return callbacks


def attach_pruning(run: Run) -> None:
    """Puts pruning masks on the model's prunable kernels for this run
    (`run.pruned_layers`), before tuning: the steps tuning compiles and
    times are those of the model as it trains, masks included."""
    if run.plan.prune is None:
        return
    from kerasfast.compress import apply_pruning

    with scope_of(run.strategy):
        run.pruned_layers = apply_pruning(run.train_model, planning.pruning_start(run))


def _restored_and_prepared(run: Run):
    """`(metric_values, steps)`: a resumed backup's state put back, and
    kerasfast's steps installed (None for Keras's eager ones)."""
    plan, model = run.plan, run.train_model
    metric_values, steps = None, None
    with scope_of(run.strategy):
        if run.progress is not None:
            run.progress, metric_values = run.backup.restore(model, plan, force=run.args.resume == "force")
            worker_state.report(worker_state.RESUMED, epoch=run.progress.epoch + 1, step=run.progress.step)
            if run.talks:
                print(f"kerasfast: resuming from {run.backup.path} at epoch {run.progress.epoch + 1}, "
                      f"step {run.progress.step}")
        if plan.train_step != "keras":
            steps = _installed_steps(run)
    return metric_values, steps


def _installed_steps(run: Run) -> StepFunctions:
    import tensorflow as tf

    plan, model, progress = run.plan, run.train_model, run.progress
    scaler = optimizers.loss_scaling(model.optimizer, plan) if run.measured is None else None
    if scaler is not None:
        scaler.build(model.trainable_variables)
    _compat.detach_from_creation_strategy(model)
    model.steps_per_execution = plan.steps_per_execution
    done = progress.batches_done(plan.steps_per_epoch) if progress and plan.steps_per_epoch else 0
    return StepFunctions.prepare(
        model, run.strategy or tf.distribute.get_strategy(), plan, done, optimizer=scaler,
        own_test_step=_compat.overridden_step(model, "test_step") is not None, measured=run.measured)
