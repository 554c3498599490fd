"""Full-integer int8 TFLite that passes verification on transformers.

Int8 activations are fine for convolutions and dense layers, but a few ops
are numerically sensitive: softmax (its outputs span orders of magnitude),
layer normalisation (a mean, a variance and a reciprocal square root on
activations whose range one outlier can stretch), and the logits layer
(whose outputs are the result). Quantised everywhere, a small GPT's logits
drift by up to 4.0 and the artifact fails verification.

`convert_int8_verified` therefore:

1. converts full-integer int8 and checks it against the Keras outputs; if it
   is within the tolerance, that file is kept as is;
2. otherwise measures each op's own quantisation error with TFLite's
   `QuantizationDebugger` (layer statistics: the RMSE between the op's int8
   output and its float output on the same inputs, over the output scale;
   uniform rounding alone gives 1/sqrt(12) = 0.29), and takes each Keras
   layer's error as its worst op's;
3. keeps whole layers in float (selective quantisation: their ops are
   denylisted, everything else stays int8), the largest error first, one
   more at a time, until the file verifies (at most a quarter of the layers);
4. if no such selection verifies, tries 16-bit activations with int8 weights
   (16x8 mode) for the whole graph (TFLite's 16x8 mode cannot calibrate
   integer inputs such as token ids, so it only serves float-input models).

On the GPT recipe the attention layer of the first block is the one kept in
float: its activation-by-activation matmuls (q.k and weights.v) measure
rmse/scale 6.8 and 2.5, and quantising that layer alone moves the logits by
5.0, while any other layer alone moves them by at most 0.5.

The report says which it was: `ArtifactReport.notes` names the layers kept
in float with their measured error and why, `ArtifactReport.quantization`
holds the same as data.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
import warnings

import numpy as np
import tensorflow as tf

from kerasfast.errors import ExportError
from kerasfast.export.litert import LiteRTModel
from kerasfast.export.tflite import convert_saved_model

# Uniform rounding to a step `scale` has RMSE scale/sqrt(12).
ROUNDING_RMSE_OVER_SCALE = 1.0 / math.sqrt(12.0)
# Ops the debugger measures on at most this many inputs (it runs the float
# and the quantised graph op by op, in Python: slow for long sequences).
DEBUG_SAMPLES = 8
# Layers kept in float at most (or a quarter of the model's, if more).
MAX_FLOAT_LAYERS = 4

_SENSITIVE = {
    "SOFTMAX": "softmax: outputs span orders of magnitude",
    "LOG_SOFTMAX": "softmax: outputs span orders of magnitude",
    "MEAN": "layer normalisation statistic",
    "SQUARED_DIFFERENCE": "layer normalisation statistic",
    "RSQRT": "layer normalisation: reciprocal square root of a variance",
    "BATCH_MATMUL": "attention scores / weighted values (activation x activation)",
}


@dataclasses.dataclass
class Int8Choice:
    """The int8 file chosen and how.

    Attributes:
        content: The .tflite bytes.
        mode: "int8" (everything int8), "int8+float" (the layers in `kept`
            stayed float) or "16x8" (16-bit activations, int8 weights).
        kept: One dict per layer kept in float: `layer`, `ops` (op types),
            `rmse_over_scale` (its worst op's int8 error) and `why`.
        max_abs_diff: Largest |output - Keras| of the chosen file.
        full_int8_max_abs_diff: The same for full int8 (what was rejected).
        tried: One line per attempt, in order.
    """

    content: bytes
    mode: str
    kept: list
    max_abs_diff: float
    full_int8_max_abs_diff: float
    tried: list

    def note(self) -> str:
        """One line for the report's notes."""
        if self.mode == "int8":
            return ""
        first = (f"full int8 was off by {self.full_int8_max_abs_diff:.3g} (over the tolerance)")
        if self.mode == "16x8":
            return f"{first}: 16-bit activations, int8 weights (16x8) for every op"
        layers = "; ".join(f"{row['layer']} ({'/'.join(row['ops'])}): {row['why']}" for row in self.kept)
        return f"{first}: kept in float: {layers}; every other layer int8"

    def to_dict(self) -> dict:
        return {"mode": self.mode, "kept_in_float": self.kept, "full_int8_max_abs_diff": self.full_int8_max_abs_diff,
                "tried": self.tried}


def _max_diff(content, comparison, reference) -> float:
    outputs = LiteRTModel(content).predict(comparison)
    if outputs.shape != reference.shape or not np.all(np.isfinite(outputs)):
        return float("inf")
    return float(np.max(np.abs(outputs - reference)))


def _converter(saved_model_dir, calibration):
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]

    def representative_dataset():
        for sample in calibration:
            yield [sample[None, ...]]

    converter.representative_dataset = representative_dataset
    return converter


