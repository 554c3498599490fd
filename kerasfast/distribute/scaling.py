"""A model on paper of data-parallel scaling: what each update communicates,
what it computes, and the efficiency that leaves for N workers on a link.

Data-parallel training (`MirroredStrategy`, `MultiWorkerMirroredStrategy`)
runs the whole model on every replica and sums the gradients across
replicas once per optimizer update. The model:

- **bytes all-reduced per update** = trainable parameters x bytes per
  gradient. Gradients are float32 (4 bytes) for float32 variables, and Keras
  keeps variables in float32 under every kerasfast precision
  (`mixed_float16`, `mixed_bfloat16` only change the compute dtype: the
  gradient of a float32 variable through a cast is float32, and
  `tests/test_scaling.py` checks it). kerasfast also densifies embedding
  gradients (`tf.IndexedSlices`) before the all-reduce, so an embedding
  table costs its full size.
- **compute per update** = `grad_accum_steps` x per-replica batch x
  training FLOPs per sample (3x the forward FLOPs that
  `kerasfast.costs.forward_flops_per_sample` counts), divided by an
  achieved FLOP rate (a measured step time, or the measured matmul peak,
  which makes compute look shorter and so the prediction pessimistic),
  plus any fixed time per micro-step (the plan adds kerasfast's measured
  per-execution dispatch, `kerasfast.plan.EXECUTION_OVERHEAD_S`, shared by
  the steps of an execution).
- **communication per update**: a ring all-reduce over N workers sends and
  receives 2(N-1)/N x bytes on each worker's link, in 2(N-1) hops:
  `2(N-1)/N * bytes / bandwidth + 2(N-1) * latency`.
- **no overlap.** kerasfast's train step accumulates gradients and applies
  them in a separate `strategy.run` after the backward pass, and Keras's
  optimizer all-reduces them all at once in `apply`; TensorFlow does not
  start the all-reduce of early layers while later ones are computing. So
  the step time is compute + communication, and
  efficiency = compute / (compute + communication): the share of a
  worker's time spent computing, i.e. the speed-up over one worker at the
  same per-replica batch divided by N.

Communication per update is fixed by the model, and compute grows with the
samples per replica per update, so a larger per-replica batch or
`grad_accum_steps` raises efficiency; `restoring()` names the value that
reaches a target. `docs/scaling.md` has the formulas, the recipe models'
table and the check against loopback workers (`benchmarks/scaling.py`).

Example:

>>> costs = ModelCosts(trainable_parameters=1_000_000, train_flops_per_sample=6e6)
>>> p = predict(costs, workers=4, per_replica_batch=64, link=LINKS["10GbE"], flops_per_second=1e12)
>>> round(p.efficiency, 2)  # 0.38 ms of compute, then 10.2 ms of all-reduce
0.04
>>> restoring(costs, workers=4, per_replica_batch=64, link=LINKS["10GbE"], flops_per_second=1e12).grad_accum_steps
240
"""

from __future__ import annotations

import dataclasses
import math
import os

from kerasfast.errors import PlanError

# Gradients of float32 variables are float32, under mixed precision too.
BYTES_PER_GRADIENT = 4
# Below this predicted efficiency the plan names the accumulation or batch
# that would bring it back to it.
PLAN_TARGET_EFFICIENCY = 0.8
LINK_ENV = "KERASFAST_LINK_GBPS"

# TensorFlow's RING collective over gRPC costs about this much per hop
# whatever the payload: fitted to 4 B .. 16 MiB all-reduces over 2 loopback
# workers on this project's 2-core CI machine (`benchmarks/scaling.py
# --part comm`, docs/scaling.md; with it the ring formula predicts 4
# workers' 4 KB-1 MB all-reduces within 10%). It is TensorFlow's software
# (gRPC, executor), not the wire, so it is
# charged to every Ethernet link; a real network adds its own wire latency
# (some 10-50 us), a faster CPU takes some away.
TF_RING_HOP_LATENCY_S = 0.9e-3


@dataclasses.dataclass(frozen=True)
class Link:
    """A link between workers, as the ring all-reduce sees it.

    Attributes:
        name: Shown in plans and tables.
        gbps: Bandwidth per direction in gigabits per second (a ring sends
            and receives at once, so the per-direction figure is the one
            that counts).
        latency_s: Fixed cost of one ring hop, in seconds.
        source: Where the figure comes from.
    """

    name: str
    gbps: float
    latency_s: float
    source: str

    @property
    def bytes_per_second(self) -> float:
        return self.gbps * 1e9 / 8


