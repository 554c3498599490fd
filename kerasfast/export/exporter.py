"""`export_model`: every requested artifact, verified, with a report, each written atomically."""

from __future__ import annotations

import dataclasses
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kerasfast import _compat
from kerasfast.compress.attach import overall_sparsity
from kerasfast.errors import ExportError
from kerasfast.export import onnx_export, preflight, recurrent
from kerasfast.export.atomic import REPORT_NAMES, check_destination, check_writable_destination, staged_export
from kerasfast.export.evaluation import classification_accuracy, loss_from_logits, loss_value, model_loss_fn
from kerasfast.export.formats import FORMATS
from kerasfast.export.int8_selection import convert_int8_verified
from kerasfast.export.litert import LiteRTModel
from kerasfast.export.precision import float32_copy, is_mixed_precision, reduced_float_dtypes
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
    unsafe_deserialization: bool = False,
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

    Recurrent models (LSTM, GRU, SimpleRNN, ConvLSTM, Bidirectional
    layers) convert to builtin TFLite ops only with a fixed batch size, so
    their `.tflite` files take one sample per call (input `[1, ...]`; the
    report says so); so do models whose first conversion fails only on
    TensorList ops. `tflite_int8` is converted from the recurrent layers
    unrolled, since TFLite's int8 calibrator crashes on their loop: it needs
    a fixed sequence length and is refused otherwise, naming the layer (see
    `kerasfast.export.recurrent`). SavedModel and `.keras` keep any batch.

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
            training samples): array (or nested lists), `(x, y)` tuple or
            `tf.data.Dataset` (batched or of single samples).
            "onnx_int8" is static (calibrated) int8 with them, dynamic
            (int8 weights only) without. Calibrated files are verified on
            eval_data, or else on representative samples held out from
            calibration (those beyond `num_calibration_samples`, or the
            last quarter), never on their own calibration samples; a
            single sample, or samples all identical (e.g. zeros), are
            refused for them.
        eval_data: `(x, y)` or a dataset of `(x, y)` batches (or single
            `(x, y)` samples, i.e. not yet `.batch(n)`-ed): accuracy and
            loss per artifact, computed from each artifact's own outputs.
        int8_input_output: for "tflite_int8", int8 input and output tensors
            instead of float ones.
        allow_flex_ops: allow TensorFlow (Flex) ops in .tflite files. Off by
            default: such files need the Flex delegate, which ai_edge_litert
            does not bundle, so they are kept but reported as not verified.
        num_calibration_samples: at most this many representative samples.
        num_comparison_samples: inputs used to compare with Keras outputs
            (taken from eval_data, else representative_data; report.json's
            `comparison_inputs` says which).
        measure_latency: time each .tflite file in LiteRT and each .onnx
            file in ONNX Runtime (batch 1, one thread).
        overwrite: also export into an `out_dir` holding files kerasfast did
            not write (they are left alone). Without it such a folder is
            refused. A foreign file at a name the export writes (e.g. the
            user's own model.keras) is refused either way.
        unsafe_deserialization: check and reload the "keras" artifact with
            `safe_mode=False`, so a model holding Python lambdas (Lambda
            layers) exports to it; reloading runs their code, so only for
            code you trust. Without it such a model is refused for "keras"
            before anything is written.

    Returns:
        An `ExportResult` with the out_dir and one `ArtifactReport` per format.

    Raises:
        ExportError, DataError: before anything is written for bad
            arguments or an `out_dir` holding foreign files (named); after a
            failed conversion or verification (out_dir untouched).

    Example:

    >>> x = np.random.default_rng(0).normal(size=(256, 16)).astype("float32")
    >>> y = (x[:, 0] > 0).astype("int32")
    >>> model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
    ...                           keras.layers.Dense(2, activation="softmax")])
    >>> model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    >>> _ = model.fit(x, y, epochs=3, verbose=0)
    >>> result = kerasfast.export.export_model(
    ...     model, "exported", formats=["keras", "tflite_int8"],
    ...     representative_data=x[:200], eval_data=(x, y))
    >>> print(result.table())  # doctest: +ELLIPSIS
    | format | file | size (KB) | ...
    ...
    """
    num_calibration_samples = preflight.check_positive_int(num_calibration_samples, "num_calibration_samples")
    num_comparison_samples = preflight.check_positive_int(num_comparison_samples, "num_comparison_samples")
    samples = _Samples(representative_data, eval_data, num_calibration_samples, num_comparison_samples)
    if int8_input_output and "tflite_int8" not in preflight.resolve_formats(formats, representative_data is not None):
        raise ExportError(
            "int8_input_output=True (--int8-io) makes tflite_int8's input and output tensors int8, but the formats "
            "asked for do not include tflite_int8: add it (it needs representative_data), or "
            "leave int8_input_output off.")
    checked = _preflight(model, out_dir, formats, samples, overwrite=overwrite,
                         unsafe_deserialization=unsafe_deserialization)
    job = _prepare(model, checked, num_comparison_samples, int8_input_output=int8_input_output,
                   allow_flex_ops=allow_flex_ops, measure_latency=measure_latency,
                   unsafe_deserialization=unsafe_deserialization)
    with staged_export(checked.destination, checked.written_names, overwrite=overwrite) as folder:
        staging = _Staging(folder)
        _export_graphs(job, staging)
        rows = [_artifact_row(job, staging, name) for name in job.formats]
        shutil.rmtree(staging.scratch, ignore_errors=True)
        write_report(folder, rows, _report_context(job, staging))
    return ExportResult(out_dir=checked.destination, rows=rows)


@dataclasses.dataclass(frozen=True)
class _Checked:
    """The arguments of one export, checked before anything is written."""

    destination: Path
    formats: list  # in the order requested
    written_names: list  # top-level names the export writes in out_dir
    signature: preflight.ModelSignature
    calibration: np.ndarray | None
    # Representative samples kept out of calibration, to verify calibrated formats on.
    held_out: np.ndarray | None
    evaluation: tuple | None
    left_in_float: list  # layers Keras int8 leaves in float ("saved_model_int8" only)


@dataclasses.dataclass(frozen=True)
class _Job:
    """What every artifact is built from and checked against."""

    model: Any
    formats: list
    calibration: np.ndarray | None
    evaluation: tuple | None
    left_in_float: list
    comparison: np.ndarray  # inputs on which each artifact must match the model
    comparison_source: str  # where `comparison` comes from, for the report
    keras_reference: np.ndarray
    # The model TFLite and ONNX convert (a float32 copy of a mixed-precision
    # one), what the report says about it, and its outputs on `comparison`.
    tflite_source: Any
    tflite_note: str
    tflite_reference: np.ndarray
    # Recurrent layers of `tflite_source`: its .tflite files take batch 1 (see recurrent).
    recurrent_layers: list
    signature: preflight.ModelSignature
    sparsity: float
    loss_fn: Any
    int8_input_output: bool
    allow_flex_ops: bool
    measure_latency: bool
    unsafe_deserialization: bool


@dataclasses.dataclass
class _Staging:
    """The staging folder of one export, and the intermediate files its artifacts share."""

    folder: Path
    graph_dir: Path | None = None  # the SavedModel every .tflite file is converted from
    onnx_float: Path | None = None  # the float .onnx file, once written (onnx_int8 quantises it)
    # Why the .tflite files take one sample per call ("": any batch), and the
    # unrolled graph tflite_int8 is then converted from (see recurrent).
    fixed_batch_reason: str = ""
    unrolled_graph_dir: Path | None = None

    @property
    def scratch(self) -> Path:
        return self.folder / ".scratch"


@dataclasses.dataclass(frozen=True)
class _Built:
    """One artifact written into the staging folder, and how to run it."""

    predict: Any
    runner: Any = None  # a LiteRT or ONNX Runtime model, timed when measure_latency
    notes: str = ""
    quantization: dict | None = None


@dataclasses.dataclass(frozen=True)
class _Samples:
    """The data an export calibrates and verifies with, and how many samples of each it takes."""

    representative: Any
    evaluation: Any
    calibration_count: int
    comparison_count: int


def _preflight(model, out_dir, formats, samples: _Samples, *, overwrite, unsafe_deserialization) -> _Checked:
    """Refuses bad arguments, cheapest checks first, writing nothing."""
    representative_data, eval_data = samples.representative, samples.evaluation
    num_calibration_samples, num_comparison_samples = samples.calibration_count, samples.comparison_count
    preflight.check_model_object(model)
    destination = check_writable_destination(out_dir)
    chosen = preflight.resolve_formats(formats, representative_data is not None)
    if any(FORMATS[f].is_onnx for f in chosen):
        onnx_export.check_available()
    written_names = [FORMATS[f].filename for f in chosen] + list(REPORT_NAMES)
    # Before the slow checks: a folder of user files is refused in a second.
    check_destination(destination, written_names, overwrite=overwrite)
    signature = preflight.model_signature(model)
    preflight.check_string_input_formats(signature, chosen)
    # A calibrated file checked on its own calibration samples looks exact
    # even when its ranges clip real inputs: without eval_data, some
    # representative samples are held out to verify it on.
    hold_out = bool(preflight.calibrated_formats(chosen)) and eval_data is None
    calibration = preflight.check_inputs(
        representative_data, signature, argument="representative_data",
        limit=num_calibration_samples + (num_comparison_samples if hold_out else 0),
    )
    preflight.check_calibration_spread(calibration, chosen)
    held_out = None
    if hold_out and calibration is not None:
        calibration, held_out = preflight.split_held_out(calibration, num_calibration_samples, num_comparison_samples)
    evaluation = preflight.check_eval_data(eval_data, signature)
    preflight.check_token_ids(model, calibration, "representative_data")
    preflight.check_token_ids(model, held_out, "representative_data")
    preflight.check_token_ids(model, None if evaluation is None else evaluation[0], "eval_data x")
    preflight.check_eval_labels(model, evaluation, model_loss_fn(model))
    if "keras" in chosen:
        preflight.check_keras_serializable(model, safe_mode=not unsafe_deserialization)
    preflight.check_traceable(model, signature, chosen)
    left_in_float = preflight.check_keras_int8_quantizable(model) if "saved_model_int8" in chosen else []
    return _Checked(destination, chosen, written_names, signature, calibration, held_out, evaluation, left_in_float)


def _prepare(model, checked: _Checked, num_comparison_samples, **options) -> _Job:
    """Picks the comparison inputs and computes the outputs every artifact must reproduce."""
    comparison, comparison_source = _comparison_inputs(checked, num_comparison_samples)
    keras_reference = _predict(model, comparison)
    # TFLite cannot take bfloat16 graphs, and Keras's ONNX export needs a
    # float32 model: convert from a float32 copy, and compare TFLite and ONNX
    # outputs with that copy (the model actually converted).
    tflite_source, tflite_note = model, ""
    if any(FORMATS[f].is_tflite or FORMATS[f].is_onnx for f in checked.formats) and is_mixed_precision(model):
        tflite_source = float32_copy(model)
        policy = model.dtype_policy.name
        # A float32 policy with float16 layers inside would read "float32 copy of the float32 model".
        what = (f"the {policy} model" if policy != "float32"
                else f"the model (layers computing in {', '.join(reduced_float_dtypes(model))})")
        tflite_note = f"converted from a float32 copy of {what}"
    tflite_reference = keras_reference if tflite_source is model else _predict(tflite_source, comparison)
    if tflite_source is not model:
        # The diff column is against the copy; how far the copy itself is from the model is said here.
        copy_diff = float(np.max(np.abs(np.asarray(tflite_reference, np.float32) -
                                        np.asarray(keras_reference, np.float32))))
        tflite_note += f" (the diff column is against the copy, which differs from the model by up to {copy_diff:.3g})"
    return _Job(
        model=model,
        formats=checked.formats,
        calibration=checked.calibration,
        evaluation=checked.evaluation,
        left_in_float=checked.left_in_float,
        comparison=comparison,
        comparison_source=comparison_source,
        keras_reference=keras_reference,
        tflite_source=tflite_source,
        tflite_note=tflite_note,
        tflite_reference=tflite_reference,
        recurrent_layers=(recurrent.recurrent_layer_names(tflite_source)
                          if any(FORMATS[f].is_tflite for f in checked.formats) else []),
        signature=checked.signature,
        sparsity=overall_sparsity(model),
        loss_fn=model_loss_fn(model),
        **options,
    )


def _predict(model, x) -> np.ndarray:
    return preflight.predicted(model, x).astype(np.float32, copy=False)


def _export_graphs(job: _Job, staging: _Staging) -> None:
    """Writes the SavedModel artifact and the graph the .tflite files are converted from (one when they agree)."""
    model, chosen = job.model, job.formats
    if "saved_model" in chosen:
        model.export(str(staging.folder / FORMATS["saved_model"].filename), format="tf_saved_model", verbose=False)
    if not any(FORMATS[f].is_tflite for f in chosen):
        return
    if job.recurrent_layers:
        _use_fixed_batch(job, staging, recurrent.fixed_batch_reason(job.recurrent_layers))
    elif "saved_model" in chosen and job.tflite_source is model:
        staging.graph_dir = staging.folder / FORMATS["saved_model"].filename
    else:
        staging.graph_dir = staging.scratch / "saved_model_for_tflite"
        job.tflite_source.export(str(staging.graph_dir), format="tf_saved_model", verbose=False)


def _artifact_row(job: _Job, staging: _Staging, name: str) -> ArtifactReport:
    """Writes the artifact of format `name` into the staging folder, verifies it and measures it."""
    spec = FORMATS[name]
    target = staging.folder / spec.filename
    if name == "keras":
        built = _build_keras(job, target)
    elif name == "saved_model":
        built = _Built(predict=_saved_model_predict(str(target)))
    elif name == "saved_model_int8":
        built = _build_saved_model_int8(job, target)
    elif spec.is_onnx:
        built = _build_onnx(job, staging, name, target)
    else:
        built = _build_tflite(job, staging, name, target)
    if isinstance(built, ArtifactReport):  # kept, but could not be run
        return built
    reference = job.tflite_reference if spec.is_tflite or spec.is_onnx else job.keras_reference
    row = _measure(name, spec.filename, target, built.predict, reference, job)
    row.sparsity = job.sparsity
    row.notes = _join_notes(row.notes, built.notes)
    row.quantization = built.quantization
    if built.runner is not None and job.measure_latency:
        row.latency_ms = built.runner.latency_ms_per_sample(job.comparison[0])
    return row


def _build_keras(job: _Job, target: Path) -> _Built:
    job.model.save(str(target))
    with warnings.catch_warnings():
        # A compiled model that never trained saved an optimizer with no slots; the reloaded one builds them,
        # and Keras warns that it skips loading them: nothing the predictions compared here depend on.
        warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
        restored = keras.saving.load_model(str(target), safe_mode=not job.unsafe_deserialization)
    return _Built(predict=lambda x: preflight.predicted(restored, x))


def _build_saved_model_int8(job: _Job, target: Path) -> _Built:
    _export_keras_int8(job.model, target)
    notes = f"left in float by Keras int8: {', '.join(job.left_in_float)}" if job.left_in_float else ""
    return _Built(predict=_saved_model_predict(str(target)), notes=notes)


def _build_onnx(job: _Job, staging: _Staging, name: str, target: Path) -> _Built:
    """Writes "onnx" or "onnx_int8"; both come from one float .onnx export."""
    if staging.onnx_float is None:
        staging.onnx_float = target if name == "onnx" else staging.scratch / "model_for_int8.onnx"
        staging.onnx_float.parent.mkdir(parents=True, exist_ok=True)
        onnx_export.export_onnx(job.tflite_source, staging.onnx_float, known_layer_names=_layer_names(job.model))
    if name == "onnx":
        if staging.onnx_float != target:
            shutil.copyfile(staging.onnx_float, target)
        notes = job.tflite_note
    else:
        how = onnx_export.quantize_int8(
            staging.onnx_float, target, job.calibration, comparison=job.comparison, reference=job.tflite_reference,
            tolerance=_allowed_diff(name, job.tflite_reference))
        notes = _join_notes(job.tflite_note, how)
    runner = onnx_export.OnnxModel(target)
    return _Built(predict=runner.predict, runner=runner, notes=notes)


def _use_fixed_batch(job: _Job, staging: _Staging, reason: str) -> None:
    """From now on, .tflite files are converted from a batch-1 trace (see recurrent)."""
    staging.graph_dir = staging.scratch / "saved_model_batch1"
    recurrent.export_fixed_batch(job.tflite_source, job.signature.input_shape, job.signature.input_dtype,
                                 staging.graph_dir)
    staging.fixed_batch_reason = reason


def _int8_graph_dir(job: _Job, staging: _Staging) -> Path:
    """The SavedModel tflite_int8 is calibrated on: with a fixed batch, the unrolled one, checked loop-free."""
    if not staging.fixed_batch_reason:
        return staging.graph_dir
    if staging.unrolled_graph_dir is None:
        path = staging.scratch / "saved_model_batch1_unrolled"
        recurrent.export_fixed_batch(job.tflite_source, job.signature.input_shape, job.signature.input_dtype,
                                     path, unroll=True)
        # TFLite's calibrator would kill the process on a loop left in the graph.
        recurrent.check_int8_calibratable(path, _layer_names(job.model))
        staging.unrolled_graph_dir = path
    return staging.unrolled_graph_dir


def _convert_tflite_once(job: _Job, staging: _Staging, name: str):
    """(.tflite bytes, the Int8Choice for tflite_int8 else None), from the current graph."""
    if name == "tflite_int8":
        # Ops whose int8 error breaks verification stay float (or 16x8); see int8_selection.
        int8_choice = convert_int8_verified(
            str(_int8_graph_dir(job, staging)), job.calibration, job.comparison, job.tflite_reference,
            _allowed_diff(name, job.tflite_reference),
            int8_input_output=job.int8_input_output, allow_flex_ops=job.allow_flex_ops,
            # A nested model (a pretrained backbone, a keras-hub task) is no one layer to keep in float: its
            # ops are taken for its own layers'.
            known_layer_names=[layer.name for layer in _layers(job.model) if not isinstance(layer, keras.Model)],
            norm_layers=[l.name for l in _layers(job.model) if isinstance(l, _NORMALIZATION_LAYERS)],
        )
        return int8_choice.content, int8_choice
    content = convert_saved_model(
        str(staging.graph_dir),
        name.removeprefix("tflite_"),
        representative_inputs=job.calibration,
        allow_flex_ops=job.allow_flex_ops,
        known_layer_names=_layer_names(job.model),
    )
    return content, None


def _convert_tflite(job: _Job, staging: _Staging, name: str):
    """As `_convert_tflite_once`; a graph that fails only on TensorList ops is traced again with batch 1."""
    try:
        return _convert_tflite_once(job, staging, name)
    except ExportError as error:
        if staging.fixed_batch_reason or not recurrent.is_tensor_list_failure(error):
            raise
        looping = getattr(error, "layers", [])
    _use_fixed_batch(job, staging, recurrent.fixed_batch_reason(looping, tensor_list=True))
    return _convert_tflite_once(job, staging, name)


def _tflite_notes(job: _Job, staging: _Staging, int8_choice) -> str:
    reason = staging.fixed_batch_reason
    batch = f"{recurrent.FIXED_BATCH_NOTE}: {reason}" if reason else ""
    if int8_choice is None:
        return _join_notes(job.tflite_note, batch)
    unrolled = recurrent.UNROLLED_NOTE if batch and job.recurrent_layers else ""
    return _join_notes(job.tflite_note, batch, unrolled, "int8 input/output" if job.int8_input_output else "",
                       int8_choice.note())


def _build_tflite(job: _Job, staging: _Staging, name: str, target: Path) -> _Built | ArtifactReport:
    """Writes one .tflite file and loads it in LiteRT; a Flex-op file allowed by the user comes back unverified."""
    content, int8_choice = _convert_tflite(job, staging, name)
    target.write_bytes(content)
    try:
        runner = LiteRTModel(content)
        runner.predict(job.comparison[:2])  # some kernels only fail once run
    except ExportError as error:
        if not (job.allow_flex_ops and "Flex" in str(error)):
            raise
        # Asked for Flex ops: keep the file, say plainly it is unverified.
        row = ArtifactReport(format=name, path=FORMATS[name].filename, sparsity=job.sparsity, verified=False)
        row.size_bytes, row.gzip_bytes = artifact_sizes(target)
        row.notes = "uses Flex ops: needs the Flex delegate, so it was not run in ai_edge_litert"
        return row
    if not runner.fixed_batch:
        _check_fresh_interpreters(job, name, content)
    notes = _tflite_notes(job, staging, int8_choice)
    if name == "tflite_dynamic_int8" and not runner.holds_int8():
        notes = _join_notes(notes, DYNAMIC_INT8_UNQUANTISED)
    return _Built(predict=runner.predict, runner=runner, notes=notes,
                  quantization=None if int8_choice is None else int8_choice.to_dict())


# TFLite's dynamic-range quantisation leaves weights of fewer than 1,024 values in float32: a small model's
# "dynamic int8" file may hold none quantised, and be the float32 file again.
DYNAMIC_INT8_UNQUANTISED = ("no weight was quantised: TFLite quantises only weights of 1,024 values or more, so this "
                            "file is float32 (tflite_int8 quantises every weight)")


def _check_fresh_interpreters(job: _Job, name: str, content: bytes) -> None:
    """Runs the file in a fresh interpreter at batch 1 (its default input shape) and at the batch `_measure` compares.

    The converter can write a graph whose shapes are right only after the
    interpreter was resized from another batch (a string input of shape
    (1,) through StringLookup and Embedding fails at batch 1 in RESHAPE),
    so one interpreter reused across batch sizes can hide it.
    """
    comparison, reference = job.comparison, job.tflite_reference
    allowed = _allowed_diff(name, reference)
    for batch in sorted({1, min(32, len(comparison))}):
        try:
            outputs = LiteRTModel(content).predict(comparison[:batch], batch_size=batch)
        except ExportError as error:
            problem = str(error)
        else:
            if outputs.shape != reference[:batch].shape or not np.all(np.isfinite(outputs)):
                problem = f"outputs of shape {outputs.shape} where Keras returns {reference[:batch].shape}"
            elif float(np.max(np.abs(outputs - reference[:batch]))) > allowed:
                difference = float(np.max(np.abs(outputs - reference[:batch])))
                problem = f"outputs differ from the Keras model's by up to {difference:.3g} (allowed {allowed:.3g})"
            else:
                continue
        raise ExportError(_fresh_interpreter_message(job, name, content, batch, problem))


def _fresh_interpreter_message(job: _Job, name: str, content: bytes, batch: int, problem: str) -> str:
    match = re.search(r"\((\w+)\) failed to (?:invoke|prepare)", problem)
    op = match.group(1) if match else None
    layers = LiteRTModel(content).layers_with_op(op, _layer_names(job.model)) if op else []
    where = f"the {op} op" + (f" of layer(s) {layers}" if layers else "") if op else "it"
    if job.signature.takes_strings and 1 in job.signature.input_shape:
        fix = ("declare the text input as one string per sample, keras.Input(shape=(), dtype=\"string\") "
               "(no layer then reshapes the looked-up ids)")
    else:
        fix = (f"rewrite {'layer(s) ' + str(layers) if layers else 'the layer at fault'} (e.g. Flatten or Reshape "
               "as GlobalAveragePooling1D/2D, or a slice such as x[:, 0])")
    return (
        f"{name}: the .tflite file fails in a fresh LiteRT interpreter at batch {batch} (its input shape "
        f"{[batch, *job.signature.input_shape]}) in {where}: {problem.strip()[:400]} The TFLite converter wrote "
        "a graph that runs only at some batch sizes (Keras's model.export(format=\"litert\") writes the same "
        f"file), so it was not kept. To fix it, {fix}, then export again; or serve the 'saved_model' "
        "artifact, which takes any batch."
    )


def _report_context(job: _Job, staging: _Staging) -> dict:
    return {
        "model_name": job.model.name,
        "formats": job.formats,
        "eval_samples": 0 if job.evaluation is None else len(job.evaluation[0]),
        "comparison_samples": len(job.comparison),
        "comparison_inputs": job.comparison_source,
        "calibration_samples": 0 if job.calibration is None else len(job.calibration),
        "latency": "median ms per sample, batch 1, 1 thread: ai_edge_litert for .tflite, "
        "onnxruntime (CPU) for .onnx",
        # None: the .tflite files take any batch size; 1: one sample per call, for the reason given.
        "tflite_input_batch": 1 if staging.fixed_batch_reason else None,
        "tflite_input_batch_reason": staging.fixed_batch_reason or None,
    }


def _layers(model) -> list:
    return _compat.flatten_layers(model)


def _augmentation_hint(model) -> str:
    """What to do about the model's random augmentation layers (`RandomFlip`, `RandomRotation`, ...), whose
    transforms a SavedModel's serving function can apply at inference, moving its outputs; "" without any."""
    augmenting = [layer.name for layer in _layers(model)
                  if type(layer).__name__.startswith("Random")
                  and any(isinstance(value, keras.random.SeedGenerator) for value in vars(layer).values())]
    if not augmenting:
        return ""
    return (f" The model holds random augmentation layer(s) {augmenting}, which the exported graph can apply at "
            "inference: export the model without them (a model from the layers after the augmentation), and "
            "augment in the data pipeline or in a model used for training only.")


