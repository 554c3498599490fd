"""Finding bad input before (or after) TensorFlow trips over it.

Two levels:

* `quick_check`: per file, cheap. Exists, size matches schema.json, the first
  bytes match the expected compression, the first record's framing and CRCs
  are right, and the first record of the first file parses with the schema.
* `check_tfrecords` (full): every record of every file, framing, CRC32C,
  record counts and parsing/decoding with the schema, each problem reported
  with file, record index and byte offset.

And after TensorFlow tripped over it (its errors name no file):
`locate_damage` finds the first damaged place, `damage_error` turns the
TensorFlow error into a `DataError` that names it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Mapping

from kerasfast.data.files import resolve_files
from kerasfast.data.framing import (
    NOT_TFRECORD,
    RecordProblem,
    describe_compression,
    iter_frames,
    sniff_compression,
)
from kerasfast.data.schema import SCHEMA_FILENAME, Schema, normalize_compression
from kerasfast.data.messages import tf_error_text
from kerasfast.errors import DataError

# What a reader does with a damaged record: name it in a `DataError`, or leave it out and warn.
ON_ERROR = ("raise", "skip")

PARSE_CHUNK = 256
MAX_SHOWN = 5


@dataclasses.dataclass
class FileReport:
    """The result of reading one file record by record."""

    file: str
    compression: str | None
    num_records: int = 0  # records found, good or bad
    problems: list = dataclasses.field(default_factory=list)
    promised: int | None = None  # records schema.json promises for the file; None without one

    @property
    def num_extra(self) -> int:
        """Records found beyond what schema.json promises for the file (read whole: only the count is off)."""
        return max(0, self.num_records - self.promised) if self.promised is not None else 0

    @property
    def bad_indices(self) -> set:
        return {p.index for p in self.problems if p.index is not None}

    @property
    def num_good(self) -> int:
        return self.num_records - len({p.index for p in self.problems if p.index is not None
                                       and p.index < self.num_records})

    @property
    def framing_damaged(self) -> bool:
        """True when TensorFlow's own reader cannot read past a problem in this file."""
        return any(p.kind in ("bad_data_crc", "truncated", "bad_length_crc") for p in self.problems)

    @property
    def unreadable(self) -> bool:
        """True when the file as a whole cannot be read (missing, not TFRecord, wrong compression).

        A file holding fewer or more records than schema.json promises is
        readable: its records are whole, only their count is wrong.
        """
        return any(p.index is None and p.kind != "count_mismatch" for p in self.problems)


@dataclasses.dataclass
class ValidationReport:
    """What `check_tfrecords` found. `ok` is True when nothing is wrong."""

    files: list  # of FileReport
    schema_path: str | None = None
    promised: int | None = None  # records schema.json lists for these files; None without a schema

    @property
    def problems(self) -> list:
        return [p for f in self.files for p in f.problems]

    @property
    def first_damage(self) -> RecordProblem | None:
        """The first problem in file order, lowest record index first."""
        return next((f.problems[0] for f in self.files if f.problems), None)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def num_records(self) -> int:
        return sum(f.num_records for f in self.files)

    @property
    def num_good(self) -> int:
        return sum(f.num_good for f in self.files)

    def summary(self) -> str:
        if self.ok:
            return f"{len(self.files)} file(s), {self.num_records} records, no problems found."
        probs = self.problems
        # Against the schema's count: records after a truncation are not found, so not counted, otherwise.
        longer = [f for f in self.files if f.num_extra]
        record_problems = [p for p in probs if p.index is not None]
        if self.num_records and not self.num_good and record_problems and all(
                p.kind == "parse" for p in record_problems):
            # Every count and file problem follows from this one: the schema describes other records.
            readable = (f"none of the {self.num_records} records matches {self.schema_path or SCHEMA_FILENAME}: it "
                        "probably describes another dataset (re-write the data, or pass features= that describe "
                        "it)")
        elif longer:
            promised = f", {self.promised} promised" if self.promised is not None else ""
            readable = (f"{len(longer)} file(s) hold more records than {SCHEMA_FILENAME} promises "
                        f"({sum(f.num_extra for f in longer)} more; {self.num_good} readable{promised})")
        elif self.promised is not None:
            readable = f"{self.num_good} of {self.promised} records readable ({SCHEMA_FILENAME} promises " \
                       f"{self.promised})"
        else:
            readable = f"{self.num_good} of the {self.num_records} records found are readable"
        first = "problem" if self.first_damage.kind == "count_mismatch" else "damage"
        lines = [f"{readable}: first {first} at {self.first_damage.where()}; {len(probs)} problem(s) in "
                 f"{sum(1 for f in self.files if f.problems)} of {len(self.files)} file(s):"]
        lines += [f"  - {p}" for p in probs[:MAX_SHOWN]]
        if len(probs) > MAX_SHOWN:
            lines.append(f"  ... and {len(probs) - MAX_SHOWN} more (see report.problems)")
        return "\n".join(lines)

    __str__ = summary

    def raise_if_problems(self) -> None:
        """Raises a `DataError` describing the problems, if there are any."""
        if not self.ok:
            raise DataError(self.summary())