LINKS = {
    "10GbE": Link("10 Gb/s Ethernet", 10.0, TF_RING_HOP_LATENCY_S, "IEEE 802.3ae (full duplex)"),
    "25GbE": Link("25 Gb/s Ethernet", 25.0, TF_RING_HOP_LATENCY_S, "IEEE 802.3by (full duplex)"),
    "100GbE": Link("100 Gb/s Ethernet", 100.0, TF_RING_HOP_LATENCY_S, "IEEE 802.3ba (full duplex)"),
    # 16 GT/s x 16 lanes x 128/130 encoding / 8 bits = 31.5 GB/s each way.
    "PCIe4": Link("PCIe 4.0 x16", 252.0, 10e-6, "PCI-SIG PCIe 4.0 base specification: 16 GT/s per lane"),
    # 12 NVLink 3 links x 25 GB/s each way = 300 GB/s each way (600 GB/s
    # "total"); H100's NVLink 4 has 450 GB/s each way. NCCL's per-hop
    # latency of ~10 us is an assumption; it is negligible for MB payloads.
    "NVLink": Link("NVLink 3 (A100)", 2400.0, 10e-6,
                   "NVIDIA A100 Tensor Core GPU Architecture whitepaper: 600 GB/s total = 300 GB/s per direction"),
}


