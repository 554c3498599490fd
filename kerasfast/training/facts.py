"""The facts a run is planned from, each found once, before any plan.

`start` decides what must come before TensorFlow touches data or model:
the hardware, the thread pools (they can only be sized before TensorFlow's
runtime starts), the strategy, a backup to resume from and the seed.
`model_facts` reads the model and its compile settings; `run_facts` the
process, with the peak FLOP/s measured only if the plan asks for it, once.
"""

from __future__ import annotations

import dataclasses
import pathlib

import keras
import numpy as np

from kerasfast import _compat, costs, threads
from kerasfast._checks import is_int
from kerasfast.distribute import ray_train, resolve_strategy
from kerasfast.distribute.strategy import scope_of
from kerasfast.distribute.consensus import chief_value
from kerasfast.errors import PlanError
from kerasfast.hardware import detect_hardware
from kerasfast.onednn import onednn_state
from kerasfast.plan import (Findings, ModelFacts, RunFacts, check_overrides, mixed_policy_in_reach,
                            mixed_precision_refusal, resolve_threads)
from kerasfast.training import optimizers, precision
from kerasfast.training.models import is_graph_model
from kerasfast.training.backup import Backup
from kerasfast.training.batch_callbacks import learning_rate_callbacks, per_batch_callbacks
from kerasfast.training.run import Run


def start(run: Run) -> None:
    """Hardware, thread pools, strategy, backup and seed: decided once, first."""
    run.args = args = ray_train.with_run_storage(run.args)  # in a Ray Train worker: the run's storage
    run.hardware = detect_hardware()
    check_overrides(run.hardware, args.overrides)  # every value checked before data or model are read
    started, current = threads.runtime_started(), threads.current_threads()
    if not started:
        chosen, _ = resolve_threads(args.overrides.intra_op_threads, args.overrides.inter_op_threads, run.hardware,
                                    RunFacts(tf_runtime_started=False))
        threads.configure_threads(chosen["intra_op_threads"], chosen["inter_op_threads"])
    run.distribution = resolve_strategy(args.strategy, run.hardware)
    backup_dir = _backup_dir(args)
    if backup_dir not in (None, False):
        run.backup = Backup(backup_dir, is_chief=run.is_chief)
        run.backup.check_writable()
        run.held.enter_context(run.backup.held())  # before it is read: one run at a time resumes from it
        if args.resume != "fresh":  # a fresh run's old backup is removed when it starts training (trainer.train)
            run.progress = run.backup.progress()
    run.seed = _seed(run)
    if run.progress is not None:
        run.findings = Findings(recorded=run.progress.plan or {})
    run.run_facts = RunFacts(
        epochs=args.epochs, tf_runtime_started=started, current_intra_op_threads=current[0],
        current_inter_op_threads=current[1], op_determinism=_compat.op_determinism_enabled(),
        user_batch_callbacks=per_batch_callbacks(args.callbacks),
        learning_rate_callbacks=learning_rate_callbacks(args.callbacks),
        peak_flops=costs.PeakFlops(shared=_shared(run)), onednn=onednn_state(),
        flash_attention=keras.config.is_flash_attention_enabled(),
    )


def _backup_dir(args):
    """Where the training state is backed up: `backup_dir`, else `run_dir/backup`; None when a Keras
    `BackupAndRestore` among the callbacks does it (two backups would both resume the run)."""
    users = [type(c).__name__ for c in args.callbacks if isinstance(c, keras.callbacks.BackupAndRestore)]
    if users and args.backup_dir not in (None, False):
        raise PlanError(f"both backup_dir={str(args.backup_dir)!r} and the {users[0]} among the callbacks would "
                        "resume this run, each from its own state: keep one (drop the callback, or pass "
                        "backup_dir=False).")
    if users or args.backup_dir is not None:
        return args.backup_dir
    return pathlib.Path(args.run_dir) / "backup" if args.run_dir not in (None, False) else None


def _seed(run: Run) -> int:
    if run.progress is not None:
        return run.progress.seed  # the resumed run must see the same data order
    if run.args.seed is not None:
        return run.args.seed
    # Every worker must shuffle identically (or sharding by data would give
    # workers overlapping samples), and a resumable run must be able to
    # replay its order: both need a fixed seed. Drawn from NumPy's global
    # generator, so `keras.utils.set_random_seed` fixes it.
    return 0 if run.distribution.name == "multi_worker" else int(np.random.randint(2**31 - 1))


def _shared(run: Run):
    """`f(value)`: the chief's value on every worker (a timing differs between
    workers, and their plans must be equal); None on one process."""
    if run.distribution.name != "multi_worker":
        return None
    distribution = run.distribution
    return lambda value: chief_value(distribution, value)


def _loss_from_raw_outputs(model, own_step: str | None) -> str | None:
    """The user's code computing a subclassed model's loss: under a mixed
    policy its outputs come in the compute dtype (kerasfast keeps a
    Sequential or functional model's outputs float32)."""
    if is_graph_model(model):
        return None
    return own_step or _compat.overridden_step(model, "compute_loss")