def promised_records(files: Iterable[str], expected_shards: Mapping) -> int | None:
    """Records schema.json lists for `files`, or None when it does not list them all."""
    shards = [expected_shards.get(os.path.abspath(f)) for f in files]
    return sum(s.num_records for s in shards) if shards and all(shards) else None


def expected_compression(resolved_schema: Schema, compression: Any, from_schema_file: bool):
    """The compression to read with: the explicit one, the schema's, or None to sniff per file."""
    if compression == "auto":
        return resolved_schema.compression if from_schema_file else "auto"
    return normalize_compression(compression)


def file_compression(path: str, expected) -> tuple:
    """Returns (compression to read with, problem or None) for one file."""
    if not os.path.exists(path):
        return expected, RecordProblem(path, None, None, "missing",
                                       "file not found; check the path, or re-copy the dataset.")
    if os.path.isdir(path):
        return expected, RecordProblem(path, None, None, "unreadable",
                                       "is a folder, not a TFRecord file; remove it from the folder/pattern.")
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError as error:
        return expected, RecordProblem(
            path, None, None, "unreadable",
            f"cannot be read ({error.strerror or error}); check its permissions.")
    found = sniff_compression(head)
    if found == NOT_TFRECORD:
        return expected, RecordProblem(
            path, None, None, "not_tfrecord",
            f"is not a TFRecord file (first bytes {head[:8].hex(' ')} are neither a TFRecord header, GZIP nor "
            f"ZLIB); remove it from the folder/pattern, or convert it with kerasfast.data.write_tfrecords.")
    if expected == "auto" or found == expected:
        return found, None
    return expected, RecordProblem(
        path, None, None, "compression",
        f"is {describe_compression(found)} but is read as {describe_compression(expected)}; pass "
        f"compression={found!r} (or compression='auto' to detect it).")


def quick_check(files: Iterable[str], schema: Schema, compression, expected_shards: Mapping,
                decoder=None) -> tuple:
    """Cheap per-file checks. Returns ({file: compression}, [RecordProblem])."""
    problems, comps = [], {}
    for i, path in enumerate(files):
        comp, problem = file_compression(path, compression)
        comps[path] = comp
        if problem:
            problems.append(problem)
            continue
        shard = expected_shards.get(os.path.abspath(path))
        if shard is not None:
            size = os.path.getsize(path)
            if size != shard.num_bytes:
                problems.append(RecordProblem(
                    path, None, None, "size_mismatch",
                    f"is {size} bytes but was written as {shard.num_bytes} bytes ({shard.num_records} records): it "
                    f"was truncated or changed after writing; re-copy it or re-run the conversion, or read with "
                    f"on_error='skip' to use its good records."))
                continue
        frame = _first_frame(path, comp)
        if frame is None:
            continue  # an empty file is a valid TFRecord file with no records
        if frame.problem is not None:
            problems.append(frame.problem)
            continue
        if i == 0 and decoder is not None:
            problem = _decode_problem(decoder, schema, path, 0, frame.offset, frame.payload)
            if problem:
                problems.append(problem)
    return comps, problems


