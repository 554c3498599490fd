"""SavedModel -> .tflite conversion, with errors that name the ops at fault."""

from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from kerasfast._quiet import filtered_stderr
from kerasfast.errors import ExportError


def _layer_name(scope: str, known_layer_names) -> str:
    # Tracing a model more than once suffixes its name scopes ("dense_1");
    # map them back to the layer's own name when it is known.
    candidate = scope
    while candidate not in known_layer_names and re.search(r"_\d+$", candidate):
        candidate = re.sub(r"_\d+$", "", candidate)
    return candidate if candidate in known_layer_names else scope


def _unsupported_ops(error, known_layer_names=()) -> tuple[list[str], list[str]]:
    """(op names, layer names) the converter could not lower to builtins."""
    text = str(error)
    ops = []
    for match in re.finditer(r"(?:Flex ops|Custom ops): ([^\n]+)", text):
        ops += [op.strip() for op in match.group(1).split(",") if op.strip()]
    layers = []
    for component in getattr(error, "errors", []) or []:
        if getattr(component.operator, "name", ""):
            ops.append(component.operator.name.removeprefix("tf."))
        for call in component.location.call:
            # e.g. "functional_1/lambda_1/erfinv/Erfinv@__inference..." -> "lambda_1"
            parts = call.name.split("@")[0].split("/")
            if len(parts) >= 3:
                layers.append(_layer_name(parts[1], set(known_layer_names)))
    return sorted(set(ops)), sorted(set(layers))


def convert_saved_model(
    saved_model_dir: str,
    kind: str,
    *,
    representative_inputs: np.ndarray | None = None,
    int8_input_output: bool = False,
    allow_flex_ops: bool = False,
    known_layer_names=(),
) -> bytes:
    """Converts a SavedModel to a .tflite flatbuffer.

    Args:
        saved_model_dir: SavedModel with a `serving_default` signature.
        kind: "float32", "dynamic_int8", "int8" or "float16".
        representative_inputs: calibration inputs (required for "int8").
        int8_input_output: for "int8", take int8 inputs and give int8
            outputs (quantisation parameters are in the tensor details).
        allow_flex_ops: also allow TensorFlow (Flex) ops; such files need
            the Flex delegate to run.
        known_layer_names: the model's layer names, to name the layer at
            fault in errors.

    Returns:
        The .tflite file contents.

    Raises:
        ExportError: the model needs ops outside the allowed op sets (named).
    """
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir)
    builtins = tf.lite.OpsSet.TFLITE_BUILTINS_INT8 if kind == "int8" else tf.lite.OpsSet.TFLITE_BUILTINS
    converter.target_spec.supported_ops = [builtins] + ([tf.lite.OpsSet.SELECT_TF_OPS] if allow_flex_ops else [])
    if kind in ("dynamic_int8", "int8", "float16"):
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if kind == "float16":
        converter.target_spec.supported_types = [tf.float16]
    if kind == "int8":
        calibration = np.asarray(representative_inputs)

        def representative_dataset():
            for sample in calibration:
                yield [sample[None, ...]]

        converter.representative_dataset = representative_dataset
        if int8_input_output:
            converter.inference_input_type = tf.int8
            converter.inference_output_type = tf.int8
    try:
        # The converter's C++ notices ("fully_quantize: 0, ...", SavedModel
        # loading) go straight to file descriptor 2; on failure all of it is
        # shown, unless the error below names the ops (its cause holds the
        # converter's own account, which it printed as MLIR diagnostics).
        with filtered_stderr(explained=lambda error: bool(_unsupported_ops(error, known_layer_names)[0])):
            return converter.convert()
    except Exception as error:
        ops, layers = _unsupported_ops(error, known_layer_names)
        if ops:
            where = f" (in layer(s) {layers})" if layers else ""
            hint = (
                "Replace them with ops that have TFLite builtin kernels"
                + ("" if allow_flex_ops else ", or pass allow_flex_ops=True (the file then needs the Flex delegate)")
            )
            if kind == "int8":
                hint += "; for full-integer int8 every op also needs an int8 kernel (try 'tflite_dynamic_int8')"
            unsupported = ExportError(
                f"TFLite {kind} conversion needs ops that are not TFLite builtins: {ops}{where}. {hint}."
            )
            # For callers that retry differently (kerasfast.export.recurrent.is_tensor_list_failure).
            unsupported.unsupported_ops, unsupported.layers = ops, layers
            raise unsupported from error
        raise ExportError(f"TFLite {kind} conversion failed: {str(error).strip().splitlines()[0][:500]}") from error
