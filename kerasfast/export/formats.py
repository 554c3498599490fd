"""The export formats kerasfast knows, by name."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ExportFormat:
    """One artifact kind: its name, file name in out_dir and a description."""

    name: str
    filename: str
    description: str
    is_tflite: bool = False
    is_onnx: bool = False
    needs_representative_data: bool = False
    # Calibrates activation ranges on representative_data (when given), so it
    # must be verified on other inputs than the calibration samples.
    calibrated: bool = False


FORMATS: dict[str, ExportFormat] = {
    f.name: f
    for f in [
        ExportFormat("keras", "model.keras", "Keras native .keras file"),
        ExportFormat("saved_model", "saved_model", "TensorFlow SavedModel, serving signature 'serving_default'"),
        ExportFormat(
            "saved_model_int8",
            "saved_model_int8",
            "SavedModel of the model after Keras model.quantize('int8') (Dense/EinsumDense/Embedding only)",
        ),
        ExportFormat("tflite_float32", "model_float32.tflite", "TFLite, float32 weights and math", is_tflite=True),
        ExportFormat(
            "tflite_dynamic_int8",
            "model_dynamic_int8.tflite",
            "TFLite, int8 weights, float activations (dynamic-range quantisation)",
            is_tflite=True,
        ),
        ExportFormat(
            "tflite_int8",
            "model_int8.tflite",
            "TFLite, full integer int8 weights and activations, calibrated on representative data",
            is_tflite=True,
            needs_representative_data=True,
            calibrated=True,
        ),
        ExportFormat("tflite_float16", "model_float16.tflite", "TFLite, float16 weights", is_tflite=True),
        ExportFormat(
            "onnx",
            "model.onnx",
            "ONNX (tf2onnx, on the frozen model), float32, run in ONNX Runtime",
            is_onnx=True,
        ),
        ExportFormat(
            "onnx_int8",
            "model_int8.onnx",
            "ONNX int8 by onnxruntime.quantization: static QDQ calibrated on representative data, "
            "else dynamic (int8 weights)",
            is_onnx=True,
            calibrated=True,
        ),
    ]
}

# tflite_int8 joins the defaults only when representative data is given.
DEFAULT_FORMATS = ("keras", "saved_model", "tflite_float32", "tflite_dynamic_int8", "tflite_float16")
