"""The export report: one row per artifact, as JSON and as a Markdown table."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import tarfile
from pathlib import Path


@dataclasses.dataclass
class ArtifactReport:
    """Measurements of one exported artifact.

    Attributes:
        format: format name (see `kerasfast.export.FORMATS`).
        path: file or folder name inside out_dir.
        size_bytes: size on disk (folders: sum of their files).
        gzip_bytes: size after gzip -9 (folders: of a tar of them). Pruned
            weights only shrink the file under compression.
        sparsity: zero fraction of the prunable kernels of the model.
        accuracy: top-1 accuracy on eval_data, computed from this artifact's
            own outputs (TFLite: run in LiteRT); None without eval_data or
            for non-classification outputs.
        loss: the model's compiled loss on eval_data, from the artifact's
            outputs; None when unknown.
        max_abs_diff: largest |artifact output - Keras output| on sample inputs.
        latency_ms: median milliseconds per sample (batch 1, 1 thread) in
            LiteRT for .tflite files, in ONNX Runtime (CPU) for .onnx files;
            None for the other formats.
        verified: the artifact loaded back and its outputs are within the
            format's tolerance of the Keras model's.
        notes: anything the reader should know (e.g. layers left in float).
        quantization: for "tflite_int8", how it was quantised: `mode`
            ("int8", "int8+float" or "16x8"), `kept_in_float` (the layers
            left in float, each with its measured int8 error and why), the
            full-int8 error and the attempts (see `kerasfast.export.int8_selection`).
    """

    format: str
    path: str
    size_bytes: int = 0
    gzip_bytes: int = 0
    sparsity: float = 0.0
    accuracy: float | None = None
    loss: float | None = None
    max_abs_diff: float | None = None
    latency_ms: float | None = None
    verified: bool = False
    notes: str = ""
    quantization: dict | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def artifact_sizes(path: Path) -> tuple[int, int]:
    """(bytes on disk, gzip -9 bytes) of a file, or of a folder as a tar."""
    if path.is_file():
        data = path.read_bytes()
        return len(data), len(gzip.compress(data, compresslevel=9))
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(path, arcname=path.name)
    return total, len(gzip.compress(buffer.getvalue(), compresslevel=9))


def _fmt(value, spec):
    return "" if value is None else format(value, spec)


def markdown_table(rows: list[ArtifactReport]) -> str:
    """Markdown table of the rows."""
    lines = [
        "| format | file | size (KB) | gzipped (KB) | sparsity | accuracy | loss | max diff vs Keras | "
        "ms/sample (LiteRT, ORT) | verified | notes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.format} | {r.path} | {r.size_bytes / 1024:.1f} | {r.gzip_bytes / 1024:.1f} | "
            f"{r.sparsity:.3f} | {_fmt(r.accuracy, '.4f')} | {_fmt(r.loss, '.4f')} | "
            f"{_fmt(r.max_abs_diff, '.2e')} | {_fmt(r.latency_ms, '.4f')} | {'yes' if r.verified else 'no'} | "
            f"{r.notes} |"
        )
    return "\n".join(lines)


def write_report(folder: Path, rows: list[ArtifactReport], context: dict) -> None:
    """Writes report.json and report.md into `folder`."""
    payload = {**context, "artifacts": [r.to_dict() for r in rows]}
    (folder / "report.json").write_text(json.dumps(payload, indent=2) + os.linesep)
    header = ["# Export report", "", f"Model: `{context.get('model_name', '')}`  "]
    if context.get("eval_samples"):
        header.append(f"Accuracy/loss on {context['eval_samples']} eval samples; TFLite evaluated in LiteRT, "
                      "ONNX in ONNX Runtime.  ")
    source = f" ({context['comparison_inputs']})" if context.get("comparison_inputs") else ""
    header.append(f"Max diff vs Keras on {context.get('comparison_samples', 0)} sample inputs{source}.")
    if context.get("tflite_input_batch"):
        header[-1] += "  "
        header.append(f"The .tflite files take a fixed batch of {context['tflite_input_batch']} (input shape "
                      f"[{context['tflite_input_batch']}, ...], one sample per call): "
                      f"{context.get('tflite_input_batch_reason', '')}.")
    (folder / "report.md").write_text("\n".join(header + ["", markdown_table(rows), ""]))
