"""Write a directory completely or not at all."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from kerasfast.errors import ExportError


def check_writable_destination(out_dir) -> Path:
    """Refuses an `out_dir` that cannot be created or replaced, writing nothing.

    Args:
        out_dir: destination folder (may exist; its contents get replaced).

    Returns:
        The absolute path.

    Raises:
        ExportError: naming the path and the reason.
    """
    out_dir = Path(out_dir).expanduser().absolute()
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"out_dir {out_dir} exists and is a file, not a folder; pick another out_dir.")
    ancestor = out_dir.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ExportError(
            f"out_dir {out_dir} cannot be created: {ancestor} is a file, not a folder. Pick another out_dir."
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ExportError(f"out_dir {out_dir} cannot be created: {ancestor} is not writable. Pick another out_dir.")
    return out_dir


@contextlib.contextmanager
def atomic_directory(out_dir):
    """Yields a temporary folder beside `out_dir` that replaces it on success.

    The temporary folder lives in the same parent, so the final step is a
    rename on one file system, not a copy. If the block raises (or the
    process is interrupted) `out_dir` keeps its previous contents and the
    temporary folder is removed (a hard kill leaves a hidden `.NAME.partial-*`
    folder beside it, never a half-written `out_dir`).

    Args:
        out_dir: the destination folder.

    Yields:
        A `pathlib.Path` to write into.
    """
    out_dir = check_writable_destination(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    except OSError as error:
        raise ExportError(f"Cannot write beside out_dir {out_dir}: {error}. Pick a writable out_dir.") from error
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out_dir.exists():
        backup = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out_dir, backup)
        try:
            os.rename(staging, out_dir)
        except BaseException:
            os.rename(backup, out_dir)
            shutil.rmtree(staging, ignore_errors=True)
            raise
        shutil.rmtree(backup, ignore_errors=True)
    else:
        os.rename(staging, out_dir)
