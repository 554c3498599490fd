"""What a run report is made from: the JSON files a run or an export leaves.

A *run folder* (the `run_dir` of `kerasfast.fit`) holds `plan.json`,
`history.json` and `result.json`, and may hold `timeline.json` (throughput
over the run), `pruning.json` (with `prune=`), `lr_find.png` (with
`learning_rate="find"`) and `tensorboard/`. An *export folder* (the
`out_dir` of `kerasfast.export.export_model`) holds `report.json`. A folder
of runs (the quickstart's or a recipe's: `train/`, `prune/`, `export/`)
holds such folders one level down.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from kerasfast.errors import ReportError

RUN_FILES = ("plan.json", "history.json", "result.json")
EXPORT_FILE = "report.json"
# metrics.json's list of the sub-folders an earlier run into the same folder left (`earlier_folders`).
LEFT_FROM_EARLIER_RUNS = "left_from_earlier_runs"

_HOW_TO_GET = {
    "plan.json": "kerasfast.fit writes it before training when run_dir= is a folder (not False)",
    "history.json": "kerasfast.fit writes it when training finishes; a run that stopped before cannot be reported "
                    "(re-run the same fit: with a backup in the folder it resumes where it stopped)",
    "result.json": "kerasfast.fit writes it when training finishes; a run that stopped before cannot be reported "
                   "(re-run the same fit: with a backup in the folder it resumes where it stopped)",
}


@dataclasses.dataclass
class RunRecord:
    """One training run, as read from its run folder.

    Attributes:
        folder: The run folder.
        plan: `plan.json`: `{"fields": {name: {value, reason, source}}, "tuning", "hardware"}`.
        history: `history.json`: `{metric: [value per epoch]}` (None for a
            non-finite value).
        result: `result.json` (`FitResult.summary()`).
        timeline: `timeline.json` (`ThroughputMeter.timeline()`), or None
            when the folder has none (written by an older kerasfast).
        pruning: `pruning.json` rows (per-layer sparsity), or None.
        extra_images: Other PNGs of the run to show, by title (the
            learning-rate range test's `lr_find.png`).
        tensorboard: The TensorBoard log folder, or None.
    """

    folder: pathlib.Path
    plan: dict
    history: dict
    result: dict
    timeline: dict | None = None
    pruning: list | None = None
    extra_images: dict = dataclasses.field(default_factory=dict)
    tensorboard: pathlib.Path | None = None


@dataclasses.dataclass
class ExportRecord:
    """One export, as read from its `report.json`.

    Attributes:
        folder: The export folder.
        context: The report's context (`model_name`, `eval_samples`, ...).
        artifacts: One dict per artifact (`kerasfast.export.ArtifactReport`
            fields: format, path, size_bytes, gzip_bytes, accuracy, ...).
    """

    folder: pathlib.Path
    context: dict
    artifacts: list


def read_json(path: pathlib.Path, how_to_get: str = ""):
    """The parsed JSON file at `path`.

    Raises:
        ReportError: When it is missing (naming it and `how_to_get` it) or
            does not parse.
    """
    if not path.is_file():
        raise ReportError(f"cannot make the report of {path.parent}: {path.name} is missing"
                          + (f" ({how_to_get})." if how_to_get else "."))
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ReportError(f"cannot make the report of {path.parent}: {path.name} could not be read ({error}). "
                          "Re-run the fit or export that wrote it.") from error


def is_run_folder(folder: pathlib.Path) -> bool:
    """Whether `folder` is a fit run folder (it has `plan.json`)."""
    return (folder / "plan.json").is_file()


def is_export_folder(folder: pathlib.Path) -> bool:
    """Whether `folder` holds an export's `report.json`."""
    path = folder / EXPORT_FILE
    if not path.is_file():
        return False
    try:
        return "artifacts" in json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def read_run(folder: pathlib.Path) -> RunRecord:
    """Reads a run folder.

    Args:
        folder: The `run_dir` of a finished `kerasfast.fit`.

    Returns:
        Its `RunRecord`.

    Raises:
        ReportError: When `plan.json`, `history.json` or `result.json` is
            missing or unreadable; the message names the file and how to
            get it.

    Example:

    >>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> _ = kerasfast.fit(model, x, x.sum(axis=1), epochs=2, loss="mse", precision="float32",
    ...                   run_dir="runs/first", verbose=0)
    >>> run = read_run(pathlib.Path("runs/first"))
    >>> run.plan["fields"]["precision"]["value"], len(run.history["loss"])
    ('float32', 2)
    """
    folder = pathlib.Path(folder)
    plan, history, result = (read_json(folder / name, _HOW_TO_GET[name]) for name in RUN_FILES)
    _check_shape(folder / "plan.json", plan, isinstance(plan, dict), 'a JSON object ({"fields": {...}, ...})')
    _check_shape(folder / "result.json", result, isinstance(result, dict), "a JSON object")
    _check_shape(folder / "history.json", history, _is_history(history),
                 'a JSON object of per-epoch numbers per metric, e.g. {"loss": [0.9, 0.5]}')
    timeline = read_json(folder / "timeline.json") if (folder / "timeline.json").is_file() else None
    pruning = read_json(folder / "pruning.json") if (folder / "pruning.json").is_file() else None
    extra = {}
    if (folder / "lr_find.png").is_file():
        extra["Learning-rate range test"] = folder / "lr_find.png"
    tensorboard = folder / "tensorboard" if (folder / "tensorboard").is_dir() else None
    return RunRecord(folder, plan, history, result, timeline, pruning, extra, tensorboard)


def _is_history(history) -> bool:
    """Whether `history` is `{metric: [number or None per epoch]}`."""
    return isinstance(history, dict) and all(
        isinstance(name, str) and isinstance(values, list)
        and all(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)) for value in values)
        for name, values in history.items())


