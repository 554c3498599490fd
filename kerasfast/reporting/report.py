"""`write_report`: a run folder's `report.html` and the PNGs behind it.

For a run folder (the `run_dir` of `kerasfast.fit`) the page shows a
summary (data, final metrics, throughput, input wait, hardware), loss and
each metric per epoch (training and validation), samples/s and the
input-wait fraction over the run's steps, the plan with the reason for
each field (and the tuning table), sparsity per layer for a pruned run, and
size and accuracy per format for each export folder inside it. For an
export folder it shows that export; for a folder of runs (the quickstart's
or a recipe's `train/`, `prune/`, `export/`) it writes each run's own
report and one page with all of them.
"""

from __future__ import annotations

import pathlib
import warnings

from kerasfast.errors import ReportError
from kerasfast.reporting import page, plots
from kerasfast.reporting.sources import (
    LEFT_FROM_EARLIER_RUNS, ExportRecord, RunRecord, export_folders, is_export_folder, is_run_folder, read_export,
    read_json, read_run, run_folders,
)

REPORT_FILE = "report.html"
CURVES, THROUGHPUT, SPARSITY = "curves.png", "throughput.png", "sparsity.png"


# The plot of an export folder's report, beside its report.html.
EXPORT_PLOT = "export.png"


def write_report(folder) -> pathlib.Path:
    """Writes `report.html` (self-contained, plots embedded) and its PNGs into `folder`.

    Made only from the files in the folder, so it can be regenerated at any
    time (`kerasfast report FOLDER`); `kerasfast.fit` writes it at the end
    of every run with a run folder.

    Args:
        folder: A run folder (`plan.json`, `history.json`, `result.json`,
            optionally `timeline.json`, `pruning.json`, an export folder),
            an export folder (`report.json`), or a folder holding such
            folders one level down.

    Returns:
        The path of `report.html`.

    Raises:
        ReportError: When the folder does not exist or lacks the files the
            report is made from; the message names the missing file and
            how to get it.

    Example:

    >>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> result = kerasfast.fit(model, x, x.sum(axis=1), epochs=3, loss="mse", run_dir="runs/first", verbose=0)
    >>> kerasfast.write_report("runs/first")
    PosixPath('runs/first/report.html')
    """
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise ReportError(f"cannot make a report of {folder}: there is no such folder. Pass the run_dir of a "
                          "kerasfast.fit run (or an export's out_dir).")
    if is_run_folder(folder):
        record = read_run(folder)
        parts = _run_parts(record, level=2)
        for export in export_folders(folder):
            parts += _export_parts(read_export(export), folder / f"{export.name}.png", level=2,
                                   title=f"Export: {export.name}/")
        return _write_page(folder, f"kerasfast run: {folder.name}", parts)
    if is_export_folder(folder):
        from kerasfast.export.atomic import record_written

        written = _write_page(folder, f"kerasfast export: {folder.name}",
                              _export_parts(read_export(folder), folder / EXPORT_PLOT, level=2, title="Export"))
        record_written(folder, [REPORT_FILE, EXPORT_PLOT])  # a later export into the folder replaces them
        return written
    runs, exports = run_folders(folder), export_folders(folder)
    if not runs and not exports:
        raise ReportError(
            f"cannot make the report of {folder}: plan.json is missing (it is neither the run_dir of a "
            "kerasfast.fit run, nor an export folder with report.json, nor a folder holding them). Pass the "
            "folder given to kerasfast.fit as run_dir= (fit writes plan.json, history.json and result.json there "
            "unless run_dir=False)."
        )
    parts = _results_parts(folder)
    earlier = _left_from_earlier_runs(folder)
    if earlier:
        runs = [run for run in runs if run.name not in earlier]
        exports = [export for export in exports if export.name not in earlier]
        for name in earlier:  # an earlier export's plot would pass for this run's
            (folder / f"{name}.png").unlink(missing_ok=True)
        parts.append(page.paragraph(f"Not from this run, so not shown: {', '.join(f'{name}/' for name in earlier)} "
                                    "(left in the folder by an earlier run)."))
    for run in runs:
        record = read_run(run)
        sub_parts = _run_parts(record, level=3)
        _write_page(run, f"kerasfast run: {folder.name}/{run.name}", _run_parts(record, level=2, plot=False))
        parts += [page.heading(f"Run: {run.name}/", 2), *sub_parts]
    for export in exports:
        parts += _export_parts(read_export(export), folder / f"{export.name}.png", level=2,
                               title=f"Export: {export.name}/")
    return _write_page(folder, f"kerasfast runs: {folder.name}", parts)


