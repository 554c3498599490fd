"""Turning what the user passes to `fit` into a batched `tf.data.Dataset`.

`fit` takes every data form Keras's `fit` takes, with Keras's meaning:
arrays, tensors and pandas objects as `x` (a structure: dict by input name,
list or tuple for several inputs) with `y` / `sample_weight` beside them; a
`tf.data.Dataset` yielding `x` or `(x, y[, sample_weight])`; a
`keras.utils.PyDataset`; a Python generator; plus kerasfast's TFRecord
paths. A tuple given as `x` without `y` is read as `(x, y[, sample_weight])`
(kerasfast's `fit(model, (x, y))` form), unless it can only be the model's
inputs, as Keras reads it (`tuple_is_model_inputs`). `class_weight` becomes sample
weights (multiplied into `sample_weight` when both are given) and
`validation_split` takes Keras's split: the last fraction, before shuffling.

The module reads off the facts the plan needs (batch size, samples per
epoch) and checks that the data fits the model's declared inputs (by name
for dicts, with Keras's leniency for a `(batch,)` array feeding a
`(None, 1)` input) before any training step.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from kerasfast import _compat
from kerasfast._checks import is_number
from kerasfast.data.arrays import array_dataset, first_rows, num_rows
from kerasfast.data.schema import NO_VALUES
from kerasfast.errors import DataError, PlanError
from kerasfast.plan import DataFacts


@dataclasses.dataclass
class PreparedData:
    """A batched dataset plus what is known about it.

    Attributes:
        dataset: Batched `tf.data.Dataset` of `x` or `(x, y[, sample_weight])`.
        facts: `DataFacts` for the plan.
        sample_inputs: The `x` of one batch (to build and check the model).
        description: One line for the plan and the run folder.
        sample_batch: One whole batch, as the dataset yields it.
        source: "arrays", "tfrecords", "dataset" (a `tf.data.Dataset`) or
            "python" (a `PyDataset` or a generator), for input advice.
        replayable: Whether the dataset can be read again from its start;
            False for a Python generator, whose batches are read once: a
            phase before training (tuning, the learning-rate range test)
            must not take any, or training would never see them.
        epoch_passes: Whether each epoch must be a pass of its own (a
            `PyDataset` of known length): callbacks may change the dataset
            between epochs, so no batch of the next epoch is read before
            they ran, as in `model.fit`.
    """

    dataset: object
    facts: DataFacts
    sample_inputs: object
    description: str
    sample_batch: object = None
    source: str = "dataset"
    remake: object = None  # f(batch_size, **changes): the same data, batched anew
    pipeline: object = None  # kerasfast's TFRecord `PipelineSettings`, printed as a table of its own
    replayable: bool = True
    epoch_passes: bool = False

    def rebatched(self, batch_size: int, **changes) -> "PreparedData":
        """The same data batched by `batch_size` (arrays and TFRecords, which kerasfast batches).

        Args:
            batch_size: The new batch size.
            **changes: Other `prepare_data` arguments to change (e.g. `shuffle=False`).
        """
        return self.remake(batch_size, **changes)

    def preprocessed(self, preprocess) -> "PreparedData":
        """The same data with a model's own preprocessing of its batches mapped over them (see `prepare_data`)."""
        return _preprocessed(self, preprocess)


def _unpack(batch):
    import keras

    return keras.utils.unpack_x_y_sample_weight(batch)


def _as_array(leaf):
    import tensorflow as tf

    if leaf is None or isinstance(leaf, tf.RaggedTensor) or _compat.is_sparse(leaf):
        return leaf  # kept as they are: array_dataset gathers their rows
    if isinstance(leaf, tf.Tensor) and leaf.dtype == tf.string:
        return leaf  # NumPy would hold its strings as objects, which Keras's validation split refuses
    if hasattr(leaf, "to_numpy") and not hasattr(leaf, "numpy"):  # pandas DataFrame / Series
        return _pandas_as_array(leaf)
    return np.asarray(leaf)  # NumPy arrays, tf / Keras tensors, lists of numbers


def _pandas_as_array(frame):
    """A DataFrame or Series as a NumPy array; its nullable numeric columns (`Int64`, `Float64`, `boolean`, whose
    NumPy form would be objects) in their NumPy dtype, or as float64 where a value is missing: pd.NA becomes NaN,
    which fit's check of the inputs then names (or trains on, with on_nan='ignore')."""
    columns = list(frame.dtypes.items()) if hasattr(frame, "columns") else [(frame.name, frame.dtype)]
    nullable = {name: dtype for name, dtype in columns
                if getattr(dtype, "numpy_dtype", None) is not None and getattr(dtype, "kind", "O") in "iufb"}
    if not nullable:
        return frame.to_numpy()
    if not hasattr(frame, "columns"):
        return frame.to_numpy(dtype=frame.dtype.numpy_dtype if not frame.isna().any() else "float64", na_value=np.nan)
    return frame.astype({name: dtype.numpy_dtype if not frame[name].isna().any() else "float64"
                         for name, dtype in nullable.items()}).to_numpy()


def _arrays(structure):
    """Lists become tuples (tf.data cannot carry lists), leaves NumPy arrays."""
    import keras

    return keras.tree.map_structure(_as_array, keras.tree.lists_to_tuples(structure))