def _layer_names(model) -> list[str]:
    return [layer.name for layer in _layers(model)]


def _allowed_diff(name: str, reference: np.ndarray) -> float:
    """Largest |artifact - reference| format `name` may show (see `_TOLERANCE`)."""
    return _TOLERANCE[name] * max(float(np.max(np.abs(reference))), 1e-6)


def _join_notes(*notes) -> str:
    return "; ".join(n for n in notes if n)


def _comparison_inputs(checked: _Checked, count):
    """`(inputs, where they come from)`: real inputs the artifacts are verified on.

    eval_data first, then representative samples held out from calibration;
    calibration samples only when no format is calibrated on them.
    """
    signature = checked.signature
    sources = [
        (None if checked.evaluation is None else checked.evaluation[0], "eval_data"),
        (checked.held_out, "representative_data samples held out from calibration"),
        (checked.calibration, "representative_data"),
    ]
    for source, name in sources:
        if source is not None:
            return source[:count], name
    if any(d is None for d in signature.input_shape):
        raise ExportError(
            f"The model input {signature.input_shape} has unknown dimensions; pass representative_data "
            "or eval_data so the exported artifacts can be checked on real inputs."
        )
    rng = np.random.default_rng(0)
    shape = (min(count, 16), *signature.input_shape)
    if signature.takes_strings:
        return np.full(shape, "", dtype=object), "empty strings"
    if np.dtype(signature.input_dtype).kind == "f":
        return rng.standard_normal(shape).astype(signature.input_dtype), "random inputs"
    return np.zeros(shape, dtype=signature.input_dtype), "zeros"


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


