"""Getting a model that computes in the planned precision.

A Keras dtype policy (and a `keras.RematScope`) only affects layers created
while it is active, so a model built under another policy has to be rebuilt.
`prepare_model()` decides whether the user's model can be trained as it is,
or clones it under the plan's policy, carries its weights across, and keeps
the output layers in float32 so that outputs and loss stay in float32.
"""

from __future__ import annotations

import contextlib
import dataclasses

import keras

from kerasfast import _compat
from kerasfast.distribute.strategy import scope_of
from kerasfast.errors import DataError, ModelError

FLOAT_POLICIES = ("float32", "float16", "bfloat16", "float64", "mixed_float16", "mixed_bfloat16")
# A layer the user made compute in float64, bfloat16 or float16 (its variables too: a keras-hub preset loaded
# with dtype="bfloat16", a layer built with dtype="float16") asked for that precision, as model.fit computes
# it: the plan's policy leaves it as it is.
KEPT_POLICIES = ("float64", "bfloat16", "float16")


@contextlib.contextmanager
def build_scope(policy: str, remat: str | None = None):
    """Creates layers under `policy` (and `remat`), restoring the global policy after.

    Args:
        policy: A Keras dtype policy name, e.g. "mixed_bfloat16".
        remat: A `keras.RematScope` mode, or None.

    Example:

    >>> with build_scope("mixed_bfloat16"):
    ...     layer = keras.layers.Dense(4)
    >>> layer.compute_dtype
    'bfloat16'
    """
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        with keras.RematScope(mode=remat) if remat else contextlib.nullcontext():
            yield
    finally:
        keras.config.set_dtype_policy(previous)


def _output_layer_names(model) -> set[str]:
    if isinstance(model, keras.Sequential):
        return {model.layers[-1].name} if model.layers else set()
    outputs = getattr(model, "outputs", None) or []
    names = set()
    for tensor in keras.tree.flatten(outputs):
        name = _compat.producing_layer_name(tensor)
        if name is not None:
            names.add(name)
    return names


def is_graph_model(model) -> bool:
    """Sequential and functional models have a config made of their layers."""
    return isinstance(model, keras.Sequential) or _compat.is_plain_functional(model)


def clone_under(model, policy: str, remat: str | None = None):
    """Rebuilds `model` with every float layer under `policy`; output layers stay float32.

    Args:
        model: A Keras model (Sequential, functional or subclassed with
            `get_config`).
        policy: The dtype policy the clone's layers compute in.
        remat: Optional `keras.RematScope` mode for the clone's layers.

    Returns:
        A new, unbuilt-or-built model with fresh weights (copy them across
        with `copy_weights`).

    Raises:
        ModelError: For a subclassed model that cannot be rebuilt from its
            config: pass a builder callable instead.
    """
    mixed = policy.startswith("mixed_")
    keep_float32 = _output_layer_names(model) if mixed else set()

    def clone_layer(layer):
        config = layer.get_config()
        current = getattr(layer, "dtype_policy", None)
        if current is not None and current.name in FLOAT_POLICIES and current.name not in KEPT_POLICIES:
            config["dtype"] = "float32" if layer.name in keep_float32 else policy
        return layer.__class__.from_config(config)

    with build_scope(policy, remat):
        if is_graph_model(model):
            with _compat.uncompiled(model):  # the caller compiles the clone
                return keras.models.clone_model(model, input_tensors=_inputs_named_alike(model),
                                                clone_function=clone_layer, recursive=True)
        try:
            return model.__class__.from_config(model.get_config())
        except Exception as error:  # noqa: BLE001 - any failure means "cannot clone"
            detail = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
            raise ModelError(
                f"kerasfast needs to rebuild model {model.name!r} ({type(model).__name__}) under the "
                f"'{policy}' dtype policy{' with rematerialisation' if remat else ''}, but this subclassed model "
                f"cannot be re-created from its config ({type(error).__name__}: {detail}). Pass a zero-argument "
                "function that builds the model instead, e.g. kerasfast.fit(lambda: MyModel(...), data), or "
                "implement get_config()."
            ) from error