def class_weights_for(y, class_weight: dict) -> np.ndarray:
    """Per-sample weights from `class_weight`, for sparse or one-hot labels (Keras's rule).

    Example:

    >>> class_weights_for(np.array([0, 1, 1]), {0: 1.0, 1: 3.0})
    array([1., 3., 3.], dtype=float32)
    """
    import keras

    if keras.tree.is_nested(y):
        raise DataError("class_weight= only works with a single output (one y array): pass sample_weight= instead.")
    labels = np.asarray(y)
    if labels.ndim > 1:
        labels = np.argmax(labels, axis=-1) if labels.shape[-1] != 1 else np.squeeze(labels, axis=-1)
    labels = np.round(labels).astype("int64")
    table = _class_weight_table(class_weight)
    outside = (labels < 0) | (labels >= len(table))
    weights = np.ones(labels.shape, "float32")
    weights[~outside] = table[labels[~outside]]
    return weights


def _class_weight_table(class_weight) -> np.ndarray:
    if not isinstance(class_weight, dict) or not class_weight:
        raise DataError(f"class_weight={class_weight!r}: pass a dict {{class index: weight}}, e.g. {{0: 1.0, 1: 5.0}}.")
    try:
        keys = [int(k) for k in class_weight]
    except (TypeError, ValueError):
        raise DataError(f"class_weight keys must be integer class indices, got {list(class_weight)!r}.") from None
    if min(keys) < 0:
        raise DataError(f"class_weight keys must be class indices >= 0, got {min(keys)}.")
    table = np.ones(max(keys) + 1, "float32")
    for key, value in class_weight.items():
        table[int(key)] = float(value)
    return table


def _class_weight_map(class_weight):
    """A `Dataset.map` function folding `class_weight` into the sample weights."""
    import tensorflow as tf

    table = tf.constant(_class_weight_table(class_weight))

    def apply(*batch):
        x, y, sample_weight = _unpack(batch if len(batch) > 1 else batch[0])
        if y is None or tf.nest.is_nested(y):
            raise DataError("class_weight= needs a dataset yielding (x, y) with a single y.")
        labels = y
        if y.shape.rank is not None and y.shape.rank >= 2:
            labels = tf.argmax(y, axis=-1) if y.shape[-1] != 1 else tf.squeeze(y, axis=-1)
        labels = tf.cast(tf.round(tf.cast(labels, tf.float32)), tf.int64)
        inside = (labels >= 0) & (labels < tf.size(table, out_type=tf.int64))
        weights = tf.where(inside, tf.gather(table, tf.clip_by_value(labels, 0, tf.size(table, out_type=tf.int64) - 1)),
                           tf.ones_like(labels, tf.float32))
        if sample_weight is not None:
            weights = weights * tf.cast(sample_weight, tf.float32)
        return x, y, weights

    return apply


def unpacked(x, y, sample_weight):
    """`(x, y, sample_weight)`, with kerasfast's `fit(model, (x, y[, sample_weight]))`
    form taken apart: a tuple `x` of 2 or 3 parts without `y` is that triple.

    >>> unpacked(("features", "labels"), None, None)
    ('features', 'labels', None)
    """
    if y is None and sample_weight is None and isinstance(x, tuple) and len(x) in (2, 3):
        return (tuple(x) + (None,))[:3]
    return x, y, sample_weight


def tuple_is_model_inputs(model, x, *, loss=None, metrics=None) -> bool:
    """Whether a tuple `x` given without `y` is the model's inputs (Keras's
    reading of `model.fit((xa, xb))`) rather than kerasfast's
    `(x, y[, sample_weight])`.

    It is, where the `(x, y)` reading cannot be what the user means:

    - a model with declared inputs (functional, Sequential) takes as many
      inputs as the tuple has parts (more than one), and each part is one
      array whose shape fits the input at its position (its first part
      alone could not feed the model);
    - a model whose inputs are not known yet (a subclassed model not
      built) would not use a `y`: it has no loss (compiled, or `loss=`),
      no metrics and none of its own `train_step` / `compute_loss` /
      `compute_metrics` (a model training on `add_loss` alone).

    Anything else keeps the documented `(x, y[, sample_weight])` reading.

    Args:
        model: The model `fit` got (anything else, e.g. a builder, gives False).
        x: What `fit` got as `x`, with `y` and `sample_weight` None.
        loss, metrics: `fit`'s own `loss=` / `metrics=`.
    """
    import keras

    if not isinstance(model, keras.Model) or type(x) is not tuple or len(x) not in (2, 3):
        return False
    if any(keras.tree.is_nested(part) or part is None for part in x):
        return False
    try:
        declared = list(model.inputs or ())
    except AttributeError:  # a subclassed model: no declared inputs
        declared = []
    if declared:
        if len(declared) != len(x):
            return False
        shapes = [tuple(part.shape) if hasattr(part, "shape") else tuple(np.shape(part)) for part in x]
        return all(_shapes_compatible(shape, tuple(spec.shape)) for shape, spec in zip(shapes, declared, strict=True))
    if any(_compat.overridden_step(model, method) for method in ("train_step", "compute_loss", "compute_metrics")):
        return False
    settings = _compat.compile_config(model)
    return all(value is None for value in (loss, metrics, settings.get("loss"), settings.get("metrics"),
                                           settings.get("weighted_metrics")))