@dataclasses.dataclass(frozen=True)
class ModelCosts:
    """What one sample and one update of a model cost, device-independent.

    Attributes:
        trainable_parameters: Elements of the trainable variables.
        train_flops_per_sample: FLOPs of one sample's forward and backward
            pass, or None when they could not be counted.
        bytes_per_gradient: 4 for float32 gradients.
    """

    trainable_parameters: int
    train_flops_per_sample: float | None
    bytes_per_gradient: int = BYTES_PER_GRADIENT

    @property
    def allreduce_bytes(self) -> int:
        """Bytes every replica contributes to the all-reduce of one update."""
        return self.trainable_parameters * self.bytes_per_gradient

    @classmethod
    def of(cls, model, input_shapes=None, input_dtypes=None, *, forward_flops_per_sample: int | None = None):
        """The costs of a built Keras model.

        Args:
            model: A built Keras model.
            input_shapes: Its input shape(s) without the batch dimension, to
                count FLOPs (`kerasfast.costs.forward_flops`); not needed when
                `forward_flops_per_sample` is given.
            input_dtypes: Matching dtype(s); float32 when None.
            forward_flops_per_sample: FLOPs of one sample's forward pass, if
                already counted.

        Returns:
            A `ModelCosts`.

        Example:

        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        >>> ModelCosts.of(model, (4,)).allreduce_bytes  # (4*2 + 2) * 4
        40
        """
        from kerasfast import costs

        if forward_flops_per_sample is None and input_shapes is not None:
            forward_flops_per_sample = costs.forward_flops_per_sample(model, input_shapes, input_dtypes)
        parameters = sum(math.prod(v.shape) for v in model.trainable_variables)
        train = costs.TRAIN_STEP_FLOPS_PER_FORWARD * forward_flops_per_sample if forward_flops_per_sample else None
        return cls(int(parameters), train)


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The model's prediction for one configuration.

    Attributes:
        workers: Replicas in the ring.
        per_replica_batch: Samples per replica per micro-step.
        grad_accum_steps: Micro-steps per update.
        link: The `Link` assumed.
        compute_seconds: A replica's compute per update.
        communication_seconds: The all-reduce per update.
        efficiency: compute / (compute + communication).
    """

    workers: int
    per_replica_batch: int
    grad_accum_steps: int
    link: Link
    compute_seconds: float
    communication_seconds: float

    @property
    def update_seconds(self) -> float:
        """Time per update: compute, then the all-reduce (no overlap)."""
        return self.compute_seconds + self.communication_seconds

    @property
    def efficiency(self) -> float:
        return self.compute_seconds / self.update_seconds if self.update_seconds else 1.0

    @property
    def speedup(self) -> float:
        """Samples per second relative to one worker at the same per-replica batch."""
        return self.workers * self.efficiency


@dataclasses.dataclass(frozen=True)
class Restoring:
    """What brings a configuration to a target efficiency (one or the other).

    Attributes:
        target: The efficiency aimed at.
        grad_accum_steps: The smallest `grad_accum_steps` that reaches it at
            the same per-replica batch.
        per_replica_batch: The smallest per-replica batch that reaches it
            with the same `grad_accum_steps`.
    """

    target: float
    grad_accum_steps: int
    per_replica_batch: int


def ring_allreduce_seconds(nbytes: float, workers: int, link: Link) -> float:
    """Seconds a ring all-reduce of `nbytes` per worker takes on `link`.

    Each worker sends and receives `2(N-1)/N * nbytes` (reduce-scatter, then
    all-gather) in `2(N-1)` hops.

    Args:
        nbytes: Bytes each worker contributes.
        workers: Workers in the ring (1: nothing to send).
        link: Each worker's link.

    Returns:
        Seconds.

    Example:

    >>> ring_allreduce_seconds(1.25e9, 2, Link("1 GB/s", 10.0, 0.0, ""))  # 1.25 GB over 1.25 GB/s
    1.0
    """
    if workers <= 1:
        return 0.0
    hops = 2 * (workers - 1)
    return hops / workers * nbytes / link.bytes_per_second + hops * link.latency_s


def _check(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum:
        raise PlanError(f"{name}={value!r} is not valid: use a number >= {minimum}.")


def predict(costs: ModelCosts, *, workers: int, per_replica_batch: int, link: Link, flops_per_second: float,
            grad_accum_steps: int = 1, fixed_seconds_per_step: float = 0.0) -> Prediction:
    """Predicts compute, communication and efficiency per update.

    Args:
        costs: The model's `ModelCosts` (FLOPs must be known).
        workers: Replicas in sync.
        per_replica_batch: Samples per replica per micro-step.
        link: The `Link` between replicas.
        flops_per_second: One replica's achieved training FLOP rate.
        grad_accum_steps: Micro-steps per optimizer update.
        fixed_seconds_per_step: Time a micro-step takes besides its math
            (dispatch, per-execution overhead shared by its steps), counted
            as compute: it is time the worker is not communicating.

    Returns:
        A `Prediction`.

    Raises:
        PlanError: For FLOPs that were not counted, or a non-positive value.

    Example:

    >>> costs = ModelCosts(trainable_parameters=2_500_000, train_flops_per_sample=1.5e7)
    >>> p = predict(costs, workers=2, per_replica_batch=100, link=LINKS["10GbE"], flops_per_second=1e11)
    >>> round(p.compute_seconds, 4), round(p.communication_seconds, 4)  # 15 ms vs 8 ms + 2 hops
    (0.015, 0.0098)
    """
    if costs.train_flops_per_sample is None:
        raise PlanError("the model's FLOPs could not be counted, so its compute time cannot be predicted: pass "
                        "ModelCosts(train_flops_per_sample=...) yourself.")
    _check("workers", workers, 1)
    _check("per_replica_batch", per_replica_batch, 1)
    _check("grad_accum_steps", grad_accum_steps, 1)
    if not flops_per_second or flops_per_second <= 0:
        raise PlanError(f"flops_per_second={flops_per_second!r} is not valid: use a measured, positive FLOP rate.")
    _check("fixed_seconds_per_step", fixed_seconds_per_step, 0)
    compute = grad_accum_steps * (per_replica_batch * costs.train_flops_per_sample / flops_per_second
                                  + fixed_seconds_per_step)
    return Prediction(workers, per_replica_batch, grad_accum_steps, link, compute,
                      ring_allreduce_seconds(costs.allreduce_bytes, workers, link))


def restoring(costs: ModelCosts, *, workers: int, per_replica_batch: int, link: Link, flops_per_second: float,
              grad_accum_steps: int = 1, target: float = 0.9, fixed_seconds_per_step: float = 0.0) -> Restoring:
    """The `grad_accum_steps`, or the per-replica batch, that reaches `target`.

    Efficiency is compute / (compute + communication) and only compute
    grows with the samples per replica per update, so it reaches `target`
    once compute >= target / (1 - target) x communication.

    Args:
        costs, workers, per_replica_batch, link, flops_per_second,
            grad_accum_steps, fixed_seconds_per_step: As for `predict`.
        target: Efficiency to reach, in (0, 1).

    Returns:
        A `Restoring` (values already reaching `target` are returned as they are).

    Example:

    >>> costs = ModelCosts(trainable_parameters=2_500_000, train_flops_per_sample=1.5e7)
    >>> r = restoring(costs, workers=2, per_replica_batch=100, link=LINKS["10GbE"], flops_per_second=1e11)
    >>> r.grad_accum_steps, r.per_replica_batch
    (6, 588)
    """
    if not 0 < target < 1:
        raise PlanError(f"target={target!r} is not valid: use an efficiency between 0 and 1 (e.g. 0.9).")
    now = predict(costs, workers=workers, per_replica_batch=per_replica_batch, link=link,
                  flops_per_second=flops_per_second, grad_accum_steps=grad_accum_steps,
                  fixed_seconds_per_step=fixed_seconds_per_step)
    needed_compute = target / (1 - target) * now.communication_seconds
    per_sample = costs.train_flops_per_sample / flops_per_second
    # A hair below the exact ratio so that float rounding cannot ask for one more.
    step = per_replica_batch * per_sample + fixed_seconds_per_step
    accum = max(grad_accum_steps, math.ceil(needed_compute / step - 1e-9))
    batch = max(per_replica_batch,
                math.ceil((needed_compute / grad_accum_steps - fixed_seconds_per_step) / per_sample - 1e-9))
    return Restoring(target, accum, batch)


def link_from_env(environ=None) -> Link | None:
    """The link named by `KERASFAST_LINK_GBPS` (per-direction Gb/s), or None.

    Raises:
        PlanError: For a value that is not a positive number.

    Example:

    >>> link_from_env({"KERASFAST_LINK_GBPS": "25"}).gbps
    25.0
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(LINK_ENV)
    if raw is None or raw.strip() == "":
        return None
    try:
        gbps = float(raw)
    except ValueError:
        gbps = float("nan")
    if not gbps > 0 or math.isinf(gbps):
        raise PlanError(f"{LINK_ENV}={raw!r} is not valid: set it to your link's bandwidth per direction in Gb/s "
                        f"(e.g. {LINK_ENV}=25 for 25 Gb/s Ethernet), or unset it.")
    return Link(f"{gbps:g} Gb/s", gbps, TF_RING_HOP_LATENCY_S, f"your {LINK_ENV}")


