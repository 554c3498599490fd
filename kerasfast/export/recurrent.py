"""Recurrent models (LSTM, GRU, SimpleRNN, Bidirectional) in .tflite files.

Keras runs a recurrent layer as a `tf.while_loop` over the time steps that
collects its outputs in TensorLists. With the batch size unknown, the lists'
element shape is not static, and the TFLite converter cannot lower them to
builtin ops: it asks for the Flex ops `TensorListReserve`, ... Traced with
a fixed batch of 1 (TensorFlow's documented recipe for RNNs in TFLite) the
shapes are static, the lists become plain tensors and the loop a builtin
`WHILE`: every op is builtin, and the file takes one sample per call (input
shape `[1, ...]`). Measured with TensorFlow 2.21 on Embedding+LSTM, GRU,
Bidirectional(LSTM)+SimpleRNN and masked models: float32, float16 and
dynamic-range int8 files match Keras to 1e-6 (float16: 1e-4).

Full-integer int8 cannot keep the loop: TFLite's int8 calibrator crashes
the whole process (a segmentation fault, nothing Python can catch) on the
`WHILE` loop of a recurrent layer (tensorflow/tensorflow#75140, since TF
2.14). `tflite_int8` is therefore converted from the model traced with its
recurrent layers unrolled (`unroll=True`: one copy of the cell per time
step, no loop), which Keras can only do for a fixed number of time steps;
otherwise, or when a loop is left that is not a Keras recurrent layer, it
is refused before calibration, naming the layer.

Both traces set the layers' `unroll` and `use_cudnn` (cuDNN's fused kernel
is no TFLite op, and Keras picks it whenever a GPU is visible) for the time
of the trace only; the model is left as it was.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import keras
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from kerasfast import _compat
from kerasfast.errors import ExportError
from kerasfast.export.tflite import _layer_name

_LOOP_OPS = ("While", "StatelessWhile")
_CALIBRATOR_BUG = "TFLite's int8 calibrator crashes on WHILE loops (tensorflow/tensorflow#75140)"
_INSTEAD = "Export 'tflite_dynamic_int8' (int8 weights) or 'tflite_float16' instead"


def recurrent_layers(model) -> list:
    """Every `keras.layers.RNN` in `model`, a Bidirectional's two included."""
    return [layer for layer in _compat.flatten_layers(model) if isinstance(layer, keras.layers.RNN)]


def recurrent_layer_names(model) -> list[str]:
    """Names of the model's looping recurrent layers as the user knows them (a Bidirectional, not its halves).

    Layers built with `unroll=True` hold no loop and do not count.
    """
    layers = _compat.flatten_layers(model)
    halves = {id(half) for layer in layers if isinstance(layer, keras.layers.Bidirectional)
              for half in (layer.forward_layer, layer.backward_layer)}
    names = []
    for layer in layers:
        if isinstance(layer, keras.layers.Bidirectional):
            if not (layer.forward_layer.unroll and layer.backward_layer.unroll):
                names.append(layer.name)
        elif isinstance(layer, keras.layers.RNN) and id(layer) not in halves and not layer.unroll:
            names.append(layer.name)
    return names


def fixed_batch_reason(layer_names, *, tensor_list: bool = False) -> str:
    """Why the .tflite files take one sample per call, for the report."""
    if tensor_list:
        what = f"layer(s) {', '.join(layer_names) or 'of the model'} loop over TensorLists, which"
    else:
        what = f"recurrent layer(s) {', '.join(layer_names)}"
    return f"{what} convert to builtin TFLite ops (a WHILE loop) only with a fixed batch size"


FIXED_BATCH_NOTE = "input batch 1 (one sample per call)"
UNROLLED_NOTE = f"recurrent layers unrolled (one cell per time step, no loop): {_CALIBRATOR_BUG}"


@contextlib.contextmanager
def traced_as(model, *, unroll: bool):
    """Sets every recurrent layer's `unroll` (and `use_cudnn=False`) while tracing; restores them after."""
    saved = [(layer, layer.unroll, getattr(layer, "use_cudnn", None)) for layer in recurrent_layers(model)]
    try:
        for layer, _, use_cudnn in saved:
            layer.unroll = unroll or layer.unroll
            if use_cudnn is not None:
                layer.use_cudnn = False
        yield
    finally:
        for layer, unrolled, use_cudnn in saved:
            layer.unroll = unrolled
            if use_cudnn is not None:
                layer.use_cudnn = use_cudnn


def export_fixed_batch(model, input_shape, input_dtype, path: Path, *, unroll: bool = False) -> None:
    """Writes a SavedModel of `model` whose input takes exactly one sample.

    Args:
        model: the (float32) model the .tflite files are converted from.
        input_shape: one sample's shape (no batch dimension).
        input_dtype: the input dtype.
        path: the SavedModel folder to write.
        unroll: unroll the recurrent layers (for full-integer int8).

    Raises:
        ExportError: `unroll` and a recurrent layer has no fixed number of
            time steps (named).
    """
    spec = tf.TensorSpec((1, *input_shape), input_dtype)
    try:
        with traced_as(model, unroll=unroll):
            model.export(str(path), format="tf_saved_model", verbose=False, input_signature=[spec])
    except ValueError as error:
        if not (unroll and "Cannot unroll" in str(error)):
            raise
        raise ExportError(
            f"tflite_int8: recurrent layer(s) {recurrent_layer_names(model)} run over a variable number of time "
            f"steps (model input {tuple(input_shape)}). Full-integer int8 needs them unrolled, since {_CALIBRATOR_BUG}, "
            "and Keras unrolls only a fixed number of time steps: give the model a fixed sequence length "
            "(keras.Input((length, ...))), or export 'tflite_dynamic_int8' (int8 weights) or 'tflite_float16'."
        ) from error


def loop_layers(saved_model_dir, known_layer_names=()) -> list[str]:
    """The layers whose graph in the SavedModel holds a while loop (read from saved_model.pb)."""
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((Path(saved_model_dir) / "saved_model.pb").read_bytes())
    known, names = set(known_layer_names), set()
    for graph in proto.meta_graphs:
        nodes = list(graph.graph_def.node) + [n for f in graph.graph_def.library.function for n in f.node_def]
        for node in nodes:
            if node.op in _LOOP_OPS:
                # e.g. "sequential_1/bidirectional_1/forward_lstm_1/while" -> "bidirectional"
                parts = node.name.split("/")
                names.add(_layer_name(parts[1], known) if len(parts) >= 3 else node.name)
    return sorted(names)


def check_int8_calibratable(saved_model_dir, known_layer_names=()) -> None:
    """Refuses, before calibration crashes the process, a graph that still holds a loop.

    Raises:
        ExportError: naming the layers that hold a while loop.
    """
    looping = loop_layers(saved_model_dir, known_layer_names)
    if looping:
        raise ExportError(
            f"tflite_int8: layer(s) {looping} run a while loop, and {_CALIBRATOR_BUG} (the process would "
            f"be killed), so no full-integer int8 file can be made. Keras recurrent layers are unrolled for "
            f"int8; other loops cannot be. {_INSTEAD}."
        )


def is_tensor_list_failure(error) -> bool:
    """Whether a conversion failed only on TensorList ops (a loop over a batch of unknown size)."""
    ops = [op for op in getattr(error, "unsupported_ops", []) if op != "Const"]
    return bool(ops) and all(op.startswith("TensorList") for op in ops)