def split_validation(x, y, sample_weight, validation_split):
    """Keras's `validation_split`: the last fraction of the arrays, taken before shuffling.

    Returns:
        `((x, y, sample_weight), (val_x, val_y, val_sample_weight))`.

    Raises:
        DataError: For a fraction outside [0, 1), or data that is not arrays.
    """
    if not is_number(validation_split) or not 0 <= validation_split < 1:
        raise DataError(f"validation_split={validation_split!r}: pass a fraction in [0, 1), e.g. 0.2.")
    if not _compat.can_convert_arrays((x, y, sample_weight)) or isinstance(x, (str, os.PathLike)):
        raise DataError(
            f"validation_split= only works for arrays or tensors (Keras refuses it too), not a "
            f"{type(x).__name__}: pass validation_data= instead (e.g. a held-out dataset)."
        )
    x, y, sample_weight = (_arrays(part) if part is not None else None for part in (x, y, sample_weight))
    try:
        return _compat.train_validation_split((_with_string_tensors(x), y, sample_weight), validation_split)
    except ValueError as error:
        raise DataError(f"validation_split={validation_split}: {error}") from error


def _holds_strings(leaf) -> bool:
    return isinstance(leaf, np.ndarray) and (leaf.dtype.kind in "US" or (
        leaf.dtype.kind == "O" and leaf.size > 0 and isinstance(leaf.flat[0], (str, bytes))))


def _with_string_tensors(structure):
    """`structure` with its NumPy (or pandas) string arrays as `tf.string` tensors, the only strings Keras's
    own array handling takes (its validation split and its evaluation of `validation_data`); kerasfast's
    training reads NumPy strings itself."""
    import keras
    import tensorflow as tf

    def convert(leaf):
        array = _as_array(leaf) if hasattr(leaf, "to_numpy") or isinstance(leaf, np.ndarray) else leaf
        return tf.constant(array) if _holds_strings(array) else leaf

    return keras.tree.map_structure(convert, structure) if structure is not None else None


def _check_not_strings(part, name: str, what: str) -> None:
    """Refuses string targets (Keras refuses NumPy string arrays too): a loss needs numbers."""
    import keras

    for leaf in keras.tree.flatten(part) if part is not None else []:
        if _holds_strings(leaf):
            raise DataError(
                f"{what}: {name} holds strings ({leaf.flat[0]!r}, ...), but a loss needs numbers: encode the labels "
                "as integers first (e.g. keras.layers.StringLookup(num_oov_indices=0) or np.unique(y, "
                "return_inverse=True)[1])."
            )


def _check_no_objects(part, name: str, what: str) -> None:
    """Refuses NumPy arrays of Python objects other than strings (numbers kept as objects, arrays of
    arrays), which TensorFlow cannot read, with the fix."""
    import keras

    for leaf in keras.tree.flatten(part) if part is not None else []:
        if isinstance(leaf, np.ndarray) and leaf.dtype == object and leaf.size and not _holds_strings(leaf):
            raise DataError(
                f"{what}: {name} is a NumPy array of Python objects (dtype object, {type(leaf.flat[0]).__name__} "
                f"first), which TensorFlow cannot read: convert it, e.g. np.asarray({name}, dtype='float32'), or "
                "np.stack for an array of arrays.")


def _first_dim(structure) -> int | None:
    import tensorflow as tf

    for tensor in tf.nest.flatten(structure):
        shape = tuple(tensor.shape)
        return int(shape[0]) if shape and shape[0] is not None else None
    return None


def _from_arrays(x, y, sample_weight, reading: "_Reading") -> PreparedData:
    import keras

    class_weight, batch_size, what = reading.class_weight, reading.batch_size, reading.what

    x, y, sample_weight = (_arrays(part) if part is not None else None for part in (x, y, sample_weight))
    for part, name in ((x, "x"), (y, "y"), (sample_weight, "sample_weight")):
        _check_no_objects(part, name, what)
    _check_not_strings(y, "y", what)
    if class_weight is not None:
        if y is None:
            raise DataError("class_weight= needs targets: pass y= (class_weight turns each label into a weight).")
        weights = class_weights_for(y, class_weight)
        sample_weight = weights if sample_weight is None else keras.tree.map_structure(
            lambda w: np.asarray(w, "float32") * weights.reshape((-1,) + (1,) * (np.ndim(w) - 1)), sample_weight)
    elif sample_weight is not None and y is not None and keras.tree.is_nested(y) \
            and not keras.tree.is_nested(sample_weight):
        # Keras's rule: one per-sample weight array applies to every output.
        sample_weight = keras.tree.map_structure(lambda _: sample_weight, y)
    num_samples = _num_samples(x, y, sample_weight, what)
    packed = keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
    # The whole packed structure as `x` makes every element that structure.
    # The endless, stateless stream lets a resumed run replay the exact order.
    dataset = array_dataset(packed, None, batch_size=batch_size, shuffle=bool(reading.shuffle), seed=reading.seed,
                            repeat=reading.repeat)
    # As tensors: NumPy object arrays (pandas strings) have no Keras dtype.
    sample = keras.tree.map_structure(lambda a: first_rows(a, batch_size), packed)
    facts = DataFacts(batch_size=None, num_samples=num_samples, steps_per_epoch=math.ceil(num_samples / batch_size))
    return PreparedData(dataset, facts, _unpack(sample)[0], f"arrays, {num_samples} samples", sample, "arrays")


