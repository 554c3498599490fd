"""`export_model`: every requested artifact, verified, with a report, each written atomically."""

from __future__ import annotations

import dataclasses
import shutil
import warnings
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from kerasfast.compress.pruning import overall_sparsity
from kerasfast.errors import ExportError
from kerasfast.export import onnx_export, preflight
from kerasfast.export.atomic import REPORT_NAMES, check_destination, check_writable_destination, staged_export
from kerasfast.export.evaluation import classification_accuracy, loss_value, model_loss_fn
from kerasfast.export.formats import FORMATS
from kerasfast.export.int8_selection import convert_int8_verified
from kerasfast.export.litert import LiteRTModel
from kerasfast.export.precision import float32_copy, is_mixed_precision
from kerasfast.export.report import ArtifactReport, artifact_sizes, markdown_table, write_report
from kerasfast.export.tflite import convert_saved_model

# Largest |artifact - Keras| allowed, as a fraction of the largest |Keras
# output|. Float formats must match closely; quantised ones only have to be
# in the right range (their real quality shows in the accuracy column).
_TOLERANCE = {
    "keras": 1e-5,
    "saved_model": 1e-4,
    "tflite_float32": 1e-3,
    "tflite_float16": 2e-2,
    "tflite_dynamic_int8": 0.5,
    "tflite_int8": 0.5,
    "saved_model_int8": 0.5,
    "onnx": 1e-4,
    "onnx_int8": 0.5,
}


# Layers whose ops full int8 may keep in float (see int8_selection).
_NORMALIZATION_LAYERS = (keras.layers.LayerNormalization, keras.layers.GroupNormalization,
                         keras.layers.UnitNormalization) + ((keras.layers.RMSNormalization,)
                                                             if hasattr(keras.layers, "RMSNormalization") else ())


@dataclasses.dataclass
class ExportResult:
    """What `export_model` wrote.

    Attributes:
        out_dir: the folder holding the artifacts, report.json, report.md and
            the manifest kerasfast-export.json.
        rows: one `ArtifactReport` per artifact, in the order requested.
    """

    out_dir: Path
    rows: list

    def table(self) -> str:
        """The report as a Markdown table."""
        return markdown_table(self.rows)

    def path(self, format_name: str) -> Path:
        """Path of the artifact of `format_name`."""
        return self.out_dir / FORMATS[format_name].filename

    def row(self, format_name: str) -> ArtifactReport:
        return next(r for r in self.rows if r.format == format_name)