def assumed_link(strategy_name: str, accelerator: str, environ=None) -> tuple[Link, str]:
    """The link a plan assumes, and why.

    `KERASFAST_LINK_GBPS` wins; otherwise workers on separate machines are
    assumed on 10 Gb/s Ethernet (the slowest common data-centre link) and
    GPUs of one machine on PCIe 4.0 x16 (NVLink cannot be detected from
    TensorFlow; set the variable to 2400 for A100 NVLink).

    Returns:
        `(link, why)`.
    """
    link = link_from_env(environ)
    if link is not None:
        return link, f"your {LINK_ENV}"
    if strategy_name == "mirrored" and accelerator == "gpu":
        return LINKS["PCIe4"], f"assumed: GPUs of one machine; {LINK_ENV} sets yours"
    return LINKS["10GbE"], f"assumed; {LINK_ENV} sets yours"


def _megabytes(nbytes: float) -> str:
    return f"{nbytes / 1e6:.3g} MB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def plan_note(costs: ModelCosts, *, workers: int, per_replica_batch: int, grad_accum_steps: int,
              flops_per_second: float | None, strategy_name: str, accelerator: str, steps_per_execution: int = 1,
              environ=None) -> str:
    """The plan's line on scaling for a distributed run.

    Args:
        costs: The model's `ModelCosts`.
        workers: Replicas in sync.
        per_replica_batch, grad_accum_steps: From the plan.
        flops_per_second: The measured peak in the plan's precision (None:
            unknown).
        strategy_name: "mirrored", "multi_worker" or a strategy's class name.
        accelerator: "cpu", "gpu" or "tpu".
        steps_per_execution: From the plan: each micro-step also pays its
            share of `kerasfast.plan.EXECUTION_OVERHEAD_S`.
        environ: For `KERASFAST_LINK_GBPS` (os.environ when None).

    Returns:
        One sentence: predicted efficiency, what it rests on and, below
        `PLAN_TARGET_EFFICIENCY`, the accumulation or per-replica batch
        that would restore it.

    Example:

    >>> print(plan_note(ModelCosts(10_000, 6e4), workers=2, per_replica_batch=32, grad_accum_steps=1,
    ...                 flops_per_second=1e11, strategy_name="multi_worker", accelerator="cpu"))
    scaling: predicted efficiency 25% for 2 replicas (0.51x one): ring all-reduce of 0.04 MB per update ...
    below 80%: grad_accum_steps=12 or a per-replica batch of 11214 (batch_size=22428) would restore 80%
    """
    link, why = assumed_link(strategy_name, accelerator, environ)
    shared = ("the logical CPU devices share this CPU's cores, so here they add no compute; for separate machines: "
              if strategy_name == "mirrored" and accelerator == "cpu" else "")
    comm = ring_allreduce_seconds(costs.allreduce_bytes, workers, link)
    moved = (f"ring all-reduce of {_megabytes(costs.allreduce_bytes)} per update ({costs.trainable_parameters:,} "
             f"float32 gradients) over {link.name} ({why}): {_ms(comm)}")
    if costs.train_flops_per_sample is None or not flops_per_second:
        return (f"scaling: {shared}{moved}; compute per update unknown (FLOPs not counted), so no efficiency "
                "is predicted (docs/scaling.md)")
    from kerasfast.plan import EXECUTION_OVERHEAD_S

    fixed = EXECUTION_OVERHEAD_S / steps_per_execution
    prediction = predict(costs, workers=workers, per_replica_batch=per_replica_batch, link=link,
                         flops_per_second=flops_per_second, grad_accum_steps=grad_accum_steps,
                         fixed_seconds_per_step=fixed)
    note = (f"scaling: {shared}predicted efficiency {prediction.efficiency:.0%} for {workers} replicas "
            f"({prediction.speedup:.2g}x one): {moved} after {_ms(prediction.compute_seconds)} of compute (math at "
            f"the measured peak {flops_per_second / 1e9:.3g} GFLOP/s + {_ms(fixed)} of dispatch per step), no "
            f"overlap (docs/scaling.md)")
    if prediction.efficiency < PLAN_TARGET_EFFICIENCY:
        fix = restoring(costs, workers=workers, per_replica_batch=per_replica_batch, link=link,
                        flops_per_second=flops_per_second, grad_accum_steps=grad_accum_steps,
                        target=PLAN_TARGET_EFFICIENCY, fixed_seconds_per_step=fixed)
        note += (f"; below {PLAN_TARGET_EFFICIENCY:.0%}: grad_accum_steps={fix.grad_accum_steps} or a per-replica "
                 f"batch of {fix.per_replica_batch} (batch_size={fix.per_replica_batch * workers}) would restore "
                 f"{PLAN_TARGET_EFFICIENCY:.0%}")
    return note


