"""Run folders: where a training run leaves its plan, history and model.

Files are written atomically and durably (temporary name, flushed to disk,
then renamed, and the folder's entry flushed too), so a run that is
interrupted or a machine that loses power never leaves a half-written file
that looks complete. JSON is strict: a NaN or infinite number is written as
`null`, so every file parses with any JSON reader.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import pathlib
import uuid

from kerasfast._atomic import replace_durably

DEFAULT_ROOT = "kerasfast_runs"


def new_run_dir(root: str | os.PathLike = DEFAULT_ROOT) -> pathlib.Path:
    """A fresh, uniquely named folder under `root`, e.g. `kerasfast_runs/20261129-210300-3f2a`."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = pathlib.Path(root) / f"{stamp}-{uuid.uuid4().hex[:4]}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def write_json(path: str | os.PathLike, data) -> pathlib.Path:
    """Writes `data` as indented, strict JSON to `path`, atomically and durably.

    Non-finite floats become `null`; NumPy scalars and arrays become
    numbers and lists; anything else unknown becomes its `str()`.

    Returns:
        The path written.
    """
    path = pathlib.Path(path)
    text = json.dumps(strict_json(data), indent=2, allow_nan=False, default=_jsonable) + "\n"
    return replace_durably(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def save_model(model, path: str | os.PathLike) -> pathlib.Path:
    """Saves `model` as `.keras`, atomically and durably."""
    return replace_durably(pathlib.Path(path), model.save, keep_suffix=True)


def strict_json(value):
    """`value` with every non-finite float (Python or NumPy) replaced by None.

    Example:

    >>> strict_json({"loss": [0.5, float("nan")]})
    {'loss': [0.5, None]}
    """
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    converted = _jsonable(value) if type(value).__module__ == "numpy" else value
    if converted is not value:
        return strict_json(converted)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


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
