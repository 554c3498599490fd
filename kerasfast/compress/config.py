"""`PruningConfig`: what to prune, how sparse, and when; validated up front.

The config is plain data. `PruningConfig.select_targets(model)` turns it into
the list of kernels to prune for one model, refusing unknown layer names and
impossible combinations before anything in the model is touched.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import keras

from kerasfast import _compat
from kerasfast.compress import schedules as schedules_lib
from kerasfast.errors import ModelError, PlanError

# Which weight of each prunable layer type is pruned. The most specific class
# comes first (SeparableConv and DepthwiseConv are not BaseConv subclasses in
# Keras 3, but keep the order explicit anyway). For separable convs only the
# pointwise kernel is pruned: the depthwise part holds few weights and pruning
# it hurts accuracy most (same choice as tfmot's prune registry).
_PRUNABLE_WEIGHTS: list[tuple[type, str]] = [
    (keras.layers.SeparableConv1D, "pointwise_kernel"),
    (keras.layers.SeparableConv2D, "pointwise_kernel"),
    (keras.layers.DepthwiseConv1D, "kernel"),
    (keras.layers.DepthwiseConv2D, "kernel"),
    (keras.layers.Conv1D, "kernel"),
    (keras.layers.Conv2D, "kernel"),
    (keras.layers.Conv3D, "kernel"),
    (keras.layers.Conv1DTranspose, "kernel"),
    (keras.layers.Conv2DTranspose, "kernel"),
    (keras.layers.Conv3DTranspose, "kernel"),
    (keras.layers.Dense, "kernel"),
    (keras.layers.EinsumDense, "kernel"),
    (keras.layers.Embedding, "embeddings"),
]

# Layer types whose pruned weight has an input-channel axis that 2:4 groups
# can run along: (type, axis). Depthwise kernels and embeddings have no
# reduction over channels, so structured sparsity does not apply to them.
_STRUCTURED_AXIS: list[tuple[type, int]] = [
    (keras.layers.SeparableConv1D, -2),
    (keras.layers.SeparableConv2D, -2),
    (keras.layers.Conv1D, -2),
    (keras.layers.Conv2D, -2),
    (keras.layers.Conv3D, -2),
    (keras.layers.Dense, 0),
]
_NOT_STRUCTURABLE = (
    keras.layers.DepthwiseConv1D,
    keras.layers.DepthwiseConv2D,
    keras.layers.Conv1DTranspose,
    keras.layers.Conv2DTranspose,
    keras.layers.Conv3DTranspose,
    keras.layers.EinsumDense,
    keras.layers.Embedding,
)

PRUNABLE_LAYER_TYPES = tuple(t for t, _ in _PRUNABLE_WEIGHTS)


def prunable_weight_name(layer) -> str | None:
    """Name of the attribute holding `layer`'s prunable weight, or None."""
    for layer_type, attribute in _PRUNABLE_WEIGHTS:
        if isinstance(layer, layer_type):
            return attribute
    return None


def _structured_axis(layer) -> int | None:
    if isinstance(layer, _NOT_STRUCTURABLE):
        return None
    for layer_type, axis in _STRUCTURED_AXIS:
        if isinstance(layer, layer_type):
            return axis
    return None


def all_layers(model) -> list:
    """Every layer inside `model`, nested models and sub-layers included.

    Uses Keras's layer walk (`_compat.flatten_layers`), the same one that
    `Model.weights` relies on, so nothing a model owns is missed.
    """
    return _compat.flatten_layers(model)


@dataclasses.dataclass(frozen=True)
class PruningTarget:
    """One kernel selected for pruning (plain data, see `to_dict`)."""

    layer: Any
    weight_name: str
    variable: Any
    structured_axis: int | None

    @property
    def params(self) -> int:
        size = 1
        for dim in self.variable.shape:
            size *= int(dim)
        return size

    def to_dict(self) -> dict:
        return {
            "layer": self.layer.name,
            "type": type(self.layer).__name__,
            "weight": self.weight_name,
            "shape": [int(d) for d in self.variable.shape],
            "params": self.params,
        }


def _parse_structured(structured):
    if structured is None:
        return None
    if isinstance(structured, str):
        parts = structured.split(":")
        if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
            kept, group = int(parts[0]), int(parts[1])
            if 0 < kept < group:
                return kept, group
    raise PlanError(
        f"structured={structured!r} is not a valid N:M pattern. Pass structured=\"2:4\" "
        "(2 of every 4 consecutive input-channel weights kept) or None for unstructured pruning."
    )


