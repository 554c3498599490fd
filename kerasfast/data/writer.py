"""`write_tfrecords`: any supported source -> N TFRecord shards + schema.json."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import glob
import json
import math
import os
import re
import time
import uuid
import warnings
from typing import Any, Callable, Mapping

import numpy as np

from kerasfast.data.files import PENDING_FILENAME, load_folder
from kerasfast.data.layout import RecordLayout
from kerasfast.data.schema import (
    FLOAT_LIST_DTYPES,
    INT_LIST_DTYPES,
    RAW_DTYPES,
    SCHEMA_FILENAME,
    FeatureSchema,
    Schema,
    ShardInfo,
    normalize_compression,
)
from kerasfast.data.sources import AUTO, LABEL_IF_PRESENT, BadRecord, EncodedImage, _as_array, open_source
from kerasfast.data.validation import ON_ERROR
from kerasfast.errors import DataError

# Big enough that per-file overhead does not matter, small enough that a
# worker's files finish at similar times and a lost shard is cheap to re-copy.
DEFAULT_SHARD_BYTES = 128 * 1024 * 1024
# Enough files for a parallel interleave on one machine and for small multi-worker jobs.
MIN_AUTO_SHARDS = 8
COMPRESSION_SUFFIX = {None: "", "GZIP": ".gz", "ZLIB": ".zlib"}
MAX_SHARDS = 99_999  # shard names hold five digits: -00000-of-99999
_SHARD_RE = r"-\d{5}-of-\d{5}\.tfrecord(\.gz|\.zlib)?$"
_PARTIAL_MARK = ".partial-"
# Test-only: KERASFAST_TEST_CRASH_AT=k ends the process with os._exit(CRASH_EXIT_CODE) right after commit
# step k, as a kill would (no cleanup, no finally), so tests can stop a write at every step of its commit.
CRASH_ENV = "KERASFAST_TEST_CRASH_AT"
CRASH_EXIT_CODE = 75


class SkippedRecordsWarning(UserWarning):
    """`write_tfrecords` left out bad records (on_error="skip"); `kerasfast convert` lists them itself."""


@dataclasses.dataclass
class WriteResult:
    """What `write_tfrecords` wrote.

    Attributes:
        out_dir: the folder holding the shards and the schema.
        files: paths of the shards, in order.
        schema_path: path of schema.json.
        schema: the `Schema` written there.
        num_records: records written.
        num_bytes: total size of the shards on disk.
        skipped: `(location, reason)` of each source record skipped with
            `on_error="skip"`.
        notes: remarks about the conversion (ignored files, inferred types).
        seconds: wall time of the conversion.
    """

    out_dir: str
    files: list
    schema_path: str
    schema: Schema
    num_records: int
    num_bytes: int
    skipped: list
    notes: list
    seconds: float

    def __str__(self) -> str:
        comp = self.schema.compression or "uncompressed"
        text = (f"wrote {self.num_records} records to {len(self.files)} shard(s) in {self.out_dir} "
                f"({self.num_bytes / 1e6:.1f} MB, {comp}) in {self.seconds:.1f}s")
        if self.skipped:
            text += f"; skipped {len(self.skipped)} bad record(s), first: {self.skipped[0][0]}: {self.skipped[0][1]}"
        return text


def shard_name(prefix: str, index: int, count: int, compression: str | None) -> str:
    return f"{prefix}-{index:05d}-of-{count:05d}.tfrecord{COMPRESSION_SUFFIX[compression]}"


def auto_shard_count(num_records: int | None, estimated_bytes: int | None,
                     target_shard_bytes: int = DEFAULT_SHARD_BYTES) -> int:
    """Number of shards: about `target_shard_bytes` each, and at least as many
    as a multi-worker job needs (8, or the workers in TF_CONFIG if more)."""
    minimum = max(MIN_AUTO_SHARDS, _workers_in_tf_config())
    by_size = math.ceil(estimated_bytes / target_shard_bytes) if estimated_bytes else 0
    count = max(minimum, by_size)
    if num_records is not None:
        count = min(count, max(1, num_records))
    return count


def _workers_in_tf_config() -> int:
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    except json.JSONDecodeError:
        return 0
    return sum(len(cluster.get(k, [])) for k in ("chief", "worker"))


@dataclasses.dataclass(frozen=True)
class _ShardPlan:
    """Where one write puts its shards: the folder, their naming, and the temporary path of each."""

    out_dir: str
    prefix: str
    compression: str | None
    tmp_paths: list

    @property
    def count(self) -> int:
        """Shards planned (empty ones are dropped at the end)."""
        return len(self.tmp_paths)


@dataclasses.dataclass(frozen=True)
class _Written:
    """What the record loop wrote: records per temporary shard, their total, the source records skipped."""

    counts: list
    num_records: int
    skipped: list


def write_tfrecords(
    source: Any,
    out_dir: str | os.PathLike,
    *,
    shards: int | None = None,
    compression: str | None = None,
    label: Any = AUTO,
    image_encoding: str | None = None,
    shuffle: bool = True,
    seed: int = 0,
    on_error: str = "raise",
    overwrite: bool = True,
    source_type: str | None = None,
    text_unit: str = "line",
    csv_dtypes: Mapping[str, str] | None = None,
    prefix: str = "data",
    target_shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: Callable[[int, int | None], None] | None = None,
) -> WriteResult:
    """Converts a data source into TFRecord shards with a schema file beside them.

    Records are streamed: memory stays bounded by one chunk of records plus one
    open writer per shard, however large the source is. Records go to the
    shards round-robin, so shards differ by at most one record.

    Crash-safe at every instant: the shards are written under temporary
    names; then one atomic rename of a commit record (schema.json.pending:
    the new schema and each shard's temporary name) switches the folder to
    the new dataset; the shards are then renamed, schema.json replaced and
    old shards removed. Killed before the commit point, the folder reads as
    the previous dataset (if any); after it, as the new one (the reader
    follows the commit record), and the next run finishes the commit.
    Re-running overwrites cleanly, removing shards of the old run.

    Args:
        source: a dict or `(x, y)` tuple of NumPy arrays (first dimension =
            records), a pandas DataFrame, a Parquet or CSV file / folder /
            glob, a folder of images with one sub-folder per class, a text
            file / folder / glob (a language-model corpus), or any iterable
            of `{feature: value}` dicts.
        out_dir: folder to write to (created if missing).
        shards: number of shards; default: about 128 MB each and at least 8
            (or the number of workers in `TF_CONFIG`), never more than records.
        compression: None, "GZIP" or "ZLIB". GZIP makes files smaller and
            costs decode time when reading.
        label: name of the label feature; default: "y" for an `(x, y)` tuple,
            "label" for image folders and for sources with a "label" column
            or key; None for no label.
        image_encoding: None (store uint8 image arrays raw: fastest to read),
            "png" (lossless, smaller) or "jpeg" (lossy, smallest). Applies to
            uint8 arrays of shape (H, W, C), C in 1/3/4; "jpeg" refuses 4
            channels (JPEG has no alpha channel: use "png"). A warning (and
            `result.notes`) says when it applies to no feature. Image folders
            keep the original file bytes.
        shuffle: shuffle record order while writing where the source allows
            random access (arrays, DataFrames, image folders); streaming
            sources keep their order.
        seed: seed of that shuffle.
        on_error: "raise" (default) stops at the first bad source record;
            "skip" leaves bad records out and lists them in `result.skipped`.
        overwrite: if False, refuse to write into a folder that already holds
            a kerasfast dataset.
        source_type: force how `source` is read: "arrays", "dataframe",
            "parquet", "csv", "images", "text" or "records".
        text_unit: for text corpora, "line" (one record per non-empty line)
            or "file" (one record per file).
        csv_dtypes: per-column type for CSV files ("int64", "float32", "float64",
            "string"); other columns are inferred from the first 1024 rows
            (blank lines and rows with another number of fields left out). A
            column of whole numbers is int64 even with empty cells, each of
            which is a bad record: pass "float64" to read them as NaN. The
            delimiter is a comma (a tab for .tsv), or the one of ';', tab, '|'
            found in a header without commas.
        prefix: shard file name prefix.
        target_shard_bytes: shard size the automatic shard count aims at.
        progress: called as `progress(records_written, total_or_None)`.

    Returns:
        A `WriteResult` with the files, schema, record count and sizes.

    Example:

    >>> import numpy as np, tempfile, kerasfast.data as kd
    >>> x = np.zeros((100, 8, 8, 3), np.uint8); y = np.arange(100) % 10
    >>> result = kd.write_tfrecords((x, y), tempfile.mkdtemp(), shards=4)
    >>> result.num_records, len(result.files)
    (100, 4)
    """
    started = time.perf_counter()
    compression = _checked_arguments(compression, on_error, image_encoding, shards, prefix)
    out_dir = os.fspath(out_dir)
    _refuse_overwrite(out_dir, overwrite)
    src = open_source(source, label=label, shuffle=shuffle, seed=seed, source_type=source_type,
                      text_unit=text_unit, csv_dtypes=csv_dtypes, out_dir=out_dir)
    count = _shard_count(shards, src, target_shard_bytes)  # refused before the folder is made
    created = not os.path.exists(out_dir)
    _prepare_folder(out_dir, prefix)
    steps = _CommitSteps()
    plan = _plan_shards(out_dir, prefix, compression, count)
    encoder = _RecordEncoder(image_encoding)
    committed = False
    try:
        written = _write_records(src, plan, encoder, on_error, progress)
        if written.num_records == 0:
            raise _no_records_error(src, written.skipped)
        kept = _keep_nonempty_shards(plan, written.counts)
        steps()  # 1: new shards complete under temporary names; the old dataset is untouched
        shard_infos = _shard_infos(plan, kept, written.counts)
        schema = Schema(
            features=encoder.final_features(),
            label=src.label,
            compression=compression,
            num_records=written.num_records,
            shards=shard_infos,
            classes=src.classes,
            source=src.description,
            shuffled=src.shuffled,
            layout=encoder.layout,
        )
        _save_commit_record(plan, schema, kept)
        committed = True  # from here the temporary files are the new dataset: never delete them
        steps()  # 2
        _roll_forward(out_dir, steps)
    finally:
        if not committed:
            _remove_files(plan.tmp_paths)
            if created and not os.listdir(out_dir):
                os.rmdir(out_dir)  # a failed write leaves no trace, not even the folder it made
    if progress is not None:
        progress(written.num_records, src.num_records)
    if image_encoding and not encoder.encoded_by_option:
        note = (f"image_encoding={image_encoding!r} applies to no feature: none is a uint8 array of shape (H, W, C) "
                f"with C in 1, 3 or 4 (image folders keep their files' bytes), so every feature is stored as it is")
        src.notes.append(note)
        warnings.warn(f"write_tfrecords: {note}.", stacklevel=2)
    if written.skipped:
        skipped = written.skipped
        warnings.warn(f"write_tfrecords skipped {len(skipped)} bad record(s); first: {skipped[0][0]}: "
                      f"{skipped[0][1]}. The full list is in result.skipped.", SkippedRecordsWarning, stacklevel=2)
    files = [os.path.join(out_dir, s.file) for s in shard_infos]
    return WriteResult(out_dir, files, os.path.join(out_dir, SCHEMA_FILENAME), schema, written.num_records,
                       sum(s.num_bytes for s in shard_infos), written.skipped, list(src.notes),
                       time.perf_counter() - started)


# -- validating the arguments and planning the shards --------------------------------

def _checked_arguments(compression, on_error, image_encoding, shards, prefix) -> str | None:
    """Refuses bad arguments before anything is read or written; returns the normalised compression."""
    compression = normalize_compression(compression)
    if on_error not in ON_ERROR:
        raise DataError(f"on_error={on_error!r}: use 'raise' or 'skip'.")
    if image_encoding not in (None, "png", "jpeg"):
        raise DataError(f"image_encoding={image_encoding!r}: use None (raw), 'png' or 'jpeg'.")
    if shards is not None and (not isinstance(shards, (int, np.integer)) or isinstance(shards, bool) or shards < 1):
        raise DataError(f"shards={shards!r}: pass a positive integer, or None to choose automatically.")
    if shards is not None and shards > MAX_SHARDS:
        raise DataError(f"shards={shards}: at most {MAX_SHARDS:,} (kerasfast convert: --shards); a few shards per "
                        "reading worker is enough, or None to choose automatically.")
    if not re.fullmatch(r"[A-Za-z0-9_.]+", prefix):
        raise DataError(f"prefix={prefix!r}: use letters, digits, '_' and '.' only.")
    return compression


def _refuse_overwrite(out_dir: str, overwrite: bool) -> None:
    """With overwrite=False, refuses a folder that holds a dataset (committed or mid-commit)."""
    schema_path = os.path.join(out_dir, SCHEMA_FILENAME)
    pending_path = os.path.join(out_dir, PENDING_FILENAME)
    if not overwrite and (os.path.exists(schema_path) or os.path.exists(pending_path)):
        raise DataError(f"{out_dir} already holds a dataset ({SCHEMA_FILENAME}); pass overwrite=True "
                        f"(--overwrite) to replace it, or choose another folder.")


def _prepare_folder(out_dir: str, prefix: str) -> None:
    """Creates the folder and clears what interrupted earlier runs left in it."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise DataError(f"out_dir {out_dir} is a file, not a folder: pass a folder to write the dataset into.")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as error:
        raise DataError(f"out_dir {out_dir} cannot be created ({error.strerror or error}): pass a folder you can "
                        f"write to.") from error
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise DataError(f"out_dir {out_dir} is not writable (read-only or without permission): pass a folder you "
                        f"can write to.")
    # A run killed after its commit point left the new dataset half renamed: finish that first, since
    # the temporary files removed next may be its shards.
    _roll_forward(out_dir)
    _refuse_foreign_shards(out_dir, prefix)
    _remove_partials(out_dir, prefix)


def _refuse_foreign_shards(out_dir: str, prefix: str) -> None:
    """Refuses a folder holding files named like this dataset's shards that its schema.json does not list:
    another program's files, which writing would replace or remove."""
    pattern = re.compile(re.escape(prefix) + _SHARD_RE)
    dataset = load_folder(out_dir)
    ours = {shard.file for shard in dataset.schema.shards} if dataset is not None else set()
    foreign = sorted(entry.name for entry in os.scandir(out_dir)
                     if entry.is_file() and pattern.fullmatch(entry.name) and entry.name not in ours)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        example = "train" if prefix != "train" else "train2"
        raise DataError(
            f"{out_dir} holds TFRecord files that no kerasfast {SCHEMA_FILENAME} there lists ({shown}); writing "
            f"would replace or remove them. Move them away, write to another folder, or name the shards with a "
            f"prefix other than {prefix!r} (e.g. prefix={example!r}; kerasfast convert: --prefix {example}).")


def _shard_count(shards, src, target_shard_bytes: int) -> int:
    """Shards to write: as asked or chosen by size and workers, never more than the source's records."""
    count = int(shards) if shards is not None else auto_shard_count(
        src.num_records, src.estimated_bytes, target_shard_bytes)
    if src.num_records is not None and src.num_records > 0:
        count = min(count, src.num_records)
    open_files = _open_files_allowed()
    if shards is None:
        return min(count, open_files)  # chosen here: as many as can be open at once
    if count > open_files:
        raise DataError(f"shards={count}: every shard is written at once, a file open for each, and this process may "
                        f"open {open_files} more (ulimit -n): pass fewer shards (kerasfast convert: --shards), or "
                        "raise the limit.")
    return count


def _open_files_allowed() -> int:
    """Files this process may open for shards (at most MAX_SHARDS), less a margin for TensorFlow's own."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # not POSIX
        return MAX_SHARDS
    return MAX_SHARDS if soft == resource.RLIM_INFINITY else max(1, min(MAX_SHARDS, soft - 256))


def _plan_shards(out_dir: str, prefix: str, compression: str | None, count: int) -> _ShardPlan:
    """Temporary shard paths of this run, marked so that a later run knows them for leftovers."""
    token = uuid.uuid4().hex[:8]
    tmp_paths = [os.path.join(out_dir, f".{prefix}-{i:05d}{_PARTIAL_MARK}{token}") for i in range(count)]
    return _ShardPlan(out_dir, prefix, compression, tmp_paths)


# -- writing the records ------------------------------------------------------------

def _write_records(src, plan: _ShardPlan, encoder: _RecordEncoder, on_error: str, progress) -> _Written:
    """Streams the source's records round-robin into the temporary shards and closes them."""
    import tensorflow as tf

    options = tf.io.TFRecordOptions(compression_type=plan.compression or "")
    counts = [0] * plan.count
    skipped: list = []
    written = 0
    writers = []
    try:
        for location, record in src.records():
            serialized = _encode(encoder, record, location, on_error, skipped)
            if serialized is None:
                continue
            if not writers:
                # Opened only once the first record settled the label, so that a refused label writes no file.
                _settle_label(src, encoder)
                writers = [tf.io.TFRecordWriter(p, options) for p in plan.tmp_paths]
            shard = written % plan.count
            writers[shard].write(serialized)
            counts[shard] += 1
            written += 1
            if progress is not None and written % 256 == 0:
                progress(written, src.num_records)
        for w in writers:
            w.close()
    except BaseException:
        for w in writers:
            try:
                w.close()
            except Exception:  # already closed or failed: removing the file is what matters
                pass
        raise
    return _Written(counts, written, skipped)


def _encode(encoder: _RecordEncoder, record, location: str, on_error: str, skipped: list) -> bytes | None:
    """The serialized record, or None for a bad one that on_error="skip" leaves out (listed in `skipped`)."""
    if isinstance(record, BadRecord):
        _bad(on_error, skipped, location, record.reason)
        return None
    try:
        return encoder.encode(record, location)
    except _RecordMismatch as exc:
        _bad(on_error, skipped, location, str(exc))
        return None


def _settle_label(src, encoder: _RecordEncoder) -> None:
    """Once the first record fixed the features: picks an optional label, and refuses one that is missing or
    the only feature."""
    if src.label == LABEL_IF_PRESENT:
        src.label = "label" if "label" in encoder.names else None
    if src.label is not None and src.label not in encoder.names:
        raise DataError(f"label {src.label!r} is not a feature of the records {encoder.names}; pass label= "
                        f"one of them, or label=None (kerasfast convert: --label NAME, or --no-label).")
    if src.label is not None and encoder.names == [src.label]:
        # Refused here rather than at fit time, which would find it only after the whole conversion.
        raise DataError(f"label {src.label!r} is the only feature of the records, so a model would have no input "
                        f"to learn it from; pass label=None (kerasfast convert: --no-label) to write it as an "
                        f"input, or convert a source with features beside the label.")


def _no_records_error(src, skipped: list) -> DataError:
    """The error for a source that gave no (good) record."""
    return DataError(f"{src.description} produced no records"
                     + (f" ({len(skipped)} bad, first: {skipped[0][0]}: {skipped[0][1]})" if skipped else "")
                     + "; nothing was written.")


# -- committing the shards and the schema -------------------------------------------

def _keep_nonempty_shards(plan: _ShardPlan, counts: list) -> list:
    """Makes each non-empty temporary shard durable and removes the empty ones; returns the kept indices."""
    kept = [i for i in range(plan.count) if counts[i]]
    for i in range(plan.count):
        if counts[i]:
            _fsync(plan.tmp_paths[i])
        else:
            os.remove(plan.tmp_paths[i])
    return kept


def _shard_infos(plan: _ShardPlan, kept: list, counts: list) -> list:
    """`ShardInfo` of each kept shard, named by the final count of shards."""
    return [ShardInfo(shard_name(plan.prefix, k, len(kept), plan.compression), counts[i],
                      os.path.getsize(plan.tmp_paths[i]))
            for k, i in enumerate(kept)]


def _save_commit_record(plan: _ShardPlan, schema: Schema, kept: list) -> None:
    """The commit point: one atomic rename makes the new dataset the folder's dataset."""
    partials = {shard.file: os.path.basename(plan.tmp_paths[i]) for shard, i in zip(schema.shards, kept, strict=True)}
    schema.save(os.path.join(plan.out_dir, PENDING_FILENAME), extra={"pending": {"partials": partials}})
    _fsync_dir(plan.out_dir)


def _remove_files(paths: list) -> None:
    """Removes those of `paths` that exist."""
    for p in paths:
        if os.path.exists(p):
            os.remove(p)


def _bad(on_error, skipped, location, reason):
    """Raises for a bad source record, or, with on_error="skip", lists it in `skipped`."""
    if on_error == "raise":
        raise DataError(f"{location} {reason}. Fix or remove it, or pass on_error='skip' (kerasfast convert: "
                        f"--on-error skip) to leave bad records out.")
    skipped.append((location, reason))


def _fsync(path):
    """Makes a file's content durable."""
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(path):
    """Makes renames in `path` durable: without it a power cut may undo them after the files' own fsync."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # Windows cannot open a folder; its renames are journaled by NTFS
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems do not support fsync on a folder
        pass
    finally:
        os.close(fd)


class _CommitSteps:
    """Counts the steps of a commit; with CRASH_ENV=k set (tests only) the process dies after step k."""

    def __init__(self):
        self.done = 0
        self.crash_at = int(os.environ.get(CRASH_ENV) or 0)

    def __call__(self):
        self.done += 1
        if self.done == self.crash_at:
            os._exit(CRASH_EXIT_CODE)


def _roll_forward(out_dir, steps=lambda: None):
    """Finishes a commit whose record (schema.json.pending) exists; does nothing otherwise.

    The steps, each leaving a folder `load_folder` reads as the new dataset:
    rename each shard to its final name (replacing an old shard of the same
    name), replace schema.json, remove old shards the new dataset does not
    list, remove the commit record. Every step can be repeated, so a run
    killed anywhere in here is finished by the next one.
    """
    dataset = load_folder(out_dir)
    if dataset is None or not dataset.pending:
        return
    for shard, path in zip(dataset.schema.shards, dataset.files, strict=True):
        final = os.path.join(out_dir, shard.file)
        if path != final:
            os.replace(path, final)
            steps()  # 3 .. 2 + shards
    _fsync_dir(out_dir)
    dataset.schema.save(os.path.join(out_dir, SCHEMA_FILENAME))
    steps()
    keep = {s.file for s in dataset.schema.shards}
    for prefix in {re.sub(_SHARD_RE, "", name) for name in keep}:
        _remove_old_shards(out_dir, prefix, keep)
    steps()
    # Removed last, so that a run killed before this line is finished again (every step repeats safely).
    os.remove(dataset.schema_path)
    _fsync_dir(out_dir)
    steps()


def _remove_partials(out_dir, prefix):
    """Temporary shards of an interrupted earlier run are never complete: remove them."""
    for p in glob.glob(os.path.join(glob.escape(out_dir), f".{glob.escape(prefix)}-*{_PARTIAL_MARK}*")):
        os.remove(p)
    for name in (SCHEMA_FILENAME, PENDING_FILENAME):
        for p in glob.glob(os.path.join(glob.escape(out_dir), f"{name}.tmp-*")):
            os.remove(p)


def _remove_old_shards(out_dir, prefix, keep):
    pattern = re.compile(re.escape(prefix) + _SHARD_RE)
    for entry in os.scandir(out_dir):
        if entry.is_file() and pattern.fullmatch(entry.name) and entry.name not in keep:
            os.remove(entry.path)


class _RecordMismatch(Exception):
    """A record whose features do not match the first record's, or that holds a value no feature can."""


# Python integers NumPy holds as int64 or uint64; one beyond becomes an object, which no feature can store.
_NUMPY_INT_RANGE = (-2**63, 2**64 - 1)


# NumPy's names of its date and duration units (`np.datetime_data`).
_TIME_UNITS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}