def _num_samples(x, y, sample_weight, what: str) -> int:
    """The samples the arrays hold; refuses a scalar, no arrays, no samples,
    or arrays that disagree on their number of rows, naming each."""
    import keras

    lengths = {}  # every array's rows, by where it sits ("x['image']")
    for name, part in (("x", x), ("y", y), ("sample_weight", sample_weight)):
        for path, leaf in keras.tree.flatten_with_path(part) if part is not None else []:
            where = name + "".join(f"[{key!r}]" for key in path)
            rows = num_rows(leaf)
            if rows is None:
                raise DataError(f"{what}: {where} is a scalar; it must have one row per sample.")
            lengths[where] = rows
    if not lengths:
        raise DataError(f"{what}: x is empty; pass at least one array.")
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{k} has {v} rows" for k, v in lengths.items())
        raise DataError(f"{what}: the arrays disagree on the number of samples ({detail}); they must match.")
    num_samples = next(iter(lengths.values()))
    if num_samples == 0:
        raise DataError(f"{what} is empty: give at least one sample.")
    return num_samples


def _dataset(dataset, what: str, class_weight=None) -> PreparedData:
    import tensorflow as tf

    if class_weight is not None:
        dataset = dataset.map(_class_weight_map(class_weight), num_parallel_calls=tf.data.AUTOTUNE)
    try:
        first = next(iter(dataset.take(1)))
    except StopIteration:
        raise DataError(f"{what} is an empty tf.data.Dataset: it yields no batch.") from None
    x = _unpack(first)[0]
    batch = _first_dim(x)
    cardinality = int(dataset.cardinality())
    steps = cardinality if cardinality > 0 else None
    if cardinality == tf.data.INFINITE_CARDINALITY:
        detail = "infinite"
    else:
        detail = f"{steps} batches" if steps else "unknown length"
    facts = DataFacts(batch_size=batch, steps_per_epoch=steps)
    return PreparedData(dataset, facts, x, f"tf.data.Dataset, {detail}, batch {batch}", first)


def _from_adapter(x, class_weight, shuffle, what: str) -> PreparedData:
    """A `keras.utils.PyDataset` or a Python generator, through Keras's own adapter."""
    try:
        adapter = _compat.data_adapter(x, class_weight=class_weight, shuffle=bool(shuffle))
    except ValueError as error:
        raise DataError(f"{what}: {error}") from error
    first = _compat.first_batch(adapter)
    _refuse_numpy_strings(first, type(x).__name__, what)
    _compat.call_epoch_hooks(adapter)
    dataset = adapter.get_tf_dataset()
    steps = adapter.num_batches
    first = _compat.tensors(first)
    batch = _first_dim(_unpack(first)[0])
    kind = type(x).__name__
    facts = DataFacts(batch_size=batch, steps_per_epoch=steps)
    sample_inputs = _unpack(first)[0]
    indexed = getattr(adapter, "py_dataset", None) is not None  # a PyDataset, not a generator
    return PreparedData(dataset, facts, sample_inputs,
                        f"{kind}, {f'{steps} batches' if steps else 'unknown length'}, batch {batch}", first,
                        source="python", replayable=indexed, epoch_passes=indexed and steps is not None)


def _refuse_numpy_strings(batch, kind: str, what: str) -> None:
    """Keras's adapter for a `PyDataset` or a generator cannot read NumPy string arrays ("Invalid dtype: str288";
    `model.fit` fails too): named, with the fix."""
    import keras

    strings = [leaf for leaf in keras.tree.flatten(batch) if isinstance(leaf, np.ndarray) and _holds_strings(leaf)]
    if strings:
        raise DataError(
            f"{what}: the {kind} yields NumPy strings ({strings[0].flat[0]!r}, ...), which Keras's adapter for it "
            "cannot read (model.fit fails too): return them as tf.constant(...) from it, or pass the arrays "
            "themselves (x=texts, y=labels).")


def _tfrecords(pattern: str, reading: "_Reading") -> PreparedData:
    from kerasfast import data as kf_data

    dataset = kf_data.tfrecord_dataset(pattern, batch_size=reading.batch_size, shuffle=reading.shuffle,
                                       seed=reading.seed, on_error=reading.on_error)
    info = dataset.kerasfast_info
    prepared = _dataset(dataset, reading.what)
    prepared.facts = DataFacts(batch_size=None, num_samples=info.num_records, steps_per_epoch=info.steps_per_epoch)
    records = f", {info.num_records} records" if info.num_records else ""
    prepared.description = f"TFRecords {pattern}{records}"
    prepared.pipeline = info.settings
    prepared.source = "tfrecords"
    return prepared


