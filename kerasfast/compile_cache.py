"""XLA's compiled programs kept on disk, so that a re-run loads them instead of compiling again.

TensorFlow can save each program XLA compiles for the CPU and load it in a
later process (its `--tf_xla_persistent_cache_directory` flag): the GPT
recipe's first train step spends about 3 s in XLA's compiler, which a re-run
of the same script then skips (docs/benchmarks.md, "Start-up"). As TensorFlow
ships it, the folder cannot be shared safely: an entry is written in place,
so a process killed while writing, or two processes compiling the same
program at once (the workers of one machine), leave a truncated file, and
TensorFlow then fails every later compile of that program instead of
compiling it afresh; a write that fails (a full disk) fails the compile.

So each process gets a folder of its own: the complete entries of the
shared folder are hard-linked into it (no copy), and TensorFlow reads from
and writes into it alone. `publish` (at the end of `kerasfast.fit` and of
the process) moves the entries TensorFlow added into the shared folder, each
checked to be whole and renamed into place in one step, so that another
process sees it complete or not at all; the shared folder keeps at most
`MAX_BYTES`, the least recently used entries going first. The shared folder
is keyed by TensorFlow's build, the CPU and the XLA flags, so an entry is
only ever loaded where it was compiled for.

TensorFlow reads its XLA flags once per process, at the first use of any
(creating its first tensor does), so `import kerasfast` sets the flag
(`prepare_before_tensorflow`) and TensorFlow reads it as soon as it is
imported, after which the flag leaves the environment again: child
processes make folders of their own. `KERASFAST_XLA_CACHE=off` turns it
off; a `TF_XLA_FLAGS` naming a cache folder of the user's own is kept; with
TensorFlow imported before kerasfast it stays off, and the plan says so.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import platform
import shutil
import sys
import tempfile
from typing import NamedTuple

from kerasfast import _tensorflow_import

ENV = "KERASFAST_XLA_CACHE"  # "off": no cache
MAX_BYTES = 2 * 1024**3  # the shared folder's size, least recently used entries evicted
MIN_FREE_BYTES = 4 * 1024**3  # below this free on its disk the cache stays off: a failed write fails the compile
STALE_S = 24 * 3600  # a process folder older than this is removed even if its process id is in use
_TF_FLAGS_ENV = "TF_XLA_FLAGS"
_DIRECTORY_FLAG = "--tf_xla_persistent_cache_directory"
_SUFFIX = ".pb"


@dataclasses.dataclass(frozen=True)
class CompileCache:
    """Where this process's XLA programs are cached.

    Attributes:
        shared: The folder the complete entries are published into.
        private: This process's folder, the one TensorFlow reads and writes.
        loaded: Entries of earlier runs linked into `private` at the start.
    """

    shared: pathlib.Path
    private: pathlib.Path
    loaded: int


class _Pending(NamedTuple):
    cache: CompileCache
    previous_flags: str | None  # TF_XLA_FLAGS as it was before


# The process's state: None before `prepare_before_tensorflow`, then the reason it is off, a `_Pending`
# until TensorFlow has read the flag, and the `CompileCache` once it has.
_state: CompileCache | _Pending | str | None = None


def prepare_before_tensorflow() -> None:
    """Called by `import kerasfast`: makes this process's folder and sets
    TensorFlow's flag, to be read as soon as TensorFlow is imported (then the
    flag leaves the environment). Does nothing when it was called before."""
    global _state
    if _state is not None:
        return
    if "tensorflow" in sys.modules:
        _state = ("off: TensorFlow was imported before kerasfast (it reads its XLA flags once; import kerasfast "
                  "first)")
        return
    from kerasfast.runs import cache_root

    try:
        _state = _prepared(cache_root() / "xla")
    except OSError as error:  # an unwritable home, a read-only disk: training goes on without the cache
        _state = f"off: its folder cannot be used ({error})"
    if isinstance(_state, _Pending):
        _tensorflow_import.after_import(_read_by_tensorflow)


def state() -> tuple[CompileCache | None, str]:
    """`(cache, reason)`: the `CompileCache` when on, else None; and why, in the plan's words."""
    global _state
    if isinstance(_state, _Pending):  # TensorFlow loaded without passing kerasfast's import hook
        _restore_flags(_state.previous_flags)
        shutil.rmtree(_state.cache.private, ignore_errors=True)
        _state = "off: TensorFlow was loaded in a way kerasfast could not follow"
    if isinstance(_state, CompileCache):
        return _state, (f"on: a re-run loads XLA's compiled programs instead of compiling them ({_state.loaded} "
                        f"kept from earlier runs; {ENV}=off turns it off)")
    return None, _state or "off: kerasfast was not imported"


