"""`kerasfast.fit`: train any Keras 3 model the fast way, from one call.

The call resolves a `Plan` once (hardware -> precision, XLA, batch sizes,
steps per execution, accumulation, clipping, remat, schedule, threads),
prints it, builds the model under the planned precision, trains it with
Keras's own `fit`, measures throughput, copies the trained weights back into
the user's model and leaves a run folder behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf

from kerasfast import costs, threads
from kerasfast.distribute import DistributedSteps, keras_compat, resolve_strategy
from kerasfast.distribute.consensus import check_same_plan, chief_value
from kerasfast.distribute.failures import lost_peer_errors
from kerasfast.errors import DataError, ModelError, PlanError
from kerasfast.hardware import detect_hardware
from kerasfast.plan import DataFacts, ModelFacts, Plan, RunFacts, compute_dtype, keras_policy, resolve_plan
from kerasfast.runs import DEFAULT_ROOT, new_run_dir, save_model, write_json
from kerasfast.training import optimizers
from kerasfast.training.inputs import check_inputs_match, prepare_data, sharded_tfrecord_stream
from kerasfast.training.models import PreparedModel, build_scope, copy_weights, prepare_model
from kerasfast.training.precision import graph_precision
from kerasfast.training.backup import DEFAULT_EVERY_STEPS, Backup
from kerasfast.training.loop import run_epochs, stream_factory
from kerasfast.training.throughput import Throughput, ThroughputMeter, input_advice, samples_counter



@dataclasses.dataclass
class FitResult:
    """What `kerasfast.fit` returns.

    Attributes:
        history: The Keras `History` of the run.
        plan: The resolved `Plan`.
        throughput: Measured `Throughput` (samples/s, steps/s, first
            execution time).
        model: The trained model: the user's own model object when one was
            passed, else the model the builder made.
        train_model: The model that was compiled and trained: `model` itself,
            or its copy rebuilt under the plan's precision.
        run_dir: The run folder, or None when disabled.
        data: One line describing the training data.
        model_preparation: One line saying whether the model was trained in
            place or rebuilt under the plan's precision.
        pruning: Per-layer pruning summary (layer, shape, params, achieved
            sparsity; dense layers with the reason), or None.
        input_report: Whether training waited for its input, measured
            during the run, and what to do about it.
    """

    history: keras.callbacks.History
    plan: Plan
    throughput: Throughput
    model: keras.Model
    train_model: keras.Model
    run_dir: pathlib.Path | None
    data: str
    model_preparation: str
    pruning: list | None = None
    input_report: str = ""

    def summary(self) -> dict:
        """The result as JSON-ready data (what `result.json` holds)."""
        return {
            "data": self.data,
            "model_preparation": self.model_preparation,
            "throughput": self.throughput.to_dict(),
            "input": self.input_report,
            "final_metrics": {k: v[-1] for k, v in self.history.history.items() if v},
            "epochs": len(self.history.epoch),
        }


def _compile_settings(model) -> dict:
    """The objects the user passed to `model.compile`, if any."""
    if not isinstance(model, keras.Model) or not model.compiled:
        return {}
    # Keras keeps the original (unserialised) compile arguments here; the
    # public get_compile_config() would lose custom, unregistered losses.
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    if config is None:
        return {"optimizer": model.optimizer, "loss": model.loss}
    return dict(config)


def _batch_callbacks(callbacks) -> tuple[str, ...]:
    """User callbacks (not Keras's own) that override a per-batch hook."""
    base = keras.callbacks.Callback
    hooks = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")
    names = []
    for callback in callbacks:
        if type(callback).__module__.startswith("keras"):
            continue
        if any(getattr(type(callback), hook) is not getattr(base, hook) for hook in hooks):
            names.append(type(callback).__name__)
    return tuple(names)


def _describe_pruning(config) -> str:
    structured = f", {config.structured} structured" if config.structured else ""
    if config.schedule == "polynomial":
        when = f"from {config.initial_sparsity:g} at update {config.begin_step} to update {config.end_step}"
    else:
        when = f"{config.schedule} from update {config.begin_step}"
    return f"magnitude pruning {when}, masks every {config.frequency} updates{structured}"


def _jit_blockers(model) -> tuple[str, ...]:
    return tuple(layer.name for layer in model._flatten_layers() if not getattr(layer, "supports_jit", True))


def _sample_shape(sample):
    import tensorflow as tf

    shapes = tf.nest.map_structure(lambda t: tuple(t.shape[1:]), sample)
    dtypes = tf.nest.map_structure(lambda t: t.dtype, sample)
    return shapes, dtypes


def _op_determinism() -> bool:
    from tensorflow.python.framework.config import is_op_determinism_enabled

    return is_op_determinism_enabled()


def fit(
    model,
    data,
    *,
    validation_data=None,
    epochs: int = 1,
    batch_size: int | None = None,
    steps_per_epoch: int | None = None,
    loss=None,
    optimizer=None,
    metrics=None,
    callbacks=None,
    verbose="auto",
    shuffle: bool = True,
    seed: int | None = None,
    precision: str = "auto",
    jit_compile="auto",
    steps_per_execution="auto",
    grad_accum_steps: int = 1,
    clipnorm: float | None = None,
    remat=None,
    learning_rate: float | None = None,
    lr_schedule: str = "auto",
    warmup_steps="auto",
    intra_op_threads="auto",
    inter_op_threads="auto",
    strategy="auto",
    scale_lr: bool = False,
    prune=None,
    run_dir=None,
    backup_dir=None,
    backup_every: int = DEFAULT_EVERY_STEPS,
    save_model_file: bool = True,
) -> FitResult:
    """Trains a Keras 3 model the fast way on the hardware found.

    Every automatic decision is resolved once into a `Plan`, printed before
    training (unless `verbose=0`) and saved as `plan.json` in the run
    folder; each can be overridden by the argument of the same name.

    Args:
        model: A Keras model (Sequential, functional or subclassed; compiled
            or not), or a zero-argument callable that builds one.
        data: A batched `tf.data.Dataset` of `(x, y[, sample_weight])`,
            `(x, y[, sample_weight])` NumPy arrays, or a TFRecord file,
            folder or pattern written by `kerasfast.data.write_tfrecords`.
        validation_data: Same forms as `data`.
        epochs: Passes over the data.
        batch_size: Global batch size for arrays / TFRecords (default 32).
        steps_per_epoch: Steps per epoch, needed for infinite datasets.
        loss, optimizer, metrics: As in `model.compile`; default to the
            model's own compile settings. Without any optimizer kerasfast
            uses AdamW with warm-up + cosine decay.
        callbacks: Keras callbacks.
        verbose: 0 silent, 1 progress bar, 2 one line per epoch, "auto".
        shuffle: Shuffle arrays / TFRecords each epoch.
        seed: Shuffle seed.
        precision: "auto", "float32", "mixed_float16" or "mixed_bfloat16".
        jit_compile: "auto", True or False (XLA).
        steps_per_execution: "auto" or an integer.
        grad_accum_steps: Steps whose gradients are averaged per update.
        clipnorm: Global gradient-norm clip, or None.
        remat: None, True or "activations" (recompute activations).
        learning_rate: Peak learning rate.
        lr_schedule: "auto", "warmup_cosine", "one_cycle" or "constant".
        warmup_steps: "auto" or warm-up updates for "warmup_cosine".
        intra_op_threads, inter_op_threads: "auto" or TensorFlow thread counts.
        strategy: "auto", "none", "mirrored", "multi_worker" or a
            `tf.distribute.Strategy` (see `kerasfast.distribute`).
        scale_lr: Multiply the learning rate by the number of replicas.
        prune: Magnitude pruning during training: a target sparsity (e.g.
            0.8), a dict of `kerasfast.compress.PruningConfig` arguments or a
            `PruningConfig`. The schedule is placed in the run's updates;
            at the end every pruned kernel has exactly its target sparsity.
        run_dir: Folder for the run's files; None makes a new one under
            `kerasfast_runs/`, False writes nothing. Only the chief worker
            writes it; other workers write to a temporary folder that is
            removed.
        backup_dir: Folder for the training-state backup (shared by all
            workers). None: `run_dir/backup` when `run_dir` is given, else
            off; False: off. A re-run of the same command with a backup
            there resumes exactly where it stopped, mid-epoch included; the
            backup is removed when training completes.
        backup_every: Save the state every this many steps (at an update
            boundary) as well as at every epoch end.
        save_model_file: Save the trained model as `model.keras` in the run
            folder.

    Returns:
        A `FitResult` with the Keras `History`, the plan and the throughput.

    Raises:
        PlanError: For a bad argument or a combination that cannot work,
            before any training step.
        DataError: For data that is malformed or does not fit the model.
        ModelError: For a model that cannot be prepared as planned.

    Example:

    >>> result = kerasfast.fit(model, (x, y), epochs=3, batch_size=64, run_dir=False)
    >>> print(result.plan)
    >>> result.throughput.samples_per_second
    """
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise PlanError(f"epochs={epochs!r} is not valid: use an integer >= 1.")
    if steps_per_epoch is not None and (not isinstance(steps_per_epoch, int) or steps_per_epoch < 1):
        raise PlanError(f"steps_per_epoch={steps_per_epoch!r} is not valid: use an integer >= 1 or None.")
    callbacks = list(callbacks or [])
    hardware = detect_hardware()

    # Validate what can be checked without the model and data, and size the
    # thread pools now: preparing data and model would start TensorFlow,
    # after which the pools can no longer change.
    started = threads.runtime_started()
    current_intra, current_inter = threads.current_threads()
    early = resolve_plan(
        hardware, precision=precision, jit_compile=jit_compile, steps_per_execution=steps_per_execution,
        batch_size=batch_size, grad_accum_steps=grad_accum_steps, clipnorm=clipnorm, remat=remat,
        intra_op_threads=intra_op_threads, inter_op_threads=inter_op_threads,
        run=RunFacts(tf_runtime_started=started, current_intra_op_threads=current_intra,
                     current_inter_op_threads=current_inter),
    )
    if not started:
        threads.configure_threads(early.intra_op_threads, early.inter_op_threads)
    distribution = resolve_strategy(strategy, hardware)
    tf_strategy = distribution.strategy
    if backup_dir is None and run_dir not in (None, False):
        backup_dir = pathlib.Path(run_dir) / "backup"
    backup = Backup(backup_dir, is_chief=distribution.is_chief) if backup_dir not in (None, False) else None
    progress = backup.progress() if backup is not None else None
    if progress is not None:
        seed = progress.seed  # the resumed run must see the same data order
    elif seed is None:
        # Every worker must shuffle identically (or sharding by data would
        # give workers overlapping samples), and a resumable run must be able
        # to replay its order: both need a fixed seed.
        seed = 0 if distribution.name == "multi_worker" else int(np.random.default_rng().integers(2**31))

    # The model is built under this policy; the step's FLOPs only decide between
    # precisions built alike (float32 and onednn_bfloat16).
    policy = keras_policy(early.precision)
    train_data = prepare_data(data, batch_size=batch_size or 32, shuffle=shuffle, seed=seed, repeat=True)
    val_data = None
    if validation_data is not None:
        val_data = prepare_data(validation_data, batch_size=train_data.facts.batch_size or batch_size or 32,
                                shuffle=False, what="validation_data")

    if isinstance(model, keras.Model):
        check_inputs_match(model, train_data.sample_inputs)
        if val_data is not None:
            check_inputs_match(model, val_data.sample_inputs, "validation_data")
    requested_remat = early.remat
    try:
        prepared: PreparedModel = prepare_model(model, policy, requested_remat, train_data.sample_inputs,
                                                strategy=tf_strategy)
    except (ModelError, PlanError, DataError):
        raise
    except (ValueError, TypeError) as error:
        raise DataError(
            f"the model could not be run on a batch of the data: {error}. Check that the data's inputs "
            "(shape, dtype, number of inputs) match what the model expects."
        ) from error
    train_model = prepared.train_model
    check_inputs_match(train_model, train_data.sample_inputs)

    settings = _compile_settings(model if isinstance(model, keras.Model) else train_model)
    user_optimizer = optimizer if optimizer is not None else settings.get("optimizer")
    user_loss = loss if loss is not None else settings.get("loss")
    user_metrics = metrics if metrics is not None else settings.get("metrics")
    if user_loss is None:
        raise PlanError(
            "no loss: the model is not compiled with one and fit got no loss=. Pass loss= (e.g. "
            "loss='sparse_categorical_crossentropy') or compile the model first."
        )
    template = keras.optimizers.get(user_optimizer) if isinstance(user_optimizer, str) else user_optimizer
    shapes, dtypes = _sample_shape(train_data.sample_inputs)
    model_facts = ModelFacts(
        layers_without_jit=_jit_blockers(train_model),
        forward_flops_per_sample=costs.forward_flops_per_sample(train_model, shapes, dtypes),
        user_optimizer=type(optimizers.unwrap(template)).__name__ if template is not None else None,
        user_learning_rate=optimizers.constant_learning_rate(template) if template is not None else None,
    )
    run_facts = RunFacts(
        epochs=epochs,
        tf_runtime_started=started,
        current_intra_op_threads=current_intra,
        current_inter_op_threads=current_inter,
        op_determinism=_op_determinism(),
        user_batch_callbacks=_batch_callbacks(callbacks),
    )

    def plan_with(run: RunFacts) -> Plan:
        return resolve_plan(
            hardware, model=model_facts, data=train_data.facts, run=run,
            precision=precision, jit_compile=jit_compile, steps_per_execution=steps_per_execution,
            batch_size=batch_size, grad_accum_steps=grad_accum_steps, clipnorm=clipnorm, remat=remat,
            learning_rate=learning_rate, lr_schedule=lr_schedule, warmup_steps=warmup_steps,
            intra_op_threads=intra_op_threads, inter_op_threads=inter_op_threads,
            steps_per_epoch=steps_per_epoch, scale_lr=scale_lr,
            num_replicas=distribution.num_replicas, strategy_name=distribution.name,
            strategy_reason=distribution.reason,
            whole_updates_per_execution=bool(train_data.facts.steps_per_epoch or steps_per_epoch),
        )

    # The peak FLOP/s (which sizes steps per execution) is measured in the
    # precision the plan picks; a timing differs between workers, so the
    # chief's keeps their plans equal.
    peak = costs.measure_peak_flops(compute_dtype(plan_with(run_facts).precision))
    plan = plan_with(dataclasses.replace(run_facts, peak_flops=chief_value(distribution, peak)))
    check_same_plan(distribution, plan)
    pruning_config = None
    if prune is not None:
        from kerasfast.compress import pruning_for_run

        if not plan.total_steps:
            raise PlanError("prune= needs the run's length: pass steps_per_epoch= for a dataset of unknown length.")
        pruning_config = pruning_for_run(prune, plan.total_steps)
        plan = dataclasses.replace(
            plan, prune=pruning_config.target_sparsity, overridden=plan.overridden + ("prune",),
            reasons={**plan.reasons, "prune": _describe_pruning(pruning_config)},
        )
    if verbose != 0 and distribution.is_chief:
        print(plan)
        print(f"  data: {train_data.description}; model: {prepared.how}")

    with contextlib.ExitStack() as cleanup:
        folder = None
        if run_dir is not False:
            if distribution.is_chief:
                folder = pathlib.Path(run_dir) if run_dir is not None else new_run_dir(DEFAULT_ROOT)
            else:
                folder = pathlib.Path(tempfile.mkdtemp(prefix=f"kerasfast-worker{distribution.cluster.index}-"))
                # Removed when fit ends, whether it succeeds or fails.
                cleanup.callback(shutil.rmtree, folder, ignore_errors=True)
            folder.mkdir(parents=True, exist_ok=True)
            write_json(folder / "plan.json", {**plan.to_dict(), "hardware": hardware.to_dict()})

        compile_kwargs = {k: settings[k] for k in ("loss_weights", "weighted_metrics") if settings.get(k) is not None}

        def scope():
            return tf_strategy.scope() if tf_strategy is not None else contextlib.nullcontext()

        # The train and test steps first run (and are optimised) in run_epochs.
        cleanup.enter_context(graph_precision(plan.precision))
        with scope(), build_scope(keras_policy(plan.precision)):
            # Optimizer variables and metrics are created under the same policy
            # (and strategy) as the model's.
            train_model.compile(
                # kerasfast's steps accumulate gradients themselves (Keras's
                # optimizer accumulation fails under tf.distribute).
                optimizer=optimizers.build_optimizer(plan, template, accumulate=False),
                loss=user_loss,
                metrics=user_metrics,
                jit_compile=plan.jit_compile if tf_strategy is None else False,
                steps_per_execution=plan.steps_per_execution,
                **compile_kwargs,
            )
            pruned_layers = None
            if pruning_config is not None:
                from kerasfast.compress import apply_pruning

                pruned_layers = apply_pruning(train_model, pruning_config)
            keras_compat.build_state(train_model, train_data.sample_batch)
            metric_values = None
            if progress is not None:
                progress, metric_values = backup.restore(train_model, plan)
                if verbose != 0 and distribution.is_chief:
                    print(f"kerasfast: resuming from {backup.path} at epoch {progress.epoch + 1}, step {progress.step}")
            steps = DistributedSteps.prepare(
                train_model, tf_strategy or tf.distribute.get_strategy(), plan,
                progress.batches_done(plan.steps_per_epoch) if progress and plan.steps_per_epoch else 0)
        meter = ThroughputMeter(samples_counter(plan.global_batch_size, train_data.facts.num_samples),
                                plan.steps_per_epoch, first_step=progress.step if progress else 0,
                                input_wait_seconds=steps.input_wait_seconds)
        with scope(), lost_peer_errors(distribution):
            if train_data.source == "tfrecords" and distribution.name == "multi_worker":
                stream_from = sharded_tfrecord_stream(os.fspath(data), tf_strategy, global_batch_size=plan.global_batch_size,
                                                      shuffle=shuffle, seed=seed)
            else:
                stream_from = stream_factory(train_data.dataset, repeat=bool(plan.steps_per_epoch))
            history = run_epochs(
                train_model, stream_from, plan=plan, epochs=epochs, callbacks=callbacks + [meter],
                verbose=verbose if distribution.is_chief else 0,
                validation_data=val_data.dataset if val_data is not None else None,
                backup=backup, backup_every=backup_every, progress=progress, metric_values=metric_values, seed=seed,
            )
        if backup is not None:
            backup.clear()
        pruning_summary = None
        if pruning_config is not None:
            from kerasfast.compress import finalize_pruning

            with scope():
                pruning_summary = finalize_pruning(train_model)
            dense = [row for row in pruned_layers if not row["pruned"]]
            pruning_summary = pruning_summary + dense
        if prepared.rebuilt:
            user_model = prepared.user_model
            copy_weights(train_model, user_model)
            if not user_model.compiled:
                # So that the user's model evaluates and predicts like the
                # trained copy, with a fresh optimizer of its own.
                user_model.compile(optimizer=optimizers.build_optimizer(
                    dataclasses.replace(plan, precision="float32"), template),
                    loss=user_loss, metrics=user_metrics, **compile_kwargs)
        result = FitResult(
            history=history,
            plan=plan,
            throughput=meter.result(),
            model=prepared.user_model if prepared.user_model is not None else train_model,
            train_model=train_model,
            run_dir=folder,
            data=train_data.description,
            model_preparation=prepared.how,
            pruning=pruning_summary,
            input_report=input_advice(meter.result().input_wait_fraction, train_data.source),
        )
        if folder is not None:
            write_json(folder / "history.json", history.history)
            write_json(folder / "result.json", result.summary())
            if pruning_summary is not None:
                write_json(folder / "pruning.json", pruning_summary)
            if save_model_file:
                save_model(train_model, folder / "model.keras")
            if not distribution.is_chief:
                result.run_dir = None
        if verbose != 0 and distribution.is_chief:
            print(f"kerasfast: {result.input_report}")
            if result.throughput.samples_per_second:
                print(f"kerasfast: {result.throughput.samples_per_second:,.0f} samples/s, "
                      f"{result.throughput.steps_per_second:,.1f} steps/s after the first execution "
                      f"({result.throughput.first_execution_s:.1f} s incl. compilation)")
            else:
                print("kerasfast: run too short to measure throughput (only the first, compiling execution ran)")
        return result