def sharded_tfrecord_stream(pattern: str, strategy, *, global_batch_size: int, shuffle: bool, seed: int | None,
                            on_error: str = "raise"):
    """`f(batches_done)` giving a distributed TFRecord stream in which every
    worker reads its own files (kerasfast.data shards by file when there are
    enough, else by record, and says so)."""
    from kerasfast import data as kf_data

    def stream_from(done: int):
        def worker_dataset(context):
            dataset = kf_data.tfrecord_dataset(
                pattern, batch_size=context.get_per_replica_batch_size(global_batch_size), shuffle=shuffle,
                seed=seed, input_context=context, on_error=on_error,
            ).repeat()
            # Each step takes one batch per local replica from this worker's pipeline.
            local_replicas = context.num_replicas_in_sync // context.num_input_pipelines
            return dataset.skip(done * local_replicas) if done else dataset

        return strategy.distribute_datasets_from_function(worker_dataset)

    return stream_from


def prepare_data(x, y=None, sample_weight=None, *, batch_size: int | None, class_weight=None,
                 shuffle=True, seed: int | None = None, what: str = "data", repeat: bool = False,
                 on_error: str = "raise", preprocess=None) -> PreparedData:
    """Normalises `fit`'s data arguments into a batched dataset and describes it.

    Args:
        x: Any data form Keras's `fit` takes as `x`, or a TFRecord file,
            folder or glob pattern written by kerasfast.
        y, sample_weight: Targets and per-sample weights beside array `x`.
        batch_size: Batch size for arrays and TFRecords (None: 32).
        class_weight: `{class index: weight}`, folded into the sample weights.
        shuffle: Shuffle arrays / TFRecords every epoch.
        seed: Shuffle seed.
        what: How to call the data in error messages.
        repeat: For arrays, return an endless, reproducible stream of
            passes (training); other data is repeated by the caller.
        on_error: For TFRecords: "raise" on a damaged record, or "skip" it
            (see `kerasfast.data.tfrecord_dataset`).
        preprocess: The model's own preprocessing, `f(x, y=None,
            sample_weight=None)` on a batch (a keras-hub task's
            `preprocess_samples`): applied once to arrays when it draws no
            random number (`kerasfast.training.preprocessing`), else mapped
            over the batches in the pipeline; None for data the model takes
            as it is.

    Returns:
        A `PreparedData`.

    Raises:
        DataError: For data that cannot be used, naming what is wrong.
    """
    once = _preprocessed_once(x, y, sample_weight, preprocess)
    if once is not None:  # every epoch reads the preprocessed arrays
        x, y, sample_weight, preprocess = once.x, once.y, once.sample_weight, None
    reading = _Reading(batch_size or 32, class_weight, shuffle, seed, what, repeat, on_error, preprocess)

    def remake(new_batch_size: int, **changes) -> PreparedData:
        remade = _prepared(x, y, sample_weight, dataclasses.replace(reading, batch_size=new_batch_size, **changes))
        if once is not None:
            remade.description += f"; {once.description}"
        remade.remake = remake
        return remade

    return remake(reading.batch_size)


def _preprocessed_once(x, y, sample_weight, preprocess):
    """A model's own preprocessing applied to whole arrays before training (`preprocessing.applied_once`), or
    None: no preprocessing, data that are no arrays, or preprocessing to map per batch."""
    if preprocess is None:
        return None
    x, y, sample_weight = unpacked(x, y, sample_weight)
    if isinstance(x, (str, os.PathLike)) or x is None or not _compat.can_convert_arrays((x, y, sample_weight)):
        return None
    from kerasfast.training import preprocessing

    x, y, sample_weight = (_arrays(part) if part is not None else None for part in (x, y, sample_weight))
    return preprocessing.applied_once(x, y, sample_weight, preprocess)


@dataclasses.dataclass(frozen=True)
class _Reading:
    """How `prepare_data` reads and batches (its arguments beside the data)."""

    batch_size: int
    class_weight: object
    shuffle: object
    seed: int | None
    what: str
    repeat: bool
    on_error: str
    preprocess: object = None


def _prepared(x, y, sample_weight, reading: _Reading) -> PreparedData:
    prepared = _read(x, y, sample_weight, reading)
    return _preprocessed(prepared, reading.preprocess) if reading.preprocess is not None else prepared


# Batches the model's own preprocessing works ahead of the step that reads them; its map runs a batch per
# core at once (in order, so a resumed run replays the same batches).
PREPROCESSED_AHEAD = 4


def _preprocessed(prepared: PreparedData, preprocess) -> PreparedData:
    """`prepared` with the model's own preprocessing mapped over its batches (a keras-hub task's preprocessor,
    which `task.fit` maps the same way), in parallel and prefetched; the sample batch is the one the model
    takes."""
    from kerasfast.training import preprocessing

    dataset = prepared.dataset.map(preprocess, num_parallel_calls=os.cpu_count() or 1, deterministic=True)
    sample = _compat.tensors(_apply_to_element(preprocess, _compat.tensors(prepared.sample_batch)))
    remake = prepared.remake
    return dataclasses.replace(
        prepared, dataset=dataset.prefetch(PREPROCESSED_AHEAD), sample_batch=sample, sample_inputs=_unpack(sample)[0],
        description=f"{prepared.description}; {preprocessing.name(preprocess)} in the input pipeline "
                    f"({os.cpu_count() or 1} batches at once, {PREPROCESSED_AHEAD} ahead)",
        remake=remake and (lambda batch_size, **changes: _preprocessed(remake(batch_size, **changes), preprocess)))


def _apply_to_element(function, element):
    """`function` called on a dataset element as `Dataset.map` calls it: a tuple's parts as its arguments."""
    return function(*element) if isinstance(element, tuple) else function(element)


