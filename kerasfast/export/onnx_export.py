"""ONNX artifacts: the model converted by tf2onnx, run in ONNX Runtime.

- "onnx": the model's `call` traced for its input signature (dynamic batch
  dimension), frozen, and converted with tf2onnx (opset chosen by tf2onnx).
  Keras's own `model.export(format="onnx")` does the same but lets tf2onnx
  freeze the function, which leaves constants the layers captured (e.g.
  `Normalization(mean=..., variance=...)`) as extra graph inputs nothing
  feeds; TensorFlow's own freezing folds them in. Ops tf2onnx lacks but ONNX
  can express exactly are taught to it (`_add_missing_handlers`: `Erfc`, from
  exact GELU). TensorFlow's freezing lowers a recurrent layer's loop
  (LSTM, GRU) to TF1 loop primitives around TensorList ops, which tf2onnx
  cannot map; such a graph is converted again frozen the way tf2onnx
  freezes it (loops kept as functions: an ONNX `LSTM` op or a `Loop`), with
  only the model input as input. kerasfast checks the result before ONNX
  Runtime sees it:
  tf2onnx does not fail on a TensorFlow op it has no ONNX mapping for, it
  logs an error and writes the TensorFlow op into the graph, giving a file
  no runtime can load. Such ops are named, with the layer they come from,
  in an `ExportError`.
- "onnx_int8": the "onnx" file quantised by `onnxruntime.quantization`:
  static QDQ quantisation (integer weights per channel, held to 7 bits so
  that CPUs without VNNI do not saturate; int8 activations) calibrated on
  the representative data when the export has some, else dynamic
  quantisation (7-bit weights, activations quantised at run time),
  also used when static int8 strays beyond the tolerance (transformers).
  The report's notes say which, and why.

`OnnxModel` runs a file in ONNX Runtime on the CPU with one thread (so its
latency compares with LiteRT's, also measured with one thread).

Needs the `onnx` extra: `pip install 'kerasfast[onnx]'` (tf2onnx, onnx,
onnxruntime).
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from kerasfast import _compat
from kerasfast._quiet import filtered_stderr
from kerasfast.errors import ExportError

_INSTALL_HINT = "pip install 'kerasfast[onnx]' (tf2onnx, onnx and onnxruntime)"


def check_available() -> None:
    """Raises ExportError, before anything is written, when the ONNX packages are missing."""
    missing = []
    for module in ("tf2onnx", "onnx", "onnxruntime"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ExportError(f"ONNX export needs {', '.join(missing)}: {_INSTALL_HINT}.")


def _layer_name(node_name: str, known_layer_names) -> str | None:
    # e.g. "sequential_1_1/erfinv_layer_1/erfinv/Erfinv" -> "erfinv_layer"
    # (tracing suffixes name scopes with _1, _2, ...).
    known = set(known_layer_names)
    for scope in node_name.split("/")[1:-1]:
        candidate = scope
        while candidate not in known and re.search(r"_\d+$", candidate):
            candidate = re.sub(r"_\d+$", "", candidate)
        if candidate in known:
            return candidate
    return None


def unsupported_ops(model_proto, known_layer_names=()) -> tuple[list[str], list[str]]:
    """(op types, layer names) of nodes of the standard ONNX domain that ONNX
    does not define at the model's opset: TensorFlow ops tf2onnx could not map."""
    import onnx

    opset = next((o.version for o in model_proto.opset_import if o.domain in ("", "ai.onnx")), None)
    ops, layers = set(), set()
    graphs = [model_proto.graph]
    while graphs:  # subgraphs of Loop/If/Scan too
        graph = graphs.pop()
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    graphs.append(attribute.g)
                elif attribute.type == onnx.AttributeProto.GRAPHS:
                    graphs.extend(attribute.graphs)
            if node.domain not in ("", "ai.onnx"):
                continue  # contrib domains (com.microsoft): ONNX Runtime decides below
            known = (
                onnx.defs.has(node.op_type, opset, node.domain) if opset is not None
                else onnx.defs.has(node.op_type, node.domain)
            )
            if not known:
                ops.add(node.op_type)
                layer = _layer_name(node.name, known_layer_names)
                if layer:
                    layers.add(layer)
    return sorted(ops), sorted(layers)