def export_model(
    model,
    out_dir,
    *,
    formats=None,
    representative_data=None,
    eval_data=None,
    int8_input_output: bool = False,
    allow_flex_ops: bool = False,
    num_calibration_samples: int = 300,
    num_comparison_samples: int = 64,
    measure_latency: bool = True,
    overwrite: bool = False,
) -> ExportResult:
    """Exports `model` to serving and edge formats, verifies each, reports.

    Every artifact is built in a hidden temporary folder inside `out_dir`,
    loaded back and compared with the Keras model (TFLite files run in the
    LiteRT interpreter, SavedModels reloaded with `tf.saved_model.load`),
    then renamed into place. Any failure leaves `out_dir` as it was. Bad
    arguments are refused before anything is written.

    Export writes only its own files: the artifacts, report.json, report.md
    and `kerasfast-export.json`, the manifest listing what it wrote. A
    previous export in `out_dir` is replaced (its artifacts not written
    again are removed); any other file or folder in `out_dir`, and the
    folder's mode, are left alone.

    Args:
        model: a built single-input, single-output Keras 3 model (e.g. after
            `kerasfast.compress.prune`).
        out_dir: destination folder: new, empty or holding a previous
            kerasfast export (replaced on success).
        formats: names from `kerasfast.export.FORMATS`: "keras",
            "saved_model", "saved_model_int8", "tflite_float32",
            "tflite_dynamic_int8", "tflite_int8", "tflite_float16", "onnx",
            "onnx_int8" (these two need `pip install 'kerasfast[onnx]'`).
            Default: all but "saved_model_int8" and the ONNX ones, with
            "tflite_int8" only when `representative_data` is given.
        representative_data: inputs for int8 calibration (a few hundred
            training samples): array, `(x, y)` tuple or `tf.data.Dataset`.
            "onnx_int8" is static (calibrated) int8 with them, dynamic
            (int8 weights only) without.
        eval_data: `(x, y)` or a dataset of `(x, y)` batches: accuracy and
            loss per artifact, computed from each artifact's own outputs.
        int8_input_output: for "tflite_int8", int8 input and output tensors
            instead of float ones.
        allow_flex_ops: allow TensorFlow (Flex) ops in .tflite files. Off by
            default: such files need the Flex delegate, which ai_edge_litert
            does not bundle, so they are kept but reported as not verified.
        num_calibration_samples: at most this many representative samples.
        num_comparison_samples: inputs used to compare with Keras outputs.
        measure_latency: time each .tflite file in LiteRT and each .onnx
            file in ONNX Runtime (batch 1, one thread).
        overwrite: also export into an `out_dir` holding files kerasfast did
            not write (they are left alone). Without it such a folder is
            refused. A foreign file at a name the export writes (e.g. the
            user's own model.keras) is refused either way.

    Returns:
        An `ExportResult` with the out_dir and one `ArtifactReport` per format.

    Raises:
        ExportError, DataError: before anything is written for bad
            arguments or an `out_dir` holding foreign files (named); after a
            failed conversion or verification (out_dir untouched).

    Example:

    >>> result = kerasfast.export.export_model(
    ...     model, "exported", formats=["keras", "tflite_int8"],
    ...     representative_data=x_train[:300], eval_data=(x_test, y_test))
    >>> print(result.table())
    """
    # -- refuse bad input before writing anything -------------------------
    destination = check_writable_destination(out_dir)
    chosen = preflight.resolve_formats(formats, representative_data is not None)
    if any(FORMATS[f].is_onnx for f in chosen):
        onnx_export.check_available()
    written_names = [FORMATS[f].filename for f in chosen] + list(REPORT_NAMES)
    # Before the slow checks: a folder of user files is refused in a second.
    check_destination(destination, written_names, overwrite=overwrite)
    signature = preflight.model_signature(model)
    calibration = preflight.check_inputs(
        representative_data, signature, argument="representative_data", limit=num_calibration_samples
    )
    evaluation = preflight.check_eval_data(eval_data, signature)
    if "keras" in chosen:
        preflight.check_keras_serializable(model)
    preflight.check_traceable(model, signature, chosen)
    left_in_float = preflight.check_keras_int8_quantizable(model) if "saved_model_int8" in chosen else []

    comparison = _comparison_inputs(signature, calibration, evaluation, num_comparison_samples)
    keras_reference = np.asarray(model.predict(comparison, verbose=0, batch_size=64), dtype=np.float32)
    # TFLite cannot take bfloat16 graphs, and Keras's ONNX export needs a
    # float32 model: convert from a float32 copy, and compare TFLite and ONNX
    # outputs with that copy (the model actually converted).
    tflite_source, tflite_note = model, ""
    if any(FORMATS[f].is_tflite or FORMATS[f].is_onnx for f in chosen) and is_mixed_precision(model):
        tflite_source = float32_copy(model)
        tflite_note = f"converted from a float32 copy of the {model.dtype_policy.name} model"
    tflite_reference = (
        keras_reference if tflite_source is model
        else np.asarray(tflite_source.predict(comparison, verbose=0, batch_size=64), dtype=np.float32)
    )
    sparsity = overall_sparsity(model)
    loss_fn = model_loss_fn(model)

    rows = []
    onnx_float = None  # the float .onnx file, once written (onnx_int8 quantises it)
    with staged_export(destination, written_names, overwrite=overwrite) as staging:
        scratch = staging / ".scratch"
        if "saved_model" in chosen:
            model.export(str(staging / FORMATS["saved_model"].filename), format="tf_saved_model", verbose=False)
        graph_dir = None
        if any(FORMATS[f].is_tflite for f in chosen):
            if "saved_model" in chosen and tflite_source is model:
                graph_dir = staging / FORMATS["saved_model"].filename
            else:
                graph_dir = scratch / "saved_model_for_tflite"
                tflite_source.export(str(graph_dir), format="tf_saved_model", verbose=False)
        for name in chosen:
            spec = FORMATS[name]
            target = staging / spec.filename
            notes = ""
            if name == "keras":
                model.save(str(target))
                restored = keras.saving.load_model(str(target))
                predict = lambda x, m=restored: np.asarray(m.predict(x, verbose=0, batch_size=64))
                runner = None
            elif name == "saved_model":
                predict = _saved_model_predict(str(target))
                runner = None
            elif name == "saved_model_int8":
                _export_keras_int8(model, target)
                predict = _saved_model_predict(str(target))
                runner = None
                if left_in_float:
                    notes = f"left in float by Keras int8: {', '.join(left_in_float)}"
            elif spec.is_onnx:
                if onnx_float is None:
                    onnx_float = target if name == "onnx" else scratch / "model_for_int8.onnx"
                    onnx_float.parent.mkdir(parents=True, exist_ok=True)
                    onnx_export.export_onnx(
                        tflite_source, onnx_float,
                        known_layer_names=[l.name for l in model._flatten_layers(include_self=False)],
                    )
                if name == "onnx":
                    if onnx_float != target:
                        shutil.copyfile(onnx_float, target)
                    notes = tflite_note
                else:
                    how = onnx_export.quantize_int8(
                        onnx_float, target, calibration, comparison=comparison, reference=tflite_reference,
                        tolerance=_TOLERANCE[name] * max(float(np.max(np.abs(tflite_reference))), 1e-6))
                    notes = "; ".join(n for n in (tflite_note, how) if n)
                runner = onnx_export.OnnxModel(target)
                predict = runner.predict
            else:
                int8_choice = None
                if name == "tflite_int8":
                    # Ops whose int8 error breaks verification stay float (or 16x8); see int8_selection.
                    int8_choice = convert_int8_verified(
                        str(graph_dir), calibration, comparison, tflite_reference,
                        _TOLERANCE[name] * max(float(np.max(np.abs(tflite_reference))), 1e-6),
                        int8_input_output=int8_input_output, allow_flex_ops=allow_flex_ops,
                        known_layer_names=[l.name for l in model._flatten_layers(include_self=False)],
                        norm_layers=[l.name for l in model._flatten_layers(include_self=False)
                                     if isinstance(l, _NORMALIZATION_LAYERS)],
                    )
                    content = int8_choice.content
                else:
                    content = convert_saved_model(
                        str(graph_dir),
                        name.removeprefix("tflite_"),
                        representative_inputs=calibration,
                        allow_flex_ops=allow_flex_ops,
                        known_layer_names=[l.name for l in model._flatten_layers(include_self=False)],
                    )
                target.write_bytes(content)
                try:
                    runner = LiteRTModel(content)
                    runner.predict(comparison[:2])  # some kernels only fail once run
                except ExportError as error:
                    if not (allow_flex_ops and "Flex" in str(error)):
                        raise
                    # Asked for Flex ops: keep the file, say plainly it is unverified.
                    row = ArtifactReport(format=name, path=spec.filename, sparsity=sparsity, verified=False)
                    row.size_bytes, row.gzip_bytes = artifact_sizes(target)
                    row.notes = "uses Flex ops: needs the Flex delegate, so it was not run in ai_edge_litert"
                    rows.append(row)
                    continue
                predict = runner.predict
                notes = "; ".join(
                    n for n in (tflite_note, "int8 input/output" if name == "tflite_int8" and int8_input_output else "",
                                int8_choice.note() if int8_choice is not None else "")
                    if n
                )
            reference = tflite_reference if spec.is_tflite or spec.is_onnx else keras_reference
            row = _measure(name, spec.filename, target, predict, comparison, reference, evaluation, loss_fn)
            row.sparsity = sparsity
            row.notes = "; ".join(n for n in (row.notes, notes) if n)
            if spec.is_tflite and name == "tflite_int8":
                row.quantization = int8_choice.to_dict()
            if runner is not None and measure_latency:
                row.latency_ms = runner.latency_ms_per_sample(comparison[0])
            rows.append(row)
        shutil.rmtree(scratch, ignore_errors=True)
        write_report(
            staging,
            rows,
            {
                "model_name": model.name,
                "formats": chosen,
                "eval_samples": 0 if evaluation is None else len(evaluation[0]),
                "comparison_samples": len(comparison),
                "calibration_samples": 0 if calibration is None else len(calibration),
                "latency": "median ms per sample, batch 1, 1 thread: ai_edge_litert for .tflite, "
                "onnxruntime (CPU) for .onnx",
            },
        )
    return ExportResult(out_dir=destination, rows=rows)