def _read(x, y, sample_weight, reading: _Reading) -> PreparedData:
    import tensorflow as tf

    x, y, sample_weight = unpacked(x, y, sample_weight)
    what, class_weight = reading.what, reading.class_weight
    if isinstance(x, (str, os.PathLike)):
        _no_arrays_beside(x, y, sample_weight, "a TFRecord path")
        prepared = _tfrecords(os.fspath(x), reading)
        if class_weight is not None:
            weighted = _dataset(prepared.dataset, what, class_weight)
            prepared.dataset, prepared.sample_batch = weighted.dataset, weighted.sample_batch
        return prepared
    if isinstance(x, tf.data.Dataset):
        _no_arrays_beside(x, y, sample_weight, "a tf.data.Dataset")
        return _dataset(x, what, class_weight)
    if x is None:
        raise DataError(f"{what}: x is None; pass the training data (arrays, a tf.data.Dataset, a PyDataset, ...).")
    if _compat.can_convert_arrays((x, y, sample_weight)):
        return _from_arrays(x, y, sample_weight, reading)
    import keras

    if isinstance(x, keras.utils.PyDataset) or hasattr(x, "__next__"):
        _no_arrays_beside(x, y, sample_weight, f"a {type(x).__name__}")
        return _from_adapter(x, class_weight, reading.shuffle, what)
    if _compat.can_convert_arrays((x,)):
        for name, value in (("y", y), ("sample_weight", sample_weight)):
            if value is not None and not _compat.can_convert_arrays((value,)):
                raise DataError(f"{what}: {name} of type {type(value).__name__} cannot be read beside the arrays of x "
                                f"(model.fit refuses it too); pass it as an array, e.g. np.asarray({name}).")
    raise DataError(
        f"{what} of type {type(x).__name__} is not supported: pass arrays (NumPy, tensors, pandas; a dict, list or "
        "tuple of them for several inputs), a tf.data.Dataset, a keras.utils.PyDataset, a generator, or a TFRecord "
        "path/pattern."
    )


def _no_arrays_beside(x, y, sample_weight, kind: str) -> None:
    for name, value in (("y", y), ("sample_weight", sample_weight)):
        if value is not None:
            raise DataError(
                f"{name}= cannot be given with {kind} as x (Keras refuses it too): the data must carry its own "
                f"{'targets' if name == 'y' else 'weights'}, e.g. yield (x, y, sample_weight)."
            )


def _input_name(spec) -> str:
    return getattr(spec, "name", "") or ""


def _shapes_compatible(given: tuple, expected: tuple) -> bool:
    if len(given) == len(expected):
        # A dimension unknown on either side (a dataset's element_spec) fits.
        return all(e is None or g is None or e == g for g, e in zip(given[1:], expected[1:], strict=True))
    # Keras's leniency: a (batch,) feature feeds a (None, 1) input, and the reverse.
    if len(given) + 1 == len(expected) and expected[-1] == 1:
        return _shapes_compatible(given + (1,), expected)
    if len(given) == len(expected) + 1 and given[-1] == 1:
        return _shapes_compatible(given[:-1], expected)
    return False


def input_names(model) -> dict:
    """`{name: input}` as Keras matches a dict of data to a model's inputs:
    by the keys of a functional model built on a dict of `keras.Input`s,
    else by the inputs' own names."""
    structure = getattr(model, "_inputs_struct", None)
    if isinstance(structure, dict):
        return dict(structure)
    return {_input_name(spec): spec for spec in model.inputs}


def check_inputs_match(model, sample_inputs, what: str = "data") -> None:
    """Raises `DataError` when a batch's inputs cannot feed `model`'s inputs.

    Only checks what the model declares (`model.inputs`): dicts are matched
    to inputs by name (extra keys are allowed, as in Keras), lists and tuples
    by position.
    """
    import keras

    declared = getattr(model, "inputs", None)
    if not declared:
        return
    if isinstance(sample_inputs, dict):
        named = input_names(model)
        missing = [name for name in named if name not in sample_inputs]
        if missing:
            raise DataError(
                f"{what} is a dict with keys {sorted(sample_inputs)} but model {model.name!r} needs input(s) "
                f"{', '.join(repr(n) for n in missing)}: name the dict's keys after the model's Inputs "
                f"({', '.join(repr(n) for n in named)})."
            )
        pairs = [(sample_inputs[name], spec) for name, spec in named.items()]
    else:
        given = keras.tree.flatten(sample_inputs)
        if len(given) != len(declared):
            raise DataError(
                f"{what} has {len(given)} input array(s) but model {model.name!r} takes {len(declared)} "
                f"({', '.join(_input_name(t) or '?' for t in declared)})."
            )
        pairs = list(zip(given, declared, strict=True))
        _check_input_order(model, given, declared, what)
    for tensor, spec in pairs:
        if hasattr(tensor, "shape") and getattr(tensor.shape, "rank", 0) is None:
            continue  # a dataset's element of unknown rank: nothing to check before it is read
        shape = tuple(tensor.shape) if hasattr(tensor, "shape") else tuple(np.shape(tensor))
        _check_input_dtype(tensor, spec, model, what)
        if 0 in shape[1:]:
            raise DataError(f"{what} has inputs of shape {('batch',) + shape[1:]} for model {model.name!r} input "
                            f"{_input_name(spec)!r}: they hold {NO_VALUES} Leave the input out, or give it values.")
        expected = tuple(spec.shape)
        if not _shapes_compatible(shape, expected):
            if _shapes_compatible((None,) + shape, expected):
                raise DataError(
                    f"{what} yields single samples of shape {shape}, but model {model.name!r} input "
                    f"{_input_name(spec)!r} takes batches of them {('batch',) + expected[1:]}: batch the data "
                    "(e.g. dataset.batch(32)), as Keras expects a tf.data.Dataset to be batched.")
            raise DataError(
                f"{what} has inputs of shape {('batch',) + shape[1:]} but model {model.name!r} input "
                f"{_input_name(spec)!r} expects {('batch',) + expected[1:]}: reshape the data "
                f"(e.g. x.reshape(-1, {', '.join(str(d) for d in expected[1:])})) or change the model's Input."
            )