def _layer_of(tensor_name: str, known_layer_names) -> str:
    # "functional_1/layer_normalization_1/moments/mean" -> "layer_normalization"
    known = set(known_layer_names)
    for part in tensor_name.split(";")[0].split("/")[1:]:
        candidate = part
        while True:
            if candidate in known:
                return candidate
            if not re.search(r"_\d+$", candidate):
                break
            candidate = re.sub(r"_\d+$", "", candidate)
    return tensor_name.split(";")[0].split("/")[1] if "/" in tensor_name else tensor_name


def per_op_errors(saved_model_dir, calibration, debug_inputs, known_layer_names=()) -> list[dict]:
    """Each quantised op's own error, largest first.

    Runs TFLite's `QuantizationDebugger` on `debug_inputs`: every op is run
    on the (dequantised) quantised inputs in float and in int8, and the RMSE
    between the two outputs over the output's quantisation scale is its
    error (0.29 is rounding alone).

    Returns:
        One dict per op: `op`, `tensor`, `layer`, `rmse_over_scale`, `why`.
    """
    converter = _converter(saved_model_dir, calibration)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]

    def debug_dataset():
        for sample in debug_inputs:
            yield [sample[None, ...]]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice
        debugger = tf.lite.experimental.QuantizationDebugger(converter=converter, debug_dataset=debug_dataset)
        debugger.run()
    buffer = io.StringIO()
    debugger.layer_statistics_dump(buffer)
    buffer.seek(0)
    rows = []
    for position, row in enumerate(csv.DictReader(buffer)):
        scale = float(row["scale"] or 0)
        mse = float(row["mean_squared_error"] or 0)
        if scale <= 0 or not math.isfinite(mse):
            continue
        op = row["op_name"]
        rows.append({"op": op, "index": position, "tensor": row["tensor_name"], "layer": _layer_of(row["tensor_name"], known_layer_names),
                     "rmse_over_scale": math.sqrt(mse) / scale,
                     "why": _SENSITIVE.get(op, "large int8 error measured")})
    rows.sort(key=lambda r: r["rmse_over_scale"], reverse=True)
    return rows


def _selective(saved_model_dir, calibration, denied: list[str]) -> bytes:
    converter = _converter(saved_model_dir, calibration)
    options = tf.lite.experimental.QuantizationDebugOptions(denylisted_nodes=list(denied))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        debugger = tf.lite.experimental.QuantizationDebugger(
            converter=converter, debug_dataset=lambda: iter(()), debug_options=options)
        return debugger.get_nondebug_quantized_model()


def _int16_activations(saved_model_dir, calibration) -> bytes:
    converter = _converter(saved_model_dir, calibration)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    return converter.convert()


_NORM_OPS = {"MEAN", "SQUARED_DIFFERENCE", "RSQRT"}
_ATTENTION_OPS = {"SOFTMAX", "LOG_SOFTMAX", "BATCH_MATMUL", "SELECT", "SELECT_V2"}
_MATMUL_OPS = {"FULLY_CONNECTED", "BATCH_MATMUL", "CONV_2D", "DEPTHWISE_CONV_2D", "CONV_3D"}


def layer_errors(ops: list[dict], norm_layers=()) -> list[dict]:
    """Each Keras layer's int8 error (the largest of its ops'), largest first.

    Args:
        ops: `per_op_errors` rows.
        norm_layers: Names of the model's normalisation layers.

    Returns:
        One dict per layer: `layer`, `rmse_over_scale`, `ops` (its rows) and
        `why`: what makes it sensitive (attention: softmax and
        activation-by-activation matmuls; layer normalisation; the logits
        layer, whose outputs are the result; otherwise the measured error).
    """
    by_layer: dict[str, list] = {}
    for row in sorted(ops, key=lambda r: r["index"]):
        by_layer.setdefault(row["layer"], []).append(row)
    last_matmul_layer = None
    for row in sorted(ops, key=lambda r: r["index"]):
        if row["op"] in _MATMUL_OPS:
            last_matmul_layer = row["layer"]
    norm_layers = set(norm_layers)
    layers = []
    for name, rows in by_layer.items():
        kinds = {row["op"] for row in rows}
        worst = max(row["rmse_over_scale"] for row in rows)
        if kinds & _ATTENTION_OPS:
            why = "attention: int8 scores and weights (softmax, activation x activation matmuls)"
        elif name in norm_layers or kinds & _NORM_OPS:
            why = "layer normalisation: mean, variance and 1/sqrt on int8 activations"
        elif name == last_matmul_layer:
            why = "the logits layer: its outputs are the result"
        else:
            why = "largest int8 error measured"
        layers.append({"layer": name, "rmse_over_scale": worst, "ops": rows,
                       "why": f"{why} (rmse/scale {worst:.2f}; rounding alone is {ROUNDING_RMSE_OVER_SCALE:.2f})"})
    layers.sort(key=lambda layer: layer["rmse_over_scale"], reverse=True)
    return layers