def _time_remedy(name: str, unit: str | None = None) -> str:
    """How to store dates, durations or decimals; `unit`: a datetime64 / timedelta64 column's, when known."""
    counts = _TIME_UNITS.get(unit, f"{unit} units") if unit else "the column's time unit"
    return (f"store it as a number (a DataFrame column: df[{name!r}].astype('int64'), a count of {counts} (since "
            f"1970 for dates); float(value) for a Decimal) or as a string (df[{name!r}].astype(str), str(value))")


def _unstorable(name: str, arr: np.ndarray) -> _RecordMismatch | None:
    """Why feature `name`'s value cannot be stored whatever the other records hold, where NumPy found no
    dtype for it (`arr` is an object array): it is (or holds) None, a missing value, or a Python integer
    beyond int64's range, or dates, times or decimals. None when none of these: the caller's
    own message names the type."""
    if arr.dtype.kind in "mM":  # NumPy dates and durations (a DataFrame's datetime64 / timedelta64 column)
        return _RecordMismatch(f"feature {name!r} is {arr.dtype} (dates or durations), which a feature cannot "
                               f"hold: {_time_remedy(name, np.datetime_data(arr.dtype)[0])}")
    for index, value in np.ndenumerate(arr):
        is_ = "is" if arr.ndim == 0 else "holds"
        at = "" if arr.ndim == 0 else f" at index {index[0] if len(index) == 1 else index}"
        if value is None:
            return _RecordMismatch(f"feature {name!r} {is_} None (a missing value){at}, which a feature cannot "
                                   f"hold: fill it (e.g. with NaN or 0 for a number, '' for a string)")
        if isinstance(value, (datetime.date, datetime.time, datetime.timedelta, np.datetime64, np.timedelta64,
                              decimal.Decimal)) or type(value).__name__ == "Period":  # pandas, not imported here
            return _RecordMismatch(f"feature {name!r} {is_} a {type(value).__name__} ({value}){at}, which a feature "
                                   f"cannot hold: {_time_remedy(name)}")
        if isinstance(value, int) and not _NUMPY_INT_RANGE[0] <= value <= _NUMPY_INT_RANGE[1]:
            return _RecordMismatch(f"feature {name!r} {is_} {value}{at}, an integer beyond int64's range (-2**63 to "
                                   f"2**63-1), which a feature cannot hold: store the feature as a float "
                                   f"(float(value), in every record; about 16 significant digits) or as a string "
                                   f"(str(value))")
    return None