def with_plan_note(plan, model, *, forward_flops_per_sample: int | None, peak_flops: float | None,
                   accelerator: str, environ=None):
    """`plan` with the scaling prediction added to its `num_replicas` reason.

    `kerasfast.fit` calls this for every run with several replicas, so the
    printed plan, `plan.json` and the run report say what the all-reduce
    costs and whether accumulation or a larger batch would pay it back.

    Args:
        plan: The resolved `kerasfast.plan.Plan`.
        model: The Keras model being trained (for its trainable parameters).
        forward_flops_per_sample: From `ModelFacts` (None: not counted).
        peak_flops: The plan's measured peak FLOP/s; measured here in the
            plan's compute dtype when None.
        accelerator: "cpu", "gpu" or "tpu".
        environ: For `KERASFAST_LINK_GBPS` (os.environ when None).

    Returns:
        A new `Plan` (the same one for a single replica).

    Raises:
        PlanError: For a `KERASFAST_LINK_GBPS` that is not a positive number.
    """
    if plan.num_replicas <= 1:
        return plan
    from kerasfast import costs as measured
    from kerasfast.plan import compute_dtype

    costs = ModelCosts.of(model, forward_flops_per_sample=forward_flops_per_sample)
    if peak_flops is None and costs.train_flops_per_sample:
        peak_flops = measured.measure_peak_flops(compute_dtype(plan.precision))
    note = plan_note(costs, workers=plan.num_replicas, per_replica_batch=plan.per_replica_batch_size,
                     grad_accum_steps=plan.grad_accum_steps, flops_per_second=peak_flops,
                     strategy_name=plan.strategy, accelerator=accelerator,
                     steps_per_execution=plan.steps_per_execution, environ=environ)
    reason = plan.reasons.get("num_replicas", "")
    return plan.with_choice("num_replicas", plan.num_replicas, f"{reason}; {note}" if reason else note,
                            yours="num_replicas" in plan.overridden)
