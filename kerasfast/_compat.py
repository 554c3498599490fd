"""Every private Keras and TensorFlow access of kerasfast, behind one door.

kerasfast reaches into Keras and TensorFlow only here. Each function says
what it touches and why no public API serves; all were checked on Keras
3.15 and TensorFlow 2.21 (`TESTED_KERAS`, `TESTED_TENSORFLOW`), the range
pyproject.toml pins. Those that change what Keras does (the distributed
build) refuse other versions; `tests/test_compat.py` has a test per
internal that fails when upstream changes it, to tell us.

Why the distributed build is here: Keras 3.15's TensorFlow trainer fails
under MultiWorkerMirroredStrategy in `_maybe_symbolic_build` (it reduces a
tuple of PerReplica batches with `strategy.reduce("MEAN", ...)`, keras issue
20585). kerasfast builds every piece of state itself under the strategy's
scope, then detaches the model from the strategy it was created under so
that Keras skips that build, and runs `fit` inside the strategy's scope so
that Keras still distributes the data.
"""

from __future__ import annotations

import contextlib
import functools

import keras

from kerasfast._quiet import filtered_stderr

TESTED_KERAS = ("3.15",)
TESTED_TENSORFLOW = ("2.21",)

# What `keras.Model.compile` (Keras 3.15) sets on a model, plus what training
# sets: undoing a compile means putting exactly these back.
COMPILE_STATE = (
    "optimizer", "loss", "compiled", "stop_training", "steps_per_execution", "unrolled_steps_per_execution",
    "train_function", "test_function", "predict_function", "_compile_loss", "_compile_metrics",
    "_loss_tracker", "_compile_config", "_compiled_trainable_state", "_jit_compile", "_run_eagerly",
)
# TensorFlow's record of a trackable's checkpoint dependencies (a list and a dict).
CHECKPOINT_DEPENDENCY_STATE = ("_self_unconditional_checkpoint_dependencies",
                               "_self_unconditional_dependency_names")


def version_supported(version: str, tested: tuple[str, ...]) -> bool:
    """Whether `version` ("3.15.1") is in one of the `tested` release lines ("3.15")."""
    return any(version == line or version.startswith(line + ".") for line in tested)


@functools.cache
def check_versions() -> None:
    """Raises when the installed Keras or TensorFlow is not one these internals were checked on."""
    import tensorflow as tf

    for name, version, tested, pin in (("Keras", keras.__version__, TESTED_KERAS, "keras>=3.15,<3.16"),
                                       ("TensorFlow", tf.__version__, TESTED_TENSORFLOW, "tensorflow>=2.21,<2.22")):
        if not version_supported(version, tested):
            raise RuntimeError(
                f"kerasfast's distributed training was verified with {name} {', '.join(tested)}.x, not {version}: "
                f"install {pin} (see pyproject.toml)."
            )


# --- Keras: model state -------------------------------------------------------------------------------


def build_state(model, sample_batch) -> None:
    """Creates model, loss, metric and optimizer state (call under the strategy's scope).

    `Model._symbolic_build` is what Keras's own `fit` calls first; it has no
    public name.
    """
    check_versions()
    model._symbolic_build(data_batch=sample_batch)
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)


def build_state_eagerly(model, sample_batch) -> None:
    """`build_state` for a model compiled with run_eagerly=True, whose layers may read tensors' values (which a
    symbolic build does not give them): one eager forward pass in inference mode, and the compiled loss and
    metrics built on it. Their variables then hold that batch's values: for a resumed run, which overwrites
    them with the backup's."""
    check_versions()
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(sample_batch)
    y_pred = model(x, training=False)
    if model._compile_metrics is not None and not model._compile_metrics.built:
        model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
    if model._compile_loss is not None and not model._compile_loss.built:
        model._compute_loss(x, y, y_pred, sample_weight=sample_weight, training=False)
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)