def _measure(name, filename, target, predict, reference, job) -> ArtifactReport:
    comparison, evaluation, loss_fn = job.comparison, job.evaluation, job.loss_fn
    row = ArtifactReport(format=name, path=filename)
    row.size_bytes, row.gzip_bytes = artifact_sizes(target)
    outputs = np.asarray(predict(comparison), dtype=np.float32)
    if outputs.shape != reference.shape or not np.all(np.isfinite(outputs)):
        raise ExportError(
            f"{name}: the reloaded artifact returned outputs of shape {outputs.shape} "
            f"(finite: {bool(np.all(np.isfinite(outputs)))}) where Keras returns {reference.shape}."
        )
    row.max_abs_diff = float(np.max(np.abs(outputs - reference)))
    allowed = _allowed_diff(name, reference)
    if row.max_abs_diff > allowed:
        raise ExportError(
            f"{name}: outputs differ from the Keras model's by up to {row.max_abs_diff:.3g} "
            f"(allowed {allowed:.3g}); the artifact was not kept.{_augmentation_hint(job.model)}"
        )
    row.verified = True
    if evaluation is not None:
        x, y = evaluation
        eval_outputs = np.asarray(predict(x), dtype=np.float32)
        row.accuracy = classification_accuracy(eval_outputs, y, loss_from_logits(loss_fn))
        row.loss = loss_value(loss_fn, eval_outputs, y)
    return row