def _first_frame(path, comp):
    frames = iter_frames(path, comp)
    try:
        return next(frames)
    except StopIteration:
        return None
    finally:
        frames.close()


def check_tfrecords(
    path_or_pattern: Any,
    *,
    compression: str | None = "auto",
    features: Schema | Mapping | None = None,
    image_size=None,
    parse: bool = True,
) -> ValidationReport:
    """Reads every record of every file and reports each problem with its location.

    Checks framing (lengths and CRC32C of the TFRecord format), compression,
    record counts against schema.json, and, with `parse=True`, that every
    record parses and decodes with the schema (images included).

    Args:
        path_or_pattern: folder, glob, file or list of files.
        compression: "auto" (schema's, else detected per file), None, "GZIP"
            or "ZLIB".
        features: explicit `Schema` or feature spec for files without schema.json.
        image_size: resize target, as passed to `tfrecord_dataset`.
        parse: also parse and decode each record (slower).

    Returns:
        A `ValidationReport`; `report.raise_if_problems()` raises a `DataError`.

    Example:

    >>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    >>> _ = kerasfast.data.write_tfrecords((x, np.arange(64) % 10), "data/train", shards=2)
    >>> print(kerasfast.data.check_tfrecords("data/train").summary())
    2 file(s), 64 records, no problems found.
    """
    resolved = resolve_files(path_or_pattern, features=features)
    expected = expected_compression(resolved.schema, compression, resolved.schema_path is not None)
    decoder = make_checked_decoder(resolved.schema, image_size) if parse else None
    reports = [check_file(f, resolved.schema, expected, resolved.expected.get(os.path.abspath(f)), decoder)
               for f in resolved.files]
    return ValidationReport(reports, resolved.schema_path, promised_records(resolved.files, resolved.expected))


def locate_damage(
    path_or_files: Any,
    *,
    features: Schema | Mapping | None = None,
    compression: str | None = "auto",
    image_size=None,
) -> RecordProblem | None:
    """Finds the first damaged place in TFRecord files.

    Reads the files in order, record by record, and stops at the first file
    with a problem: framing (lengths, CRC32C, truncation, compression), record
    count against schema.json, then parsing against the schema (e.g. a record
    without a key the schema requires) and decoding. Without a schema (and no
    `features=`) only the framing is checked.

    Args:
        path_or_files: folder, glob, file or list of files, as given to
            `tfrecord_dataset`, or a dataset it returned (or its `DatasetInfo`).
        features: explicit `Schema` or feature spec for files without schema.json.
        compression: "auto" (schema's, else detected per file), None, "GZIP"
            or "ZLIB".
        image_size: resize target, as passed to `tfrecord_dataset`.

    Returns:
        The first `RecordProblem` (`file`, `index`, `offset`, `kind`,
        `message`; `str()` gives all of it), or None when nothing is wrong.

    Raises:
        DataError: when the files cannot be found or their schema is invalid.

    Example:

    >>> import pathlib
    >>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    >>> _ = kerasfast.data.write_tfrecords((x, np.arange(64) % 10), "data/train", shards=2)
    >>> print(kerasfast.data.locate_damage("data/train"))
    None
    >>> last = pathlib.Path("data/train/data-00001-of-00002.tfrecord")
    >>> _ = last.write_bytes(last.read_bytes()[:-5])  # as an interrupted copy leaves it
    >>> problem = kerasfast.data.locate_damage("data/train")
    >>> problem.file == str(last), problem.index, problem.offset, problem.kind
    (True, 31, 1767, 'truncated')
    """
    return _scan(path_or_files, features, compression, image_size)[1]