def report_or_warning(folder) -> pathlib.Path | None:
    """`write_report(folder)`, or None and a warning naming the failure.

    For callers that have just finished a run (`kerasfast.fit`, the
    quickstart, the recipes): a report that cannot be drawn (a plotting
    error, a full disk) must never lose the run's results.

    Args:
        folder: As for `write_report`.

    Returns:
        The path of `report.html`, or None when it could not be written.

    Example:

    >>> import warnings
    >>> with warnings.catch_warnings(record=True, action="always") as caught:
    ...     report_or_warning("runs/missing")  # None: no report, and no exception
    >>> print(caught[0].message)
    kerasfast: the run's files are in runs/missing, but its report.html could not be written (ReportError: ...);
    regenerate it with `kerasfast report runs/missing`.
    """
    try:
        return write_report(folder)
    except Exception as error:  # noqa: BLE001 - whatever failed, the run's results stand
        warnings.warn(f"kerasfast: the run's files are in {folder}, but its report.html could not be written "
                      f"({type(error).__name__}: {error}); regenerate it with `kerasfast report {folder}`.",
                      RuntimeWarning, stacklevel=2)
        return None


def _write_page(folder: pathlib.Path, title: str, parts: list[str]) -> pathlib.Path:
    from kerasfast._atomic import replace_durably

    text = page.page(title, parts)
    return replace_durably(folder / REPORT_FILE, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def _number(value, spec: str = ".4g") -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, (int, float)):
        return format(value, spec)
    return str(value)


def _summary_rows(record: RunRecord) -> list[tuple[str, str]]:
    result, hardware = record.result, record.plan.get("hardware") or {}
    throughput = result.get("throughput") or {}
    rows = [("data", result.get("data", "")), ("model", result.get("model_preparation", "")),
            ("epochs", _number(result.get("epochs")))]
    final = result.get("final_metrics") or {}
    if final:
        rows.append(("final metrics", ", ".join(f"{name} {_number(value)}" for name, value in final.items())))
    if throughput.get("samples_per_second"):
        rows.append(("throughput", f"{throughput['samples_per_second']:,.0f} samples/s, "
                                   f"{throughput['steps_per_second']:,.1f} steps/s over "
                                   f"{throughput['measured_steps']} steps after the first execution"))
    else:
        rows.append(("throughput", "run too short to measure (only the first, compiling execution ran)"))
    if throughput.get("first_execution_s") is not None:
        rows.append(("first execution", f"{throughput['first_execution_s']:.2f} s (tracing and compilation "
                                        "included)"))
    rows.append(("input", result.get("input", "")))
    recoveries = result.get("recoveries") or []
    rows.append(("divergence recoveries", "none" if not recoveries else
                 "; ".join(f"epoch {r.get('epoch')} step {r.get('step')}: {r.get('problem')}" for r in recoveries)))
    if hardware:
        gpus = ", ".join(gpu.get("name", "?") for gpu in hardware.get("gpus") or []) or "no GPU"
        rows.append(("hardware", f"{hardware.get('cpu_model', '?')}, {hardware.get('cpu_cores', '?')} usable cores; "
                                 f"{gpus}"))
    return rows


def _plan_rows(plan: dict) -> list[tuple[str, str, str]]:
    """(field, value, reason) as `Plan.rows()` shows them, from `plan.json`."""
    rows = []
    for name, field in (plan.get("fields") or {}).items():
        value = field.get("value")
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        rows.append((name, shown + (" (yours)" if field.get("source") == "user" else ""), field.get("reason", "")))
    return rows