def _inputs_named_alike(model):
    """New `keras.Input`s with the names of `model`'s own (Keras's clone
    appends "CLONE"), so that data keyed by the user's input names feeds
    the clone too. None where Keras's clone makes its own (Sequential)."""
    if isinstance(model, keras.Sequential) or getattr(model, "inputs", None) is None:
        return None
    return keras.tree.map_structure(
        lambda tensor: keras.Input(batch_shape=tensor.shape, dtype=tensor.dtype, name=tensor.name,
                                   sparse=tensor.sparse), model._inputs_struct)


def copy_weights(source, target) -> None:
    """Copies every weight (trainable and not) from `source` to `target`.

    Raises:
        ModelError: When the two models do not hold the same weights.
    """
    source_weights = source.weights
    target_weights = target.weights
    if len(source_weights) != len(target_weights):
        raise ModelError(
            f"cannot carry weights from {source.name!r} to its rebuilt copy: {len(source_weights)} vs "
            f"{len(target_weights)} weights. Pass a builder callable to kerasfast.fit instead."
        )
    for src, dst in zip(source_weights, target_weights, strict=True):
        if tuple(src.shape) != tuple(dst.shape):
            raise ModelError(
                f"cannot carry weight {src.path} {tuple(src.shape)} to {dst.path} {tuple(dst.shape)}: the rebuilt "
                "model differs. Pass a builder callable to kerasfast.fit instead."
            )
        dst.assign(keras.ops.cast(src.value, dst.dtype))


def _functional_models(model) -> list:
    """`model` and every Sequential / functional model nested in it."""
    found = [model] if is_graph_model(model) else []
    for layer in _compat.flatten_layers(model):
        if isinstance(layer, keras.Model) and is_graph_model(layer):
            found.append(layer)
    return found


def _kept_in_float32(model) -> set[int]:
    """Layers that stay float32 under a mixed policy: those whose outputs
    leave a (sub-)model, so outputs and losses keep full precision, and in a
    model the user built with a mixed policy, the layers they kept float32
    (Keras's mixed-precision guide pins e.g. a final softmax so)."""
    kept = set()
    for graph in _functional_models(model):
        names = _output_layer_names(graph)
        kept.update(id(layer) for layer in _compat.flatten_layers(graph) if layer.name in names)
    policies = {id(layer): layer.dtype_policy.name for layer in _compat.flatten_layers(model)
                if getattr(layer, "dtype_policy", None) is not None}
    if any(name.startswith("mixed_") for name in policies.values()):
        kept.update(layer for layer, name in policies.items() if name == "float32")
    return kept


@contextlib.contextmanager
def computing_in(model, policy: str, remat: str | None = None):
    """Runs `model`'s layers under `policy` (and `remat`) inside the block,
    then puts every layer's own policy and remat mode back.

    Mixed policies keep float32 variables, so switching a built layer's
    compute dtype in place is exact: nothing is rebuilt or copied, and the
    model object the user holds is the one that trains. Layers whose outputs
    leave the model (or a nested functional model) stay float32, as do the
    layers a model built under a mixed policy keeps in float32; float64,
    bfloat16 and float16 layers keep theirs (`KEPT_POLICIES`).

    Args:
        model: A Keras model (any kind, built or not).
        policy: A Keras dtype policy name from the plan.
        remat: A `keras.RematScope` mode, or None.

    Example:

    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    >>> with computing_in(model, "mixed_bfloat16"):
    ...     model.layers[0].compute_dtype, model.layers[-1].compute_dtype  # the output layer stays float32
    ('bfloat16', 'float32')
    >>> model.layers[0].compute_dtype
    'float32'
    """
    kept = _kept_in_float32(model) if policy.startswith("mixed_") else set()
    mode = _compat.remat_mode(remat) if remat else None
    saved = []
    for layer in _compat.flatten_layers(model):
        current = getattr(layer, "dtype_policy", None)
        if current is None or current.name not in FLOAT_POLICIES:
            continue  # quantised layers and policy maps keep theirs
        saved.append((layer, current, _compat.get_remat(layer)))
        wanted = current.name if current.name in KEPT_POLICIES else "float32" if id(layer) in kept else policy
        if wanted != current.name:
            layer.dtype_policy = wanted
        if mode is not None and not isinstance(layer, keras.Model) and layer.weights:
            _compat.set_remat(layer, mode)
    try:
        yield
    finally:
        for layer, policy_before, remat_before in saved:
            if layer.dtype_policy is not policy_before:
                layer.dtype_policy = policy_before
            _compat.set_remat(layer, remat_before)


