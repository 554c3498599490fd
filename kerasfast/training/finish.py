"""The finish phase: pruning folded in, a rebuilt copy's state carried back
to the user's model, the run folder written and only then the backup
cleared. A run that trained to the end returns its result: a step of
finishing that cannot be done is a warning naming what was not written."""

from __future__ import annotations

import contextlib
import warnings

import keras
import numpy as np

from kerasfast._atomic import replace_durably
from kerasfast.distribute.strategy import scope_of
from kerasfast.errors import RunFolderWarning
from kerasfast.runs import save_model, write_json
from kerasfast.training import optimizers
from kerasfast.training.models import copy_optimizer_state, copy_weights
from kerasfast.training.run import Run


def finish_model(run: Run) -> list | None:
    """Pruning folded into the weights and a rebuilt copy's state carried
    back to the user's model; returns the pruning summary (or None)."""
    summary = None
    if run.pruned_layers is not None:
        from kerasfast.compress import finalize_pruning, measure_sparsity

        with scope_of(run.strategy):
            pruned = [{**row, "pruned": True} for row in finalize_pruning(run.train_model)]
            # Every row has the same keys: the layers left dense with their kernels' measured sparsity.
            measured = {row["layer"]: row["sparsity"] for row in measure_sparsity(run.train_model)}
            summary = pruned + [{**row, "sparsity": measured.get(row["layer"], 0.0), "structured": None}
                                for row in run.pruned_layers if not row["pruned"]]
    if run.prepared.rebuilt:
        _carry_back(run.train_model, run.prepared.user_model)
    if run.uses_default_optimizer:
        for model in run.models:  # a rebuilt copy, returned as `train_model`, holds the same state
            _settle_optimizer(model, run.plan)
    return summary


@contextlib.contextmanager
def optimizer_settled_on_error(run: Run):
    """kerasfast's own optimizer keeps the run's peak rate after a run that
    raised (a callback's error, Ctrl-C) too, as after one that finished: the
    planned schedule would go on decaying in a later `model.fit`, and a
    callback there could not set the rate. The run's own error goes on."""
    try:
        yield
    except BaseException as error:
        if run.uses_default_optimizer:
            for model in run.models:
                try:
                    if model.optimizer is not None:
                        optimizers.settle_after_run(model.optimizer, run.plan)
                except Exception as failure:  # noqa: BLE001 - noted on the run's error, which goes on
                    error.add_note(f"kerasfast: the optimizer it made for {model.name!r} also keeps the run's "
                                   f"schedule ({type(failure).__name__}: {failure}); compile the model again "
                                   "before training it further.")
        raise


def _settle_optimizer(user_model, plan) -> None:
    """kerasfast's own optimizer on the user's model keeps the run's peak rate
    (`optimizers.settle_after_run`); a failure is a warning: the run is done."""
    if user_model.optimizer is None:
        return
    try:
        optimizers.settle_after_run(user_model.optimizer, plan)
    except Exception as error:  # noqa: BLE001 - the trained weights and state are in; only the rate is not
        warnings.warn(
            f"kerasfast: training finished, but the optimizer kerasfast made for {user_model.name!r} keeps the "
            f"run's schedule, which has ended at 0 ({type(error).__name__}: {error}); set "
            f"model.optimizer.learning_rate or compile again before training it further.", stacklevel=4)


def write_run_folder(run: Run, result) -> None:
    """The run's files, its report, then the backup cleared (kept where a
    write failed, so that re-running only redoes the writing)."""
    unwritten, failed_writes = [], False
    folder = run.folder
    if folder is not None:
        broken = _non_finite_layers(run.train_model) if run.args.save_model_file else []
        if broken and run.is_chief:
            print(f"kerasfast: not saving model.keras: the weights of {', '.join(broken[:5])} are NaN or infinite "
                  "(on_nan='ignore' trained on a diverged loss).")
        model = run.train_model if run.args.save_model_file and not broken else None
        unwritten, failed_writes = _write_run_files(folder, result, model)
        if unwritten and run.is_chief:
            _warn_unwritten(folder, unwritten, run.backup if failed_writes else None)
        if run.is_chief:
            from kerasfast.reporting import report_or_warning

            result.report = report_or_warning(folder)  # a report that fails never loses the run
        else:
            result.run_dir = None
    if run.backup is not None and not failed_writes:
        run.backup.clear()