def _convert(model, target: Path, keep_control_flow: bool = False) -> None:
    """Traces, freezes and converts `model` with tf2onnx.

    By default with TensorFlow's own freezing, which folds captured constants
    and lowers control flow to TF1 loop primitives. With `keep_control_flow`,
    frozen as tf2onnx's `from_function` (Keras's `model.export(format="onnx")`)
    freezes it: `While`/`If` kept as functions, which tf2onnx's LSTM/GRU
    rewriters and its Loop conversion understand; only the model input is
    named an input, so captured constants are folded, not left unfed.
    """
    import tensorflow as tf
    import tf2onnx
    from tf2onnx import tf_loader

    _compat.patch_tf2onnx()
    (model_input,) = model.inputs
    spec = tf.TensorSpec((None, *model_input.shape[1:]), model_input.dtype, name="inputs")
    traced = tf.function(lambda inputs: model(inputs, training=False), input_signature=[spec])
    concrete = traced.get_concrete_function()
    if keep_control_flow:
        input_names = [concrete.inputs[0].name]
        output_names = [t.name for t in concrete.outputs]
        graph_def = tf_loader.from_function(concrete, input_names, output_names)
    else:
        frozen = _compat.freeze(concrete)
        graph_def = frozen.graph.as_graph_def()
        input_names, output_names = [t.name for t in frozen.inputs], [t.name for t in frozen.outputs]
    tf2onnx.convert.from_graph_def(graph_def, input_names=input_names, output_names=output_names,
                                   output_path=str(target))


_HANDLERS_ADDED = []


def _add_missing_handlers() -> None:
    """Teaches tf2onnx the TensorFlow ops Keras layers emit that it has no
    mapping for, each rewritten into ONNX ops exactly:

    - `Erfc` (exact GELU, `keras.activations.gelu(approximate=False)`):
      erfc(x) = 1 - erf(x), and ONNX has `Erf` since opset 9.
    """
    if _HANDLERS_ADDED:
        return
    from tf2onnx import utils
    from tf2onnx.handler import tf_op

    @tf_op("Erfc")
    class Erfc:  # noqa: F841 - registered by the decorator
        @classmethod
        def version_9(cls, ctx, node, **kwargs):
            dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
            node.type = "Erf"
            one = ctx.make_const(utils.make_name(f"{node.name}_one"), np.array(1, dtype=dtype))
            erf = node.output[0]
            ctx.insert_new_node_on_output("Sub", erf, name=utils.make_name(f"{node.name}_erfc"),
                                          inputs=[one.output[0], erf])

    _HANDLERS_ADDED.append(Erfc)


def _convert_quietly(model, target: Path, keep_control_flow: bool = False) -> None:
    """`_convert`, with tf2onnx's logging and chatter kept out of the user's output."""
    tf2onnx_logger, tf_logger = logging.getLogger("tf2onnx"), logging.getLogger("tensorflow")
    previous_levels = tf2onnx_logger.level, tf_logger.level
    # tf2onnx logs each op it cannot map (with a traceback); the error below
    # names them. Its freezing calls TF1 functions TensorFlow logs as deprecated.
    tf2onnx_logger.setLevel(logging.CRITICAL)
    tf_logger.setLevel(max(tf_logger.getEffectiveLevel(), logging.ERROR))
    # Importing tf2onnx.convert sets TF_CPP_MIN_LOG_LEVEL=3 for the whole
    # process; the user's (or kerasfast's) value is put back afterwards.
    log_level = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    try:
        # The graph optimiser tf2onnx runs prints "Starting new session"
        # lines that ignore TF_CPP_MIN_LOG_LEVEL: filtered like start-up chatter.
        with filtered_stderr(), warnings.catch_warnings():
            # Keras's tf2onnx numpy-2 patch touches np.object (a FutureWarning).
            warnings.simplefilter("ignore", FutureWarning)
            _convert(model, target, keep_control_flow)
    except Exception as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:500]
        raise ExportError(f"ONNX conversion (tf2onnx) failed: {first}") from error
    finally:
        tf2onnx_logger.setLevel(previous_levels[0])
        tf_logger.setLevel(previous_levels[1])
        if log_level is None:
            os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
        else:
            os.environ["TF_CPP_MIN_LOG_LEVEL"] = log_level