def _scan(path_or_files, features, compression, image_size) -> tuple:
    """(files, first problem or None) of `locate_damage`."""
    info = getattr(path_or_files, "kerasfast_info", path_or_files)
    promised = {}
    if hasattr(info, "files") and hasattr(info, "schema"):  # a dataset from tfrecord_dataset, or its DatasetInfo
        path_or_files, features = info.files, features or info.schema
        promised = getattr(info, "expected", {})  # the counts schema.json gave when the dataset was made
    resolved = resolve_files(path_or_files, features=features, require_schema=False)
    schema = resolved.schema
    expected = expected_compression(schema, compression, resolved.schema_path is not None)
    decoder = make_checked_decoder(schema, image_size) if schema is not None else None
    promised = resolved.expected or promised
    for f in resolved.files:
        report = check_file(f, schema, expected, promised.get(os.path.abspath(f)), decoder)
        if report.problems:
            return resolved.files, report.problems[0]
    return resolved.files, None


SKIP_HINT = "fix or remove the file, or pass on_error='skip' to skip damaged records"


def damage_error(
    path_or_files: Any,
    error: BaseException,
    *,
    features: Schema | Mapping | None = None,
    image_size=None,
) -> DataError:
    """Turns an error TensorFlow raised while reading into a `DataError` that names the damage.

    TensorFlow says e.g. "corrupted record at 184" without the file. Call this
    where `tf.errors.DataLossError` / `InvalidArgumentError` is caught:
    `raise damage_error(path, e) from e`. It runs `locate_damage` and never
    raises itself, so the original error is never hidden.

    Args:
        path_or_files: what was read: folder, glob, file or list of files, or
            a dataset from `tfrecord_dataset` (or its `DatasetInfo`).
        error: the exception TensorFlow raised.
        features: as given to `tfrecord_dataset`, for files without schema.json.
        image_size: as given to `tfrecord_dataset`.

    Returns:
        A `DataError`: "<file>, record 17 (byte offset 4096): <what is wrong>
        ... (TensorFlow said: ...)", or, when the files show no damage, the
        original message with the files that were checked.
    """
    said = f"(TensorFlow said: {type(error).__name__}: {tf_error_text(error)})"
    try:
        files, problem = _scan(path_or_files, features, "auto", image_size)
    except DataError as exc:  # the files cannot even be listed: that is the explanation
        return DataError(f"{exc} {said}")
    except Exception as exc:  # noqa: BLE001 - an explanation must never replace the error it explains
        return DataError(f"reading {path_or_files} failed {said}; locating the damage failed too "
                         f"({type(exc).__name__}: {exc}).")
    if problem is None:
        return no_damage_error(files, error)
    hint = "" if "on_error='skip'" in problem.message else f" — {SKIP_HINT}."
    return DataError(f"{problem}{hint} {said}")


def no_damage_error(files: list, error: BaseException) -> DataError:
    """The `DataError` for a read that failed although a full check of its files finds nothing."""
    shown = ", ".join(files[:3]) + (f" (and {len(files) - 3} more)" if len(files) > 3 else "")
    return DataError(
        f"reading the data failed ({type(error).__name__}: {tf_error_text(error)}), but a record-by-record "
        f"check of its {len(files)} file(s) finds no damage: {shown}. The error may not come from the files "
        f"(check the data values against the model), or the files changed while reading: check the storage "
        f"and retry.")