def _check_input_dtype(tensor, spec, model, what: str) -> None:
    """Refuses strings for an input that takes numbers (a model without its own text layer), with the
    fix; Keras fails in a graph op."""
    expected = str(getattr(spec, "dtype", "") or "")
    dtype = getattr(tensor, "dtype", None)
    strings = _holds_strings(tensor) or str(dtype) in ("string", "<dtype: 'string'>")
    name = _input_name(spec)
    if strings and expected and expected != "string":
        values = tensor.numpy() if hasattr(tensor, "numpy") else tensor if isinstance(tensor, np.ndarray) else None
        example = f" ({values.flat[0]!r}, ...)" if values is not None and values.size else ""
        raise DataError(
            f"{what}: input {name!r} holds strings{example}, but model {model.name!r} takes {expected} "
            "there: turn the text into numbers first (keras.layers.TextVectorization or StringLookup, in the "
            "model or in a tf.data map), or give the model a string Input (keras.Input(..., dtype='string')).")


def _check_input_order(model, given, declared, what: str) -> None:
    """Refuses arrays given by position that fit the model's inputs only in another order (a common slip with
    several inputs), naming that order; any other misfit is named input by input by the caller."""
    from itertools import permutations

    def shape(tensor):
        return tuple(tensor.shape) if hasattr(tensor, "shape") else tuple(np.shape(tensor))

    if len(given) < 2 or len(given) > 6 or any(getattr(getattr(t, "shape", None), "rank", 0) is None for t in given):
        return
    shapes = [shape(t) for t in given]
    expected = [tuple(spec.shape) for spec in declared]
    if all(_shapes_compatible(s, e) for s, e in zip(shapes, expected, strict=True)):
        return
    for order in permutations(range(len(given))):
        if all(_shapes_compatible(shapes[i], e) for i, e in zip(order, expected, strict=True)):
            names = [_input_name(spec) or f"input {k}" for k, spec in enumerate(declared)]
            placed = ", ".join(f"{names[k]!r} {('batch',) + expected[k][1:]} <- your array {i}"
                               for k, i in enumerate(order))
            raise DataError(
                f"{what}'s arrays fit model {model.name!r}'s inputs only in another order: {placed}. Pass them in "
                f"the model's order ({', '.join(map(repr, names))}), or as a dict keyed by those names.")


def check_validation_data(validation_data, model=None) -> None:
    """Refuses `validation_data` that cannot work before any training step,
    with the training data's checks and messages, naming `validation_data`
    (Keras would raise its own error only when the first epoch has trained).

    Arrays (`(x, y[, sample_weight])`, or `x` alone): every array holds one
    row per sample and they agree on the number of samples, the targets are
    not strings, and `x` fits the model's declared inputs. A
    `tf.data.Dataset`: its `element_spec`'s inputs fit the model's declared
    inputs (dimensions the spec leaves unknown are not checked); nothing is
    read. Generators and `PyDataset`s are read only by the evaluation.

    Args:
        validation_data: As Keras's `validation_arguments` give it to `fit`.
        model: The model, or None to check the arrays alone. A model with
            its own `train_step` or `test_step` reads the data its own way:
            its inputs are not checked.

    Raises:
        DataError: Naming `validation_data` and what is wrong.
    """
    import keras
    import tensorflow as tf

    what = "validation_data"
    if validation_data is None or isinstance(validation_data, (str, os.PathLike)):
        return
    if isinstance(validation_data, tf.data.Dataset):
        sample_inputs = _unpack(validation_data.element_spec)[0]
    else:
        try:
            x, y, sample_weight = _unpack(tuple(validation_data) if isinstance(validation_data, list)
                                          else validation_data)
        except ValueError as error:  # a tuple of more than three parts
            raise DataError(f"{what}: {error} Pass (x, y) or (x, y, sample_weight), or a tf.data.Dataset.") from error
        if x is None or not _compat.can_convert_arrays((x, y, sample_weight)):
            return
        x, y, sample_weight = (_arrays(part) if part is not None else None for part in (x, y, sample_weight))
        _check_not_strings(y, "y", what)
        _num_samples(x, y, sample_weight, what)
        sample_inputs = x
    if isinstance(model, keras.Model) and not any(
            _compat.overridden_step(model, method) for method in ("train_step", "test_step")):
        check_inputs_match(model, sample_inputs, what)


