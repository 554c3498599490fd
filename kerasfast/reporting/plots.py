"""The run report's PNG figures, drawn with matplotlib's Agg renderer.

Figures are made as `matplotlib.figure.Figure` objects on an Agg canvas,
never through `pyplot`: nothing global changes (a notebook's or an
application's own matplotlib backend and open figures are left alone) and
no display is needed. Each function writes one PNG, atomically, and
returns its path.
"""

from __future__ import annotations

import math
import pathlib

import numpy as np

from kerasfast._atomic import replace_durably

DPI = 100
# Colours of the train and validation curves (matplotlib's first two).
TRAIN, VALIDATION = "#1f77b4", "#ff7f0e"


def _figure(width: float, height: float, rows: int = 1, columns: int = 1, **options):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False, **options)
    return figure, axes


def _save(figure, path: pathlib.Path) -> pathlib.Path:
    return replace_durably(pathlib.Path(path), lambda temporary: figure.savefig(temporary, format="png", dpi=DPI))


def _floats(values) -> np.ndarray:
    """Values as floats, None (a non-finite number in JSON) as NaN."""
    return np.array([math.nan if v is None else float(v) for v in values], dtype="float64")


def plot_curves(history: dict, path: pathlib.Path, title: str = "") -> pathlib.Path:
    """Loss and each metric per epoch: one panel each, training and validation.

    Args:
        history: `{name: [value per epoch]}` as Keras's `History.history`
            (validation values under `val_<name>`).
        path: The PNG to write.
        title: The figure's title.

    Returns:
        `path`.

    Example:

    >>> plot_curves({"loss": [0.9, 0.5], "val_loss": [1.0, 0.7]}, pathlib.Path("curves.png"))
    PosixPath('curves.png')
    """
    from matplotlib.ticker import MaxNLocator

    names = [name for name in history if not name.startswith("val_")]
    names += [name for name in history if name.startswith("val_") and name[4:] not in history]
    names = names or ["loss"]
    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    figure, axes = _figure(4.2 * columns, 3.2 * rows, rows, columns)
    for index, axis in enumerate(axes.flat):
        if index >= len(names):
            axis.set_visible(False)
            continue
        name = names[index]
        base = name[4:] if name.startswith("val_") and name not in history else name
        for key, label, colour in ((base, "train", TRAIN), (f"val_{base}", "validation", VALIDATION)):
            values = history.get(key)
            if values:
                axis.plot(range(1, len(values) + 1), _floats(values), marker="o", markersize=3, label=label,
                          color=colour)
        axis.set_title(base)
        axis.set_xlabel("epoch")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        if axis.get_lines():  # an empty history draws an empty panel, with nothing to label
            axis.legend(fontsize="small")
    if title:
        figure.suptitle(title)
    try:
        return _save(figure, path)
    finally:
        figure.clear()


def _windowed(counts: np.ndarray, seconds: np.ndarray, window: int) -> np.ndarray:
    """Rate over `window` intervals ending at each point (NaN before the first full window)."""
    rates = np.full(len(counts) - 1, math.nan)
    if len(counts) > window:
        span = seconds[window:] - seconds[:-window]
        with np.errstate(divide="ignore", invalid="ignore"):
            rates[window - 1:] = np.where(span > 0, (counts[window:] - counts[:-window]) / span, math.nan)
    return rates


def timeline_rates(timeline: dict) -> dict:
    """Samples/s and input-wait fraction between consecutive timeline points.

    Args:
        timeline: `ThroughputMeter.timeline()` (as saved in `timeline.json`).

    Returns:
        `{"step", "samples_per_second", "input_wait_fraction", "epoch_ends"}`:
        arrays over the intervals (x: steps done at each interval's end;
        the wait fraction is None when not measured), and the steps at
        which an epoch ended.

    Example:

    >>> timeline_rates({"step": [1, 3], "epoch": [0, 0], "seconds": [0.0, 0.5], "samples": [0, 64],
    ...                 "input_wait_seconds": [0.0, 0.1]})["samples_per_second"]
    array([128.])
    """
    steps = np.asarray(timeline["step"], dtype="float64")
    seconds = _floats(timeline["seconds"])
    samples = _floats(timeline["samples"])
    with np.errstate(divide="ignore", invalid="ignore"):
        spans = np.diff(seconds)
        rate = np.where(spans > 0, np.diff(samples) / spans, math.nan)
        waits = timeline.get("input_wait_seconds") or []
        fraction = None
        if waits and all(w is not None for w in waits):
            fraction = np.clip(np.where(spans > 0, np.diff(_floats(waits)) / spans, math.nan), 0.0, 1.0)
    epochs = timeline.get("epoch") or [0] * len(steps)
    ends = [steps[i] for i in range(len(epochs) - 1) if epochs[i + 1] != epochs[i]]
    return {"step": steps[1:], "samples_per_second": rate, "input_wait_fraction": fraction, "epoch_ends": ends,
            "seconds": seconds, "samples": samples, "waits": _floats(waits) if fraction is not None else None}