def check_file(path: str, schema: Schema, expected_comp, shard=None, decoder=None) -> FileReport:
    comp, problem = file_compression(path, expected_comp)
    report = FileReport(path, comp)
    if problem:
        report.problems.append(problem)
        return report
    pending = []  # (index, offset, payload) waiting to be parsed as one batch

    def flush():
        if decoder is not None and pending:
            report.problems.extend(_decode_chunk(decoder, schema, path, pending))
        pending.clear()

    for frame in iter_frames(path, comp):
        if frame.problem is not None:
            report.problems.append(frame.problem)
            if frame.problem.fatal_for_file:
                break
        else:
            pending.append((frame.index, frame.offset, frame.payload))
            if len(pending) >= PARSE_CHUNK:
                flush()
        report.num_records = frame.index + 1
    flush()
    complete = not any(p.fatal_for_file for p in report.problems)
    if shard is not None and complete:
        report.promised = shard.num_records
    if shard is not None and complete and report.num_records > shard.num_records:
        report.problems.append(RecordProblem(
            path, None, None, "count_mismatch",
            f"holds more records than schema.json promises: {report.num_records} records where schema.json says "
            f"{shard.num_records}; schema.json was edited, or the file was rewritten or appended to after writing; "
            f"re-run the conversion, or correct num_records in schema.json."))
    elif shard is not None and complete and report.num_records != shard.num_records:
        report.problems.append(RecordProblem(
            path, None, None, "count_mismatch",
            f"holds {report.num_records} records but schema.json says {shard.num_records}; the file was replaced "
            f"or changed after writing; re-run the conversion."))
    report.problems.sort(key=lambda p: (p.index is None, p.index or 0))
    return report


def make_checked_decoder(schema: Schema, image_size=None):
    """The schema's batch decoder, compiled once, for validation passes."""
    import tensorflow as tf

    decode = schema.make_batch_decoder(image_size)
    return tf.function(decode, input_signature=[tf.TensorSpec([None], tf.string)])


def _decode_chunk(decoder, schema, path, chunk) -> list:
    import tensorflow as tf

    try:
        decoder(tf.constant([payload for _, _, payload in chunk]))
        return []
    except tf.errors.OpError:
        pass
    # Some record in the chunk is bad: find which, one by one (rare path).
    out = []
    for index, offset, payload in chunk:
        problem = _decode_problem(decoder, schema, path, index, offset, payload)
        if problem:
            out.append(problem)
    return out


def _decode_problem(decoder, schema, path, index, offset, payload):
    import tensorflow as tf

    try:
        decoder(tf.constant([payload]))
        return None
    except tf.errors.OpError as exc:
        message = tf_error_text(exc)
    # Which feature? Parse alone tells schema mismatches from image decode failures.
    try:
        parsed = tf.io.parse_example(tf.constant([payload]), schema.parse_spec())
    except tf.errors.OpError as exc:
        detail = tf_error_text(exc)
        return RecordProblem(path, index, offset, "parse",
                             f"does not match the schema ({detail}); the file was written with other features: "
                             f"re-write it, or pass features= that describe it.")
    layout = schema.layout
    if layout is not None and not layout.fits(payload, schema.features):
        return RecordProblem(path, index, offset, "parse",
                             f"parses, but does not have the byte layout that schema.json records for these files "
                             f"(every record {layout.length} bytes, the features at fixed places), as another "
                             f"program re-writing the file may order the features: write the data again, or "
                             f"remove the layout entry from schema.json to parse each record.")
    images = [f for f in schema.features if getattr(f, "is_image", False)]
    for f in images:
        try:
            tf.io.decode_image(parsed[f.name][0], expand_animations=False)
        except tf.errors.OpError as exc:
            detail = tf_error_text(exc)
            return RecordProblem(path, index, offset, "decode",
                                 f"image feature {f.name!r} cannot be decoded ({detail}); replace the image and "
                                 f"re-write the shard, or read with on_error='skip'.")
    return RecordProblem(path, index, offset, "parse",
                         f"does not decode with the schema ({message}); the stored sizes or dtypes differ from "
                         f"schema.json: re-write the file, or pass features= that describe it.")


def good_records(report: FileReport) -> Iterable[tuple[int, bytes]]:
    """Yields `(record index, payload)` of every good record of a damaged file, in order."""
    bad = report.bad_indices
    for frame in iter_frames(report.file, report.compression):
        if frame.problem is not None:
            if frame.problem.fatal_for_file:
                return
            continue
        if frame.index not in bad:
            yield frame.index, frame.payload