def keras_backup_epoch(callbacks) -> int:
    """The epoch a Keras `BackupAndRestore` among `callbacks` resumes the run at (0: none, or nothing saved),
    read from the file its `on_train_begin` reads it from, before the run starts (the data must start there)."""
    import json
    import os

    for callback in callbacks:
        path = getattr(callback, "_training_metadata_path", None)
        if isinstance(callback, keras.callbacks.BackupAndRestore) and path and os.path.exists(path):
            with open(path) as file:
                return int(json.load(file).get("epoch", 0))
    return 0


def detach_from_creation_strategy(model) -> None:
    """Makes Keras take the strategy from the surrounding scope instead of the
    one the model was created under, which skips the failing symbolic build."""
    check_versions()
    model._distribute_strategy = None


def attach_strategy(model, strategy) -> None:
    """Puts back the strategy a model was created under (see `detach_from_creation_strategy`)."""
    model._distribute_strategy = strategy


def creation_strategy(model):
    """The tf.distribute strategy `model` was created under, or None."""
    return getattr(model, "_distribute_strategy", None)


def optimizer_strategy(optimizer):
    """The tf.distribute strategy in scope when an optimizer was created (its variables go there), or None."""
    return getattr(optimizer, "_distribution_strategy", None)


def adam_moments(optimizer, variable) -> tuple:
    """`(m, v)`: the first and second moment variables a Keras Adam keeps for `variable`."""
    index = optimizer._get_variable_index(variable)
    return optimizer._momentums[index], optimizer._velocities[index]


def loss_tracker(model):
    """The `Mean` metric behind the "loss" entry of Keras's logs (None before `compile`)."""
    return getattr(model, "_loss_tracker", None)


def keras_masks(outputs) -> list:
    """The Keras masks of a model's `outputs` (None where an output has none),
    flat: a `tf.function`'s results are new tensors without them, and Keras
    reads them when it computes metrics (`put_keras_masks`)."""
    from keras.src.backend.common.masking import get_keras_mask

    return [get_keras_mask(output) for output in keras.tree.flatten(outputs)]


def put_keras_masks(outputs, masks: list) -> None:
    """Gives `outputs` the masks `keras_masks` read from them before a `tf.function`'s boundary."""
    from keras.src.backend.common.masking import set_keras_mask

    for output, mask in zip(keras.tree.flatten(outputs), masks, strict=True):
        if mask is not None:
            set_keras_mask(output, mask)


def learning_rate_store(optimizer):
    """What an optimizer keeps its learning rate in: a variable holding a
    constant, a `LearningRateSchedule` or a callable.

    The public `learning_rate` property reads its current value, and its
    setter will not put a schedule where a float was (or back); kerasfast
    swaps the store for a run and puts the user's back afterwards. Read
    directly also because `get_config()` fails on a schedule without one of
    its own.
    """
    return optimizer._learning_rate


def set_learning_rate_store(optimizer, store) -> None:
    optimizer._learning_rate = store


def replace_learning_rate(optimizer, rate) -> None:
    """Gives the optimizer `rate` (a constant or a schedule) for good, as if
    it had been made with it: a variable that held its constant rate is no
    longer among its variables once a schedule replaces it, and a constant
    replacing a schedule gets the variable Keras would have made, second
    after the step count. Keras's own setter refuses both: a model saved
    then could not load its optimizer's state (the optimizer rebuilt from the
    config has one variable more or fewer), and a callback could not set a
    constant kept as a plain number."""
    old = optimizer._learning_rate
    is_schedule = isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) or callable(rate)
    if isinstance(old, keras.Variable) and not is_schedule:
        old.assign(rate)
        return
    if is_schedule:
        optimizer._learning_rate = rate
        if isinstance(old, keras.Variable):
            _drop_variable(optimizer, old)
        return
    _add_learning_rate_variable(optimizer, float(rate))


def _add_learning_rate_variable(optimizer, rate: float) -> None:
    """Makes the variable Keras's optimizer makes for a constant rate, in its place among the variables."""
    from keras.src.utils.tracking import DotNotTrackScope

    strategy = optimizer_strategy(optimizer)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        with keras.name_scope(optimizer.name, caller=optimizer):
            variable = keras.Variable(rate, name="learning_rate", dtype=keras.backend.floatx(), trainable=False,
                                      aggregation="only_first_replica")
    with DotNotTrackScope():
        optimizer._learning_rate = variable
        kept = [v for v in optimizer._variables if v is not variable]
        optimizer._variables = kept[:1] + [variable] + kept[1:]  # Keras: step count, rate, then the slots
    optimizer._tracker.stored_ids["variables"].add(id(variable))