def plot_timeline(timeline: dict, path: pathlib.Path, title: str = "") -> pathlib.Path:
    """Samples/s and the input-wait fraction over the run's steps.

    The first execution (tracing and compilation) and validation are not
    in the window. Each point is one recorded interval (one execution, or
    several in a long run); a smoothed line is drawn over many points.

    Args:
        timeline: `ThroughputMeter.timeline()` with at least two points.
        path: The PNG to write.
        title: The figure's title.

    Returns:
        `path`.
    """
    rates = timeline_rates(timeline)
    steps = rates["step"]
    figure, axes = _figure(8.5, 5.2, 2, 1, sharex=True)
    top, bottom = axes[0, 0], axes[1, 0]
    count = len(steps)
    window = max(2, count // 25) if count >= 20 else 0
    style = dict(marker="o", markersize=2.5) if count <= 60 else {}
    top.plot(steps, rates["samples_per_second"], color=TRAIN, alpha=0.45 if window else 1.0, linewidth=1,
             label="per interval", **style)
    if window:
        smooth = _windowed(rates["samples"], rates["seconds"], window)
        top.plot(steps, smooth, color=TRAIN, linewidth=2, label=f"over {window} intervals")
        top.legend(fontsize="small")
    top.set_ylabel("samples/s")
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    if rates["input_wait_fraction"] is not None:
        bottom.plot(steps, rates["input_wait_fraction"], color=VALIDATION, alpha=0.45 if window else 1.0,
                    linewidth=1, **style)
        if window:
            bottom.plot(steps, _windowed(rates["waits"], rates["seconds"], window), color=VALIDATION, linewidth=2)
        bottom.set_ylim(0, 1)
    else:
        bottom.text(0.5, 0.5, "input wait not measured (Keras's own train step ran)", ha="center", va="center",
                    transform=bottom.transAxes)
    bottom.set_ylabel("input-wait fraction")
    bottom.set_xlabel("training step")
    bottom.grid(alpha=0.3)
    for end in rates["epoch_ends"]:
        for axis in (top, bottom):
            axis.axvline(end, color="grey", linestyle=":", linewidth=0.8)
    figure.suptitle(title or "throughput over the run (dotted: epoch ends)")
    try:
        return _save(figure, path)
    finally:
        figure.clear()


def plot_sparsity(rows: list, path: pathlib.Path, title: str = "") -> pathlib.Path:
    """Achieved sparsity per layer (bars) against each layer's target (ticks).

    Args:
        rows: `FitResult.pruning` / `pruning.json` rows (`layer`,
            `sparsity`, `target_sparsity`, `pruned`).
        path: The PNG to write.
        title: The figure's title.

    Returns:
        `path`.
    """
    names = [f"{row['layer']}" + ("" if row.get("pruned", True) else " (dense)") for row in rows]
    achieved = _floats([row.get("sparsity", 0.0) if row.get("pruned", True) else 0.0 for row in rows])
    target = _floats([row.get("target_sparsity", 0.0) for row in rows])
    figure, axes = _figure(7.0, 0.9 + 0.35 * max(2, len(rows)))
    axis = axes[0, 0]
    positions = np.arange(len(rows))
    axis.barh(positions, achieved, color=TRAIN, label="achieved")
    axis.scatter(target, positions, marker="|", s=250, color="black", label="target", zorder=3)
    axis.set_yticks(positions, names)
    axis.invert_yaxis()
    axis.set_xlim(0, 1)
    axis.set_xlabel("sparsity (share of zero weights)")
    axis.grid(axis="x", alpha=0.3)
    axis.legend(fontsize="small", loc="lower right")
    figure.suptitle(title or "sparsity per layer")
    try:
        return _save(figure, path)
    finally:
        figure.clear()


def plot_export(artifacts: list, path: pathlib.Path, title: str = "") -> pathlib.Path:
    """Size (on disk and gzipped) and accuracy of each exported format.

    Args:
        artifacts: `report.json`'s artifact rows (`format`, `size_bytes`,
            `gzip_bytes`, `accuracy`, `loss`).
        path: The PNG to write.
        title: The figure's title.

    Returns:
        `path`.
    """
    formats = [row["format"] for row in artifacts]
    positions = np.arange(len(formats))
    figure, axes = _figure(max(7.0, 1.3 * len(formats) * 2), 3.6, 1, 2)
    size, quality = axes[0, 0], axes[0, 1]
    size.bar(positions - 0.2, _floats([row.get("size_bytes", 0) / 1024 for row in artifacts]), 0.4,
             label="on disk", color=TRAIN)
    size.bar(positions + 0.2, _floats([row.get("gzip_bytes", 0) / 1024 for row in artifacts]), 0.4,
             label="gzipped", color=VALIDATION)
    size.set_ylabel("KB")
    size.set_title("size")
    size.legend(fontsize="small")
    measure = "accuracy" if any(row.get("accuracy") is not None for row in artifacts) else "loss"
    values = _floats([row.get(measure) for row in artifacts])
    if np.isfinite(values).any():
        quality.bar(positions, values, color=TRAIN)
        for x, value in zip(positions, values, strict=True):
            if np.isfinite(value):
                quality.annotate(f"{value:.4f}", (x, value), ha="center", va="bottom", fontsize="small")
        if measure == "accuracy":
            low = np.nanmin(values)
            quality.set_ylim(max(0.0, low - 0.1), min(1.0, np.nanmax(values) + 0.05) if low > 0.15 else 1.0)
    else:
        quality.text(0.5, 0.5, "not evaluated (export without eval_data)", ha="center", va="center",
                     transform=quality.transAxes)
    quality.set_title(f"{measure} on eval_data")
    for axis in (size, quality):
        axis.set_xticks(positions, formats, rotation=20, ha="right")
        axis.grid(axis="y", alpha=0.3)
    figure.suptitle(title or "exported formats")
    try:
        return _save(figure, path)
    finally:
        figure.clear()