@dataclasses.dataclass
class PruningConfig:
    """Magnitude-pruning settings, validated when created.

    Args:
        target_sparsity: fraction of each pruned kernel set to zero at the end,
            in [0, 1). With `structured="2:4"` it is 0.5 by construction and
            may be left as None.
        schedule: "polynomial" (sparsity grows from `initial_sparsity` to
            `target_sparsity` between `begin_step` and `end_step`), "constant"
            (`target_sparsity` from `begin_step` on), or a schedule object such
            as `kerasfast.compress.PolynomialDecay(...)`.
        initial_sparsity: sparsity at `begin_step` for the polynomial schedule.
        begin_step: first optimizer step at which masks are computed.
        end_step: step at which the final sparsity is reached (required for
            the polynomial schedule; -1 or None for constant means "until the
            end of training").
        frequency: masks are recomputed every `frequency` optimizer steps.
        include: None (every prunable layer) or a list of layer names and/or
            layer classes to prune. A layer named here is pruned even if it
            is smaller than `min_size`.
        exclude: layer names and/or layer classes never to prune.
        min_size: layers whose kernel has fewer weights are left dense
            (small layers save little and hurt accuracy most).
        structured: None for unstructured pruning, or "2:4" for N:M
            structured sparsity along the input-channel axis.

    Example:

    >>> config = PruningConfig(target_sparsity=0.8, end_step=1000, frequency=50,
    ...                        exclude=["logits"], min_size=1000)
    """

    target_sparsity: float | None = None
    schedule: Any = "polynomial"
    initial_sparsity: float = 0.0
    begin_step: int = 0
    end_step: int | None = None
    frequency: int = 100
    include: Sequence | None = None
    exclude: Sequence = ()
    min_size: int = 0
    structured: str | None = None

    def __post_init__(self):
        if self.target_sparsity is not None:
            schedules_lib._check_sparsity(self.target_sparsity, "target_sparsity")
            self.target_sparsity = float(self.target_sparsity)  # a NumPy scalar becomes plain data
        schedules_lib._check_sparsity(self.initial_sparsity, "initial_sparsity")
        self.initial_sparsity = float(self.initial_sparsity)
        self.m_by_n = _parse_structured(self.structured)
        if self.m_by_n is not None:
            kept, group = self.m_by_n
            structured_sparsity = (group - kept) / group
            if self.target_sparsity is not None and abs(self.target_sparsity - structured_sparsity) > 1e-9:
                raise PlanError(
                    f"target_sparsity={self.target_sparsity} conflicts with structured={self.structured!r}, "
                    f"whose sparsity is {structured_sparsity} by construction. Leave target_sparsity unset "
                    "or use structured=None for unstructured pruning at any sparsity."
                )
            self.target_sparsity = structured_sparsity
        if self.target_sparsity is None and isinstance(self.schedule, str):
            raise PlanError("target_sparsity is required (e.g. target_sparsity=0.8 for 80% zeros).")
        if not isinstance(self.min_size, int) or self.min_size < 0:
            raise PlanError(f"min_size={self.min_size!r} must be an int >= 0 (minimum weights per pruned kernel).")
        self.include = None if self.include is None else list(self._as_list(self.include, "include"))
        self.exclude = list(self._as_list(self.exclude, "exclude"))
        self.schedule_object = self._build_schedule()

    @staticmethod
    def _as_list(value, argument):
        if isinstance(value, (str, type)):
            value = [value]
        items = list(value)
        for item in items:
            if not isinstance(item, (str, type)):
                raise PlanError(
                    f"{argument} entries must be layer names (str) or layer classes, got {item!r}."
                )
        return items

    def _build_schedule(self):
        schedule = self.schedule
        if isinstance(schedule, str):
            end_step = -1 if self.end_step is None else self.end_step
            if schedule == "polynomial":
                if self.end_step is None:
                    raise PlanError(
                        "schedule='polynomial' needs end_step (the optimizer step at which target_sparsity "
                        "is reached); kerasfast.compress.prune(), and kerasfast.fit(prune=...) given the settings "
                        "as a dict (e.g. prune=dict(structured='2:4')), set it from the run for you."
                    )
                return schedules_lib.PolynomialDecay(
                    self.initial_sparsity, self.target_sparsity, self.begin_step, end_step, frequency=self.frequency
                )
            if schedule == "constant":
                return schedules_lib.ConstantSparsity(
                    self.target_sparsity, self.begin_step, end_step, frequency=self.frequency
                )
            raise PlanError(f"schedule={schedule!r} is unknown; use 'polynomial', 'constant' or a schedule object.")
        missing = [a for a in ("begin_step", "end_step", "frequency", "final_sparsity") if not hasattr(schedule, a)]
        if not callable(schedule) or missing:
            raise PlanError(
                f"schedule={schedule!r} is not a pruning schedule: it must be callable as "
                f"schedule(step) -> (update_mask, sparsity) and have {', '.join(missing) or 'these'} attributes."
            )
        schedules_lib._check_sparsity(schedule.final_sparsity, "schedule.final_sparsity")
        if self.m_by_n is None:
            self.target_sparsity = float(schedule.final_sparsity)
        return schedule

    def to_dict(self) -> dict:
        """Plain-data view for plans and run folders."""
        schedule = self.schedule_object
        return {
            "target_sparsity": self.target_sparsity,
            "schedule": schedule.get_config() if hasattr(schedule, "get_config") else repr(schedule),
            "include": None if self.include is None else [i if isinstance(i, str) else i.__name__ for i in self.include],
            "exclude": [i if isinstance(i, str) else i.__name__ for i in self.exclude],
            "min_size": self.min_size,
            "structured": self.structured,
        }

    def select_targets(self, model) -> tuple[list[PruningTarget], list[dict]]:
        """Resolves which kernels of `model` get pruned.

        Args:
            model: a built Keras model.

        Returns:
            `(targets, skipped)`: the kernels to prune, and one plain dict per
            prunable layer left dense, with the reason.

        Raises:
            ModelError: the model is not built.
            PlanError: a name in include/exclude is not a layer of the model,
                a layer named in include cannot be pruned as asked, or no
                layer is left to prune.
        """
        if not model.built:
            raise ModelError(
                "The model is not built, so its kernels do not exist yet. Call it on a batch or "
                "build it (model.build(input_shape)) before pruning."
            )
        layers = all_layers(model)
        named_in_include = self._check_named_layers(layers)
        targets, skipped = [], []
        for layer in layers:
            if prunable_weight_name(layer) is None:
                continue
            target, reason = self._target(layer, explicitly_named=layer.name in named_in_include)
            if target is None:
                skipped.append({"layer": layer.name, "type": type(layer).__name__, "reason": reason})
            else:
                targets.append(target)
        if not targets:
            raise PlanError(
                "No layer is left to prune with these include/exclude/min_size/structured settings. "
                f"Layers considered: {[(s['layer'], s['reason']) for s in skipped]}."
            )
        return targets, skipped

    def _check_named_layers(self, layers) -> set[str]:
        """Refuses include/exclude names that are no layer, or (include) no prunable one; returns the included names."""
        by_name = {layer.name: layer for layer in layers}
        for argument, entries in (("include", self.include or []), ("exclude", self.exclude)):
            unknown = [e for e in entries if isinstance(e, str) and e not in by_name]
            if unknown:
                prunable = [l.name for l in layers if prunable_weight_name(l)]
                raise PlanError(
                    f"{argument} names {unknown} but the model has no layer by that name. "
                    f"Prunable layers of this model: {prunable}."
                )
        named_in_include = {e for e in (self.include or []) if isinstance(e, str)}
        for name in named_in_include:
            layer = by_name[name]
            if prunable_weight_name(layer) is None:
                raise PlanError(
                    f"include names layer '{name}' ({type(layer).__name__}), which has no prunable kernel. "
                    f"Prunable layer types: {', '.join(t.__name__ for t in PRUNABLE_LAYER_TYPES)}."
                )
        return named_in_include

    def _target(self, layer, *, explicitly_named: bool) -> tuple[PruningTarget | None, str]:
        """`(target, "")` for a prunable `layer` these settings prune, else `(None, why it stays dense)`.

        A layer named in include that cannot be pruned as asked is refused
        rather than left dense.
        """
        weight_name = prunable_weight_name(layer)
        variable = _prunable_variable(layer, weight_name)
        if self.include is not None and not _matches(layer, self.include):
            return None, "not in include"
        if _matches(layer, self.exclude):
            return None, "in exclude"
        if not isinstance(variable, keras.Variable) or not variable.trainable:
            reason = "kernel is quantized, LoRA-enabled or frozen"
            if explicitly_named:
                raise PlanError(f"include names layer '{layer.name}' but its {weight_name} cannot be pruned: {reason}.")
            return None, reason
        target = PruningTarget(layer, weight_name, variable, None)
        if target.params < self.min_size and not explicitly_named:
            return None, f"{target.params} weights < min_size={self.min_size}"
        if self.m_by_n is None:
            return target, ""
        axis, problem = self._structured_axis_or_problem(layer, variable)
        if problem:
            if explicitly_named:
                raise PlanError(
                    f"include names layer '{layer.name}' but structured={self.structured!r} cannot apply: "
                    f"{problem}. Exclude it or use structured=None."
                )
            return None, problem
        return PruningTarget(layer, weight_name, variable, axis), ""

    def _structured_axis_or_problem(self, layer, variable) -> tuple[int | None, str]:
        """The axis N:M groups run along in `layer`'s kernel, or why there is none."""
        axis = _structured_axis(layer)
        group = self.m_by_n[1]
        if axis is None:
            return None, f"{type(layer).__name__} has no input-channel axis for {self.structured} groups"
        if int(variable.shape[axis]) % group:
            return None, f"its {int(variable.shape[axis])} input channels are not a multiple of {group}"
        return axis, ""


def _prunable_variable(layer, weight_name: str):
    """The variable behind `layer.<weight_name>`.

    Keras's `kernel` and `embeddings` properties may return a computed tensor
    (e.g. with LoRA enabled), so the variable under them is read first.
    """
    variable = _compat.weight_variable(layer, weight_name) if weight_name in ("kernel", "embeddings") else None
    if variable is None:
        variable = getattr(layer, weight_name, None)
    return variable


def _matches(layer, entries) -> bool:
    """Whether an include/exclude list names `layer` or one of its classes."""
    return any(
        (isinstance(e, str) and layer.name == e) or (isinstance(e, type) and isinstance(layer, e))
        for e in entries
    )