def convert_int8_verified(saved_model_dir: str, calibration: np.ndarray, comparison: np.ndarray,
                          reference: np.ndarray, allowed: float, *, int8_input_output: bool = False,
                          allow_flex_ops: bool = False, known_layer_names=(), norm_layers=()) -> Int8Choice:
    """Full-integer int8, keeping the ops whose int8 error breaks verification in float.

    Args:
        saved_model_dir: The SavedModel to convert.
        calibration: Representative inputs (int8 ranges).
        comparison: Inputs the file is checked on.
        reference: The Keras model's outputs on `comparison`.
        allowed: Largest |output - reference| that verifies.
        int8_input_output, allow_flex_ops, known_layer_names: As in
            `convert_saved_model`.
        norm_layers: Names of the model's normalisation layers.

    Returns:
        An `Int8Choice`; with `int8_input_output` only full int8 is tried
        (a float op next to int8 inputs and outputs defeats the purpose).

    Raises:
        ExportError: When no variant verifies (each attempt named).
    """
    content = convert_saved_model(saved_model_dir, "int8", representative_inputs=calibration,
                                  int8_input_output=int8_input_output, allow_flex_ops=allow_flex_ops,
                                  known_layer_names=known_layer_names)
    full_error = _max_diff(content, comparison, reference)
    tried = [f"int8 everywhere: max |diff| {full_error:.3g} (allowed {allowed:.3g})"]
    if full_error <= allowed or int8_input_output:
        return Int8Choice(content, "int8", [], full_error, full_error, tried)

    ops = per_op_errors(saved_model_dir, calibration, comparison[:DEBUG_SAMPLES], known_layer_names)
    layers = layer_errors(ops, norm_layers)
    # Whole layers go to float, the largest measured error first, until the
    # file verifies; at most a quarter of the layers (or MAX_FLOAT_LAYERS).
    limit = min(len(layers), max(MAX_FLOAT_LAYERS, len(layers) // 4))
    for count in range(1, limit + 1):
        chosen = layers[:count]
        denied = [row["tensor"] for layer in chosen for row in layer["ops"]]
        label = ", ".join(layer["layer"] for layer in chosen)
        try:
            candidate = _selective(saved_model_dir, calibration, denied)
            error = _max_diff(candidate, comparison, reference)
        except Exception as problem:  # a selection the converter or LiteRT refuses: try a larger one
            tried.append(f"{label} in float: failed ({str(problem).strip().splitlines()[0][:200]})")
            continue
        tried.append(f"{label} in float: max |diff| {error:.3g}")
        if error <= allowed:
            kept = [{"layer": layer["layer"], "ops": sorted({row["op"] for row in layer["ops"]}),
                     "rmse_over_scale": layer["rmse_over_scale"], "why": layer["why"]} for layer in chosen]
            return Int8Choice(candidate, "int8+float", kept, error, full_error, tried)
    try:
        candidate = _int16_activations(saved_model_dir, calibration)
        error = _max_diff(candidate, comparison, reference)
    except Exception as problem:
        tried.append(f"16x8: failed ({str(problem).strip().splitlines()[0][:200]})")
    else:
        tried.append(f"16x8: max |diff| {error:.3g}")
        if error <= allowed:
            return Int8Choice(candidate, "16x8", [], error, full_error, tried)
    raise ExportError("tflite_int8: no int8 variant is within the verification tolerance; tried " + "; ".join(tried)
                      + ". Export 'tflite_dynamic_int8' (int8 weights, float activations) instead.")
