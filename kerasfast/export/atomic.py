"""Write export artifacts into a folder without touching anything else in it.

kerasfast owns only what it wrote: the names listed in the manifest
`kerasfast-export.json` it keeps in `out_dir`. Everything else (a user's
notes, sub-folders, the folder's own mode) is left alone. Each artifact is
built in a hidden temporary folder inside `out_dir` and renamed into place,
so an interrupted export never leaves a half-written artifact under its final
name; the hidden `.kerasfast-tmp-*` leftovers of a killed export are removed
by the next export into that folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import uuid
from pathlib import Path

from kerasfast._atomic import replace_durably
from kerasfast.errors import ExportError

MANIFEST_NAME = "kerasfast-export.json"
# Every temporary name kerasfast uses inside out_dir starts with this, so
# leftovers of an interrupted export can be told from the user's files.
TEMP_PREFIX = ".kerasfast-tmp-"
REPORT_NAMES = ("report.json", "report.md")
_SHOWN = 5  # foreign names quoted in an error; the rest are counted


@dataclasses.dataclass
class DestinationContents:
    """What `out_dir` holds, split by who wrote it.

    Attributes:
        owned: top-level names kerasfast wrote, mapped to the relative paths
            it recorded under them (None: the whole entry, for an export
            written before the manifest existed).
        foreign: top-level names (folders end in "/") kerasfast did not
            write, each with a reason when it is not simply unknown.
        leftovers: `TEMP_PREFIX` names left by an interrupted export.
    """

    owned: dict = dataclasses.field(default_factory=dict)
    foreign: dict = dataclasses.field(default_factory=dict)
    leftovers: list = dataclasses.field(default_factory=list)


# Suffixes of single model files: an out_dir named so was meant as one file, not as a folder of artifacts.
ARTIFACT_SUFFIXES = (".keras", ".tflite", ".onnx", ".h5", ".pb")


def check_writable_destination(out_dir) -> Path:
    """Refuses an `out_dir` that cannot be created or written into, writing nothing.

    Args:
        out_dir: destination folder (may exist; only kerasfast's own files in
            it are ever replaced).

    Returns:
        The absolute path.

    Raises:
        ExportError: naming the path and the reason.
    """
    if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir).strip():
        raise ExportError(
            f"out_dir must be the path of a folder to export into (a str or pathlib.Path); got {out_dir!r}."
        )
    out_dir = Path(out_dir).expanduser().absolute()
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"out_dir {out_dir} exists and is a file, not a folder; pick another out_dir.")
    if not out_dir.exists() and out_dir.suffix.lower() in ARTIFACT_SUFFIXES:
        raise ExportError(
            f"out_dir {out_dir} is named like a {out_dir.suffix} file, but it is the folder the artifacts are "
            f"written into (model.keras, model_float32.tflite, ...): pass a folder, e.g. {out_dir.with_suffix('')}.")
    if out_dir.is_dir():
        if not os.access(out_dir, os.W_OK | os.X_OK):
            raise ExportError(f"out_dir {out_dir} is not writable. Pick another out_dir.")
        return out_dir
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


def _listing(folder: Path) -> set[str]:
    """Relative POSIX paths under `folder`, starting with its name; folders end in "/"."""
    paths = {folder.name + "/"}
    for root, dirs, files in os.walk(folder):
        relative = Path(root).relative_to(folder.parent).as_posix()
        paths.update(f"{relative}/{d}/" for d in dirs)
        paths.update(f"{relative}/{f}" for f in files)
    return paths


def _read_manifest(out_dir: Path) -> dict | None:
    """{top-level name: recorded paths} from the manifest, None if absent or not ours."""
    try:
        payload = json.loads((out_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
        entries = payload["entries"]
        if payload.get("kerasfast_export_manifest") != 1 or not all(isinstance(e, str) for e in entries):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    owned: dict = {}
    for entry in entries:
        top = entry.split("/", 1)[0]
        if top and top not in (".", "..", MANIFEST_NAME) and not top.startswith(TEMP_PREFIX):
            owned.setdefault(top, set()).add(entry)
    return owned


def _read_pre_manifest_report(out_dir: Path) -> dict | None:
    """Owned names of an export written before the manifest, from its report.json.

    Such a folder holds report.json, report.md and the artifacts its report
    lists; recognising it lets an upgrade re-export into it as before.
    """
    from kerasfast.export.formats import FORMATS

    try:
        payload = json.loads((out_dir / "report.json").read_text(encoding="utf-8"))
        paths = [a["path"] for a in payload["artifacts"] if FORMATS[a["format"]].filename == a["path"]]
        if len(paths) != len(payload["artifacts"]) or "formats" not in payload:
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return {name: None for name in [*paths, *REPORT_NAMES] if (out_dir / name).exists()}


def inspect_destination(out_dir: Path) -> DestinationContents:
    """Sorts the entries of `out_dir` into kerasfast's, foreign and leftovers.

    An entry the manifest lists counts as kerasfast's only while it still is
    what kerasfast wrote: the same kind (file or real folder, never a link)
    and, for a folder, nothing added inside it. Otherwise the whole entry is
    foreign, so no later export deletes what the user put there.

    Args:
        out_dir: an absolute folder path (need not exist).

    Returns:
        A `DestinationContents`.
    """
    contents = DestinationContents()
    if not out_dir.is_dir():
        return contents
    recorded = _read_manifest(out_dir)
    has_manifest = recorded is not None
    if not has_manifest:
        recorded = _read_pre_manifest_report(out_dir) or {}
    for entry in sorted(os.scandir(out_dir), key=lambda e: e.name):
        name, is_dir = entry.name, entry.is_dir(follow_symlinks=False)
        if name.startswith(TEMP_PREFIX):
            contents.leftovers.append(name)
            continue
        if name == MANIFEST_NAME and has_manifest and entry.is_file(follow_symlinks=False):
            continue
        label = name + "/" if is_dir else name
        if name == MANIFEST_NAME:
            contents.foreign[label] = "not a manifest kerasfast can read"
            continue
        if name not in recorded:
            contents.foreign[label] = ""
            continue
        paths = recorded[name]
        if entry.is_symlink():
            contents.foreign[label] = "a link where kerasfast wrote a real file or folder"
        elif paths is None:
            contents.owned[name] = None
        elif is_dir != (f"{name}/" in paths):
            contents.foreign[label] = "replaced since kerasfast wrote it"
        elif is_dir and (added := sorted(_listing(Path(entry.path)) - paths)):
            more = f" and {len(added) - 1} more" if len(added) > 1 else ""
            contents.foreign[label] = f"holds {added[0]}{more}, which kerasfast did not write"
        else:
            contents.owned[name] = paths
    return contents


def _quote(foreign: dict, names) -> str:
    shown = [f"{n} ({foreign[n]})" if foreign[n] else n for n in list(names)[:_SHOWN]]
    rest = len(names) - len(shown)
    return ", ".join(shown) + (f" and {rest} more" if rest else "")


def check_destination(out_dir: Path, names, *, overwrite: bool) -> DestinationContents:
    """Refuses an export that would mix with, replace or delete files kerasfast did not write.

    Args:
        out_dir: absolute destination folder (need not exist).
        names: top-level names the export is about to write.
        overwrite: export into a folder that also holds foreign files
            (they are left alone).

    Returns:
        The folder's `DestinationContents`.

    Raises:
        ExportError: naming the foreign entries (a few, and how many) and the
            way out.
    """
    contents = inspect_destination(out_dir)
    foreign = contents.foreign
    if not foreign:
        return contents
    wanted = {*names, MANIFEST_NAME}
    # overwrite=True leaves foreign entries alone, which it cannot do for one
    # at a name this export writes: refuse that even with overwrite.
    clashing = [label for label in foreign if label.rstrip("/") in wanted]
    if clashing:
        raise ExportError(
            f"out_dir {out_dir} holds {_quote(foreign, clashing)}, which kerasfast did not write, at "
            f"{'a name' if len(clashing) == 1 else 'names'} this export would replace. kerasfast never "
            "replaces or deletes files it did not write, even with overwrite=True (command line: --overwrite): "
            f"move or rename {'it' if len(clashing) == 1 else 'them'}, or pick another out_dir."
        )
    if not overwrite:
        listed = list(foreign)
        raise ExportError(
            f"out_dir {out_dir} holds {len(listed)} "
            f"{'entry' if len(listed) == 1 else 'entries'} kerasfast did not write: {_quote(foreign, listed)}. "
            "Export writes only its own files and leaves these alone, but mixes with them only when asked: "
            "pass overwrite=True (command line: --overwrite) to export into this folder anyway, or pick an "
            "empty or new out_dir."
        )
    return contents


def _temp_path(out_dir: Path, role: str) -> Path:
    return out_dir / f"{TEMP_PREFIX}{role}-{uuid.uuid4().hex[:12]}"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _move_into_place(source: Path, target: Path) -> None:
    """Renames `source` over `target`: a file in one atomic step, a folder in two.

    A folder cannot be renamed over a non-empty one, so the old folder is
    first renamed to a temporary name (an interruption between the two
    renames leaves no artifact under `target`, never a half-written one;
    the next export removes the temporary one).
    """
    if target.is_dir() and not target.is_symlink():
        retired = _temp_path(target.parent, "old")
        os.rename(target, retired)
        os.rename(source, target)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(source, target)


def _write_manifest(out_dir: Path, entries) -> None:
    from kerasfast import __version__

    payload = {
        "kerasfast_export_manifest": 1,
        "written_by": f"kerasfast {__version__}",
        "about": "What kerasfast export wrote in this folder. The next export into it replaces or removes "
        "only these; every other file is left alone.",
        "entries": sorted(entries),
    }
    text = json.dumps(payload, indent=2) + "\n"
    # A TEMP_PREFIX name: if the export is killed mid-write, the next one removes it.
    replace_durably(out_dir / MANIFEST_NAME, lambda temporary: temporary.write_text(text, encoding="utf-8"),
                    temporary=_temp_path(out_dir, "manifest"))


def record_written(out_dir, names) -> None:
    """Adds files written into an export folder after its export (a report of it) to the folder's
    manifest, so that the next export into it replaces them as its own rather than refusing them as
    the user's.

    Args:
        out_dir: An export folder; a folder without a manifest kerasfast can read is left alone.
        names: Top-level file names in it; the ones that do not exist are skipped.
    """
    out_dir = Path(out_dir)
    with _exclusive(out_dir):
        recorded = _read_manifest(out_dir)
        if recorded is None:
            return
        entries = {path for paths in recorded.values() for path in paths}
        added = {name for name in names if (out_dir / name).is_file()} - entries
        if added:
            _write_manifest(out_dir, entries | added)


@contextlib.contextmanager
def _exclusive(out_dir: Path):
    """Holds an advisory lock on `out_dir`, so two exports into it cannot interleave.

    The lock is also what makes removing `TEMP_PREFIX` leftovers safe: no
    other export can be writing them at the same time.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no flock, export unlocked
        yield
        return
    descriptor = os.open(out_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as error:
            raise ExportError(
                f"Another kerasfast export is writing into out_dir {out_dir}; wait for it or pick another out_dir."
            ) from error
        except OSError:
            pass  # a file system without flock: export unlocked rather than not at all
        yield
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def staged_export(out_dir, names, *, overwrite: bool = False):
    """Yields a temporary folder inside `out_dir`; its entries replace kerasfast's on success.

    On entering, `out_dir` is created if needed (with the process umask, like
    every folder and file written here), leftovers of interrupted exports are
    removed and a hidden staging folder is made. When the block completes,
    each entry of the staging folder is renamed into `out_dir`, the previous
    export's artifacts that were not written again are removed, and the
    manifest is rewritten to list exactly what this export wrote. Entries
    kerasfast did not write, and `out_dir`'s own mode, are never touched.

    If the block raises, the staging folder is removed and `out_dir` keeps
    its previous contents (a folder this call created is removed again).

    Args:
        out_dir: the destination folder.
        names: top-level names the block will write (checked against foreign
            entries before anything is written).
        overwrite: as in `check_destination`.

    Yields:
        A `pathlib.Path` to write into.

    Raises:
        ExportError: see `check_destination`; also when another export holds
            `out_dir`.
    """
    out_dir = check_writable_destination(out_dir)
    check_destination(out_dir, names, overwrite=overwrite)
    created = []
    folder = out_dir
    while not folder.exists():
        created.append(folder)
        folder = folder.parent
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ExportError(f"Cannot create out_dir {out_dir}: {error}. Pick a writable out_dir.") from error
    try:
        with _exclusive(out_dir):
            contents = check_destination(out_dir, names, overwrite=overwrite)
            for leftover in contents.leftovers:
                _remove(out_dir / leftover)
            staging = _temp_path(out_dir, "stage")
            staging.mkdir()  # not tempfile.mkdtemp: that makes 0700 folders
            try:
                yield staging
                _commit(out_dir, staging, overwrite)
            finally:
                _remove(staging)
    except BaseException:
        for folder in created:  # deepest first; stops at the first one not empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def _entries(path: Path) -> set[str]:
    """Manifest entries of one top-level file or folder."""
    return _listing(path) if path.is_dir() and not path.is_symlink() else {path.name}


def _commit(out_dir: Path, staging: Path, overwrite: bool) -> None:
    """Moves the staged entries into `out_dir`, one rename each, and rewrites the manifest."""
    new_names = sorted(p.name for p in staging.iterdir())
    # The folder may have changed while the artifacts were built: check again.
    contents = check_destination(out_dir, new_names, overwrite=overwrite)
    new_entries = set().union(*(_entries(staging / name) for name in new_names))
    old_entries = set().union(
        *(paths if paths is not None else _entries(out_dir / name) for name, paths in contents.owned.items())
    )
    # List old and new first: if the export is killed while moving, every
    # entry of ours in the folder is still in the manifest, not "foreign".
    _write_manifest(out_dir, old_entries | new_entries)
    # The reports go last, so a report in place describes artifacts in place.
    for name in sorted(new_names, key=lambda n: (n in REPORT_NAMES, n)):
        _move_into_place(staging / name, out_dir / name)
    for name in sorted(set(contents.owned) - set(new_names)):
        retired = _temp_path(out_dir, "old")
        os.rename(out_dir / name, retired)  # off its final name first, then delete
        _remove(retired)
    _write_manifest(out_dir, new_entries)
