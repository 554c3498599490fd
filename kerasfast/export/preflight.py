"""Checks run before an export writes anything: formats, model, data."""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import inspect
import numbers
import os
import re

import keras
import numpy as np
import tensorflow as tf

from kerasfast import _compat
from kerasfast.data.messages import tf_error_text
from kerasfast.errors import DataError, ExportError
from kerasfast.export.formats import DEFAULT_FORMATS, FORMATS

# Formats that serve a model whose input is a string tensor: TFLite has
# string tensors and builtin hash-table lookups (StringLookup converts), but
# int8 calibration needs numeric inputs, and tf2onnx's lookup-table support
# is not verified here.
STRING_INPUT_FORMATS = ("keras", "saved_model", "saved_model_int8", "tflite_float32", "tflite_dynamic_int8",
                        "tflite_float16")

# Layers Keras's model.quantize("int8") converts; everything else with
# weights stays in float (Keras only warns, per layer).
KERAS_INT8_LAYER_TYPES = (keras.layers.Dense, keras.layers.EinsumDense, keras.layers.Embedding)


@dataclasses.dataclass(frozen=True)
class ModelSignature:
    """The single input and output of an exportable model."""

    input_shape: tuple  # without the batch dimension
    input_dtype: str
    output_shape: tuple

    def tensor_spec(self):
        return tf.TensorSpec((None, *self.input_shape), self.input_dtype)

    @property
    def takes_strings(self) -> bool:
        # Keras names the dtype "string", which NumPy does not know.
        return self.input_dtype == "string"


def resolve_formats(formats, has_representative_data: bool) -> list[str]:
    """Validated list of format names (defaults when `formats` is None)."""
    if formats is None:
        chosen = list(DEFAULT_FORMATS) + (["tflite_int8"] if has_representative_data else [])
    else:
        chosen = [formats] if isinstance(formats, str) else list(formats)
        if not chosen:
            raise ExportError(f"formats is empty; pass one or more of {sorted(FORMATS)}.")
    unknown = [name for name in chosen if name not in FORMATS]
    if unknown:
        raise ExportError(f"Unknown export format(s) {unknown}. Known formats: {', '.join(FORMATS)}.")
    missing_data = [n for n in chosen if FORMATS[n].needs_representative_data and not has_representative_data]
    if missing_data:
        raise ExportError(
            f"{missing_data} calibrates activation ranges and needs representative_data=... "
            "(a few hundred training inputs, shaped like the model input)."
        )
    return list(dict.fromkeys(chosen))


