"""Run folders: where a training run leaves its plan, history and model.

Files are written atomically (temporary name, then rename), so a run that
is interrupted never leaves a half-written file that looks complete.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import uuid

DEFAULT_ROOT = "kerasfast_runs"


def new_run_dir(root: str | os.PathLike = DEFAULT_ROOT) -> pathlib.Path:
    """A fresh, uniquely named folder under `root`, e.g. `kerasfast_runs/20261129-210300-3f2a`."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = pathlib.Path(root) / f"{stamp}-{uuid.uuid4().hex[:4]}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def write_json(path: str | os.PathLike, data) -> pathlib.Path:
    """Writes `data` as indented JSON to `path` atomically."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        temporary.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n", encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def save_model(model, path: str | os.PathLike) -> pathlib.Path:
    """Saves `model` as `.keras` atomically."""
    path = pathlib.Path(path)
    temporary = path.with_name(f".tmp-{uuid.uuid4().hex[:8]}-{path.name}")
    try:
        model.save(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def _jsonable(value):
    try:
        import numpy as np

        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return value.tolist()
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    return str(value)