def _drop_variable(optimizer, variable) -> None:
    """Takes `variable` out of the optimizer's variables, as a new list:
    TensorFlow refuses to save (checkpoint or export) a tracked list that an
    item was deleted from."""
    from keras.src.utils.tracking import DotNotTrackScope

    tracker = optimizer._tracker
    is_variable, _ = tracker.config["variables"]
    tracker.stored_ids["variables"].discard(id(variable))
    with DotNotTrackScope():  # Keras's tracker would wrap the list to track it again
        optimizer._variables = [kept for kept in optimizer._variables if kept is not variable]
    tracker.config["variables"] = (is_variable, optimizer._variables)


_OPTIMIZER_SETTINGS = ("_learning_rate", "clipnorm", "clipvalue", "global_clipnorm")


@contextlib.contextmanager
def configured_as_now(optimizer):
    """Inside the block `optimizer.get_config()`, and so a model saved then
    (a checkpoint callback's), gives the learning rate and clipping the
    optimizer has when the block starts, whatever it trains with later (a
    variable holding a constant rate is saved with the value it holds then).
    The outermost block's settings hold."""
    if "get_config" in vars(optimizer):
        yield
        return
    settings = {name: getattr(optimizer, name) for name in _OPTIMIZER_SETTINGS}

    def get_config():
        training_with = {name: getattr(optimizer, name) for name in _OPTIMIZER_SETTINGS}
        try:
            for name, value in settings.items():
                setattr(optimizer, name, value)
            return type(optimizer).get_config(optimizer)
        finally:
            for name, value in training_with.items():
                setattr(optimizer, name, value)

    optimizer.get_config = get_config
    try:
        yield
    finally:
        del optimizer.get_config


def weight_variable(layer, name: str):
    """The variable Keras keeps behind `layer.kernel` / `layer.embeddings`
    (`layer._kernel`), or None: the public property may return a computed
    tensor (with LoRA enabled, kernel + A @ B)."""
    return getattr(layer, "_" + name, None)


def layers_add_losses(model) -> bool:
    """Whether a layer of `model` (or the model) adds losses in `call` (`add_loss`)."""
    return any(getattr(layer, "_losses", None) for layer in flatten_layers(model, include_self=True))


def variable_strategy(variable):
    """The tf.distribute strategy a Keras variable was created under, or None."""
    return getattr(variable.value, "_distribute_strategy", None)


def unscale_loss_for_distribution(loss):
    """Undoes Keras's division of the loss by the number of replicas, for logging it."""
    from keras.src.losses.loss import unscale_loss_for_distribution as unscale

    return unscale(loss)


def compute_loss(model, x, y, y_pred, sample_weight, training: bool):
    """`model.compute_loss`, called as Keras calls it: with `training` only
    when the user's override takes it (keras-io's distiller does not)."""
    return model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)


@contextlib.contextmanager
def uncompiled(model):
    """Inside the block the model reads as not compiled, so that
    `keras.models.clone_model` does not serialise its compile settings (a
    schedule without `get_config()` cannot be); the clone is compiled after."""
    compiled = model.compiled
    model.compiled = False
    try:
        yield
    finally:
        model.compiled = compiled


@contextlib.contextmanager
def learning_rate_hidden(optimizer):
    """Inside the block the optimizer's learning rate is a placeholder
    float, so that `get_config()` works whatever the rate is."""
    rate = optimizer._learning_rate
    optimizer._learning_rate = 0.5
    try:
        yield
    finally:
        optimizer._learning_rate = rate


def call_has_training_arg(model) -> bool:
    """Whether the model's `call` takes a `training` argument."""
    return model._call_has_training_arg