def _prepared(folder: pathlib.Path) -> _Pending | str:
    if os.environ.get(ENV, "").strip().lower() in ("off", "0", "false", "no"):
        return f"off: your {ENV}={os.environ[ENV]}"
    previous = os.environ.get(_TF_FLAGS_ENV)
    if _DIRECTORY_FLAG in (previous or ""):
        return f"yours: {_TF_FLAGS_ENV} names a cache folder"
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < MIN_FREE_BYTES:
        return (f"off: {free / 1024**3:.1f} GiB free on the disk of {folder} (at least "
                f"{MIN_FREE_BYTES // 1024**3} GiB kept free: a write that fails fails XLA's compile)")
    shared = folder / _key(previous or "")
    processes = folder / "processes"
    shared.mkdir(exist_ok=True)
    processes.mkdir(exist_ok=True)
    _remove_stale(processes)
    private = pathlib.Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=processes))
    if any(character.isspace() or character in "\"'" for character in str(private)):
        shutil.rmtree(private, ignore_errors=True)
        return f"off: TensorFlow's flags cannot name the folder {private} (a space or quote in it)"
    loaded = _link_complete(shared, private)
    # "CPU": TensorFlow matches the device kinds to persist against the device's name, not XLA's "XLA_CPU_JIT".
    os.environ[_TF_FLAGS_ENV] = " ".join(
        filter(None, [previous, f"{_DIRECTORY_FLAG}={private}", "--tf_xla_persistent_cache_device_types=CPU"]))
    return _Pending(CompileCache(shared=shared, private=private, loaded=loaded), previous)


def _read_by_tensorflow() -> None:
    """Right after TensorFlow's import: TensorFlow reads its XLA flags (once per process, at the first
    use of any), and the flag leaves the environment, so that child processes make folders of their own."""
    global _state
    pending = _state
    if not isinstance(pending, _Pending):
        return
    from tensorflow.python.client import _pywrap_tf_session

    try:
        _pywrap_tf_session.TF_GetXlaAutoJitEnabled()  # any getter of XLA's flags reads them all
        _state = pending.cache
        atexit.register(_at_exit, pending.cache)
    except AttributeError:  # a TensorFlow without the getter: the flag would be read late, if at all
        shutil.rmtree(pending.cache.private, ignore_errors=True)
        _state = "off: this TensorFlow has no way to read its XLA flags early"
    finally:
        _restore_flags(pending.previous_flags)


def _restore_flags(previous: str | None) -> None:
    if previous is None:
        os.environ.pop(_TF_FLAGS_ENV, None)
    else:
        os.environ[_TF_FLAGS_ENV] = previous