def check_positive_int(value, argument: str) -> int:
    """`value` as an int, refusing anything but a positive integer."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ExportError(f"{argument} must be a positive integer (a number of samples); got {value!r}.")
    return int(value)


def check_model_object(model) -> None:
    """Refuses a path or other non-model passed as the model."""
    if isinstance(model, (str, os.PathLike)):
        raise ExportError(
            f"model must be a keras.Model object, not the path {str(model)!r}; load it first: "
            f"model = keras.models.load_model({str(model)!r}), then export that."
        )
    if not isinstance(model, keras.Model):
        raise ExportError(
            f"model must be a built keras.Model (Functional or Sequential); got {type(model).__name__}."
        )


def model_signature(model) -> ModelSignature:
    """Input/output shapes of a built single-input, single-output model."""
    if not getattr(model, "built", False):
        raise ExportError("The model is not built; call it on a batch or build it before exporting.")
    inputs = getattr(model, "inputs", None)
    outputs = getattr(model, "outputs", None)
    if not inputs or not outputs:
        raise ExportError(
            f"Cannot read the input signature of {type(model).__name__}: export needs a Functional or "
            "Sequential model (with an Input) so the serving signature and TFLite shapes are known."
        )
    if len(inputs) != 1 or len(outputs) != 1:
        raise ExportError(
            f"The model has {len(inputs)} inputs and {len(outputs)} outputs; kerasfast export handles "
            "single-input, single-output models."
        )
    input_shape = tuple(inputs[0].shape[1:])
    return ModelSignature(input_shape, str(inputs[0].dtype), tuple(outputs[0].shape[1:]))


def _first_line(error) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


# Keras highlights the real reason of a failed call() in bold.
_KERAS_BOLD = re.compile(r"\x1b\[1m(.*?)\x1b\[0m", re.S)
_EXCEPTION_LINE = re.compile(r"^\s*[A-Za-z_][\w.]*(Error|Exception): ")
_INVALID_SCOPE = re.compile(r"'(.*)' is not a valid (?:root )?scope name")


def _trace_reason(error) -> str:
    """The line saying why tracing failed.

    Errors raised inside a tf.function start with "in user code:" and a
    traceback; the reason is Keras's highlighted text, else the traceback's
    last exception line.
    """
    text = str(error)
    bold = _KERAS_BOLD.search(text)
    if bold:
        return " ".join(bold.group(1).split())[:300].rstrip(".")
    exception_lines = [line.strip() for line in text.splitlines() if _EXCEPTION_LINE.match(line)]
    if text.strip().startswith("in user code:") and exception_lines:
        return exception_lines[-1][:300].rstrip(".")
    return _first_line(error)


@contextlib.contextmanager
def _keeping_keras_name_scopes():
    """Restores Keras's name-scope stack after a failed trace.

    When TensorFlow rejects a scope name (e.g. a layer named "out layer"),
    Keras's name_scope has already pushed itself and never pops: every
    later model built in the process would get that prefix, and fail too.
    """
    try:
        from keras.src.backend.common import global_state
    except ImportError:  # pragma: no cover - another Keras layout
        yield
        return
    depth = len(global_state.get_global_attribute("name_scope_stack") or [])
    try:
        yield
    finally:
        stack = global_state.get_global_attribute("name_scope_stack")
        if stack:
            del stack[depth:]


def check_traceable(model, signature: ModelSignature, formats) -> None:
    """Refuses models a SavedModel/TFLite export cannot trace into a graph.

    Raises:
        ExportError: naming the first layer that fails to trace.
    """
    with _keeping_keras_name_scopes():
        _check_traceable(model, signature, formats)


def _check_traceable(model, signature: ModelSignature, formats) -> None:
    graph_formats = [f for f in formats if f != "keras"]
    if not graph_formats:
        return
    try:
        tf.function(lambda x: model(x, training=False)).get_concrete_function(signature.tensor_spec())
        return
    except Exception as model_error:  # find the layer to name
        culprit, reason = None, _trace_reason(model_error)
        for layer in model.layers:
            layer_inputs = getattr(layer, "input", None)
            if layer_inputs is None or isinstance(layer, keras.layers.InputLayer):
                continue
            specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), layer_inputs)
            try:
                _trace_layer(layer, specs)
            except Exception as layer_error:
                culprit, reason = layer, _trace_reason(layer_error)
                break
        where = f"layer '{culprit.name}' ({type(culprit).__name__})" if culprit else "the model"
        invalid_name = _INVALID_SCOPE.search(reason)
        if invalid_name:
            raise ExportError(
                f"The name '{invalid_name.group(1)}' (of {where if culprit else 'the model or one of its layers'}) "
                f"is not a valid TensorFlow scope name, so none of the formats {graph_formats} can export it: "
                "names may hold only letters, digits and _ . / > -. Build the model with that name changed (e.g. "
                f"'{re.sub(r'[^A-Za-z0-9_.>/-]', '_', invalid_name.group(1))}'), or export with formats=['keras'] "
                "only."
            ) from model_error
        raise ExportError(
            f"{where} cannot be traced into a TensorFlow graph, so none of the formats {graph_formats} can "
            f"export it: {reason}. Write its call() with keras.ops / TensorFlow ops (no NumPy or Python "
            "values taken from tensors), or export with formats=['keras'] only."
        ) from model_error


def _trace_layer(layer, specs) -> None:
    """Traces `layer` alone on `specs`, raising what tracing raises."""
    if _accepts_training(layer):
        tf.function(lambda *a: layer(*a, training=False)).get_concrete_function(specs)
    else:
        tf.function(lambda *a: layer(*a)).get_concrete_function(specs)


def _accepts_training(layer) -> bool:
    import inspect

    try:
        return "training" in inspect.signature(layer.call).parameters
    except (TypeError, ValueError):
        return False


def check_keras_serializable(model, *, safe_mode: bool = True) -> None:
    """Refuses models whose layers could not be loaded back from `.keras`.

    Besides unregistered classes and missing `get_config()`, each layer is
    rebuilt from its config as `keras.saving.load_model(...,
    safe_mode=safe_mode)` would, so a Lambda holding a Python lambda
    (refused in safe mode) or a `get_config()` missing an `__init__`
    argument is named here, before any artifact is built.
    """
    problems = []
    custom_objects = keras.saving.get_custom_objects()
    for layer in _compat.flatten_layers(model, include_self=True):
        cls = type(layer)
        builtin = cls.__module__.startswith("keras.")
        registered = keras.saving.get_registered_name(cls) in custom_objects
        if not (builtin or registered):
            problems.append(f"'{layer.name}' ({cls.__name__}: not registered)")
            continue
        try:
            layer.get_config()
        except NotImplementedError:
            problems.append(f"'{layer.name}' ({cls.__name__}: get_config() not implemented)")
    if problems:
        raise ExportError(
            f"The 'keras' format cannot save layers {problems} so that they load again. Decorate each "
            "class with @keras.saving.register_keras_serializable() and give it a get_config(), or drop "
            "'keras' from formats."
        )
    # Layer by layer, not the whole model: rebuilding builds weights, and one
    # layer's at a time is cheap even for a large model.
    for layer in _compat.flatten_layers(model):
        if isinstance(layer, (keras.layers.InputLayer, keras.Model)):
            continue
        try:
            _config_round_trip(layer, safe_mode)
        except Exception as error:
            where = f"layer '{layer.name}' ({type(layer).__name__})"
            if safe_mode and isinstance(layer, keras.layers.Lambda):
                raise ExportError(
                    f"The 'keras' format would write a file that cannot be loaded back: {where} holds a Python "
                    "lambda, which keras.saving.load_model refuses by default (safe_mode) since loading runs its "
                    "code. Replace it with a registered custom layer, pass unsafe_deserialization=True (CLI: "
                    "--unsafe-deserialization) if you trust the code, or drop 'keras' from formats."
                ) from error
            raise ExportError(
                f"The 'keras' format would write a file that cannot be loaded back: {where} cannot be rebuilt "
                f"from its config ({_innermost_reason(error)}). Make its get_config() return every argument its "
                "__init__ needs (and its from_config() rebuild any nested layer), or drop 'keras' from formats."
            ) from error


def _innermost_reason(error) -> str:
    # Keras wraps the real failure (e.g. "__init__() missing 1 required
    # positional argument") in "Exception encountered:" layers of advice.
    text = str(error)
    marker = "Exception encountered: "
    if marker in text:
        return text.rsplit(marker, 1)[1].strip().splitlines()[0][:300]
    return _first_line(error)


def _config_round_trip(obj, safe_mode: bool) -> None:
    """Rebuilds `obj` from its serialized config, as loading a `.keras` file does."""
    config = keras.saving.serialize_keras_object(obj)
    keras.saving.deserialize_keras_object(config, safe_mode=safe_mode)


def check_keras_int8_quantizable(model) -> list[str]:
    """Names of the layers Keras int8 quantisation would leave in float.

    Raises:
        ExportError: if no layer at all can be quantised.
    """
    layers = _compat.flatten_layers(model)
    quantizable = [l for l in layers if isinstance(l, KERAS_INT8_LAYER_TYPES)]
    left_in_float = [
        l.name for l in layers
        if l.weights and not isinstance(l, KERAS_INT8_LAYER_TYPES) and not isinstance(l, keras.Model)
    ]
    if not quantizable:
        raise ExportError(
            f"'saved_model_int8' uses Keras model.quantize('int8'), which only converts Dense, EinsumDense "
            f"and Embedding layers, and this model has none (layers with weights: {left_in_float}). "
            "Use 'tflite_int8' or 'tflite_dynamic_int8' instead."
        )
    return left_in_float


def _ndim(value) -> int:
    try:
        return np.ndim(value)
    except ValueError:  # ragged nested lists
        return -1


def _dataset_batches(dataset, argument: str, sample_rank: int, limit: int, *, with_labels: bool):
    """(input batches, label batches) of a dataset, up to about `limit` samples.

    A dataset not yet batched (`from_tensor_slices` without `.batch(n)`)
    yields single samples; each is taken as a batch of one.
    """
    xs, ys, count = [], [], 0
    for element in dataset:
        parts = element if isinstance(element, (tuple, list)) else (element,)
        if with_labels and len(parts) < 2:
            raise DataError(f"{argument} dataset must yield (x, y) pairs (batched or single samples).")
        if with_labels and len(parts) > 2:
            raise DataError(f"{argument} dataset yields {len(parts)} parts, (x, y, sample_weight): export's "
                            "evaluation does not weight samples, and would report an unweighted accuracy; yield "
                            "(x, y), e.g. dataset.map(lambda x, y, w: (x, y)).")
        x = np.asarray(_single_input(parts[0], argument))
        single = x.ndim == sample_rank
        xs.append(x[None, ...] if single else x)
        if with_labels:
            ys.append(np.asarray(parts[1])[None, ...] if single else np.asarray(parts[1]))
        count += len(xs[-1]) if xs[-1].ndim else 1
        if count >= limit:
            break
    if not xs:
        raise DataError(f"{argument} is an empty dataset; pass a few hundred input samples.")
    return xs, ys


def _concatenate(batches, argument: str) -> np.ndarray:
    try:
        return np.concatenate(batches)
    except ValueError as error:
        shapes = sorted({tuple(b.shape[1:]) for b in batches})[:3]
        raise DataError(
            f"{argument}'s batches hold samples of different shapes {shapes}; pad them to one shape "
            "(e.g. dataset.padded_batch(n)) or pass one array."
        ) from error


def _single_input(x, argument: str):
    """The model's one input of `x`: a dict of one entry (a functional model's inputs by name) gives its value."""
    if not isinstance(x, dict):
        return x
    if len(x) != 1:
        raise DataError(f"{argument} is a dict of {len(x)} inputs ({', '.join(map(str, x))}); export takes "
                        "models of one input.")
    return next(iter(x.values()))


def _generated_batches(data, argument: str, sample_rank: int, limit: int) -> list:
    """Input batches of a generator, or of a function returning one (TFLite's `representative_dataset`:
    each item a list holding a batch), up to about `limit` samples."""
    if callable(data):
        try:
            parameters = inspect.signature(data).parameters.values()
        except (TypeError, ValueError):  # a built-in without a signature Python can read
            parameters = []
        required = [p for p in parameters
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if required:
            raise DataError(f"{argument} is a function of {len(required)} argument(s) ({required[0].name}, ...); "
                            "pass one that takes none and yields batches (TFLite's representative_dataset form).")
        data = data()
    try:
        items = iter(data)
    except TypeError as error:
        raise DataError(f"{argument} is a function that returned {type(data).__name__}, not samples; pass an "
                        "array of inputs, a tf.data.Dataset, or a generator of batches.") from error
    xs, count = [], 0
    for item in items:
        # (x, y) pairs, and TFLite's one-batch lists; a list of several samples is the samples themselves.
        if isinstance(item, tuple) or (isinstance(item, list) and item
                                       and (len(item) == 1 or _ndim(item[0]) > sample_rank)):
            item = item[0]
        x = np.asarray(_single_input(item, argument))
        xs.append(x[None, ...] if x.ndim == sample_rank else x)
        count += len(xs[-1]) if xs[-1].ndim else 1
        if count >= limit:
            break
    if not xs:
        raise DataError(f"{argument} yielded no samples; pass a few hundred input samples.")
    return xs


def _take_inputs(data, limit, argument, sample_rank):
    """First `limit` input samples of arrays / (x, y) tuples / datasets / generators of batches."""
    if data is None:
        return None
    if isinstance(data, tf.data.Dataset):
        xs, _ = _dataset_batches(data, argument, sample_rank, limit, with_labels=False)
        return _concatenate(xs, argument)[:limit]
    if callable(data) or isinstance(data, collections.abc.Iterator):
        return _concatenate(_generated_batches(data, argument, sample_rank, limit), argument)[:limit]
    # A tuple, or a list starting with a whole batch, is (x, y); any other
    # list (e.g. x.tolist()) holds the samples themselves.
    if isinstance(data, tuple) or (isinstance(data, list) and data and _ndim(data[0]) > sample_rank):
        data = data[0]
    data = _single_input(data, argument)
    try:
        array = np.asarray(data)
    except Exception as error:
        raise DataError(f"{argument} cannot be read as an array: {error}") from error
    return array[:limit]


def check_inputs(data, signature: ModelSignature, *, argument: str, limit: int) -> np.ndarray | None:
    """Validates and converts input samples to the model's input dtype.

    Raises:
        DataError: empty data, wrong shape or wrong kind of dtype.
    """
    array = _take_inputs(data, limit, argument, len(signature.input_shape))
    if array is None:
        return None
    if array.ndim == 0 or len(array) == 0:
        raise DataError(f"{argument} holds no samples; pass a few hundred inputs shaped like {signature.input_shape}.")
    sample_shape = array.shape[1:]
    expected = signature.input_shape
    compatible = len(sample_shape) == len(expected) and all(
        e is None or int(e) == int(s) for e, s in zip(expected, sample_shape, strict=True)
    )
    if not compatible:
        raise DataError(
            f"{argument} samples have shape {tuple(sample_shape)} but the model input is "
            f"{tuple(expected)} (batch dimension first, then exactly these). Reshape the data, e.g. "
            f"x.reshape(-1, {', '.join(str(d) for d in expected)})."
        )
    if signature.takes_strings:
        return _check_strings(array, argument)
    want = np.dtype(signature.input_dtype)
    if array.dtype.kind not in ("f", "i", "u", "b") or (want.kind == "f") != (array.dtype.kind == "f"):
        raise DataError(
            f"{argument} has dtype {array.dtype} but the model input is {want}; pass "
            f"{'floating-point' if want.kind == 'f' else 'integer'} data (e.g. x.astype('{want}'))."
        )
    array = array.astype(want)
    if want.kind == "f" and not np.all(np.isfinite(array)):
        raise DataError(f"{argument} contains NaN or infinite values.")
    return array


def _check_strings(array, argument: str) -> np.ndarray:
    """`array` as an object array of str/bytes, for a model whose input is a string tensor."""
    if array.dtype.kind == "O":
        bad = next((value for value in array.flat if not isinstance(value, (str, bytes))), None)
        if bad is not None:
            raise DataError(f"{argument} holds {type(bad).__name__} value {bad!r} but the model input is a string "
                            "tensor; pass str or bytes values (e.g. np.array([...], dtype=object)).")
    elif array.dtype.kind not in ("U", "S"):
        raise DataError(f"{argument} has dtype {array.dtype} but the model input is a string tensor; pass text "
                        "(str or bytes) values.")
    return array.astype(object)


def predicted(model, x, batch_size: int = 64) -> np.ndarray:
    """`model.predict` on `x`, as the one output array of a single-output model.

    Keras refuses NumPy text arrays (not string tensors) as input, and a
    single output may be declared as a dict or a one-element list.
    """
    outputs = model.predict(tf.constant(x) if x.dtype == object else x, verbose=0, batch_size=batch_size)
    if isinstance(outputs, dict):
        (outputs,) = outputs.values()
    elif isinstance(outputs, (list, tuple)):
        (outputs,) = outputs
    return np.asarray(outputs)


def check_string_input_formats(signature: ModelSignature, formats) -> None:
    """Refuses formats that cannot take a string input tensor, naming those that can.

    Full-integer int8 calibrates on numeric inputs; ONNX is not offered for
    them (see `STRING_INPUT_FORMATS`).
    """
    if not signature.takes_strings:
        return
    refused = [name for name in formats if name not in STRING_INPUT_FORMATS]
    if refused:
        raise ExportError(
            f"The model input is a string tensor, which {refused} cannot take; export it with formats="
            f"{list(STRING_INPUT_FORMATS)}, or move the text preprocessing (e.g. StringLookup, TextVectorization) "
            "out of the model and export the model that takes its integer ids."
        )


def calibrated_formats(formats) -> list[str]:
    """The formats among `formats` whose int8 ranges are calibrated on representative_data."""
    return [name for name in formats if FORMATS[name].calibrated]


def check_calibration_spread(samples, formats) -> None:
    """Refuses representative data that cannot calibrate int8 ranges.

    One sample, or samples that are all the same (e.g. all zeros), give
    activation ranges that clip every other input; checked on those very
    samples, the file would still look exact.

    Raises:
        DataError: naming the formats that calibrate and what is wrong.
    """
    calibrated = calibrated_formats(formats)
    if samples is None or not calibrated:
        return
    if len(samples) < 2:
        raise DataError(
            f"representative_data holds 1 sample, which cannot calibrate {calibrated}: int8 ranges taken from one "
            "input clip other inputs, and no sample is left to verify the file on. Pass a few hundred training "
            "inputs."
        )
    if np.all(samples == samples[:1]):
        what = "all zeros" if not np.any(samples) else "one input repeated"
        raise DataError(
            f"representative_data's {len(samples)} samples are all identical ({what}), which cannot calibrate "
            f"{calibrated}: int8 ranges taken from them clip every real input. Pass a few hundred real training "
            "inputs."
        )


def split_held_out(samples, calibration_limit: int, count: int):
    """`(calibration, held_out)`: representative samples to calibrate on, and others to verify on.

    Samples beyond `calibration_limit` are held out first; with no more than
    that, the last quarter (at most `count`, at least one) is.
    """
    if len(samples) > calibration_limit:
        return samples[:calibration_limit], samples[calibration_limit:calibration_limit + count]
    held = min(count, max(1, len(samples) // 4))
    return samples[:-held], samples[-held:]


def check_eval_data(eval_data, signature: ModelSignature, limit: int = 100_000):
    """`(x, y)` arrays from `eval_data` (tuple or dataset of (x, y))."""
    if eval_data is None:
        return None
    if isinstance(eval_data, tf.data.Dataset):
        xs, ys = _dataset_batches(eval_data, "eval_data", len(signature.input_shape), limit, with_labels=True)
        x, y = _concatenate(xs, "eval_data"), _concatenate(ys, "eval_data labels")
    elif isinstance(eval_data, (tuple, list)) and len(eval_data) == 2:
        x, y = np.asarray(_single_input(eval_data[0], "eval_data x")), np.asarray(eval_data[1])
    else:
        raise DataError("eval_data must be an (x, y) tuple of arrays or a tf.data.Dataset of (x, y) batches.")
    x = check_inputs(x[:limit], signature, argument="eval_data x", limit=limit)
    y = y[:limit]
    if len(y) != len(x):
        raise DataError(f"eval_data has {len(x)} inputs but {len(y)} labels.")
    if y.dtype.kind not in ("f", "i", "u", "b"):
        raise DataError(
            f"eval_data's labels have dtype {y.dtype} (e.g. {str(y.flat[0])!r}); pass them as the model was trained "
            "on them: integer class ids or one-hot rows (map label names to ids first, e.g. with "
            "np.unique(y, return_inverse=True))."
        )
    return x, y


def _input_embeddings(model) -> list:
    """Embedding layers fed the model input directly: its values are their ids."""
    source = model.inputs[0]
    found = []
    for layer in model.layers:
        try:
            if isinstance(layer, keras.layers.Embedding) and layer.input is source:
                found.append(layer)
        except (AttributeError, ValueError):  # a layer shared across calls has no single input
            continue
    return found


def check_token_ids(model, array, argument: str) -> None:
    """Refuses ids outside the vocabulary of an Embedding the input feeds.

    TensorFlow would fail deep inside the gather (on CPU) or silently return
    zeros (on GPU); both hide which data was wrong.
    """
    if array is None or array.dtype.kind not in ("i", "u"):
        return
    for layer in _input_embeddings(model):
        bad = (array < 0) | (array >= layer.input_dim)
        if np.any(bad):
            position = tuple(int(i) for i in np.argwhere(bad)[0])
            raise DataError(
                f"{argument} holds token id {array[position]} (sample {position[0]}) outside the vocabulary of "
                f"Embedding layer '{layer.name}' (input_dim={layer.input_dim}: ids 0 to {layer.input_dim - 1}). "
                "Map out-of-vocabulary tokens to an id below input_dim, or pass data tokenised with the "
                "vocabulary the model was built for."
            )


def _check_class_ids(labels: np.ndarray, width: tuple) -> None:
    """Refuses integer labels, one per output row, outside the outputs' classes (the accuracy would count
    them wrong without a word)."""
    classes = width[-1] if width else 1
    if classes < 2 or not np.issubdtype(labels.dtype, np.integer) or labels.size * classes != labels.shape[0] * int(
            np.prod(width)):
        return
    outside = np.flatnonzero(((labels < 0) | (labels >= classes)).reshape(len(labels), -1).any(axis=1))
    if len(outside):
        value = labels.reshape(len(labels), -1)[outside[0]]
        value = value[(value < 0) | (value >= classes)][0]
        raise DataError(
            f"eval_data's labels hold class id {value} at sample {outside[0]} ({len(outside)} sample(s) in all), "
            f"but the model has {classes} outputs (class ids 0..{classes - 1}): pass the labels the model was "
            "trained on (shift ids that start at 1: y - 1).")


def check_eval_labels(model, evaluation, loss_fn, chunk: int = 8192) -> None:
    """Refuses eval labels the model's compiled loss cannot take (one-hot rows
    for a sparse loss, class ids for a categorical one, ids beyond the outputs),
    before anything is written: the loss is computed on uniform outputs of the
    model's output shape, so the model itself runs on one sample only."""
    if evaluation is None:
        return
    x, y = evaluation
    width = predicted(model, x[:1]).shape[1:]
    if loss_fn is None:  # no loss to judge them by: class ids, at least, must name one of the outputs
        _check_class_ids(np.asarray(y), width)
        return
    for start in range(0, len(y), chunk):
        labels = y[start:start + chunk]
        uniform = np.full((len(labels), *width), 1.0 / max(1, int(np.prod(width[-1:]))), np.float32)
        try:
            loss_fn(labels, uniform)
        except (ValueError, TypeError, tf.errors.InvalidArgumentError) as error:
            first = tf_error_text(error)[:300]
            raise DataError(
                f"eval_data's labels (shape {tuple(np.shape(y))}, dtype {np.asarray(y).dtype}) do not fit the model's "
                f"loss {getattr(loss_fn, 'name', None) or getattr(loss_fn, '__name__', type(loss_fn).__name__)} on outputs of shape (batch, "
                f"{', '.join(map(str, width))}): {first}. Pass labels as the model was trained on them (class ids "
                f"below {width[-1] if width else '?'} for a sparse loss, one-hot rows for a categorical one)."
            ) from error