def overridden_step(model, method: str) -> str | None:
    """`"Class.method"` when a class of the user's overrides one of Keras's
    trainer methods (`train_step`, `test_step`, ...), else None."""
    for cls in type(model).__mro__:
        if method in cls.__dict__:
            if cls.__module__.split(".")[0] == "keras":
                return None
            return f"{cls.__name__}.{method}"
    return None


def compile_config(model) -> dict:
    """The arguments the user passed to `model.compile` (unserialised), or {}.

    Keras keeps the original objects here; the public `get_compile_config()`
    would lose custom, unregistered losses.
    """
    if not isinstance(model, keras.Model) or not model.compiled:
        return {}
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    if config is None:
        return {"optimizer": model.optimizer, "loss": getattr(model, "loss", None)}
    return dict(config)


# --- Keras: layers and graphs ---------------------------------------------------------------------------


def flatten_layers(model, include_self: bool = False, recursive: bool = True) -> list:
    """Every layer inside `model`, nested ones included (Keras's own walk,
    the one its weights and serialisation follow; `model.layers` is only the
    top level)."""
    return list(model._flatten_layers(include_self=include_self, recursive=recursive))


def producing_layer_name(tensor) -> str | None:
    """The name of the layer whose output a symbolic Keras tensor is, or None."""
    history = getattr(tensor, "_keras_history", None)
    return history.operation.name if history is not None else None


def is_plain_functional(model) -> bool:
    """Whether `model` is exactly what `keras.Model(inputs, outputs)` returns.

    Keras has no public name for that class; a subclass of `keras.Model`
    built with inputs and outputs is a subclass of it too, with an
    `__init__` (and so a config) of its own, and does not count.
    """
    from keras.src.models.functional import Functional

    return type(model) is Functional


def remat_mode(mode: str):
    """The object Keras stores on a layer created inside `RematScope(mode)`."""
    from keras.src.backend.common.remat import get_current_remat_mode

    with keras.RematScope(mode=mode):
        return get_current_remat_mode()


def get_remat(layer):
    """The remat mode a layer was created with (None: none)."""
    return getattr(layer, "_remat_mode", None)


def set_remat(layer, mode) -> None:
    layer._remat_mode = mode


def tensorflow_nn_module():
    """Keras's TensorFlow `nn` module: `keras.ops.dot_product_attention` looks its
    `dot_product_attention` up there on every call."""
    from keras.src.backend.tensorflow import nn

    return nn


def loss_as_compiled(function):
    """A loss function (`keras.losses.binary_crossentropy`, a user's) as `compile(loss=...)` applies it: labels
    and outputs brought to one rank first ((batch,) against (batch, 1)), the mean over the batch."""
    from keras.src.losses.losses import LossFunctionWrapper

    return LossFunctionWrapper(function, name=getattr(function, "__name__", None))


def tensorflow_random_module():
    """Keras's TensorFlow `random` module: `keras.layers.Dropout` (and every layer's dropout) looks its
    `dropout` up there on every call."""
    from keras.src.backend.tensorflow import random

    return random


def keras_random_seed(seed):
    """The two int32 seed values Keras's TensorFlow random functions draw from `seed` (a
    `keras.random.SeedGenerator`, which advances as it does for Keras's own draw, or an int)."""
    random = tensorflow_random_module()
    return random._cast_seed(random.draw_seed(seed))


# --- Keras: data ---------------------------------------------------------------------------------------


def train_validation_split(arrays, validation_split: float):
    """Keras's own split: the last `validation_split` of the samples, before shuffling."""
    from keras.src.trainers.data_adapters import array_slicing

    return array_slicing.train_validation_split(arrays, validation_split=validation_split)


def can_convert_arrays(structure) -> bool:
    """Whether Keras's fit would take `structure` as in-memory arrays."""
    from keras.src.trainers.data_adapters import array_data_adapter

    return array_data_adapter.can_convert_arrays(structure)


