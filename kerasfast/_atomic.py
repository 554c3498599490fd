"""The one way kerasfast replaces a file: write beside it, flush, rename.

Every file kerasfast writes that a reader might open while it is being
(re)written (run folders, backups, reports, plots, dataset schemas, the export
manifest) goes through `replace_durably`, so an interrupted process or a
machine that loses power never leaves a half-written file under its final
name: the reader sees the old file or the new one, complete.
"""

from __future__ import annotations

import os
import pathlib
import uuid


def replace_durably(path, write, *, keep_suffix: bool = False, temporary=None) -> pathlib.Path:
    """Calls `write(temporary)` beside `path`, flushes it, renames it to `path`.

    The temporary file is flushed to disk before the rename and the folder's
    entry after it, so the new content survives a power loss once this
    returns. The temporary file is removed whenever the write or rename
    fails.

    Args:
        path: The file to (re)place (`str` or path-like); its folder is
            created if missing.
        write: Writes the file's content to the `pathlib.Path` it is given.
        keep_suffix: The temporary name ends with `path`'s name (for writers
            such as Keras's `save` and NumPy's `savez` that add or require
            a suffix).
        temporary: Where to write before the rename, in `path`'s folder.
            Default: a hidden unique name beside `path`. Pass one when the
            caller's own clean-up of killed writes looks for its names.

    Returns:
        `path`, as a `pathlib.Path`.

    Raises:
        OSError: As raised by the write or rename (disk full, permissions),
            with `path` as the error's filename; no temporary file is left.

    Example:

    >>> import tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> replace_durably(folder / "notes.txt", lambda t: t.write_text("done\\n")).read_text()
    'done\\n'
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if temporary is None:
        tag = uuid.uuid4().hex[:8]
        temporary = path.with_name(f".tmp-{tag}-{path.name}" if keep_suffix else f".{path.name}.tmp-{tag}")
    temporary = pathlib.Path(temporary)
    try:
        write(temporary)
        _fsync(temporary)
        os.replace(temporary, path)
        _fsync(path.parent)
    except OSError as error:
        if error.filename is None:
            error.filename = os.fspath(path)
        raise
    finally:
        temporary.unlink(missing_ok=True)
    return path


def _fsync(path: pathlib.Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