def _retry_keeping_control_flow(model, target: Path, known_layer_names) -> bool:
    """Converts again with control flow kept as functions (see `_convert`);
    True, with `target` replaced, when that file has only ONNX ops.

    TensorFlow's freezing lowers a recurrent layer's `While` loop to TF1
    loop primitives around TensorList ops, a pattern tf2onnx cannot map;
    kept as a function, tf2onnx writes an ONNX LSTM op or a Loop.
    """
    import onnx

    retry = target.with_name(f".{target.name}.control-flow")
    try:
        _convert_quietly(model, retry, keep_control_flow=True)
        if unsupported_ops(onnx.load(str(retry)), known_layer_names)[0]:
            return False
        os.replace(retry, target)
        return True
    except ExportError:
        return False
    finally:
        retry.unlink(missing_ok=True)


def export_onnx(model, target: Path, known_layer_names=()) -> None:
    """Writes `model` (float32, one input) as ONNX to `target` via tf2onnx.

    A graph whose frozen form holds ops ONNX cannot express (the TensorList
    ops of a recurrent layer's loop) is converted again with its control
    flow kept, as Keras's own ONNX export does (see `_convert`).

    Raises:
        ExportError: naming the TensorFlow ops (and their layers) ONNX cannot
            express, or with the first line of the converter's error.
    """
    import onnx

    check_available()
    _add_missing_handlers()
    _convert_quietly(model, target)
    ops, layers = unsupported_ops(onnx.load(str(target)), known_layer_names)
    if ops and not _retry_keeping_control_flow(model, target, known_layer_names):
        where = f" (in layer(s) {layers})" if layers else ""
        raise ExportError(
            f"ONNX cannot express the TensorFlow op(s) {ops}{where}: tf2onnx has no ONNX mapping for them. "
            "Write that part of the model with ops ONNX has (keras.ops equivalents), or leave 'onnx' "
            "and 'onnx_int8' out of formats."
        )


class _Calibration:
    """onnxruntime CalibrationDataReader over an array, one sample per batch."""

    def __init__(self, input_name: str, samples: np.ndarray):
        self._feeds = iter([{input_name: samples[i : i + 1]} for i in range(len(samples))])

    def get_next(self):
        return next(self._feeds, None)

    def rewind(self):  # pragma: no cover - only used by some calibration methods
        raise NotImplementedError