def _narrowed(f: FeatureSchema, arr: np.ndarray, target: np.dtype, first: str) -> np.ndarray:
    """`arr` in the feature's dtype, that of the first record written (at `first`); refuses a value that dtype
    cannot hold (an int8 feature given 1000 would wrap to -24, an int64 one given 2**63 + 5 to a negative, a
    float16 one given 1e6 would become inf, a float32 one given the integer 16777217 would round it), where a
    float's rounding is the stored dtype's precision."""
    with np.errstate(over="ignore", invalid="ignore"):
        cast = arr.astype(target)
        if target.kind == "f" and arr.dtype.kind == "f":
            # Beyond the range: inf; below its smallest magnitude: 0 (1e-50 in float32).
            lost = (np.isfinite(arr) & ~np.isfinite(cast)) | ((arr != 0) & (cast == 0))
        elif target.kind in "iu" and arr.dtype.kind in "iu":
            # By range: a cast back cannot see a wrap between signed and unsigned (2**63 + 5 -> int64 -> back).
            bounds = np.iinfo(target)
            lost = (arr < bounds.min) | (arr > bounds.max)
        else:  # an integer a float feature would round, a fraction an integer feature would drop
            lost = cast.astype(arr.dtype) != arr
    if np.any(lost):
        value = arr[lost].flat[0] if arr.ndim else arr.item()
        rounded = f" (it would be stored as {cast[lost].flat[0] if arr.ndim else cast.item()})" if (
            target.kind == "f" and arr.dtype.kind in "iu") else ""
        if rounded:
            exact = f"2**{np.finfo(target).nmant + 1}"
            remedy = (f"{f.dtype} holds integers exactly only up to {exact}: " + (
                f"give {first} float64 (np.float64(value))" if target != np.float64 else
                "keep such integers in an integer feature of their own, or store them as strings"))
        elif arr.dtype.kind in "iu" and int(value) > np.iinfo(np.int64).max:
            remedy = ("TFRecord integers are int64, which stops at 2**63 - 1: store such values as strings "
                      "(str(value)) or map them into int64's range")
        else:
            remedy = (f"give {first} the dtype every record fits (e.g. np.asarray(value, {arr.dtype.name!r})) or "
                      "convert the source's values to one dtype")
        raise _RecordMismatch(
            f"feature {f.name!r} holds {value}, which the first record's {f.dtype} cannot hold{rounded} ({first} "
            f"gave the feature that dtype); {remedy}")
    return cast