def is_sparse(x) -> bool:
    """Whether `x` is a `tf.SparseTensor` or a SciPy sparse matrix (Keras takes both as arrays)."""
    from keras.src.trainers.data_adapters import data_adapter_utils

    return data_adapter_utils.is_tensorflow_sparse(x) or data_adapter_utils.is_scipy_sparse(x)


def sparse_rows(x):
    """A `tf.SparseTensor` or SciPy sparse matrix as Keras's row-gatherable wrapper (`gather_sparse_rows`)."""
    from keras.src.trainers.data_adapters import array_slicing, data_adapter_utils

    if data_adapter_utils.is_scipy_sparse(x):
        x = data_adapter_utils.scipy_sparse_to_tf_sparse(x)
    return array_slicing.to_tensorflow_sparse_wrapper(x)


def gather_sparse_rows(rows, indices):
    """The rows `indices` of a `sparse_rows` wrapper, as a `tf.SparseTensor` (Keras's own slicing)."""
    from keras.src.trainers.data_adapters import array_slicing

    return array_slicing.slice_tensorflow_sparse_wrapper(rows, indices)


def data_adapter(x, *, class_weight=None, shuffle=False, steps_per_epoch=None):
    """Keras's adapter for a `PyDataset` or a Python generator."""
    from keras.src.trainers.data_adapters import get_data_adapter

    return get_data_adapter(x, class_weight=class_weight, shuffle=shuffle, steps_per_epoch=steps_per_epoch)


def call_epoch_hooks(adapter) -> None:
    """Makes each full pass of a `PyDataset` adapter's tf.data stream call the dataset's
    `on_epoch_begin()` before its first batch and `on_epoch_end()` after its last.

    Keras calls them from its epoch loop around a fresh iterator per epoch;
    kerasfast reads one repeated stream, so the pass itself calls them:
    indices a PyDataset reshuffles in `on_epoch_end` shape the next pass, as
    in `model.fit`. `model.fit` also calls `on_epoch_end()` once before its
    first epoch (resetting its epoch iterator), so the first epoch already
    sees a reshuffled order: it is called here once, before any pass. A PyDataset of
    unknown length has no passes to hook.
    """
    py_dataset = getattr(adapter, "py_dataset", None)
    if py_dataset is None or py_dataset.num_batches is None:
        return
    batches = adapter._get_iterator  # what Keras's from_generator calls once per pass
    py_dataset.on_epoch_end()  # as `model.fit` resetting its epoch iterator

    def one_pass():
        py_dataset.on_epoch_begin()
        last = None
        for batch in batches():
            if last is not None:
                yield last
            last = batch
        # The pass ends (Keras's worker threads stop) before its last batch
        # goes out: a reader that takes exactly one pass never asks past it.
        py_dataset.on_epoch_end()
        if last is not None:
            yield last

    adapter._get_iterator = one_pass


def first_batch(adapter):
    """The first batch of a Keras `PyDataset` or generator adapter, without consuming it."""
    batches = getattr(adapter, "_first_batches", None)  # generators: peeked and put back by Keras
    if batches:
        return batches[0]
    return adapter.py_dataset[0]  # a PyDataset is indexable


def tensors(structure):
    """A batch as tensors (lists made tuples, as Keras's adapters yield them)."""
    import tensorflow as tf

    return keras.tree.map_structure(tf.convert_to_tensor, keras.tree.lists_to_tuples(structure))


# --- Keras: export ---------------------------------------------------------------------------------------


def patch_tf2onnx() -> None:
    """Keras's fix-up of tf2onnx 1.17 for NumPy 2, as its own `model.export(format="onnx")` applies it."""
    try:
        from keras.src.export.tf2onnx_lib import patch_tf2onnx as patch
    except ImportError:  # a Keras without it: nothing to patch
        return
    patch()


# --- TensorFlow -------------------------------------------------------------------------------------------


def runtime_started() -> bool:
    """Whether TensorFlow's runtime (and so its thread pools) already exists.

    The eager context gets its C handle when the first op or device
    placement runs; listing physical devices does not create it. No public
    API tells.
    """
    from tensorflow.python.eager import context

    return context.context()._context_handle is not None