def copy_optimizer_state(source, target) -> None:
    """Copies an optimizer's variables (iterations, moments, ...) into another
    of the same class and configuration, built for the same variables.

    Raises:
        ModelError: When the two optimizers do not hold the same state.
    """
    source_variables, target_variables = list(source.variables), list(target.variables)
    if len(source_variables) != len(target_variables):
        raise ModelError(
            f"cannot carry optimizer state back: {len(source_variables)} vs {len(target_variables)} variables."
        )
    for src, dst in zip(source_variables, target_variables, strict=True):
        dst.assign(keras.ops.cast(src.value, dst.dtype))


@dataclasses.dataclass
class PreparedModel:
    """The model `fit` trains, and how it relates to the user's.

    Attributes:
        train_model: The model that trains: the user's own model object, or
            (only under a strategy the model was not created in) its copy
            rebuilt in the strategy's scope.
        user_model: The user's model (the builder's result for a builder).
        rebuilt: Whether `train_model` is a rebuilt copy whose weights and
            optimizer state are copied back into `user_model` after training.
        how: One line saying what was done, for the plan.
    """

    train_model: object
    user_model: object
    rebuilt: bool
    how: str


def prepare_model(model_or_builder, sample_inputs, *, strategy=None, own_steps: bool = False) -> PreparedModel:
    """Returns the model to train: the user's own, built on a batch if needed.

    Args:
        model_or_builder: A Keras model or a zero-argument callable that
            returns one (called in the strategy's scope).
        sample_inputs: One batch of inputs, used to build unbuilt models.
        strategy: A `tf.distribute.Strategy` whose scope the model's variables
            must live in, or None.
        own_steps: The model overrides `train_step`: it is never called
            directly (it may have no `call()`), its own step builds it.

    Returns:
        A `PreparedModel`.

    Raises:
        ModelError: For a builder that returns no model, or a subclassed
            model created outside the strategy's scope.
    """

    if isinstance(model_or_builder, keras.Model):
        model = model_or_builder
        created_under = _compat.creation_strategy(model)
        if created_under is strategy or (created_under is None and model.distribute_strategy is strategy):
            if not own_steps:
                with scope_of(strategy):
                    _ensure_built(model, sample_inputs)
            return PreparedModel(model, model, False, "your model object, trained in place")
        if not is_graph_model(model) or own_steps:
            raise ModelError(_unshareable(model, strategy, created_under))
        _ensure_built(model, sample_inputs)
        with scope_of(strategy):
            clone = clone_under(model, "float32")
            _ensure_built(clone, sample_inputs)
            copy_weights(model, clone)
        return PreparedModel(clone, model, True,
                             "rebuilt in the strategy's scope; weights and optimizer state carried back after")
    if callable(model_or_builder):
        with scope_of(strategy):
            model = model_or_builder()
            if not isinstance(model, keras.Model):
                raise ModelError(
                    f"the model builder returned {type(model).__name__}, not a keras.Model: make it return the model."
                )
            if not own_steps and not _overrides_train_step(model):
                _ensure_built(model, sample_inputs)
        return PreparedModel(model, model, False, "built by your function" + (" in the strategy's scope" if strategy else ""))
    raise ModelError(
        f"model must be a keras.Model or a zero-argument function that builds one, not {type(model_or_builder).__name__}."
    )