class _RecordEncoder:
    """Infers the features from the first record and serialises every record.

    The first record fixes names, dtypes, shapes and encodings; later records
    must match (images may vary in height and width). A mismatch names that
    record by its location in the source (`first`), which after a shuffle is
    not the source's first.
    """

    def __init__(self, image_encoding):
        self.image_encoding = image_encoding
        self.features: dict | None = None
        self.first = ""  # the location of the record that fixed the features
        self.names: list = []
        self._image_shapes: dict = {}
        self._image_formats: dict = {}
        self.encoded_by_option: list = []  # the features image_encoding applies to
        # The byte layout every record written so far has, or None (see `RecordLayout`).
        self.layout: RecordLayout | None = None

    def final_features(self) -> list:
        out = []
        for f in self.features.values():
            if f.name in self._image_shapes:
                shapes = self._image_shapes[f.name]
                fmts = self._image_formats[f.name]
                f = FeatureSchema(f.name, "uint8", shapes, fmts.pop() if len(fmts) == 1 else "image")
            out.append(f)
        return out

    def encode(self, record: Mapping, location: str) -> bytes:
        import tensorflow as tf

        names = [str(k) for k in record]
        if len(set(names)) < len(names):
            clashing = sorted({n for n in names if names.count(n) > 1})
            raise DataError(f"{location}: keys {[k for k in record if str(k) in clashing]} all become the feature "
                            f"name(s) {clashing}; give each feature a distinct name.")
        if self.features is None:
            self.features = {str(k): self._infer(str(k), v, location) for k, v in record.items()}
            self.first = location
            self.names = list(self.features)
            if not self.names:
                raise DataError(f"{location} has no features.")
            self.layout = RecordLayout.of(list(self.features.values()))
        elif len(record) != len(self.features) or any(str(k) not in self.features for k in record):
            raise _RecordMismatch(f"has features {sorted(map(str, record))}, {self.first} had {sorted(self.names)}")
        feature = {}
        for key, value in record.items():
            f = self.features[str(key)]
            feature[f.name] = self._encode_value(f, value)
        serialized = tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
        if self.layout is not None and not self.layout.fits(serialized, self.features.values()):
            self.layout = None  # one record off the layout (an integer of 128 or more): all are parsed
        return serialized

    def _infer(self, name, value, location) -> FeatureSchema:
        if isinstance(value, EncodedImage):
            self._image_shapes[name] = tuple(value.shape)
            self._image_formats[name] = {value.format}
            return FeatureSchema(name, "uint8", value.shape, value.format)
        if isinstance(value, (str, bytes)):
            return FeatureSchema(name, "string", (), "bytes")
        arr = _as_array(name, value, DataError, location)
        if arr.dtype.kind in "OmM" and (unstorable := _unstorable(name, arr)) is not None:
            raise unstorable  # a bad record (None, say), which on_error="skip" leaves out; the next one is first
        if arr.dtype.kind in "USO":
            if arr.ndim == 0 and arr.dtype.kind in "US":
                return FeatureSchema(name, "string", (), "bytes")
            raise DataError(f"{location}: feature {name!r} is a {arr.dtype} array of shape {arr.shape}; only "
                            f"numbers, arrays of numbers and single strings can be stored.")
        dtype = arr.dtype.name
        if arr.ndim == 0:
            if dtype in INT_LIST_DTYPES:
                return FeatureSchema(name, dtype, (), "int64")
            if dtype in FLOAT_LIST_DTYPES:
                return FeatureSchema(name, dtype, (), "float")
        if self.image_encoding and dtype == "uint8" and arr.ndim == 3 and arr.shape[2] in (1, 3, 4):
            if self.image_encoding == "jpeg" and arr.shape[2] == 4:
                raise DataError(
                    f"{location}: feature {name!r} is a uint8 image with 4 channels (RGBA), which "
                    f"image_encoding='jpeg' cannot store: JPEG has no alpha channel. Pass image_encoding='png' "
                    f"(lossless, keeps the alpha channel), drop the alpha channel to store JPEG "
                    f"({name}[..., :3]), or image_encoding=None to store the arrays raw (kerasfast convert: "
                    f"--image-encoding png, or no --image-encoding).")
            self._image_shapes[name] = arr.shape
            self._image_formats[name] = {self.image_encoding}
            self.encoded_by_option.append(name)
            return FeatureSchema(name, "uint8", arr.shape, self.image_encoding)
        if dtype not in RAW_DTYPES:
            scalar = arr.ndim == 0 and arr.dtype.kind in "iuf"
            allowed = (*INT_LIST_DTYPES, "int64", *FLOAT_LIST_DTYPES, "float64") if scalar else RAW_DTYPES
            hint = (" (an unsigned 64-bit id: cast it to int64 if every value is below 2**63, or store it as a "
                    "string)" if dtype == "uint64" else "")
            raise DataError(f"{location}: feature {name!r} is {dtype}{' (one value)' if scalar else ''}, which a "
                            f"feature cannot hold{hint}: cast it to one of {tuple(dict.fromkeys(allowed))}.")
        return FeatureSchema(name, dtype, arr.shape, "raw")

    def _encode_value(self, f: FeatureSchema, value):
        import tensorflow as tf

        if f.encoding in ("png", "jpeg", "image"):
            if isinstance(value, EncodedImage):
                data, shape = value.data, tuple(value.shape)
                self._image_formats[f.name].add(value.format)
            else:
                arr = np.asarray(value)
                if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != f.shape[2]:
                    raise _RecordMismatch(f"feature {f.name!r} is {arr.dtype} {arr.shape}, {self.first} had "
                                          f"uint8 with {f.shape[2]} channels")
                shape = arr.shape
                data = (tf.io.encode_png(arr) if f.encoding == "png" else tf.io.encode_jpeg(arr, quality=95)).numpy()
            self._merge_image_shape(f.name, shape)
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))
        if f.encoding == "bytes":
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[self._string(f, value)]))
        arr = _as_array(f.name, value, _RecordMismatch)
        if arr.dtype.kind in "OmM" and (unstorable := _unstorable(f.name, arr)) is not None:
            raise unstorable
        if arr.shape != f.shape:
            raise _RecordMismatch(f"feature {f.name!r} has shape {arr.shape}, {self.first} had {f.shape}; all "
                                  f"records need the same shape (pad or resize them)")
        target = np.dtype(f.dtype)
        if arr.dtype != target:
            # NumPy casts bool to numbers safely; a True among integers is a mixed column all the same.
            if (not np.can_cast(arr.dtype, target, casting="same_kind") or arr.dtype.kind in "USO"
                    or arr.dtype.kind == "b"):
                raise _RecordMismatch(f"feature {f.name!r} is {arr.dtype}, {self.first} had {f.dtype}")
            arr = _narrowed(f, arr, target, self.first)
        if f.encoding == "int64":
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(arr)]))
        if f.encoding == "float":
            return tf.train.Feature(float_list=tf.train.FloatList(value=[float(arr)]))
        if f.dtype == "bool":
            arr = arr.astype(np.uint8)
        data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))

    def _string(self, f: FeatureSchema, value) -> bytes:
        """The bytes of string feature `f`'s `value`."""
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value.item()
        if isinstance(value, str):
            value = value.encode("utf-8")
        if value is None or (isinstance(value, (float, np.floating)) and np.isnan(value)):
            # NaN is how pandas gives a missing string (df.to_dict("records"), df.itertuples()).
            raise _RecordMismatch(f"feature {f.name!r} is {'None' if value is None else 'NaN'} (a missing value), "
                                  f"which a string feature cannot hold: fill it (e.g. with '')")
        if not isinstance(value, bytes):
            raise _RecordMismatch(f"feature {f.name!r} is a {type(value).__name__}, {self.first} had a string")
        return value

    def _merge_image_shape(self, name, shape):
        old = self._image_shapes[name]
        if tuple(old) == tuple(shape):
            return
        h = old[0] if old[0] == shape[0] else None
        w = old[1] if old[1] == shape[1] else None
        # decode_image(channels=C) converts, so the widest channel count read covers every image
        c = max(old[2], shape[2])
        self._image_shapes[name] = (h, w, c)