def onednn_enabled() -> bool | None:
    """Whether TensorFlow loaded with its oneDNN kernels on (read once at its
    start-up from TF_ENABLE_ONEDNN_OPTS and the CPU); None where this
    TensorFlow does not say. No public API tells."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return None


def op_determinism_enabled() -> bool:
    """Whether `tf.config.experimental.enable_op_determinism()` is on (TF has no public getter)."""
    from tensorflow.python.framework.config import is_op_determinism_enabled

    return is_op_determinism_enabled()


def profile_float_operations(graph):
    """TensorFlow's (v1) profiler's count of the floating-point operations
    in a `tf.Graph`: a tree of nodes with `name`, `float_ops`, `children`
    and the root's `total_float_ops`. TF2 has no public FLOP counter."""
    import tensorflow as tf
    from tensorflow.python.profiler import model_analyzer, option_builder

    _count_einsum_flops()
    options = option_builder.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    # The v1 profiler logs a deprecation warning per call; it is ours to ignore.
    verbosity = tf.get_logger().level
    tf.get_logger().setLevel("ERROR")
    try:
        with filtered_stderr():  # its notice for ops of unknown shape is printed, whatever the options
            profile = model_analyzer.profile(graph, options=options)
    finally:
        tf.get_logger().setLevel(verbosity)
    return profile


def _count_einsum_flops():
    """Teaches the profiler the FLOPs of `Einsum`, which TensorFlow's own
    registry leaves out: Keras's `ops.dot_product_attention` (so every
    `MultiHeadAttention`) traces to it, and its matmuls counted zero.
    Registered once per process; a TensorFlow that counts `Einsum` itself
    keeps its own."""
    from tensorflow.python.framework import ops

    try:
        ops.RegisterStatistics("Einsum", "flops")(_einsum_flops)
    except KeyError:  # registered already, by this function or by TensorFlow
        pass


def _einsum_flops(graph, node):
    """2 x output elements x the contracted dimensions for a product of two
    operands, as for `BatchMatMul`; one operand is a sum (or a transpose)."""
    import math

    from tensorflow.python.framework import graph_util, ops

    inputs, output = node.attr["equation"].s.decode().replace(" ", "").split("->")
    operands = inputs.split(",")
    sizes = {}
    for labels, name in zip(operands, node.input, strict=False):
        shape = graph_util.tensor_shape_from_node_def_name(graph, name)
        shape.assert_is_fully_defined()
        dims = shape.as_list()
        head, _, tail = labels.partition("...")  # "..." stands for the dims the labels leave over
        for label, dim in zip(head + tail, dims[:len(head)] + dims[len(dims) - len(tail):], strict=True):
            sizes[label] = max(sizes.get(label, 1), dim)
    output_shape = graph_util.tensor_shape_from_node_def_name(graph, node.name)
    output_shape.assert_is_fully_defined()
    elements = math.prod(output_shape.as_list())
    contracted = math.prod(size for label, size in sizes.items() if label not in output)
    if len(operands) == 1:
        return ops.OpStats("flops", elements * contracted if contracted > 1 else 0)
    return ops.OpStats("flops", 2 * elements * contracted)


def freeze(concrete_function):
    """A concrete function with its variables folded into constants (TF's own freezing)."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    return convert_variables_to_constants_v2(concrete_function)


def dataset_kinds(dataset) -> list[str]:
    """The class names of a `tf.data.Dataset`'s stages, from it back to its sources (TensorFlow's private
    `_inputs()`; e.g. `_MapDataset` for a sequential map, `_ParallelMapDataset`, `CacheDataset`,
    `_PrefetchDataset`): what the pipeline does, without serializing its graph (arrays in it included).
    A stage whose function is tf.data's own (the map inside `unbatch()` or `rebatch()`) is named `tf.data:`
    and its class; `Dataset.from_generator`'s is `from_generator`."""
    kinds, seen, stack = [], set(), [dataset]
    while stack:
        stage = stack.pop()
        if id(stage) in seen:
            continue
        seen.add(id(stage))
        function = getattr(getattr(stage, "_map_func", None), "_func", None)
        module = getattr(function, "__module__", None) or ""
        if module.endswith(".from_generator_op"):
            kinds.append("from_generator")  # a Python generator's elements, one at a time
        else:
            kinds.append(("tf.data:" if module.startswith("tensorflow.python.data.") else "") + type(stage).__name__)
        stack.extend(getattr(stage, "_inputs", lambda: [])())
    return kinds