def say_how_it_went(run: Run, result) -> None:
    if not run.talks:
        return
    throughput = result.throughput
    print(f"kerasfast: {result.input_report}")
    if throughput.samples_per_second:
        print(f"kerasfast: {throughput.samples_per_second:,.0f} samples/s, "
              f"{throughput.steps_per_second:,.1f} steps/s after the first execution "
              f"({throughput.first_execution_s:.1f} s incl. compilation)")
    else:
        print("kerasfast: run too short to measure throughput (only the first, compiling execution ran)")
    if result.report is not None:
        print(f"kerasfast: report: {result.report}")


def _carry_back(train_model, user_model) -> None:
    """Copies the trained copy's weights and optimizer state into the user's model.

    Training is over and its result is in `train_model` (the result's
    `train_model`), so a part that cannot be copied is a warning naming it,
    never an error that loses the run.
    """
    try:
        copy_weights(train_model, user_model)
    except Exception as error:  # noqa: BLE001 - whatever it is, the trained weights are still returned
        warnings.warn(
            f"kerasfast: training finished, but its weights could not be copied into your model {user_model.name!r} "
            f"({type(error).__name__}: {error}); the trained model is the result's train_model.", stacklevel=4)
        return
    user_optimizer, trained_optimizer = user_model.optimizer, train_model.optimizer
    if user_optimizer is None or trained_optimizer is None:
        return
    try:
        if not user_optimizer.built:
            user_optimizer.build(user_model.trainable_variables)
        copy_optimizer_state(trained_optimizer, user_optimizer)
    except Exception as error:  # noqa: BLE001 - the weights are in; only the optimizer's moments are missing
        warnings.warn(
            f"kerasfast: training finished and your model {user_model.name!r} holds the trained weights, but its "
            f"optimizer's state (step count, moments) was not copied ({type(error).__name__}: {error}); the "
            "result's train_model.optimizer holds it.", stacklevel=4)


def _non_finite_layers(model) -> list[str]:
    """Names of the layers holding a NaN or infinite weight."""
    return [layer.name for layer in model.layers or [model]
            if any(not np.isfinite(keras.ops.convert_to_numpy(w)).all() for w in layer.weights
                   if keras.backend.is_float_dtype(w.dtype))]


def _save_model_or_weights(model, folder) -> str | None:
    """model.keras; for a model Keras cannot serialise (a custom layer or
    schedule without get_config()), model.weights.h5, since training itself
    went as in Keras.

    Returns:
        None when model.keras was written, else what was not written and why.
    """
    if not model.built:
        # A model with its own train_step may never be called (keras.io's VAE
        # and GAN): Keras saves neither it nor its weights.
        return (f"model.keras (model {model.name!r} was never built: its own train_step never calls it, and Keras "
                "saves no unbuilt model; save the models it trains, or build it with model.build(input_shape))")
    try:
        save_model(model, folder / "model.keras")
        return None
    except OSError:
        raise
    except Exception as error:  # noqa: BLE001 - Keras raises several kinds when serialising
        weights = replace_durably(folder / "model.weights.h5", model.save_weights, keep_suffix=True)
        detail = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
        return (f"model.keras (Keras cannot save the model: {type(error).__name__}: {detail}; its trained weights "
                f"are in {weights.name}: give the object named there a get_config() to save the whole model)")


def _write_run_files(folder, result, model) -> tuple[list[str], bool]:
    """history.json, result.json, timeline.json, pruning.json and model.keras,
    each durable (flushed, then renamed into place).

    Returns:
        What could not be written and why (disk full, permissions, a model
        Keras cannot save), each file tried whatever failed before it; and
        whether a write failed (which writing again may mend).
    """
    files = {"history.json": result.history.history, "result.json": result.summary(),
             "timeline.json": result.timeline, "pruning.json": result.pruning}
    unwritten = []
    for name, content in files.items():
        if content is None:
            continue
        try:
            write_json(folder / name, content)
        except OSError as error:
            unwritten.append(f"{name} ({error.strerror or error})")
    failed_writes = bool(unwritten)
    if model is not None:
        try:
            unwritten.append(_save_model_or_weights(model, folder))
        except OSError as error:
            unwritten.append(f"model.keras ({error.strerror or error})")
            failed_writes = True
    return [entry for entry in unwritten if entry is not None], failed_writes


def _warn_unwritten(folder, unwritten: list[str], backup) -> None:
    """A finished run keeps its result: what its folder lacks is a warning."""
    kept = (f"the trained state is kept in {backup.path}: re-run the same command to write the files again "
            "without retraining. Free space or fix permissions there, or pass another run_dir=")\
        if backup is not None and backup.path.is_file() else "the trained model is the one this call returned"
    warnings.warn(RunFolderWarning(
        f"kerasfast: training finished, but in {folder}: {'; '.join(unwritten)} not written; {kept}."), stacklevel=4)