def check_sparse_labels(model, y, name: str = "y") -> None:
    """Refuses array labels outside the classes of a model compiled with a sparse categorical loss on one
    output of known width, which TensorFlow reports only when a step meets them (after updates on the
    batches before it; for validation data, after the first epoch has trained).

    Args:
        model: The compiled model.
        y: The labels; anything but an array of numbers is not checked.
        name: How the message names them ("y", "validation_data's y").
    """
    import keras

    from kerasfast.training.data_errors import labels_out_of_range, labels_outside

    loss = getattr(model, "loss", None)
    sparse = (loss == "sparse_categorical_crossentropy" or loss is keras.losses.sparse_categorical_crossentropy
              or isinstance(loss, keras.losses.SparseCategoricalCrossentropy))
    outputs = getattr(model, "outputs", None) or []
    if not sparse or len(outputs) != 1 or not isinstance(outputs[0].shape[-1], int):
        return
    classes = outputs[0].shape[-1]
    if (isinstance(y, np.ndarray) and y.ndim == 2 and len(outputs[0].shape) == 2 and classes > 1
            and y.shape[1] == classes and np.isin(y, (0, 1)).all() and (y.sum(axis=1) == 1).all()):
        raise DataError(
            f"{name} is one-hot (shape {y.shape}, one 1 per row), but the model is compiled with the sparse "
            "categorical crossentropy, which takes class indices: pass y.argmax(axis=1), or compile with "
            "loss='categorical_crossentropy'.")
    where = labels_outside(y, classes, name, getattr(loss, "ignore_class", None))
    if where is not None:
        raise labels_out_of_range(where, classes)


def check_targets(model, sample_batch, what: str = "data") -> None:
    """Raises `DataError` when `model` is compiled with a loss but a batch holds no targets.

    Keras's own step hands the loss `y=None` and fails deep inside it with a
    bare "None values not supported"; a model whose own `compute_loss` may
    do without targets is not checked.

    Args:
        model: The compiled model (Keras's own `train_step`).
        sample_batch: One batch, as the dataset yields it.
        what: How the error names the data.
    """
    import keras

    if getattr(model, "loss", None) is None or _compat.overridden_step(model, "compute_loss") is not None:
        return
    if keras.utils.unpack_x_y_sample_weight(sample_batch)[1] is not None:
        return
    remedy = "y=" if what == "data" else f"{what}=(x, y)"
    raise DataError(
        f"{what} holds inputs only (y=None, or a dataset yielding no targets), but model {model.name!r} is compiled "
        f"with loss={_loss_name(model.loss)}, which compares its outputs with targets: pass {remedy}, or a dataset "
        "of (inputs, targets) pairs. A model whose loss comes only from add_loss() is compiled without loss=.")


def _loss_name(loss) -> str:
    if isinstance(loss, str):
        return repr(loss)
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__


def validation_arguments(validation_data, batch_size, steps, freq, train_data, on_error, preprocess=None) -> dict:
    """Keras's own validation arguments; kerasfast reads TFRecord paths itself, and any data the model's own
    preprocessing (`preprocess`, as in `prepare_data`) maps over."""
    if validation_data is None:
        return {}
    if isinstance(validation_data, (tuple, list)) and len(validation_data) == 1:
        validation_data = validation_data[0]  # Keras reads (x,) as x alone
    if isinstance(validation_data, (tuple, list)) and 2 <= len(validation_data) <= 3:
        validation_data = (_with_string_tensors(validation_data[0]), *validation_data[1:])
    _refuse_endless_validation(validation_data, steps)
    if isinstance(validation_data, (str, os.PathLike)) or steps is not None or preprocess is not None:
        # kerasfast's evaluation runs whole executions until the data ends, so
        # validation_steps is applied to the data itself.
        validation_data = prepare_data(validation_data, batch_size=batch_size or train_data.facts.batch_size,
                                       shuffle=False, what="validation_data", on_error=on_error,
                                       preprocess=preprocess).dataset
        if steps is not None:
            validation_data, steps = first_batches(validation_data, steps), None
    return {"validation_data": validation_data, "validation_steps": steps, "validation_freq": freq,
            "validation_batch_size": batch_size or train_data.facts.batch_size or 32}


def _refuse_endless_validation(validation_data, steps) -> None:
    """An evaluation reads its data to the end: a dataset that repeats forever would never end it (Keras hangs)."""
    import tensorflow as tf

    if steps is None and isinstance(validation_data, tf.data.Dataset) \
            and int(validation_data.cardinality()) == tf.data.INFINITE_CARDINALITY:
        raise PlanError("validation_data repeats forever (e.g. .repeat()) and validation_steps is not given, so the "
                        "first validation would never end: pass validation_steps= (batches per validation), or a "
                        "dataset that ends.")


def first_batches(dataset, steps: int):
    """The first `steps` batches of `dataset`, their count known to Keras.

    Keras warns that "your input ran out of data" whenever an evaluation
    ends on data of unknown length (a generator's), as this one always
    does; with `validation_steps` the length is known, and a generator
    that yields fewer batches fails, naming the count.
    """
    import tensorflow as tf

    first = dataset.take(steps)
    if first.cardinality() == tf.data.UNKNOWN_CARDINALITY:
        first = first.apply(tf.data.experimental.assert_cardinality(steps))
    return first