def _key(user_flags: str) -> str:
    """What an entry was compiled for: TensorFlow's build, the CPU and XLA's flags."""
    from kerasfast.hardware import cpu_flags_and_model

    flags, model = cpu_flags_and_model()
    spec = importlib.util.find_spec("tensorflow")
    installed = pathlib.Path(spec.origin) if spec is not None and spec.origin else None
    facts = {"tensorflow": [str(installed), installed.stat().st_mtime if installed else None, _version()],
             "machine": platform.machine(), "cpu": [model, list(flags), os.cpu_count()],
             "flags": [os.environ.get("XLA_FLAGS", ""), user_flags]}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def _version() -> str | None:
    for distribution in ("tensorflow", "tensorflow-cpu", "tf-nightly", "tensorflow-intel"):
        try:
            return f"{distribution}=={importlib.metadata.version(distribution)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _link_complete(shared: pathlib.Path, private: pathlib.Path) -> int:
    """Hard-links the shared folder's complete entries into `private`; returns how many."""
    linked = 0
    for entry in shared.glob(f"*{_SUFFIX}"):
        if not complete(entry):
            continue
        try:
            os.link(entry, private / entry.name)
            os.utime(entry)  # used: the last to be evicted
            linked += 1
        except FileNotFoundError:
            continue  # evicted by another process meanwhile
    return linked


def complete(path: pathlib.Path) -> bool:
    """Whether `path` holds a whole serialised cache entry: TensorFlow's
    `XlaSerializedCacheEntry`, fields 1 (key), 2 (HLO) and 3 (the
    executable, not empty), each length-delimited, ending exactly at the
    file's end. A file cut short anywhere fails the count of lengths."""
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            position, field, length = 0, 0, 0
            for expected in (1, 2, 3):
                tag, position = _varint(file, position)
                if tag != (expected << 3 | 2):
                    return False
                length, position = _varint(file, position)
                position += length
                file.seek(position)
                field = expected
            return field == 3 and length > 0 and position == size
    except (OSError, ValueError):
        return False


def _varint(file, position: int) -> tuple[int, int]:
    """Reads a protobuf varint at `position`; returns it and the position after it."""
    value, shift = 0, 0
    while True:
        byte = file.read(1)
        if not byte or shift > 63:
            raise ValueError("cut short")
        value |= (byte[0] & 0x7F) << shift
        position, shift = position + 1, shift + 7
        if not byte[0] & 0x80:
            return value, position


def publish() -> int:
    """Moves this process's new complete entries into the shared folder; returns how many.

    Each is linked under a temporary name and renamed into place, so a
    reader sees it whole or not at all. Then the shared folder is trimmed to
    `MAX_BYTES`. Nothing happens when the cache is off.
    """
    if not isinstance(_state, CompileCache):
        return 0
    shared, published = _state.shared, 0
    try:
        for entry in _state.private.glob(f"*{_SUFFIX}"):
            target = shared / entry.name
            if (target.exists() and complete(target)) or not complete(entry):
                continue  # published already (by another process), or cut short
            staged = shared / f".{entry.name}.{os.getpid()}.tmp"
            os.link(entry, staged)
            os.replace(staged, target)
            published += 1
        _trim(shared, MAX_BYTES)
    except OSError:
        pass  # the shared folder went away or filled up: this run's programs are just not kept
    return published


def _trim(shared: pathlib.Path, max_bytes: int) -> None:
    entries = []
    for entry in shared.glob(f"*{_SUFFIX}"):
        try:
            stat = entry.stat()
        except FileNotFoundError:
            continue
        entries.append((stat.st_mtime, stat.st_size, entry))
    total = sum(size for _, size, _ in entries)
    for _, size, entry in sorted(entries):
        if total <= max_bytes:
            break
        entry.unlink(missing_ok=True)
        total -= size


def _remove_stale(processes: pathlib.Path) -> None:
    """Removes the folders of processes that ended without removing theirs (killed), and any a day old."""
    import time

    for folder in processes.iterdir():
        pid = folder.name.split("-")[0]
        try:
            age = time.time() - folder.stat().st_mtime
        except FileNotFoundError:
            continue
        if age > STALE_S or not (pid.isdigit() and _alive(int(pid))):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _at_exit(cache: CompileCache) -> None:
    publish()
    shutil.rmtree(cache.private, ignore_errors=True)