def _unshareable(model, strategy, created_under) -> str:
    """Why a subclassed `model` cannot train under `strategy` (None: no strategy), and the fix."""
    where = f"model {model.name!r} ({type(model).__name__}) was created "
    if strategy is None:
        return (where + f"in a {type(created_under).__name__}'s scope, so its variables are the strategy's, but "
                "it trains with no strategy (strategy='none'), and a subclassed model cannot be rebuilt safely. "
                "Create it outside any strategy's scope, or train it with that strategy (strategy=its object).")
    return (where + f"outside the {type(strategy).__name__}'s scope, so its variables cannot be shared by the "
            "replicas, and a subclassed model cannot be rebuilt safely. Pass a function that builds (and compiles) "
            "it: kerasfast.fit(lambda: make_model(), ...) is called in the strategy's scope.")


def _overrides_train_step(model) -> bool:
    return _compat.overridden_step(model, "train_step") is not None


def _ensure_built(model, sample_inputs) -> None:
    """Builds an unbuilt model on one batch.

    A Sequential or functional model is made of Keras layers, so a failure
    there means the data does not fit it (`DataError`); an error from a
    subclassed model's own `call` propagates with its own type.
    """
    if model.built and getattr(model, "inputs", None) is not None:
        return
    if model.built and not is_graph_model(model) and all(
            layer.built for layer in _compat.flatten_layers(model, include_self=False)):
        # `model.build(input_shape)` on a subclassed model without a build() of its own marks it built and
        # leaves its layers unbuilt (Keras warns): they would create their variables in the first step,
        # outside the strategy's scope.
        return
    if not is_graph_model(model):
        model(sample_inputs, training=False)
        return
    try:
        model(sample_inputs, training=False)
    except (ValueError, TypeError) as error:
        raise DataError(
            f"model {model.name!r} could not be run on a batch of the data: {error}. Check that the data's inputs "
            "(shape, dtype, number of inputs) match what the model expects."
        ) from error


def own_settings(model) -> str:
    """What of the model's own the run keeps, for the plan's `model:` line ("" when nothing): a keras-hub task's
    class, layers computing in their own precision (`KEPT_POLICIES`), LoRA and its rank, frozen weights.

    Example:

    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, dtype="bfloat16"), keras.layers.Dense(1)])
    >>> model.layers[1].enable_lora(2)
    >>> own_settings(model)
    'its own dtype: bfloat16 (1 layer); LoRA rank 2 on 1 layer; 59 of 67 weights train'
    """
    layers = [layer for layer in _compat.flatten_layers(model) if not isinstance(layer, keras.Model)]
    parts = [f"keras-hub {type(model).__name__}"] if _compat.hub_preprocessing(model) is not None \
        or type(model).__module__.startswith("keras_hub.") else []
    policies: dict[str, int] = {}
    for layer in layers:
        policy = getattr(getattr(layer, "dtype_policy", None), "name", None)
        if policy in KEPT_POLICIES and layer.weights:
            policies[policy] = policies.get(policy, 0) + 1
    if policies:
        parts.append("its own dtype: " + ", ".join(f"{name} ({_count(count, 'layer')})"
                                                   for name, count in policies.items()))
    lora = [layer for layer in layers if getattr(layer, "lora_enabled", False)]
    if lora:
        ranks = sorted({layer.lora_rank for layer in lora})
        parts.append(f"LoRA rank {'/'.join(map(str, ranks))} on {_count(len(lora), 'layer')}")
    trainable = sum(int(keras.ops.size(weight)) for weight in model.trainable_weights)
    total = sum(int(keras.ops.size(weight)) for weight in model.weights)
    if trainable < total and (lora or parts):
        parts.append(f"{trainable:,} of {total:,} weights train")
    return "; ".join(parts)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"