def _comparison_inputs(signature, calibration, evaluation, count):
    for source in (calibration, None if evaluation is None else evaluation[0]):
        if source is not None:
            return source[:count]
    if any(d is None for d in signature.input_shape):
        raise ExportError(
            f"The model input {signature.input_shape} has unknown dimensions; pass representative_data "
            "or eval_data so the exported artifacts can be checked on real inputs."
        )
    rng = np.random.default_rng(0)
    shape = (min(count, 16), *signature.input_shape)
    if np.dtype(signature.input_dtype).kind == "f":
        return rng.standard_normal(shape).astype(signature.input_dtype)
    return np.zeros(shape, dtype=signature.input_dtype)


def _saved_model_predict(path):
    loaded = tf.saved_model.load(path)
    serve = loaded.signatures["serving_default"]
    (output_key,) = serve.structured_outputs.keys()
    (input_key,) = serve.structured_input_signature[1].keys()

    def predict(x):
        return np.concatenate(
            [np.asarray(serve(**{input_key: tf.constant(x[i : i + 64])})[output_key]) for i in range(0, len(x), 64)]
        )

    return predict


def _export_keras_int8(model, target):
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    with warnings.catch_warnings():
        # Keras warns once per layer it leaves in float; the report lists them.
        warnings.simplefilter("ignore")
        clone.quantize("int8")
    clone.export(str(target), format="tf_saved_model", verbose=False)