def _check_shape(path: pathlib.Path, data, ok: bool, expected: str) -> None:
    if not ok:
        found = json.dumps(data)
        found = found if len(found) <= 60 else found[:57] + "..."
        raise ReportError(f"cannot make the report of {path.parent}: {path.name} should hold {expected}, but it "
                          f"holds {found}. Re-run the fit that wrote it.")


def read_export(folder: pathlib.Path) -> ExportRecord:
    """Reads an export folder's `report.json`.

    Raises:
        ReportError: When it is missing or unreadable.
    """
    folder = pathlib.Path(folder)
    data = read_json(folder / EXPORT_FILE, "kerasfast.export.export_model writes it into its out_dir")
    artifacts = data.get("artifacts", [])
    context = {key: value for key, value in data.items() if key != "artifacts"}
    return ExportRecord(folder, context, artifacts)


def export_folders(folder: pathlib.Path) -> list[pathlib.Path]:
    """The export folders directly inside `folder`, by name."""
    return [sub for sub in sorted(folder.iterdir()) if sub.is_dir() and is_export_folder(sub)]


def run_folders(folder: pathlib.Path) -> list[pathlib.Path]:
    """The run folders directly inside `folder`, in the order they were made.

    A folder whose `plan.json` exists but whose run did not finish is
    included (reading it then names the missing file).
    """
    found = [sub for sub in folder.iterdir() if sub.is_dir() and is_run_folder(sub)]
    return sorted(found, key=lambda sub: ((sub / "plan.json").stat().st_mtime, sub.name))


def earlier_folders(folder: pathlib.Path, run: pathlib.Path) -> list[str]:
    """The run and export folders inside `folder` written before the run in `run` started: left by an
    earlier run into the same folder (a recipe run again without --prune leaves the last one's prune/).

    Example:

    >>> earlier_folders(pathlib.Path("runs"), pathlib.Path("runs/missing"))
    []
    """
    started = run / "plan.json"
    if not started.is_file():
        return []
    since = started.stat().st_mtime_ns
    written = {sub: sub / ("plan.json" if is_run_folder(sub) else EXPORT_FILE)
               for sub in [*run_folders(folder), *export_folders(folder)] if sub != run}
    return sorted(sub.name for sub, marker in written.items() if marker.stat().st_mtime_ns < since)