def serialized_dataset_graph(dataset) -> bytes:
    """A `tf.data.Dataset`'s graph as a serialized `GraphDef` (no public accessor)."""
    return dataset._as_serialized_graph().numpy()


def stop_server(server) -> None:
    """Stops a tf.data service `DispatchServer` / `WorkerServer` (TF has no public stop; `join()` never returns)."""
    server._stop()


def data_service_distribute(**arguments):
    """`tf.data.experimental.service.distribute` with the arguments only its
    private implementation takes (`task_refresh_interval_hint_ms`: how often
    a client polls the dispatcher for a new job's tasks)."""
    from tensorflow.python.data.experimental.ops.data_service_ops import _distribute

    return _distribute(**arguments)


def mirrored_strategy(devices, collective_key_base: int):
    """A `tf.distribute.MirroredStrategy` over `devices` whose collective
    operations are numbered from `collective_key_base`.

    Every MirroredStrategy numbers its collectives from the same start
    (`MirroredStrategy._collective_key_base`, 0, "only set this in tests"),
    and TensorFlow keeps the first shapes seen under a number: one the user
    made earlier in the process (their own `model.fit` under it) and a
    second one would all-reduce mismatched tensors ("Shape mismatch in the
    collective instance") as soon as a model all-reduces inside its forward
    pass (`BatchNormalization(synchronized=True)`).
    """
    import tensorflow as tf

    strategy_class = tf.distribute.MirroredStrategy
    previous = strategy_class._collective_key_base
    strategy_class._collective_key_base = collective_key_base  # read once, by the strategy's constructor
    try:
        return strategy_class(list(devices))
    finally:
        strategy_class._collective_key_base = previous


def is_multi_worker(strategy) -> bool:
    """Whether `strategy` is a MultiWorkerMirroredStrategy, the one keras issue 20585 breaks."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def _keras_hub_pipeline_class(model):
    """keras-hub's `PipelineModel` (`keras_hub.src.utils.pipeline_model`, private; the base of every
    `keras_hub.models.Task`) when `model` is one, else None. Found by name, so that kerasfast never imports
    keras-hub (it loads TensorFlow Text and its tokenizers) for a model that is not one of its own."""
    for cls in type(model).__mro__:
        if cls.__name__ == "PipelineModel" and cls.__module__.startswith("keras_hub."):
            return cls
    return None


def hub_preprocessing(model):
    """The preprocessing a keras-hub model maps over its batches in its own `fit`, `evaluate` and `predict`
    (its `preprocess_samples(x, y, sample_weight)`), or None: not a keras-hub model, or a task whose
    `preprocessor` is None (keras-hub then passes the data through as it is)."""
    pipeline = _keras_hub_pipeline_class(model)
    if pipeline is None:
        return None
    defined_by = next(cls for cls in type(model).__mro__ if "preprocess_samples" in cls.__dict__)
    if defined_by is pipeline:
        return None  # PipelineModel's own: packs (x, y, sample_weight) as they are
    if defined_by.__module__.startswith("keras_hub.") and getattr(model, "preprocessor", None) is None:
        return None  # Task's: passes the data through when there is no preprocessor
    return model.preprocess_samples


def keras_fit(model):
    """The `fit` to train `model` on batches kerasfast has already prepared: Keras's own, where keras-hub's
    `PipelineModel.fit` stands in the way (it would map the task's preprocessing over them a second time and
    re-wrap the stream); else the model's `fit` (a user's override runs as in `model.fit`)."""
    for cls in type(model).__mro__:
        if "fit" in cls.__dict__:
            if cls is _keras_hub_pipeline_class(model):
                return functools.partial(keras.Model.fit, model)
            return model.fit
    return model.fit