def _measure(name, filename, target, predict, comparison, reference, evaluation, loss_fn) -> ArtifactReport:
    row = ArtifactReport(format=name, path=filename)
    row.size_bytes, row.gzip_bytes = artifact_sizes(target)
    outputs = np.asarray(predict(comparison), dtype=np.float32)
    if outputs.shape != reference.shape or not np.all(np.isfinite(outputs)):
        raise ExportError(
            f"{name}: the reloaded artifact returned outputs of shape {outputs.shape} "
            f"(finite: {bool(np.all(np.isfinite(outputs)))}) where Keras returns {reference.shape}."
        )
    row.max_abs_diff = float(np.max(np.abs(outputs - reference)))
    allowed = _TOLERANCE[name] * max(float(np.max(np.abs(reference))), 1e-6)
    if row.max_abs_diff > allowed:
        raise ExportError(
            f"{name}: outputs differ from the Keras model's by up to {row.max_abs_diff:.3g} "
            f"(allowed {allowed:.3g}); the artifact was not kept."
        )
    row.verified = True
    if evaluation is not None:
        x, y = evaluation
        eval_outputs = np.asarray(predict(x), dtype=np.float32)
        row.accuracy = classification_accuracy(eval_outputs, y)
        row.loss = loss_value(loss_fn, eval_outputs, y)
    return row