def check_mixed_precision(run: Run) -> None:
    """Adds to `run.model_facts` what stops the model's forward pass under
    the mixed policy its plan may pick (`mixed_policy_in_reach`), found by
    tracing it there, so that "auto" keeps float32 and a mixed precision
    the user asked for is refused now, before anything is compiled, rather
    than by TensorFlow in the first step.

    Keras's own layers keep to the policy's compute dtype, so only a model
    with layers running user code (`precision.runs_user_code`) is traced,
    and only where a mixed policy is within reach: one graph of the forward
    pass, nothing run (a second, in float32, only for a model that failed).
    Measured on a 2-core CPU: 0.02 s on a small MLP with a custom layer
    (its whole fit: 0.9 s), 0.33 s on the GPT recipe's 4-block model.
    Other models pay nothing.

    Raises:
        PlanError: For a mixed precision the user asked for that the model
            cannot train in, naming the layer, the dtypes and the fix.
    """
    model = run.prepared.train_model
    policy = mixed_policy_in_reach(run.hardware, run.args.overrides, run.model_facts)
    if policy is None:
        return
    suspects = [layer for layer in _compat.flatten_layers(model, include_self=True)
                if precision.runs_user_code(layer)]
    if not suspects:
        return
    with scope_of(run.strategy):
        problem = precision.mixed_dtype_problem(model, run.train_data.sample_inputs, policy, suspects)
    if problem is None:
        return
    run.model_facts = dataclasses.replace(run.model_facts, mixed_precision_problem=problem)
    if run.args.overrides.precision != "auto":
        raise PlanError(mixed_precision_refusal(policy, problem))


def model_facts(model, train_data, optimizer) -> ModelFacts:
    """What the plan needs to know about the model and its compile settings."""
    settings = _compat.compile_config(model)
    user_optimizer = optimizer if optimizer is not None else (model.optimizer if model.compiled else None)
    if optimizers.is_kerasfasts_own(user_optimizer):
        user_optimizer = None  # made by an earlier kerasfast.fit: planned afresh, as for an uncompiled model
    template = keras.optimizers.get(user_optimizer) if isinstance(user_optimizer, str) else user_optimizer
    own_step = _compat.overridden_step(model, "train_step")
    flops = None
    if own_step is None:
        shapes, dtypes = sample_shape(train_data.sample_inputs)
        flops = costs.forward_flops(model, shapes, dtypes)
    spe = settings.get("steps_per_execution", 1)
    layers = _compat.flatten_layers(model, include_self=False)
    return ModelFacts(
        layers_without_jit=tuple(layer.name for layer in _compat.flatten_layers(model, include_self=True)
                                 if not getattr(layer, "supports_jit", True)),
        synchronized_batch_norm_layers=tuple(layer.name for layer in layers if isinstance(
            layer, keras.layers.BatchNormalization) and getattr(layer, "synchronized", False)),
        forward_flops_per_sample=flops.total if flops else None,
        depthwise_conv_flops=flops.by_op_type.get("DepthwiseConv2dNative", 0) if flops else 0,
        recurrent_layers=_names_of(layers, keras.layers.RNN),
        layer_norm_layers=_names_of(layers, keras.layers.LayerNormalization),
        batch_norm_layers=_names_of(layers, keras.layers.BatchNormalization),
        random_layers=tuple(layer.name for layer in layers if _draws_random_numbers(layer)),
        conv_flops=sum(count for op, count in flops.by_op_type.items() if op.startswith(("Conv", "DepthwiseConv")))
        if flops else 0,
        user_optimizer=type(optimizers.unwrap(template)).__name__ if template is not None else None,
        user_learning_rate=optimizers.constant_learning_rate(template) if template is not None else None,
        fused_update=template is None or optimizers.fuses_update(template),  # None: kerasfast's AdamW
        custom_train_step=own_step,
        loss_from_raw_outputs=_loss_from_raw_outputs(model, own_step),
        compile_jit_compile=settings.get("jit_compile", "auto"),
        compile_steps_per_execution=spe if is_int(spe) else 1,
        run_eagerly=bool(settings.get("run_eagerly")),
        loss_scaled=isinstance(template, keras.optimizers.LossScaleOptimizer),
        built_under=_mixed_policy(layers),
        float64_layers=tuple(layer.name for layer in layers if getattr(layer, "compute_dtype", None) == "float64"),
    )


def sample_shape(sample):
    """`(shapes, dtypes)` of one batch's tensors, without the batch dimension."""
    import tensorflow as tf

    shapes = tf.nest.map_structure(lambda t: tuple(t.shape[1:]), sample)
    dtypes = tf.nest.map_structure(lambda t: t.dtype, sample)
    return shapes, dtypes


def _names_of(layers, layer_class) -> tuple[str, ...]:
    return tuple(layer.name for layer in layers if isinstance(layer, layer_class))


def _draws_random_numbers(layer) -> bool:
    """Dropout, noise and random augmentation layers (each holds a Keras
    seed generator), unless their rate or deviation is 0."""
    if not any(isinstance(value, keras.random.SeedGenerator) for value in vars(layer).values()):
        return False
    return all(getattr(layer, name, 1) != 0 for name in ("rate", "stddev"))


def _mixed_policy(layers) -> str | None:
    """The mixed dtype policy most of the layers were built under, if any."""
    mixed = [layer.dtype_policy.name for layer in layers
             if getattr(layer, "dtype_policy", None) is not None and layer.dtype_policy.name.startswith("mixed_")]
    return max(set(mixed), key=mixed.count) if mixed else None