def _preprocessed(float_path: Path, folder: Path) -> Path:
    """The file after onnxruntime's recommended pre-quantisation pass (shape
    inference, graph optimisation); the file itself if that pass fails.

    Without it onnxruntime.quantization warns through `logging.warning`,
    which configures the root logger of the user's process.
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process

    target = folder / "preprocessed.onnx"
    try:
        # Symbolic shape inference would need sympy; Keras's exports have static shapes but the batch.
        quant_pre_process(str(float_path), str(target), skip_symbolic_shape=True)
        return target
    except Exception:  # optional step: quantise the exported file as it is
        return float_path


def quantize_int8(float_path: Path, target: Path, calibration: np.ndarray | None, *, comparison=None,
                  reference=None, tolerance: float | None = None) -> str:
    """Writes the int8 version of the ONNX file `float_path` to `target`.

    Static int8 (activations calibrated on `calibration`) first; when its
    outputs on `comparison` stray from `reference` by more than `tolerance`
    (transformers: attention's activation-by-activation matmuls and softmax
    lose too much in int8), dynamic int8 instead: int8 weights, activations
    quantised per batch at run time.

    Returns:
        A note for the report saying how it was quantised, and why.
    """
    with tempfile.TemporaryDirectory(prefix="kerasfast-onnx-") as scratch:
        source = _preprocessed(Path(float_path), Path(scratch))
        how = _quantize(source, Path(target), calibration)
        if calibration is None or comparison is None or reference is None or tolerance is None:
            return how
        difference = float(np.max(np.abs(OnnxModel(target).predict(comparison) - reference)))
        if difference <= tolerance:
            return how
        dynamic = _quantize(source, Path(target), None)
        return (f"{dynamic.split(' (')[0]} (7-bit weights, activations quantised per batch at run time): static int8 "
                f"strayed by {difference:.3g} from the float model (allowed {tolerance:.3g})")


# On x86 CPUs without VNNI, ONNX Runtime's int8 matmul (VPMADDUBSW) saturates the
# 16-bit sums of 8-bit products, which moved a trained digits MLP's outputs by 0.14
# on an AVX2 EPYC; with 7-bit weights the sums cannot saturate, so a file keeps its
# accuracy on whichever CPU runs it.
_SEVEN_BIT_WEIGHTS = True

_ONNX_INPUT_DTYPES = {"tensor(float)": np.float32, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
                      "tensor(float16)": np.float16, "tensor(double)": np.float64, "tensor(uint8)": np.uint8}


def _quantize(source: Path, target: Path, calibration) -> str:
    import onnxruntime
    from onnxruntime import quantization

    try:
        if calibration is None or len(calibration) == 0:
            quantization.quantize_dynamic(str(source), str(target), weight_type=quantization.QuantType.QInt8,
                                          reduce_range=_SEVEN_BIT_WEIGHTS)
            return "onnxruntime dynamic int8 (7-bit weights; no representative_data to calibrate activations)"
        session = onnxruntime.InferenceSession(str(source), providers=["CPUExecutionProvider"])
        model_input = session.get_inputs()[0]
        # The input's own dtype: token ids stay integers ("tensor(int32)").
        dtype = _ONNX_INPUT_DTYPES.get(model_input.type, np.float32)
        reader = _Calibration(model_input.name, np.asarray(calibration, dtype=dtype))
        quantization.quantize_static(
            str(source),
            str(target),
            reader,
            quant_format=quantization.QuantFormat.QDQ,
            activation_type=quantization.QuantType.QInt8,
            weight_type=quantization.QuantType.QInt8,
            per_channel=True,
            reduce_range=_SEVEN_BIT_WEIGHTS,
        )
        return (
            f"onnxruntime static int8 (QDQ, per-channel 7-bit weights, activations calibrated on "
            f"{len(calibration)} representative samples)"
        )
    except ExportError:
        raise
    except Exception as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:500]
        raise ExportError(f"ONNX int8 quantisation (onnxruntime.quantization) failed: {first}") from error


class OnnxModel:
    """An .onnx file in ONNX Runtime (CPU), called like a Keras model.

    Args:
        path: the .onnx file.
        num_threads: intra-op threads (1, like the LiteRT latency).
    """

    def __init__(self, path, num_threads: int = 1):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors come back as exceptions
        try:
            self._session = onnxruntime.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as error:
            raise ExportError(f"ONNX Runtime cannot load {Path(path).name}: {str(error).strip()[:500]}") from error
        (self._input,) = self._session.get_inputs()
        self._dtype = np.float32 if self._input.type == "tensor(float)" else None

    def _run(self, batch):
        if self._dtype is not None:
            batch = batch.astype(self._dtype, copy=False)
        try:
            return self._session.run(None, {self._input.name: batch})[0]
        except Exception as error:
            raise ExportError(f"ONNX Runtime failed to run the model: {str(error).strip()[:500]}") from error

    def predict(self, x: np.ndarray, batch_size: int = 64) -> np.ndarray:
        """Outputs for all of `x`, in batches of `batch_size`."""
        return np.concatenate(
            [np.asarray(self._run(x[i : i + batch_size]), dtype=np.float32) for i in range(0, len(x), batch_size)]
        )

    def latency_ms_per_sample(self, sample: np.ndarray, *, warmup: int = 5, min_runs: int = 30, budget_s: float = 0.5):
        """Median milliseconds of one batch-1 run."""
        batch = np.ascontiguousarray(sample[None, ...])
        for _ in range(warmup):
            self._run(batch)
        timings, started = [], time.perf_counter()
        while len(timings) < min_runs or (time.perf_counter() - started < budget_s and len(timings) < 2000):
            tick = time.perf_counter()
            self._run(batch)
            timings.append(time.perf_counter() - tick)
        return float(np.median(timings) * 1000.0)