def _run_parts(record: RunRecord, *, level: int, plot: bool = True) -> list[str]:
    """The HTML parts of one run; with `plot`, its PNGs are (re)drawn first."""
    folder, sub = record.folder, level + 1
    parts = [page.heading("Summary", sub),
             page.table(["", ""], _summary_rows(record))]
    if record.tensorboard is not None:
        parts.append(page.paragraph(f"TensorBoard logs (scalars and a profile of a few steady-state steps): "
                                    f"tensorboard --logdir {record.tensorboard}", "note"))

    parts.append(page.heading("Loss and metrics per epoch", sub))
    if plot:
        plots.plot_curves(record.history, folder / CURVES, title=f"{folder.name}: training and validation")
    parts.append(page.image(folder / CURVES, "loss and metrics per epoch"))
    if not any(name.startswith("val_") for name in record.history):
        parts.append(page.paragraph("No validation curves: the run had no validation data.", "note"))

    parts.append(page.heading("Throughput and input wait over the run", sub))
    timeline = record.timeline
    if timeline and len(timeline.get("step") or []) >= 2:
        if plot:
            plots.plot_timeline(timeline, folder / THROUGHPUT)
        parts.append(page.image(folder / THROUGHPUT, "samples/s and input-wait fraction over the steps"))
        parts.append(page.paragraph("The first execution (tracing and compilation) and validation are outside the "
                                    "measured window; each point is one recorded interval of training.", "note"))
    else:
        if plot:  # a plot left by an earlier run in this folder would pass for this one's
            (folder / THROUGHPUT).unlink(missing_ok=True)
        why = ("the run was too short (only its first, compiling execution)" if timeline is not None
               else "the folder has no timeline.json (written by an older kerasfast)")
        parts.append(page.paragraph(f"No throughput timeline: {why}.", "note"))

    parts.append(page.heading("Plan", sub))
    parts.append(page.table(["field", "value", "why"], _plan_rows(record.plan)))
    tuning = record.plan.get("tuning") or []
    if tuning:
        columns = [name for name in tuning[0] if name != "rates"]
        seconds = record.plan.get("tuning_seconds")
        took = f" (tuning took {seconds:.1f} s beyond the chosen plan's compilation)" if seconds is not None else ""
        parts.append(page.heading(f"Tuning: candidate plans measured on the model{took}", sub + 1))
        parts.append(page.table(columns, [[_number(row.get(name)) for name in columns] for row in tuning],
                                numeric=("samples_per_second", "loss", "compile_s")))

    if record.pruning:
        parts.append(page.heading("Sparsity per layer", sub))
        if plot:
            plots.plot_sparsity(record.pruning, folder / SPARSITY)
        parts.append(page.image(folder / SPARSITY, "sparsity per layer"))
        columns = ["layer", "type", "shape", "params", "target sparsity", "sparsity"]
        rows = [[row.get("layer"), row.get("type"), "x".join(map(str, row.get("shape") or [])), row.get("params"),
                 _number(row.get("target_sparsity"), ".3f"),
                 _number(row.get("sparsity"), ".3f") if row.get("pruned", True) else f"dense ({row.get('reason', '')})"]
                for row in record.pruning]
        parts.append(page.table(columns, rows, numeric=("params", "target sparsity")))
    elif plot:
        (folder / SPARSITY).unlink(missing_ok=True)

    for title, path in record.extra_images.items():
        parts += [page.heading(title, sub), page.image(path, title)]
    return parts


def _export_parts(record: ExportRecord, png: pathlib.Path, *, level: int, title: str) -> list[str]:
    """The HTML parts of one export: size and accuracy per format, and its table."""
    parts = [page.heading(title, level)]
    context = record.context
    if context.get("model_name"):
        note = f"Model {context['model_name']}"
        if context.get("eval_samples"):
            note += f"; accuracy and loss on {context['eval_samples']} eval samples, each artifact run in its runtime"
        parts.append(page.paragraph(note + ".", "note"))
    if not record.artifacts:
        return parts + [page.paragraph("The export report lists no artifacts.", "note")]
    plots.plot_export(record.artifacts, png, title=f"{record.folder.name}: size and accuracy per format")
    parts.append(page.image(png, "size and accuracy per exported format"))
    columns = ["format", "file", "size (KB)", "gzipped (KB)", "sparsity", "accuracy", "loss", "max diff vs Keras",
               "ms/sample", "verified", "notes"]
    rows = [[row.get("format"), row.get("path"), _number(row.get("size_bytes", 0) / 1024, ".1f"),
             _number(row.get("gzip_bytes", 0) / 1024, ".1f"), _number(row.get("sparsity"), ".3f"),
             _number(row.get("accuracy"), ".4f"), _number(row.get("loss"), ".4f"),
             _number(row.get("max_abs_diff"), ".2e"), _number(row.get("latency_ms"), ".4f"),
             "yes" if row.get("verified") else "no", row.get("notes", "")]
            for row in record.artifacts]
    parts.append(page.table(columns, rows, numeric=("size (KB)", "gzipped (KB)", "sparsity", "accuracy", "loss",
                                                    "max diff vs Keras", "ms/sample")))
    return parts


def _left_from_earlier_runs(folder: pathlib.Path) -> list[str]:
    """The sub-folders a recipe's `metrics.json` lists as an earlier run's (`recipes.finish`)."""
    path = folder / "metrics.json"
    return list(read_json(path).get(LEFT_FROM_EARLIER_RUNS, [])) if path.is_file() else []


def _results_parts(folder: pathlib.Path) -> list[str]:
    """The figures of a quickstart's or recipe's `metrics.json`, when there is one."""
    path = folder / "metrics.json"
    if not path.is_file():
        return []
    metrics = read_json(path)
    rows = [(name, _number(value)) for name, value in metrics.items()
            if isinstance(value, (int, float, str, bool)) or value is None]
    return [page.heading("Results (metrics.json)", 2), page.table(["", ""], rows)] if rows else []
