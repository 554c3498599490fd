"""The plan: every automatic decision of a training run, resolved once.

`resolve_plan()` turns the hardware (`kerasfast.hardware`), facts about the
model and data, and the user's overrides into a frozen `Plan`. Each field
records what was chosen and why, and whether the user or kerasfast chose it.
The plan is printed before training, saved as `plan.json` in the run folder,
and nothing else in kerasfast makes a hidden choice of its own.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from kerasfast._checks import is_int, is_number
from kerasfast.errors import PlanError
from kerasfast.hardware import Hardware

# "onednn_bfloat16" keeps the Keras model in float32 and lets TensorFlow's
# oneDNN graph pass run matmuls and convolutions in bfloat16 (CPU only); the
# others are Keras dtype policies.
ONEDNN_BFLOAT16 = "onednn_bfloat16"
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16", ONEDNN_BFLOAT16)
MIXED_POLICIES = ("mixed_float16", "mixed_bfloat16")
# How a train step computes causal self-attention: in query blocks that skip the masked half
# (`kerasfast.training.attention`), or with Keras's own op.
ATTENTION_BLOCKS = "causal_blocks"
ATTENTION_KERAS = "keras"
# Where a train step's dropout masks come from: a counter hash in one XLA-compiled loop
# (`kerasfast.training.dropout`), or Keras's own random stream.
DROPOUT_HASHED = "hashed"
DROPOUT_KERAS = "keras"
DROPOUT_CHOICES = ("auto", DROPOUT_HASHED, DROPOUT_KERAS)
# How a layer's own code keeps to a mixed policy's compute dtype.
MIXED_DTYPE_FIX = ("cast what you create to the input's dtype (keras.ops.cast(c, x.dtype), or self.compute_dtype) "
                   "or compute it with keras.ops from the input")
LR_SCHEDULES = ("warmup_cosine", "warmup_hold_cosine", "one_cycle", "constant")
# The schedules shaped by the run's length (`total_steps`).
RUN_LENGTH_SCHEDULES = ("warmup_cosine", "warmup_hold_cosine", "one_cycle")
# warmup_hold_cosine holds its peak over this share of the run, then decays
# (a pruning fine-tune: while the sparsity ramp grows, which ends at half by default).
HOLD_FRACTION = 0.5
# Keras 3.15 on TensorFlow only supports activation rematerialisation in
# graph mode; "full", "larger_than" and "list_of_layers" fail (keras 21207).
REMAT_MODES = ("activations",)
UNSUPPORTED_REMAT_MODES = ("full", "larger_than", "list_of_layers")

# model.compile's arguments that fit takes no override for: they stay the compiled model's.
COMPILE_ONLY_ARGUMENTS = ("loss_weights", "weighted_metrics", "run_eagerly", "auto_scale_loss")

# Measured on the 2-core CI CPU with Keras 3.15 (see docs/benchmarks.md):
# `model.fit` spends ~0.6 ms of Python and dispatch per execution, whatever
# the model. Steps per execution amortise it.
EXECUTION_OVERHEAD_S = 6e-4
# Aim for the per-execution overhead to cost at most this share of the time.
OVERHEAD_BUDGET = 0.05
MAX_STEPS_PER_EXECUTION = 64
# Without XLA an execution's edges cost more than that dispatch: measured on
# the same CPU, interleaved, 5 runs each, the 6-conv CNN of benchmarks/tune.py
# in onednn_bfloat16 (a ~37 ms step, ~2% of it dispatch by the estimate)
# trains 7% faster with 8 steps per execution than with 1 (3,549 against
# 3,306 samples/s, ranges apart). Executions of several steps compile one
# block of micro-steps, looped, so graph (non-XLA) plans take at least this
# many; under XLA the looped steps measured slower on the GPT recipe (278
# against 312 samples/s), so XLA plans keep the estimate alone.
MIN_GRAPH_STEPS_PER_EXECUTION = 8
# ... as long as an execution stays this short, so that progress, the
# divergence guard and backups (all checked between executions) stay prompt.
MAX_EXECUTION_S = 1.0
# Measured on the same CPU: below ~0.1 GFLOP per train step (a small MLP),
# bfloat16 gains nothing measurable, so such steps keep float32's precision.
BF16_MIN_TRAIN_STEP_FLOPS = 1e8
# Batch normalization between bfloat16 convolutions costs casts and float32
# statistics on every activation. Measured on the same CPU, interleaved
# (onednn_bfloat16 / float32 samples/s), ResNet-style and plain conv stacks
# with batch norm: 0.87-1.09 (mean 0.97) at 0.9-3.7 GFLOP per train step,
# 0.98-1.38 (mean 1.14) at 4.7-7.5 GFLOP. The same stacks without batch norm
# gain 1.01-1.35 at 0.9-1.2 GFLOP, and an MLP with batch norm 1.36 at 3.3.
BF16_MIN_CONV_BATCH_NORM_STEP_FLOPS = 4e9
DEFAULT_BATCH_SIZE = 32
DEFAULT_LEARNING_RATE = 1e-3
# What the plan says of an optimizer whose update runs fused.
FUSED_UPDATE_NOTE = "; its update of each weight runs as one TensorFlow op (ResourceApplyAdam): a shorter trace"
WARMUP_FRACTION = 0.05
FIELD_ORDER = (
    "strategy", "num_replicas", "train_step", "precision", "jit_compile", "steps_per_execution", "steps_per_epoch",
    "global_batch_size", "per_replica_batch_size", "grad_accum_steps",
    "effective_batch_size", "clipnorm", "remat", "attention", "dropout", "optimizer", "learning_rate",
    "lr_schedule", "warmup_steps", "total_steps", "prune", "intra_op_threads",
    "inter_op_threads", "onednn",
)

# The fields that decide what training computes (not only how fast): a
# resumed run must have the values its backup recorded.
COMPUTATION_FIELDS = (
    "num_replicas", "train_step", "precision", "jit_compile", "steps_per_epoch", "global_batch_size",
    "grad_accum_steps", "clipnorm", "optimizer", "learning_rate", "lr_schedule", "warmup_steps", "total_steps",
    "prune", "dropout",
)


# The fields tuning measures and may change.
TUNED_FIELDS = ("precision", "jit_compile", "steps_per_execution")


@dataclasses.dataclass
class Measurement:
    """One candidate: its choices, measured rate and verdict."""

    precision: str
    jit_compile: bool
    steps_per_execution: int
    samples_per_second: float = 0.0  # mean of the rounds' rates
    loss: float | None = None  # mean loss of the first execution (from the same state and batches)
    compile_s: float | None = None  # the first execution's seconds beyond a steady one: tracing and compiling
    rates: list = dataclasses.field(default_factory=list)
    verdict: str = ""  # "chosen", "rejected: ...", "slower", "not measured: ..."

    def choices(self) -> dict:
        return {name: getattr(self, name) for name in TUNED_FIELDS}


def format_table(table: list[Measurement], seconds: float | None = None) -> list[str]:
    """Lines of the tuning table, as the plan prints it; `seconds`: tuning's own cost."""
    took = f"took {seconds:.1f} s beyond the chosen plan's compilation, which training reuses; " \
        if seconds is not None else ""
    lines = [f"  tuning ({took}rates measured on your model, compile time excluded):"]
    for row in table:
        rate = f"{row.samples_per_second:,.0f} samples/s" if row.samples_per_second else "-"
        loss = f"loss {row.loss:.4g}" if row.loss is not None and math.isfinite(row.loss) else ""
        compiled = f"compile {row.compile_s:.1f} s" if row.compile_s is not None else ""
        lines.append(f"    {row.precision:<16} jit={str(row.jit_compile):<5} spe={row.steps_per_execution:<4} "
                     f"{rate:>20}  {loss:<14} {compiled:<14} {row.verdict}")
    return lines


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a training run will do, with a reason for every choice.

    Attributes:
        strategy: "none" (one device) or the tf.distribute strategy's name.
        num_replicas: Devices that each process a share of the global batch.
        precision: A Keras dtype policy name, or "onednn_bfloat16" (a float32
            Keras model whose train step TensorFlow's oneDNN pass runs in
            bfloat16 where that is safe: see `keras_policy()`).
        jit_compile: Whether the train step is compiled with XLA.
        steps_per_execution: Train steps run per call into the compiled graph.
        steps_per_epoch: Train steps per epoch (None: until the data ends).
        global_batch_size: Samples per step over all replicas.
        per_replica_batch_size: Samples per step on each replica.
        grad_accum_steps: Steps whose gradients are summed before an update.
        effective_batch_size: Samples per optimizer update.
        clipnorm: Global gradient-norm clipping threshold, or None.
        remat: Rematerialisation mode ("activations") or None.
        attention: How the train step computes causal self-attention:
            "causal_blocks" (query blocks that skip the masked half,
            `kerasfast.training.attention`) or "keras" (Keras's own op);
            `resolve_attention`.
        dropout: Where the train step's dropout masks come from: "hashed"
            (a counter hash, `kerasfast.training.dropout`) or "keras"
            (Keras's random stream); `resolve_dropout`.
        optimizer: Name of the optimizer class used.
        learning_rate: Peak learning rate when kerasfast sets it, else None.
        lr_schedule: "warmup_cosine", "warmup_hold_cosine", "one_cycle",
            "constant" or "optimizer's own".
        warmup_steps: Warm-up steps of the schedule, or None.
        total_steps: Optimizer updates the schedule spans (train steps divided
            by `grad_accum_steps`), or None when unknown.
        intra_op_threads: TensorFlow threads inside one op (0 = TF default).
        inter_op_threads: TensorFlow ops run at once (0 = TF default).
        onednn: Whether TensorFlow runs its oneDNN CPU kernels in this
            process (None where the platform has no such switch); decided
            when TensorFlow loads (`kerasfast.onednn`).
        prune: Target sparsity of magnitude pruning during the run, or None.
        train_step: Whose train step runs: "kerasfast" (its own, with every
            fast path), "yours" (the model overrides `train_step`) or "keras"
            (`run_eagerly=True`: Keras's own functions, eagerly).
        tuning: The candidates `tune=` measured (dicts: precision,
            jit_compile, steps_per_execution, samples_per_second, loss,
            verdict), empty when nothing was measured.
        tuning_seconds: What tuning cost: its time less the chosen plan's
            compilation, which training reuses (None when nothing was measured).
        reasons: Field name -> why that value was chosen.
        overridden: Field names the user set explicitly.
    """

    strategy: str
    num_replicas: int
    precision: str
    jit_compile: bool
    steps_per_execution: int
    steps_per_epoch: int | None
    global_batch_size: int | None
    per_replica_batch_size: int | None
    grad_accum_steps: int
    effective_batch_size: int | None
    clipnorm: float | None
    remat: str | None
    optimizer: str
    learning_rate: float | None
    lr_schedule: str
    warmup_steps: int | None
    total_steps: int | None
    intra_op_threads: int
    inter_op_threads: int
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)
    overridden: tuple[str, ...] = ()
    prune: float | None = None
    train_step: str = "kerasfast"
    tuning: tuple = ()
    tuning_seconds: float | None = None
    onednn: bool | None = None
    attention: str = ATTENTION_KERAS
    dropout: str = DROPOUT_KERAS

    def with_choice(self, name: str, value: Any, reason: str | None, *, yours: bool = False) -> "Plan":
        """The plan with `name` set to `value` because of `reason`: the one
        way a resolved plan changes (a check, tuning, a note).

        Args:
            name: A field of the plan.
            value: Its new value.
            reason: Why, as the plan prints it (None: the reason stays).
            yours: Whether the value is the user's (printed "(yours)").

        Example:

        >>> from kerasfast.hardware import detect_hardware
        >>> plan = resolve_plan(detect_hardware(), batch_size=64, jit_compile=True)
        >>> plan = plan.with_choice("jit_compile", False, "off: a layer XLA cannot compile")
        >>> plan.jit_compile, plan.reasons["jit_compile"], "jit_compile" in plan.overridden
        (False, 'off: a layer XLA cannot compile', False)
        """
        if name not in {field.name for field in dataclasses.fields(self)} - {"reasons", "overridden"}:
            raise PlanError(f"a plan has no field {name!r}.")
        reasons = self.reasons if reason is None else {**self.reasons, name: reason}
        overridden = tuple(field for field in self.overridden if field != name) + ((name,) if yours else ())
        return dataclasses.replace(self, **{name: value}, reasons=reasons, overridden=overridden)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data: `{"fields": {name: {value, reason, source}}}`."""
        return {
            "fields": {
                name: {
                    "value": getattr(self, name),
                    "reason": self.reasons.get(name, ""),
                    "source": "user" if name in self.overridden else "auto",
                }
                for name in FIELD_ORDER
            },
            "tuning": list(self.tuning),
            "tuning_seconds": self.tuning_seconds,
        }

    def values(self) -> dict[str, Any]:
        """`{field: value}` for every field of `FIELD_ORDER` (what a backup records)."""
        return {name: getattr(self, name) for name in FIELD_ORDER}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def rows(self) -> list[tuple[str, str, str]]:
        """(field, value, reason) rows in a stable order, for printing."""
        rows = []
        for name in FIELD_ORDER:
            value = getattr(self, name)
            source = " (yours)" if name in self.overridden else ""
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            rows.append((name, f"{shown}{source}", self.reasons.get(name, "")))
        return rows

    def __str__(self) -> str:
        width = max(len(name) for name in FIELD_ORDER)
        lines = ["kerasfast plan"]
        for name, value, reason in self.rows():
            lines.append(f"  {name:<{width}}  {value:<16}  {reason}")
        if self.tuning:
            lines += format_table([Measurement(**row) for row in self.tuning], self.tuning_seconds)
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What the plan needs to know about the model.

    Attributes:
        layers_without_jit: Names of layers that declare `supports_jit=False`.
        synchronized_batch_norm_layers: Names of the
            `BatchNormalization(synchronized=True)` layers, which all-reduce
            inside the forward pass under a strategy.
        forward_flops_per_sample: FLOPs of one sample's forward pass, or None.
        depthwise_conv_flops: FLOPs of one sample's forward pass in
            depthwise convolutions (0: none, or not counted).
        recurrent_layers: Names of recurrent layers (LSTM, GRU, ...): on a
            CPU they run as a loop of small ops, which XLA fuses.
        layer_norm_layers: Names of `LayerNormalization` layers.
        batch_norm_layers: Names of `BatchNormalization` layers.
        random_layers: Names of layers drawing random numbers in training
            (dropout with a rate above 0, noise, random augmentation).
        conv_flops: FLOPs of one sample's forward pass in convolutions.
        user_optimizer: Class name of the optimizer the user gave (or compiled
            with), None when kerasfast picks it.
        user_learning_rate: The user optimizer's learning rate if constant.
        fused_update: The optimizer's update of each weight runs as one op
            (Keras's own Adam or AdamW; `kerasfast.training.optimizers.fused_update`).
        custom_train_step: "Class.train_step" when the model overrides
            `train_step` (kerasfast then runs it), else None.
        loss_from_raw_outputs: "Class.train_step" or "Class.compute_loss"
            when a subclassed model (whose outputs a mixed policy leaves in
            its compute dtype) computes its loss in code of the user's, else
            None.
        mixed_precision_problem: What stops the model's forward pass under
            the mixed policy the plan would pick, found by tracing it there
            (`kerasfast.training.precision.mixed_dtype_problem`): e.g.
            "ScaleF32 layer 'scale_f32' mixes float32 into bfloat16 (...)";
            None when it traces, or was not traced (only Keras's own layers,
            or no mixed policy within reach: `mixed_policy_in_reach`).
        compile_jit_compile: `jit_compile` as passed to the model's
            `compile` ("auto" when not compiled or not set).
        compile_steps_per_execution: `steps_per_execution` of the model's
            `compile` (1 when not set).
        run_eagerly: The model was compiled with `run_eagerly=True`.
        loss_scaled: The model's optimizer already scales the loss
            (a `LossScaleOptimizer`).
        built_under: The mixed dtype policy the model's layers were built
            under (e.g. a global "mixed_float16"), None for float32.
        float64_layers: Layers computing in float64 (`dtype="float64"`, or
            `keras.config.set_floatx("float64")`), which keep it.
    """

    layers_without_jit: tuple[str, ...] = ()
    synchronized_batch_norm_layers: tuple[str, ...] = ()
    forward_flops_per_sample: int | None = None
    depthwise_conv_flops: int = 0
    recurrent_layers: tuple[str, ...] = ()
    layer_norm_layers: tuple[str, ...] = ()
    batch_norm_layers: tuple[str, ...] = ()
    random_layers: tuple[str, ...] = ()
    conv_flops: int = 0
    user_optimizer: str | None = None
    user_learning_rate: float | None = None
    fused_update: bool = False
    custom_train_step: str | None = None
    loss_from_raw_outputs: str | None = None
    mixed_precision_problem: str | None = None
    compile_jit_compile: Any = "auto"
    compile_steps_per_execution: int = 1
    run_eagerly: bool = False
    loss_scaled: bool = False
    built_under: str | None = None
    float64_layers: tuple[str, ...] = ()

    @property
    def normalised_stack(self) -> bool:
        """A transformer-style stack that XLA speeds up on a CPU: layer
        norms, and no convolutions, recurrent layers or random numbers.

        Measured with Keras 3.15 / TF 2.21 on the 2-core CPU, float32:
        XLA 1.36x on the GPT recipe and 1.24x on the text encoder without
        dropout; but 0.6x on the text encoder with dropout (XLA's CPU random
        numbers are slow) and 0.80-0.86x on MLPs without layer norms.
        """
        return (bool(self.layer_norm_layers) and not self.random_layers and not self.recurrent_layers
                and self.forward_flops_per_sample is not None and not self.conv_flops)


@dataclasses.dataclass(frozen=True)
class DataFacts:
    """What the plan needs to know about the data.

    Attributes:
        batch_size: Batch size fixed by the data (an already batched
            tf.data.Dataset), or None when kerasfast batches it.
        num_samples: Samples per epoch, when known.
        steps_per_epoch: Steps per epoch, when known.
    """

    batch_size: int | None = None
    num_samples: int | None = None
    steps_per_epoch: int | None = None


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """Facts about the process the plan must respect.

    Attributes:
        epochs: Planned epochs.
        tf_runtime_started: Whether TensorFlow's runtime is already running
            (thread pools can then no longer be resized).
        current_intra_op_threads: TF's current setting (0 = TF default).
        current_inter_op_threads: TF's current setting (0 = TF default).
        op_determinism: Whether TF op determinism is enabled (XLA is then off).
        user_batch_callbacks: The callbacks that act on every batch
            (`kerasfast.training.batch_callbacks`), with why.
        learning_rate_callbacks: The callbacks that set the learning rate
            as training goes (`ReduceLROnPlateau`, `LearningRateScheduler`).
        peak_flops: Peak FLOP/s, if known: a number, or `f(compute_dtype)`
            measuring it in the precision the plan picks (once per dtype,
            `kerasfast.costs.PeakFlops`).
        onednn: `(on, reason)`: whether TensorFlow loaded with its oneDNN
            CPU kernels, and why (`kerasfast.onednn.onednn_state()`).
        flash_attention: `keras.config.is_flash_attention_enabled()`: None
            (Keras's default), or the user's True / False.
    """

    epochs: int = 1
    tf_runtime_started: bool = True
    current_intra_op_threads: int = 0
    current_inter_op_threads: int = 0
    op_determinism: bool = False
    user_batch_callbacks: tuple[str, ...] = ()
    learning_rate_callbacks: tuple[str, ...] = ()
    peak_flops: Any = None
    onednn: tuple[bool | None, str] = (None, "not known")
    flash_attention: bool | None = None

    def peak_flops_in(self, precision: str) -> float | None:
        """The peak FLOP/s in `precision`'s compute dtype, if known."""
        if callable(self.peak_flops):
            return self.peak_flops(compute_dtype(precision))
        return self.peak_flops


@dataclasses.dataclass(frozen=True)
class Overrides:
    """The user's overrides of automatic choices, listed once.

    Each field's default means "not overridden: kerasfast chooses"; any other
    value is the user's and is marked "(yours)" in the plan. `kerasfast.fit`
    takes these as keyword arguments of the same names.

    Example:

    >>> Overrides(precision="float32", batch_size=64).user_set()
    ('precision', 'global_batch_size')
    """

    precision: Any = "auto"
    jit_compile: Any = "auto"
    steps_per_execution: Any = "auto"
    batch_size: Any = None
    grad_accum_steps: Any = 1
    clipnorm: Any = None
    remat: Any = None
    learning_rate: Any = None
    lr_schedule: Any = "auto"
    warmup_steps: Any = "auto"
    intra_op_threads: Any = "auto"
    inter_op_threads: Any = "auto"
    steps_per_epoch: Any = None
    scale_lr: Any = False
    dropout: Any = "auto"

    # Overrides named differently from the plan field they set.
    PLAN_FIELDS = {"batch_size": "global_batch_size"}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def pick(cls, options: dict) -> "Overrides":
        """The overrides among `options` (other keys are ignored)."""
        return cls(**{name: options[name] for name in cls.names() if name in options})

    @classmethod
    def from_options(cls, options: dict, where: str = "kerasfast.fit") -> "Overrides":
        """`Overrides(**options)`, refusing an unknown name with the closest known one.

        Raises:
            PlanError: For an option that is not an override.
        """
        unknown = [name for name in options if name not in cls.names()]
        if unknown:
            import difflib

            hints = []
            for name in unknown:
                close = difflib.get_close_matches(name, cls.names(), n=1)
                if name in COMPILE_ONLY_ARGUMENTS:
                    hints.append(f"{name!r} (an argument of model.compile: compile the model with it, then "
                                 "kerasfast.fit keeps it)")
                else:
                    hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise PlanError(f"{where} got unknown option(s) {', '.join(hints)}; see docs/fit.md for every option.")
        return cls(**options)

    def user_set(self) -> tuple[str, ...]:
        """Plan fields the user set (scale_lr is reported on learning_rate)."""
        chosen = []
        for field in dataclasses.fields(self):
            if field.name != "scale_lr" and getattr(self, field.name) != field.default:
                chosen.append(self.PLAN_FIELDS.get(field.name, field.name))
        return tuple(chosen)


def keras_policy(precision: str) -> str:
    """The Keras dtype policy that the model is built under for `precision`.

    Example:

    >>> keras_policy("onednn_bfloat16")
    'float32'
    """
    return "float32" if precision == ONEDNN_BFLOAT16 else precision


def compute_dtype(precision: str) -> str:
    """The dtype the matmuls and convolutions of a train step run in.

    Example:

    >>> compute_dtype("mixed_float16"), compute_dtype("onednn_bfloat16")
    ('float16', 'bfloat16')
    """
    import keras

    return "bfloat16" if precision == ONEDNN_BFLOAT16 else keras.DTypePolicy(precision).compute_dtype


def resolve_precision(hardware: Hardware, requested: str = "auto", *, train_step_flops: float | None = None,
                      depthwise_convs: bool = False, recurrent: bool = False, conv_batch_norm: bool = False,
                      normalised_stack_under_xla: bool = False, jit_compile="auto") -> tuple[str, str]:
    """Chooses the precision of the train step for `hardware`.

    Args:
        hardware: The machine.
        requested: "auto" or one of `PRECISIONS`.
        train_step_flops: FLOPs of one train step on one replica, if known:
            on a CPU, a step too small to gain from bfloat16 stays float32.
        depthwise_convs: The step has depthwise convolutions: on a CPU,
            oneDNN runs them slower in bfloat16, so it stays float32.
        recurrent: The model has recurrent layers: on a CPU they are fastest
            in float32 under XLA, so it stays float32.
        conv_batch_norm: The model has convolutions and batch normalization:
            on a CPU, a step under `BF16_MIN_CONV_BATCH_NORM_STEP_FLOPS`
            stays float32.
        normalised_stack_under_xla: A `ModelFacts.normalised_stack` model
            that XLA compiles: on a CPU it is fastest in float32.
        jit_compile: The user's `jit_compile`: oneDNN's graph pass does not
            reach into XLA clusters.

    Returns:
        `(precision, reason)`.

    Raises:
        PlanError: For an unknown precision, or "onednn_bfloat16" off a CPU
            or with `jit_compile=True`.

    Example:

    >>> resolve_precision(Hardware(cpu_flags=("avx512_bf16",)))[0]
    'onednn_bfloat16'
    >>> resolve_precision(Hardware(cpu_flags=("avx512_bf16",)), train_step_flops=2e7)[0]
    'float32'
    """
    if requested != "auto":
        return _requested_precision(hardware, requested, jit_compile)
    if hardware.accelerator == "tpu":
        return "mixed_bfloat16", "TPU: bfloat16 is native"
    if hardware.accelerator == "gpu":
        return _gpu_precision(hardware)
    return _cpu_precision(hardware, train_step_flops=train_step_flops, depthwise_convs=depthwise_convs,
                          recurrent=recurrent, conv_batch_norm=conv_batch_norm,
                          normalised_stack_under_xla=normalised_stack_under_xla, jit_compile=jit_compile)


def _requested_precision(hardware: Hardware, requested: str, jit_compile) -> tuple[str, str]:
    """The user's precision, refused where it cannot run, with a note where it runs slowly."""
    if requested not in PRECISIONS:
        raise PlanError(
            f"precision={requested!r} is not known: use 'auto' or one of {', '.join(PRECISIONS)}."
        )
    if requested == ONEDNN_BFLOAT16:
        if hardware.accelerator != "cpu":
            raise PlanError(
                f"precision='{ONEDNN_BFLOAT16}' is TensorFlow's oneDNN rewrite for CPUs, but this run trains on "
                f"a {hardware.accelerator.upper()}: use precision='mixed_bfloat16' (or 'auto')."
            )
        if jit_compile is True:
            raise PlanError(
                f"precision='{ONEDNN_BFLOAT16}' with jit_compile=True: oneDNN's bfloat16 graph pass does not "
                "apply inside XLA. Use precision='mixed_bfloat16' with XLA, or drop jit_compile=True."
            )
        if not hardware.cpu_has_bf16:
            return requested, "requested; note: this CPU has no AVX512_BF16/AMX, so oneDNN emulates bfloat16"
    if requested == "mixed_float16" and hardware.accelerator == "cpu":
        return requested, "requested; note: float16 is emulated on CPUs (measured ~4x slower than float32)"
    return requested, "requested"


def _gpu_precision(hardware: Hardware) -> tuple[str, str]:
    """What the least capable GPU's tensor cores run fast."""
    capabilities = [g.compute_capability for g in hardware.gpus if g.compute_capability]
    if not capabilities:
        return "float32", "GPU compute capability unknown: staying safe"
    lowest = min(capabilities)
    if lowest >= (8, 0):
        return "mixed_bfloat16", f"GPU compute capability {lowest[0]}.{lowest[1]} >= 8.0 has bf16 tensor cores"
    if lowest >= (7, 0):
        return "mixed_float16", f"GPU compute capability {lowest[0]}.{lowest[1]} has fp16 tensor cores but no bf16"
    return "float32", f"GPU compute capability {lowest[0]}.{lowest[1]} < 7.0 has no fast low precision"


def _cpu_precision(hardware: Hardware, *, train_step_flops, depthwise_convs: bool, recurrent: bool,
                   conv_batch_norm: bool, normalised_stack_under_xla: bool, jit_compile) -> tuple[str, str]:
    """bfloat16 where the CPU has it and the model gains from it, else float32."""
    if not hardware.cpu_has_bf16:
        return "float32", "CPU has no AVX512_BF16/AMX; never mixed_float16 on a CPU (measured 4x slower)"
    flags = "/".join(f.upper() for f in hardware.cpu_flags if f in ("avx512_bf16", "amx_bf16"))
    if recurrent:
        # Measured with Keras 3.15 / TF 2.21 on this CPU, LSTM(64) under XLA:
        # float32 18,670-19,972 samples/s, mixed_bfloat16 6,912-7,043.
        return "float32", ("the model has recurrent layers, whose loop of small matmuls gains nothing from "
                           f"{flags} and runs fastest in float32 under XLA (measured LSTM: bfloat16 0.36x)")
    if normalised_stack_under_xla:
        # Measured with Keras 3.15 / TF 2.21 on this CPU, GPT recipe (64
        # tokens, batch 32), 2-3 interleaved runs: float32 under XLA 371-396
        # samples/s, mixed_bfloat16 under XLA 328, onednn_bfloat16 269-294.
        return "float32", (f"XLA compiles this layer-normalised stack, and there {flags} gains nothing: float32 "
                           "runs fastest (measured GPT recipe: float32 1.2x mixed_bfloat16 under XLA, 1.4x "
                           "onednn_bfloat16 without)")
    if jit_compile is True:
        # Checked before the step's size, so that the Keras policy does not
        # depend on whether the FLOPs are known yet.
        return "mixed_bfloat16", f"CPU has {flags}; XLA was requested, and oneDNN's bfloat16 graph pass skips XLA"
    if train_step_flops is not None and train_step_flops < BF16_MIN_TRAIN_STEP_FLOPS:
        return "float32", (
            f"a train step is only {train_step_flops / 1e6:.0f} MFLOP: too little math for {flags} to pay "
            "(measured on a small MLP: float32 1.64x plain Keras, bfloat16 1.48-1.66x), so full precision"
        )
    if conv_batch_norm and train_step_flops is not None and train_step_flops < BF16_MIN_CONV_BATCH_NORM_STEP_FLOPS:
        return "float32", (
            f"a train step of {train_step_flops / 1e9:.1f} GFLOP with convolutions and batch normalization: the "
            f"casts and float32 statistics around each bfloat16 convolution cost what {flags} saves below "
            f"{BF16_MIN_CONV_BATCH_NORM_STEP_FLOPS / 1e9:.0f} GFLOP (measured 0.97x of float32 on average on small "
            "conv stacks with batch norm), so full precision"
        )
    if depthwise_convs:
        # Measured with Keras 3.15 / TF 2.21 on this CPU: strided depthwise
        # blocks 0.26x, depthwise + batch-norm blocks 0.53x, MobileNetV3-Small
        # at 32x32 0.5x of float32 (batch 64 and 256).
        return "float32", (
            f"the model has depthwise convolutions, which oneDNN runs slower in bfloat16 than in float32 on "
            f"{flags} (measured 0.26-0.53x on depthwise blocks, 0.5x on MobileNetV3-Small), so full precision"
        )
    return ONEDNN_BFLOAT16, (
        f"CPU has {flags}: oneDNN runs the step's matmuls and convolutions in bfloat16, the rest in float32, "
        "on the model as built (as fast as mixed_bfloat16 here: GPT recipe 1.26x vs 1.24x plain Keras)"
    )


def _resolve_train_step(model: ModelFacts, overrides: Overrides, strategy_name: str) -> tuple[str, str]:
    """Whose train step runs, refusing the fast paths that need kerasfast's own."""
    if model.run_eagerly:
        if strategy_name != "none":
            raise PlanError(
                "your model is compiled with run_eagerly=True, which Keras cannot run under a tf.distribute "
                "strategy: compile with run_eagerly=False, or pass strategy='none'."
            )
        needs_own = [name for name, value in (("grad_accum_steps", overrides.grad_accum_steps != 1),
                                              ("jit_compile=True", overrides.jit_compile is True)) if value]
        if needs_own:
            raise PlanError(
                f"{' and '.join(needs_own)} need(s) compiled steps, but your model is compiled with "
                "run_eagerly=True: compile with run_eagerly=False (it is a debugging switch) or drop them."
            )
        return "keras", "Keras's own steps, eagerly: your compile(run_eagerly=True) (a debugging setting)"
    if model.custom_train_step is None:
        return "kerasfast", "kerasfast's own: one compiled loop of micro-steps per execution (every fast path)"
    owner = model.custom_train_step
    needs_own = {
        "grad_accum_steps": (overrides.grad_accum_steps != 1,
                             "accumulate inside your train_step, or drop grad_accum_steps="),
        "clipnorm": (overrides.clipnorm is not None, "set clipnorm= on your optimizer(s) instead"),
    }
    for name, (requested, way_out) in needs_own.items():
        if requested:
            raise PlanError(
                f"{name}= needs kerasfast's own train step, but {owner} overrides it (kerasfast runs your step "
                f"as written): {way_out}."
            )
    return "yours", (
        f"{owner}, run as written inside kerasfast's execution loop (precision, steps per execution, XLA off a "
        "strategy and strategies still apply; accumulation and clipping are your step's to do)"
    )


def _resolve_jit(requested, hardware, model: ModelFacts, run: RunFacts, train_step: str = "kerasfast",
                 strategy_name: str = "none") -> tuple[bool, str]:
    blockers = []
    if model.layers_without_jit:
        blockers.append(f"layer(s) {', '.join(model.layers_without_jit)} do not support XLA")
    if run.op_determinism:
        blockers.append("TF op determinism is enabled (XLA has no deterministic kernels for some ops)")
    if train_step == "keras":
        blockers.append("run_eagerly=True runs no compiled function")
    if model.synchronized_batch_norm_layers and strategy_name != "none":
        blockers.append(f"BatchNormalization(synchronized=True) layer(s) "
                        f"{', '.join(model.synchronized_batch_norm_layers[:3])} all-reduce inside the forward pass, "
                        "which XLA cannot compile under a tf.distribute strategy")
    if train_step == "yours" and strategy_name != "none":
        # kerasfast compiles only the forward and backward pass under a
        # strategy; a custom step holds its optimizer's all-reduce, which XLA
        # cannot compile on these devices.
        blockers.append("your train_step holds the optimizer's cross-replica update, which XLA cannot compile "
                        "under a tf.distribute strategy")
    if requested == "auto":
        if blockers:
            return False, "off: " + "; ".join(blockers)
        if hardware.accelerator in ("gpu", "tpu"):
            return True, f"on: {hardware.accelerator.upper()}, XLA fuses the step's ops"
        if model.recurrent_layers:
            # Measured with Keras 3.15 / TF 2.21 on the 2-core CPU (float32,
            # batch 64): LSTM(64) 1.7x, GRU(64) 3.0x, Bidirectional LSTM 1.6-3x.
            return True, (f"on: recurrent layer(s) {', '.join(model.recurrent_layers[:3])} run a loop of small ops "
                          "per time step, which XLA fuses (measured on this CPU: LSTM 1.7x, GRU 3.0x)")
        if model.normalised_stack:
            return True, (f"on: layer norms ({', '.join(model.layer_norm_layers[:2])}, ...) without convolutions or "
                          "dropout: XLA fuses the normalisations, softmaxes and activations between the matmuls "
                          "(measured on this CPU: GPT recipe 1.36x, text encoder without dropout 1.24x; with "
                          "dropout 0.6x, so dropout keeps XLA off)")
        return False, "off: XLA measured no faster than the default kernels on this CPU (noisy 0.7-1.2x)"
    if not isinstance(requested, bool):
        raise PlanError(f"jit_compile={requested!r} is not valid: use 'auto', True or False.")
    if requested and blockers:
        raise PlanError(
            "jit_compile=True cannot work here: " + "; ".join(blockers)
            + ". Use jit_compile=False (or 'auto'), or remove the layers that do not support XLA."
        )
    return requested, "requested"


def _resolve_steps_per_execution(requested, data: DataFacts, model: ModelFacts, run: RunFacts, batch_size,
                                 jit_compile: bool, precision: str = "float32") -> tuple[int, str]:
    if requested != "auto":
        if not is_int(requested) or requested < 1:
            raise PlanError(f"steps_per_execution={requested!r} is not valid: use 'auto' or an integer >= 1.")
        return requested, "requested"
    if run.user_batch_callbacks:
        return 1, (
            f"1: {', '.join(run.user_batch_callbacks)} act(s) on every batch, which longer executions "
            "would show only once per execution"
        )
    cap = MAX_STEPS_PER_EXECUTION
    if data.steps_per_epoch:
        cap = max(1, min(cap, data.steps_per_epoch))
    flops = model.forward_flops_per_sample
    peak = run.peak_flops_in(precision) if flops and batch_size else None
    if peak:
        from kerasfast.costs import TRAIN_STEP_FLOPS_PER_FORWARD

        step_s = TRAIN_STEP_FLOPS_PER_FORWARD * flops * batch_size / peak
        wanted = math.ceil(EXECUTION_OVERHEAD_S / (OVERHEAD_BUDGET * max(step_s, 1e-9)))
        floor = 1 if jit_compile else min(MIN_GRAPH_STEPS_PER_EXECUTION,
                                          int(MAX_EXECUTION_S // max(step_s, 1e-9)))
        chosen = max(1, min(cap, max(wanted, floor)))
        steps = data.steps_per_epoch
        if steps and steps % chosen:
            # A divisor of the epoch keeps every execution whole without
            # rounding the epoch up.
            chosen = next((d for d in range(chosen, cap + 1) if steps % d == 0), chosen)
        return chosen, (
            f"{chosen}: a step is ~{step_s * 1e3:.3f} ms of math "
            f"({TRAIN_STEP_FLOPS_PER_FORWARD * flops * batch_size / 1e6:.1f} MFLOP at "
            f"{peak / 1e9:.0f} GFLOP/s); per-execution overhead ~{EXECUTION_OVERHEAD_S * 1e3:.1f} ms "
            f"should stay under {OVERHEAD_BUDGET:.0%}"
            + (f"; at least {floor} without XLA, where an execution's edges cost more" if floor > wanted else "")
            + f" (capped at {cap})"
        )
    chosen = min(cap, 16)
    return chosen, f"{chosen}: step cost unknown, amortises ~{EXECUTION_OVERHEAD_S * 1e3:.1f} ms overhead per execution"


def resolve_threads(requested_intra, requested_inter, hardware: Hardware, run: RunFacts):
    """`({field: threads}, {field: reason})` for TensorFlow's two thread pools:
    the plan's, and what a run configures before TensorFlow starts."""
    cores = hardware.cpu_cores
    wanted = {"intra_op_threads": cores, "inter_op_threads": min(2, cores)}
    requested = {"intra_op_threads": requested_intra, "inter_op_threads": requested_inter}
    values, reasons = {}, {}
    _check_thread_requests(requested)
    if run.tf_runtime_started:
        for name, value in requested.items():
            current = run.current_intra_op_threads if name.startswith("intra") else run.current_inter_op_threads
            if value != "auto" and value != current:
                raise PlanError(
                    f"{name}={value} cannot be applied: TensorFlow's runtime has already started. Call "
                    f"kerasfast.configure_threads({name}={value}) at the top of your script, before any "
                    "model or tensor is created."
                )
            values[name] = current
            reasons[name] = (
                ("TensorFlow's default (0: it sizes the pool to the cores), " if current == 0 else "")
                + "kept: TensorFlow already started (call kerasfast.configure_threads() first to tune)"
            )
        return values, reasons
    for name, value in requested.items():
        if value == "auto":
            values[name] = wanted[name]
            reasons[name] = (
                f"{cores} usable cores: every op may use all of them"
                if name.startswith("intra")
                else "2 ops at once overlap small ops without oversubscribing the cores"
            )
        else:
            values[name] = value
            reasons[name] = "requested"
    return values, reasons


@dataclasses.dataclass(frozen=True)
class Findings:
    """What a run measured or recorded before its plan, taken by the plan as facts.

    Attributes:
        batch_size: The global batch `batch_size="auto"` found (or the one a
            resumed backup recorded), with `batch_reason`.
        learning_rate: The rate `learning_rate="find"` suggested, with
            `learning_rate_reason`.
        recorded: The plan (`Plan.values()`) of the backup a run resumes:
            the choices kerasfast made from measurements or the machine
            (`RECORDED_CHOICES`) are kept unless the user sets them.
    """

    batch_size: int | None = None
    batch_reason: str = ""
    learning_rate: float | None = None
    learning_rate_reason: str = ""
    recorded: dict = dataclasses.field(default_factory=dict)


# Choices a resumed run takes from the plan its backup recorded, unless the
# user sets them: what kerasfast chose from measurements or the machine.
RECORDED_CHOICES = (*TUNED_FIELDS, "dropout")
# What a run computed before its plan had these fields: a backup whose plan
# lacks one resumes as its run began.
BEFORE_RECORDED = {"dropout": DROPOUT_KERAS}
RECORDED_REASON = "as recorded by the backup this run resumes"


@dataclasses.dataclass(frozen=True)
class Computation:
    """How each train step computes at one global batch size: the part of a
    plan a batch-size search measures with (`resolve_computation`)."""

    train_step: str
    precision: str
    jit_compile: bool
    steps_per_execution: int
    steps_per_epoch: int | None
    global_batch_size: int
    per_replica_batch_size: int
    num_replicas: int
    grad_accum_steps: int
    remat: str | None
    clipnorm: float | None
    reasons: dict
    attention: str = ATTENTION_KERAS
    dropout: str = DROPOUT_KERAS


def resolve_computation(hardware: Hardware, *, model: ModelFacts, data: DataFacts, run: RunFacts,
                        overrides: Overrides, num_replicas: int, strategy_name: str, global_batch: int,
                        overridden: list | None = None) -> Computation:
    """Whose step runs, in which precision, with XLA or not, how many steps
    per execution, at `global_batch` samples per step.

    Args:
        hardware, model, data, run, overrides, num_replicas, strategy_name:
            As for `resolve_plan`.
        global_batch: Samples per step over all replicas.
        overridden: Collects the fields the model's compile settings set
            (they count as the user's); None: not collected.

    Returns:
        A `Computation`.

    Raises:
        PlanError: For a value or combination that cannot work.
    """
    overridden = overridden if overridden is not None else []
    reasons = {}
    train_step, reasons["train_step"] = _resolve_train_step(model, overrides, strategy_name)
    jit_compile, steps_per_execution = _with_compile_settings(overrides, model, hardware, overridden)
    remat, reasons["remat"] = _resolve_remat(overrides.remat)  # before jit: both change how a step compiles
    chosen_jit, reasons["jit_compile"] = _resolve_jit(jit_compile, hardware, model, run, train_step, strategy_name)
    if "jit_compile" in overridden and overrides.jit_compile == "auto" and reasons["jit_compile"] == "requested":
        reasons["jit_compile"] = f"your compile(jit_compile={jit_compile})"
    grad_accum_steps, reasons["grad_accum_steps"] = _resolve_grad_accum_steps(overrides.grad_accum_steps)
    if global_batch % num_replicas:
        raise PlanError(_indivisible_batch_message(global_batch, num_replicas, data))
    per_replica = global_batch // num_replicas
    reasons["per_replica_batch_size"] = f"{global_batch} / {num_replicas} replica(s)"
    precision, reasons["precision"] = _resolve_model_precision(
        hardware, overrides.precision, model, train_step, per_replica, jit_compile, chosen_jit)
    if model.float64_layers:
        shown = ", ".join(repr(name) for name in model.float64_layers[:3])
        more = f" and {len(model.float64_layers) - 3} more" if len(model.float64_layers) > 3 else ""
        reasons["precision"] += (f"; {len(model.float64_layers)} layer(s) computing in float64 as built ({shown}{more}) "
                                 f"keep float64")
    steps_per_epoch, reasons["steps_per_epoch"] = _resolve_steps_per_epoch(overrides.steps_per_epoch, data,
                                                                           global_batch, overridden)
    if train_step == "keras":
        spe, reasons["steps_per_execution"] = 1, "1: run_eagerly=True runs one step at a time"
    else:
        spe, reasons["steps_per_execution"] = _resolve_steps_per_execution(
            steps_per_execution, dataclasses.replace(data, steps_per_epoch=steps_per_epoch), model, run,
            per_replica, chosen_jit, precision)
        if "steps_per_execution" in overridden and overrides.steps_per_execution == "auto":
            reasons["steps_per_execution"] = f"your compile(steps_per_execution={spe})"
    clipnorm, reasons["clipnorm"] = _resolve_clipnorm(overrides.clipnorm)
    attention, reasons["attention"] = resolve_attention(chosen_jit, hardware, run)
    dropout, reasons["dropout"] = resolve_dropout(overrides.dropout, hardware, model, train_step)
    return Computation(train_step, precision, chosen_jit, spe, steps_per_epoch, global_batch, per_replica,
                       num_replicas, grad_accum_steps, remat, clipnorm, reasons, attention, dropout)


def check_overrides(hardware: Hardware, overrides: Overrides) -> None:
    """Refuses an override whose value cannot work on this hardware, whatever
    the model and data: the check a run makes first, before reading either.

    Raises:
        PlanError: Naming the argument and the values it takes.

    Example:

    >>> from kerasfast.hardware import detect_hardware
    >>> check_overrides(detect_hardware(), Overrides(precision="fp8"))
    Traceback (most recent call last):
    ...
    kerasfast.errors.PlanError: precision='fp8' is not known: use 'auto' or one of float32, mixed_float16, mixed_bfloat16, onednn_bfloat16.
    """
    batch, _ = _resolve_global_batch(overrides.batch_size, DataFacts(), [])
    resolve_computation(hardware, model=ModelFacts(), data=DataFacts(), run=RunFacts(), overrides=overrides,
                        num_replicas=1, strategy_name="none", global_batch=batch)
    _check_learning_rate_request(overrides.learning_rate, overrides.lr_schedule)
    _check_thread_requests({name: getattr(overrides, name) for name in ("intra_op_threads", "inter_op_threads")})


def _check_thread_requests(requested: dict) -> None:
    for name, value in requested.items():
        if value != "auto" and (not is_int(value) or value < 0):
            raise PlanError(f"{name}={value!r} is not valid: use 'auto' or an integer >= 0 (0 = TensorFlow's default).")


def resolve_plan(
    hardware: Hardware,
    *,
    model: ModelFacts = ModelFacts(),
    data: DataFacts = DataFacts(),
    run: RunFacts = RunFacts(),
    overrides: Overrides | None = None,
    num_replicas: int = 1,
    strategy_name: str = "none",
    strategy_reason: str = "one device",
    found: Findings = Findings(),
    **options,
) -> Plan:
    """Resolves every automatic choice of a run into a `Plan`.

    Args:
        hardware: From `kerasfast.hardware.detect_hardware()`.
        model: Facts about the model (`ModelFacts`).
        data: Facts about the data (`DataFacts`).
        run: Facts about the process (`RunFacts`).
        overrides: The user's overrides (`Overrides`); or pass them as
            keyword arguments of the same names (precision=, batch_size=, ...).
        num_replicas, strategy_name, strategy_reason: The distribution set-up
            (`kerasfast.distribute`).
        found: What the run's searches found and its backup recorded
            (`Findings`).

    Returns:
        A frozen `Plan`.

    Raises:
        PlanError: For an unknown value or a combination that cannot work,
            before anything is trained.

    Example:

    >>> from kerasfast.hardware import detect_hardware
    >>> plan = resolve_plan(detect_hardware(), batch_size=64)
    >>> plan.global_batch_size
    64
    """
    if overrides is None:
        overrides = Overrides.from_options(options, "resolve_plan")
    elif options:
        raise PlanError(f"resolve_plan got both overrides= and option(s) {', '.join(options)}: pass one of them.")
    asked = overrides
    overrides, from_backup = _with_findings(overrides, found)
    overridden = [name for name in asked.user_set() if name != "steps_per_epoch"]
    global_batch, batch_reason = _resolve_global_batch(overrides.batch_size, data, overridden)
    computation = resolve_computation(hardware, model=model, data=data, run=run, overrides=overrides,
                                      num_replicas=num_replicas, strategy_name=strategy_name,
                                      global_batch=global_batch, overridden=overridden)
    reasons = {"strategy": strategy_reason, "num_replicas": f"{num_replicas} device(s) share each global batch",
               "global_batch_size": batch_reason, **computation.reasons}
    grad_accum_steps, steps_per_epoch = computation.grad_accum_steps, computation.steps_per_epoch
    reasons["effective_batch_size"] = f"{global_batch} x {grad_accum_steps} accumulated step(s) per update"
    # Keras counts optimizer iterations in updates: with accumulation, one
    # update per `grad_accum_steps` train steps. Schedules span updates.
    total_steps = max(1, steps_per_epoch * run.epochs // grad_accum_steps) if steps_per_epoch else None
    rate = _scaled_for_found_batch(_resolve_learning_rate(overrides, model, total_steps, num_replicas, overridden,
                                                          run.learning_rate_callbacks), asked, found)
    reasons.update(rate.reasons)
    reasons["prune"] = "off: not requested"
    reasons["total_steps"] = (
        f"optimizer updates: {run.epochs} epoch(s) x {steps_per_epoch} steps / {grad_accum_steps} accumulated"
        if total_steps else "unknown"
    )
    threads, thread_reasons = resolve_threads(overrides.intra_op_threads, overrides.inter_op_threads, hardware, run)
    reasons.update(thread_reasons)
    reasons["onednn"] = run.onednn[1]
    plan = Plan(
        strategy=strategy_name, num_replicas=num_replicas, precision=computation.precision,
        jit_compile=computation.jit_compile, steps_per_execution=computation.steps_per_execution,
        steps_per_epoch=steps_per_epoch, global_batch_size=global_batch,
        per_replica_batch_size=computation.per_replica_batch_size, grad_accum_steps=grad_accum_steps,
        effective_batch_size=global_batch * grad_accum_steps, clipnorm=computation.clipnorm, remat=computation.remat,
        optimizer=rate.optimizer, learning_rate=rate.peak, lr_schedule=rate.schedule, warmup_steps=rate.warmup_steps,
        total_steps=total_steps, intra_op_threads=threads["intra_op_threads"],
        inter_op_threads=threads["inter_op_threads"], reasons=reasons, overridden=tuple(dict.fromkeys(overridden)),
        train_step=computation.train_step, onednn=run.onednn[0], attention=computation.attention,
        dropout=computation.dropout,
    )
    return _marked_as_found(plan, found, from_backup, rate_was_asked=asked.learning_rate is not None or asked.scale_lr)


def _with_findings(overrides: Overrides, found: Findings) -> tuple[Overrides, tuple[str, ...]]:
    """The overrides with what was found or recorded in them, and the
    recorded choices taken (fields the user did not set)."""
    user_set = overrides.user_set()
    recorded = {**BEFORE_RECORDED, **found.recorded} if found.recorded else {}
    from_backup = tuple(name for name in RECORDED_CHOICES if name in recorded and name not in user_set)
    taken = {name: recorded[name] for name in from_backup}
    if found.batch_size is not None:
        taken["batch_size"] = found.batch_size
    if found.learning_rate is not None:
        taken["learning_rate"] = found.learning_rate
    return dataclasses.replace(overrides, **taken), from_backup


def _scaled_for_found_batch(rate: "_LearningRate", asked: Overrides, found: Findings) -> "_LearningRate":
    """A rate meant for Keras's default batch, scaled to the batch
    `batch_size="auto"` found; a rate the user passed (or found) is theirs."""
    if found.batch_size is None or found.learning_rate is not None:
        return rate
    if rate.peak is None:
        return dataclasses.replace(rate, reasons={**rate.reasons, "learning_rate": (
            "not scaled for batch_size='auto': your optimizer's learning rate is a schedule "
            "(pass learning_rate= to set its peak)")})
    if asked.learning_rate is not None or asked.scale_lr:
        return rate
    factor, rule = learning_rate_factor(rate.optimizer, found.batch_size)
    reason = (f"{rate.peak:g} x {factor:.3g}: {rule} from batch {FIRST_BATCH} to the {found.batch_size} "
              "batch_size='auto' chose")
    return dataclasses.replace(rate, peak=rate.peak * factor, reasons={**rate.reasons, "learning_rate": reason})


def _marked_as_found(plan: Plan, found: Findings, from_backup: tuple[str, ...], *, rate_was_asked: bool) -> Plan:
    """What was found or recorded, with its reason, and not as the user's."""
    for name in from_backup:
        plan = plan.with_choice(name, getattr(plan, name), RECORDED_REASON)
    if found.batch_size is not None:
        plan = plan.with_choice("global_batch_size", plan.global_batch_size, found.batch_reason)
        if not rate_was_asked:
            plan = plan.with_choice("learning_rate", plan.learning_rate, None)
    if found.learning_rate is not None:
        plan = plan.with_choice("learning_rate", plan.learning_rate, f"found: {found.learning_rate_reason}")
    return plan


FIRST_BATCH = 32  # Keras's default batch: the one a learning rate is usually chosen for
# Optimizers whose learning rate scales linearly with the batch (Goyal et al.,
# 2017); adaptive ones (Adam and kin) by its square root (Malladi et al., 2022).
LINEAR_SCALING_OPTIMIZERS = ("SGD", "Lion")


def learning_rate_factor(optimizer_name: str, batch_size: int, reference: int = FIRST_BATCH) -> tuple[float, str]:
    """How much to scale a learning rate chosen for `reference` samples per update.

    Example:

    >>> learning_rate_factor("SGD", 128)
    (4.0, 'linear scaling (SGD)')
    >>> learning_rate_factor("Adam", 128)
    (2.0, 'square-root scaling (Adam)')
    """
    ratio = batch_size / reference
    if optimizer_name in LINEAR_SCALING_OPTIMIZERS:
        return ratio, f"linear scaling ({optimizer_name})"
    return math.sqrt(ratio), f"square-root scaling ({optimizer_name})"


def _with_compile_settings(overrides: Overrides, model: ModelFacts, hardware: Hardware, overridden: list):
    """`(jit_compile, steps_per_execution)` requested: the user's, else their
    model's own compile settings, which count as the user's choices (added to
    `overridden`)."""
    jit_compile, steps_per_execution = overrides.jit_compile, overrides.steps_per_execution
    # Keras's compile stores jit_compile="auto" already resolved (False on a
    # CPU-only machine), so only a value auto would not give counts as the user's.
    compile_jit = model.compile_jit_compile
    if jit_compile == "auto" and (compile_jit is True or compile_jit is False and hardware.accelerator != "cpu"):
        jit_compile = compile_jit
        overridden.append("jit_compile")
    if steps_per_execution == "auto" and model.compile_steps_per_execution != 1:
        steps_per_execution = model.compile_steps_per_execution
        overridden.append("steps_per_execution")
    return jit_compile, steps_per_execution


def _resolve_remat(remat) -> tuple[str | None, str]:
    if remat in (None, False):
        return None, "off: not requested (costs ~30% more compute to save memory)"
    if remat is True or remat in REMAT_MODES:
        return "activations", "activations: recompute activation layers in the backward pass to save memory"
    if remat in UNSUPPORTED_REMAT_MODES:
        raise PlanError(
            f"remat={remat!r} does not work with Keras 3.15 on TensorFlow (keras issue 21207: it fails in "
            "graph mode). Use remat='activations' (or True), or split the model into smaller pieces."
        )
    raise PlanError(f"remat={remat!r} is not known: use None, True or 'activations'.")


def _resolve_grad_accum_steps(grad_accum_steps) -> tuple[int, str]:
    if not is_int(grad_accum_steps) or grad_accum_steps < 1:
        raise PlanError(
            f"grad_accum_steps={grad_accum_steps!r} is not valid: use an integer >= 1 (1 = update every step)."
        )
    if grad_accum_steps == 1:
        return 1, "1: update every step"
    return grad_accum_steps, f"{grad_accum_steps}: gradients of {grad_accum_steps} steps are averaged into one update"


def _indivisible_batch_message(global_batch: int, num_replicas: int, data: DataFacts) -> str:
    """Why `global_batch` cannot be split over the replicas, and what to pass instead; for batched data, where
    the number came from (its first batch, which is all of it when it holds fewer samples than its batch size)."""
    multiple = -(-global_batch // num_replicas) * num_replicas
    if data.batch_size is None:
        return (f"global batch size {global_batch} does not divide over {num_replicas} replicas: use a multiple of "
                f"{num_replicas} (e.g. batch_size={multiple}).")
    return (f"the dataset's first batch holds {global_batch} sample(s), which makes {global_batch} its global batch "
            f"size (batched data keeps its batches, as in Keras's fit), and {global_batch} does not divide over "
            f"{num_replicas} replicas: batch it by a multiple of {num_replicas} (e.g. "
            f"dataset.unbatch().batch({multiple})). A dataset holding fewer samples than the batch size it was "
            f"batched by has one batch of all of them.")


def _resolve_global_batch(batch_size, data: DataFacts, overridden: list) -> tuple[int, str]:
    if batch_size is not None and (not is_int(batch_size) or batch_size < 1):
        raise PlanError(f"batch_size={batch_size!r} is not valid: use a positive integer (or 'auto' in kerasfast.fit).")
    if data.batch_size is not None:
        reason = f"{data.batch_size}: set by the dataset"
        if batch_size is not None and batch_size != data.batch_size:
            # Keras's fit ignores batch_size for data that comes batched.
            reason += (f"; batch_size={batch_size} ignored, as Keras ignores it for batched "
                       "data (re-batch with dataset.unbatch().batch(N) to change it)")
            overridden.remove("global_batch_size")
        return data.batch_size, reason
    if batch_size is not None:
        return batch_size, "requested"
    return DEFAULT_BATCH_SIZE, f"{DEFAULT_BATCH_SIZE}: Keras's default (pass batch_size= to change)"


def _resolve_model_precision(hardware: Hardware, precision, model: ModelFacts, train_step: str, per_replica: int,
                             jit_compile, xla_chosen: bool) -> tuple[str, str]:
    """`resolve_precision` for this model's step; float16 needs loss scaling in a step of the user's."""
    train_step_flops = None
    if model.forward_flops_per_sample:
        from kerasfast.costs import TRAIN_STEP_FLOPS_PER_FORWARD

        train_step_flops = TRAIN_STEP_FLOPS_PER_FORWARD * model.forward_flops_per_sample * per_replica
    chosen, reason = resolve_precision(
        hardware, precision, train_step_flops=train_step_flops, depthwise_convs=model.depthwise_conv_flops > 0,
        recurrent=bool(model.recurrent_layers), conv_batch_norm=bool(model.batch_norm_layers) and model.conv_flops > 0,
        normalised_stack_under_xla=model.normalised_stack and xla_chosen,
        jit_compile=jit_compile)
    if precision == "auto" and model.built_under and keras_policy(chosen) != model.built_under:
        reason += (f"; your model was built under '{model.built_under}': pass precision='{model.built_under}' "
                   "to train in it")
    if precision == "auto" and chosen in MIXED_POLICIES and model.loss_from_raw_outputs:
        # Keras's compiled losses cast the outputs; the user's own code may
        # subtract float32 labels from them, which fails in their dtype.
        return "float32", (
            f"float32: {reason}, but {model.loss_from_raw_outputs} computes the loss from a subclassed model's "
            f"outputs, which '{chosen}' would hand it in {compute_dtype(chosen)} (cast y_pred to float32 there and "
            f"pass precision='{chosen}' to train in it)"
        )
    if chosen in MIXED_POLICIES and model.mixed_precision_problem:
        if precision != "auto":
            raise PlanError(mixed_precision_refusal(chosen, model.mixed_precision_problem))
        return "float32", (
            f"float32: {reason}, but under '{chosen}' {model.mixed_precision_problem}, which fails in the first "
            f"step (in its call(), {MIXED_DTYPE_FIX}, then pass precision='{chosen}' to train in it)"
        )
    if chosen != "mixed_float16" or train_step != "yours" or model.loss_scaled:
        return chosen, reason
    if precision == "auto":
        return "float32", (
            f"float32: {reason}, but float16 needs loss scaling, which kerasfast cannot add to "
            f"{model.custom_train_step} (wrap your optimizer in keras.optimizers.LossScaleOptimizer to allow it)"
        )
    raise PlanError(
        f"precision='mixed_float16' needs loss scaling, which kerasfast cannot add to "
        f"{model.custom_train_step}: wrap your optimizer in keras.optimizers.LossScaleOptimizer and call "
        "its scale_loss() in your step, or use precision='mixed_bfloat16' / 'float32'."
    )


def mixed_precision_refusal(precision: str, problem: str) -> str:
    """The refusal of a mixed `precision` the user asked for, which `problem` stops."""
    return (f"precision='{precision}' cannot train this model: under it {problem}, which TensorFlow refuses in the "
            f"first train step. In its call(), {MIXED_DTYPE_FIX}; or pass precision='float32' (or 'auto').")


def mixed_policy_in_reach(hardware: Hardware, overrides: Overrides, model: ModelFacts) -> str | None:
    """The mixed Keras policy a plan for `hardware` may train `model` in
    (the user's, or the one "auto" picks there), None where no plan would.

    A model whose layers run user code has its forward pass traced under it
    before planning (`ModelFacts.mixed_precision_problem`). "auto" is taken
    as `resolve_precision` picks it without the model's size or layers, so
    a model the plan then keeps in float32 anyway (a small step on a
    bfloat16 CPU under XLA) may have paid one trace, and one it mixes has
    always been traced.

    Example:

    >>> from kerasfast.hardware import GPU
    >>> mixed_policy_in_reach(Hardware(gpus=(GPU("A100", (8, 0)),)), Overrides(), ModelFacts())
    'mixed_bfloat16'
    >>> mixed_policy_in_reach(Hardware(cpu_flags=("avx2",)), Overrides(), ModelFacts()) is None
    True
    """
    if model.custom_train_step is not None or (overrides.precision == "auto" and model.loss_from_raw_outputs):
        return None  # a step of the user's calls the model its own way; raw outputs keep "auto" float32
    jit_compile, _ = _with_compile_settings(overrides, model, hardware, [])
    chosen, _ = resolve_precision(hardware, overrides.precision, jit_compile=jit_compile)
    return chosen if chosen in MIXED_POLICIES else None


def _resolve_steps_per_epoch(steps_per_epoch, data: DataFacts, global_batch: int,
                             overridden: list) -> tuple[int | None, str]:
    if steps_per_epoch is not None:
        if not is_int(steps_per_epoch) or steps_per_epoch < 1:
            raise PlanError(f"steps_per_epoch={steps_per_epoch!r} is not valid: use an integer >= 1 or None.")
        overridden.append("steps_per_epoch")
        return steps_per_epoch, "requested"
    steps_per_epoch = data.steps_per_epoch
    if steps_per_epoch is None and data.num_samples:
        steps_per_epoch = math.ceil(data.num_samples / global_batch)
    return steps_per_epoch, f"{steps_per_epoch}: one pass over the data" if steps_per_epoch else "until the data ends"


def _resolve_clipnorm(clipnorm) -> tuple[float | None, str]:
    if clipnorm is not None and (not is_number(clipnorm) or not 0 < clipnorm < math.inf):
        raise PlanError(f"clipnorm={clipnorm!r} is not valid: use a positive, finite number or None.")
    return clipnorm, "off: not requested" if clipnorm is None else f"global gradient norm clipped to {clipnorm}"


@dataclasses.dataclass(frozen=True)
class _LearningRate:
    """The optimizer, its peak rate, schedule and warm-up, with their reasons."""

    optimizer: str
    peak: float | None
    schedule: str
    warmup_steps: int | None
    reasons: dict


def _check_learning_rate_request(learning_rate, lr_schedule) -> None:
    if lr_schedule != "auto" and lr_schedule not in LR_SCHEDULES:
        raise PlanError(f"lr_schedule={lr_schedule!r} is not known: use 'auto' or one of {', '.join(LR_SCHEDULES)}.")
    if learning_rate is not None and (not is_number(learning_rate) or not 0 < learning_rate < math.inf):
        raise PlanError(f"learning_rate={learning_rate!r} is not valid: use a positive, finite number.")


def _resolve_learning_rate(overrides: Overrides, model: ModelFacts, total_steps: int | None, num_replicas: int,
                           overridden: list, rate_callbacks: tuple = ()) -> _LearningRate:
    learning_rate, lr_schedule = overrides.learning_rate, overrides.lr_schedule
    _check_learning_rate_request(learning_rate, lr_schedule)
    reasons = {}
    optimizer, reasons["optimizer"], peak, schedule, reasons["lr_schedule"] = _resolve_optimizer_and_schedule(
        learning_rate, lr_schedule, model, total_steps, rate_callbacks)
    if schedule in ("warmup_cosine", "warmup_hold_cosine", "one_cycle") and not total_steps:
        raise PlanError(
            f"lr_schedule={schedule!r} needs the run's length, which is unknown here: pass steps_per_epoch= "
            "or use lr_schedule='constant'."
        )
    if schedule == "one_cycle" and total_steps < 2:
        raise PlanError("lr_schedule='one_cycle' needs at least 2 optimizer updates: train longer or use 'constant'.")
    if peak is None:
        reasons["learning_rate"] = "n/a: set by your optimizer"
    elif learning_rate is not None:
        reasons["learning_rate"] = "requested"
    elif model.user_optimizer:
        reasons["learning_rate"] = "your optimizer's"
    else:
        reasons["learning_rate"] = f"{DEFAULT_LEARNING_RATE}: AdamW default peak"
    if overrides.scale_lr:
        if peak is None:
            raise PlanError("scale_lr=True needs a constant peak learning rate: pass learning_rate=.")
        overridden.append("learning_rate")
        reasons["learning_rate"] = (
            f"{peak:g} x {num_replicas} replica(s): linear scaling with the global batch (scale_lr=True)"
        )
        peak = peak * num_replicas
    warmup, reasons["warmup_steps"] = _resolve_warmup(overrides.warmup_steps, schedule, total_steps)
    return _LearningRate(optimizer, peak, schedule, warmup, reasons)


def _resolve_optimizer_and_schedule(learning_rate, lr_schedule, model: ModelFacts, total_steps: int | None,
                                    rate_callbacks: tuple = ()):
    """`(optimizer, its reason, peak rate, schedule, its reason)`: the user's optimizer, else AdamW.

    A callback that sets the learning rate (`rate_callbacks`) gets a constant
    rate to set: a schedule would fight it, and Keras cannot set one.
    """
    if model.user_optimizer:
        peak = learning_rate if learning_rate is not None else model.user_learning_rate
        schedule = "optimizer's own" if lr_schedule == "auto" else lr_schedule
        if schedule != "optimizer's own" and peak is None:
            raise PlanError(
                f"lr_schedule={lr_schedule!r} needs a peak learning rate, but your optimizer's learning rate is "
                "already a schedule: pass learning_rate= or drop lr_schedule=."
            )
        if rate_callbacks and schedule == "optimizer's own" and peak is None:
            raise PlanError(
                f"{rate_callbacks[0]} sets the learning rate as training goes, but your optimizer's learning rate is "
                "a schedule, which Keras cannot set (it raises TypeError at the callback): give the optimizer a "
                f"constant learning rate, or drop {rate_callbacks[0]}."
            )
        _check_schedule_leaves_rate_to(rate_callbacks, schedule)
        why = "your optimizer's learning rate is used as is" if schedule == "optimizer's own" else "requested"
        return model.user_optimizer, "yours" + (FUSED_UPDATE_NOTE if model.fused_update else ""), peak, schedule, why
    peak = learning_rate if learning_rate is not None else DEFAULT_LEARNING_RATE
    if lr_schedule != "auto":
        schedule, why = lr_schedule, "requested"
        _check_schedule_leaves_rate_to(rate_callbacks, schedule)
    elif rate_callbacks:
        schedule, why = "constant", f"constant: {', '.join(rate_callbacks)} sets the learning rate"
    elif total_steps:
        schedule, why = "warmup_cosine", "linear warm-up then cosine decay over the whole run"
    else:
        schedule = "constant"
        why = "constant: the run's length is unknown (e.g. an infinite dataset without steps_per_epoch)"
    return "AdamW", "kerasfast default: AdamW (decoupled weight decay)" + FUSED_UPDATE_NOTE, peak, schedule, why


def _check_schedule_leaves_rate_to(rate_callbacks: tuple, schedule: str) -> None:
    """Refuses a planned schedule next to a callback that sets the learning rate."""
    if rate_callbacks and schedule not in ("constant", "optimizer's own"):
        raise PlanError(
            f"{rate_callbacks[0]} sets the learning rate as training goes, and lr_schedule={schedule!r} sets it "
            f"every step: keep one (lr_schedule='constant' leaves the rate to {rate_callbacks[0]})."
        )


def _resolve_warmup(warmup_steps, schedule: str, total_steps: int | None) -> tuple[int | None, str]:
    if schedule in ("warmup_cosine", "warmup_hold_cosine"):
        if warmup_steps == "auto":
            chosen = min(max(1, int(total_steps * WARMUP_FRACTION)), int(total_steps * HOLD_FRACTION),
                         total_steps - 1)
            return chosen, f"{WARMUP_FRACTION:.0%} of {total_steps} steps"
        if not is_int(warmup_steps) or not 0 <= warmup_steps < total_steps:
            raise PlanError(f"warmup_steps={warmup_steps!r} is not valid: use an integer in [0, {total_steps}).")
        return warmup_steps, "requested"
    if warmup_steps != "auto":
        raise PlanError(f"warmup_steps= only applies to lr_schedule='warmup_cosine' or 'warmup_hold_cosine', "
                        f"not {schedule!r}.")
    return None, "n/a" if schedule != "one_cycle" else "one-cycle warms up over its first 30%"


def resolve_attention(jit_compile: bool, hardware: Hardware, run: RunFacts) -> tuple[str, str]:
    """How the train step computes causal self-attention, and why: `ATTENTION_BLOCKS`
    (`kerasfast.training.attention`) or `ATTENTION_KERAS`.

    The query blocks pay off in an XLA-compiled step only (without XLA each
    block's ops run one by one and cost more than the masked half they
    skip), and are measured on CPUs only. `keras.config.disable_flash_attention()`,
    Keras's switch for its attention fast paths, keeps Keras's op.

    Example:

    >>> from kerasfast.hardware import Hardware
    >>> resolve_attention(False, Hardware(), RunFacts())[0]
    'keras'
    """
    if run.flash_attention is False:
        return ATTENTION_KERAS, "Keras's op: keras.config.disable_flash_attention() was called"
    if not jit_compile:
        return ATTENTION_KERAS, "Keras's op: without XLA, query blocks cost more than the masked half they skip"
    if hardware.accelerator != "cpu":
        return ATTENTION_KERAS, f"Keras's op: query blocks are measured on CPUs only, not on this {hardware.accelerator}"
    return ATTENTION_BLOCKS, ("causal self-attention of 128 tokens or more in query blocks that skip the masked "
                              "half (measured on a CPU: 1.2x at 128 tokens, 1.8x at 512; GPT recipe's train step "
                              "1.1x); other attention as Keras runs it")


def resolve_dropout(requested: str, hardware: Hardware, model: "ModelFacts",
                    train_step: str = "kerasfast") -> tuple[str, str]:
    """Where the train step's dropout masks come from, and why: `DROPOUT_HASHED`
    (`kerasfast.training.dropout`) or `DROPOUT_KERAS`.

    Hashed masks are Keras's dropout with another random stream: the same
    rate, scaling and seeds, without `tf.random`'s per-value cost, which on
    a CPU exceeded the layers' arithmetic. They are measured on CPUs only,
    and `dropout="keras"` keeps Keras's stream (a run then matches
    `model.fit`'s bit for bit where everything else does).

    Example:

    >>> from kerasfast.hardware import Hardware
    >>> resolve_dropout("auto", Hardware(), ModelFacts(random_layers=("dropout",)))[0]
    'hashed'
    """
    if requested not in DROPOUT_CHOICES:
        raise PlanError(f"dropout={requested!r} is not known: use one of {', '.join(map(repr, DROPOUT_CHOICES))}.")
    if requested != "auto":
        return requested, "requested"
    if train_step == "keras":
        return DROPOUT_KERAS, "Keras's random stream: run_eagerly=True runs Keras's own steps"
    if not model.random_layers:
        return DROPOUT_KERAS, "n/a: no dropout or other random layers"
    if hardware.accelerator != "cpu":
        return DROPOUT_KERAS, f"Keras's random stream: hashed masks are measured on CPUs only, not on this {hardware.accelerator}"
    return DROPOUT_HASHED, ("masks from a counter hash of Keras's seeds, one XLA-compiled loop per dropout (measured "
                            "on a CPU: one dropout 1.9x faster, 410x under XLA; the text recipe's encoder's train step "
                            "1.2x); same rate, scaling and seeds as Keras, another random stream (dropout='keras' keeps "
                            "Keras's)")


def _candidate(plan: Plan, **choices) -> Plan:
    for name, value in choices.items():
        if value != getattr(plan, name):
            plan = plan.with_choice(name, value, "a tuning candidate")
    return plan


def candidate_plans(plan: Plan, hardware: Hardware, model: ModelFacts, run: RunFacts, *, mode: str = "auto",
                    user_set: tuple[str, ...] = ()) -> list[Plan]:
    """Plans that differ from `plan` in precision, XLA and steps per
    execution, for `kerasfast.training.tuning` to time; `plan` comes first.

    Fields the user set stay as they are. "auto" keeps the grid small with
    the rules (no float16 on a CPU, no bfloat16 without hardware support,
    two step counts); "full" tries every precision the machine can run and
    more step counts.

    Example:

    >>> from kerasfast.hardware import detect_hardware
    >>> hardware = detect_hardware()
    >>> plan = resolve_plan(hardware, batch_size=64)
    >>> plans = candidate_plans(plan, hardware, ModelFacts(), RunFacts())
    >>> plans[0] is plan
    True
    """
    precisions = [plan.precision]
    if "precision" not in user_set:
        if hardware.accelerator == "cpu":
            wanted = [p for p in ("float32", ONEDNN_BFLOAT16, "mixed_bfloat16") if mode == "full" or hardware.cpu_has_bf16
                      or p == "float32"]
        else:
            wanted = ["float32", "mixed_float16", "mixed_bfloat16"]
            if mode != "full" and not all((gpu.compute_capability or (0, 0)) >= (8, 0) for gpu in hardware.gpus):
                wanted.remove("mixed_bfloat16")
        if model.mixed_precision_problem:
            wanted = [p for p in wanted if p not in MIXED_POLICIES]  # it would fail under either
        precisions += [p for p in wanted if p != plan.precision]
    jits = [plan.jit_compile]
    if "jit_compile" not in user_set:
        try:
            _resolve_jit(True, hardware, model, run, plan.train_step, plan.strategy)
            jits.append(not plan.jit_compile)
        except PlanError:
            pass  # a layer, op determinism or the step rules XLA out
    counts = [plan.steps_per_execution]
    if "steps_per_execution" not in user_set:
        more = (1, 4, 16, 64) if mode == "full" else (1, max(8, plan.steps_per_execution))
        # An execution never runs past its epoch's end, so a longer one is the epoch's length.
        more = [min(count, plan.steps_per_epoch or count) for count in more]
        counts += [count for count in dict.fromkeys(more) if count not in counts]
    candidates = []
    for precision in precisions:
        for jit in jits:
            if precision == ONEDNN_BFLOAT16 and jit:
                continue  # oneDNN's pass does not reach into XLA clusters
            for count in counts:
                if (precision, jit, count) == (plan.precision, plan.jit_compile, plan.steps_per_execution):
                    continue
                candidate = _candidate(plan, precision=precision, jit_compile=jit, steps_per_execution=count)
                candidates.append(candidate.with_choice("attention", *resolve_attention(jit, hardware, run)))
    # Single changes first, precisions before XLA before step counts: a
    # budget that runs out has then tried the likeliest wins before any
    # combination.
    def order(candidate: Plan) -> tuple[int, int]:
        changed = (candidate.precision != plan.precision, candidate.jit_compile != plan.jit_compile,
                   candidate.steps_per_execution != plan.steps_per_execution)
        return sum(changed), changed.index(True)

    candidates.sort(key=order)
    return [plan] + candidates
