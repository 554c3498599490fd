"""`tfrecord_dataset`: TFRecord shards -> a fast, batched `tf.data.Dataset`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import warnings
from typing import Any, Mapping, Sequence

from kerasfast.data.files import resolve_files
from kerasfast.data.framing import NOT_TFRECORD
from kerasfast.data.schema import Schema
from kerasfast.data.validation import (
    ON_ERROR,
    FileReport,
    ValidationReport,
    check_file,
    expected_compression,
    file_compression,
    good_records,
    make_checked_decoder,
    no_damage_error,
    promised_records,
    quick_check,
)
from kerasfast.data.messages import tf_error_text
from kerasfast.errors import DataError

AUTOTUNE = "autotune"
# Memory the shuffle buffer may use for serialized records; the buffer never
# needs more than 10,000 records for a well-mixed order once files are
# shuffled and interleaved.
SHUFFLE_BUFFER_BYTES = 128 * 1024 * 1024
MAX_SHUFFLE_BUFFER = 10_000
UNKNOWN_RECORD_BYTES = 1024
# Records taken from one file at a time when that costs no randomness: it cuts
# tf.data's per-element overhead in interleave and shuffle ~16-fold.
DEFAULT_READ_BLOCK = 16
# With shuffle=False, records come in the order `write_tfrecords` wrote them,
# which deals them out round-robin over its shards: every shard is open at once
# and gives one record in turn. Beyond this many files (each with its read
# buffer and file handle open) the order is given up for blocks of a few files.
MAX_ORDERED_FILES = 256
# A file that ends before the records schema.json promises is padded with
# records starting with this mark, each holding the error to raise, and the
# batch decoder raises it. A serialized tf.train.Example cannot start with a
# zero byte (protobuf has no field 0), so no real record carries the mark.
# The padding costs nothing per record; counting each file's records inside
# the pipeline cost more than the reading itself.
SHORT_FILE_MARK = "\x00kerasfast-short-file\x00"
# Where the padding's error says how many records were read, known only when the
# error is raised: a padding record's index in its file less its index among the
# padding (each carries the latter, "<k>:" after the mark). Its index in its file
# alone would say so only for the first padding record, which a shuffle may put
# in a later batch than another.
READ_COUNT = "<read>"
# Each record travels with an id, file index * RECORD_ID_STRIDE + record
# index in its file, which becomes its name in `parse_example`: TensorFlow's
# own error for a missing or mistyped feature then names the file and record
# wherever the dataset is read (a user's loop, model.fit). ~2 us of CPU per record (docs/data.md).
RECORD_ID_STRIDE = 1 << 40


@dataclasses.dataclass
class PipelineSettings:
    """Every choice `tfrecord_dataset` made, with the reason for each.

    Each field can be overridden by the argument of the same name. Print it
    (`str(settings)`) or store it (`settings.as_dict()`) with the run.
    """

    num_files: int
    compression: str | None
    sharding: str  # "off", "file" or "data"
    num_workers: int
    worker_index: int
    shuffle_files: bool
    cycle_length: int
    read_block: int
    num_parallel_reads: Any  # int or "autotune"
    deterministic: bool
    shuffle_buffer: int
    batch_size: int
    drop_remainder: bool
    parse_parallelism: Any
    cache: str | None
    repeat: Any
    prefetch: Any
    read_buffer_bytes: int | None
    on_error: str
    validate: str
    reasons: dict = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        lines = ["input pipeline:"]
        for field in dataclasses.fields(self):
            if field.name == "reasons":
                continue
            value = getattr(self, field.name)
            reason = self.reasons.get(field.name)
            lines.append(f"  {field.name:18s} {value!s:12s}" + (f"  ({reason})" if reason else ""))
        return "\n".join(lines)


@dataclasses.dataclass
class DatasetInfo:
    """What training code needs to know about a dataset, without reading it.

    Attributes:
        files: the files this pipeline reads (after worker sharding).
        schema: the `Schema` (features, label, compression, counts).
        schema_path: path of schema.json, or None with an explicit spec.
        label: label feature, or None when elements are feature dicts.
        input_names: the model inputs; one name means elements are `(x, y)`.
        num_records: records per epoch from this pipeline, None if unknown.
        total_records: records in the whole dataset, None if unknown.
        batch_size: records per batch.
        steps_per_epoch: batches per epoch, None if unknown.
        settings: the `PipelineSettings`.
        skipped: `RecordProblem`s of records left out with `on_error="skip"`.
        validation: the `ValidationReport` of a full check, if one ran.
    """

    files: list
    schema: Schema
    schema_path: str | None
    label: str | None
    input_names: list
    num_records: int | None
    total_records: int | None
    batch_size: int
    steps_per_epoch: int | None
    settings: PipelineSettings
    skipped: list
    validation: ValidationReport | None = None
    expected: dict = dataclasses.field(default_factory=dict)  # file path -> ShardInfo from schema.json

    def explain(self, error: BaseException) -> DataError:
        """Turns an error raised while iterating into a `DataError` that names the file.

        TensorFlow reports a damaged record as e.g. "corrupted record at 184"
        without the file; this re-reads this pipeline's files record by record
        to find which file and record it was.
        """
        return explain_data_error(error, self)


@dataclasses.dataclass(frozen=True)
class _Request:
    """The pipeline arguments of `tfrecord_dataset`, as given or, once resolved, with "auto" filled in."""

    batch_size: int
    shuffle: bool
    seed: int | None
    compression: str | None
    image_size: Sequence[int] | None
    cycle_length: int | None
    read_block: int | None
    num_parallel_reads: int | None
    deterministic: bool | None
    shuffle_buffer: int | None
    parse_parallelism: int | None
    cache: str | None
    repeat: bool | int
    drop_remainder: bool
    prefetch: int | None
    read_buffer_bytes: int | None
    on_error: str
    validate: str | None


@dataclasses.dataclass(frozen=True)
class _Elements:
    """What one element holds: the label, the model inputs and the batch decoder that makes them."""

    label: str | None
    input_names: list
    decode: Any
    parse_spec: dict  # `tf.io.parse_example`'s spec of the records
    stand_in: bytes  # a record of the files' layout (b"" without one), parsed in place of a short file's padding


@dataclasses.dataclass(frozen=True)
class _Sharding:
    """Which files this worker reads and how records are split between workers."""

    mode: str  # "off", "file" or "data"
    num_workers: int
    worker_index: int
    all_files: list
    files: list
    reason: str


@dataclasses.dataclass(frozen=True)
class _Checked:
    """What the checks before reading found: each file's compression and, after a full check, the reports."""

    comps: dict
    reports: list = dataclasses.field(default_factory=list)
    validation: ValidationReport | None = None


@dataclasses.dataclass(frozen=True)
class _Counts:
    """Records in the whole dataset and records this pipeline reads per epoch (None: unknown)."""

    total: int | None
    worker: int | None


def _worker_layout(num_workers, worker_index, input_context) -> tuple:
    """`(num_workers, worker_index)` from an input context or the two arguments, checked."""
    if input_context is not None:
        if num_workers is not None or worker_index is not None:
            raise DataError("pass either input_context or num_workers/worker_index, not both.")
        return int(input_context.num_input_pipelines), int(input_context.input_pipeline_id)
    if worker_index is not None and num_workers is None:
        raise DataError(f"worker_index={worker_index!r} needs num_workers= too (the number of input pipelines), "
                        "or pass input_context=.")
    num_workers = 1 if num_workers is None else int(num_workers)
    worker_index = 0 if worker_index is None else int(worker_index)
    if num_workers < 1 or not 0 <= worker_index < num_workers:
        raise DataError(f"worker_index={worker_index} with num_workers={num_workers}: need "
                        f"0 <= worker_index < num_workers.")
    return num_workers, worker_index


def _record_bytes(schema: Schema, expected: Mapping) -> int:
    """Estimated bytes one serialized record holds in the shuffle buffer."""
    if expected:
        shards = list(expected.values())
        records = sum(s.num_records for s in shards)
        if records:
            # File bytes under-count compressed records; decoded sizes are the upper bound.
            decoded = 0
            for f in schema.features:
                if all(d is not None for d in f.shape) and f.dtype != "string":
                    decoded += math.prod(f.shape) * (1 if f.dtype == "bool" else _itemsize(f.dtype))
            if schema.compression is None:
                return max(1, sum(s.num_bytes for s in shards) // records)
            return max(1, decoded or UNKNOWN_RECORD_BYTES)
    return UNKNOWN_RECORD_BYTES


def _itemsize(dtype: str) -> int:
    """Bytes of one value of a NumPy dtype name."""
    import numpy as np

    return np.dtype(dtype).itemsize


def _tune(value):
    """tf.data's AUTOTUNE for "autotune", else the value."""
    import tensorflow as tf

    return tf.data.AUTOTUNE if value == AUTOTUNE else value


def tfrecord_dataset(
    path_or_pattern: Any,
    *,
    batch_size: int,
    shuffle: bool = True,
    seed: int | None = None,
    features: Schema | Mapping | None = None,
    label: Any = None,
    compression: str | None = "auto",
    image_size: Sequence[int] | None = None,
    cycle_length: int | None = None,
    read_block: int | None = None,
    num_parallel_reads: int | None = None,
    deterministic: bool | None = None,
    shuffle_buffer: int | None = None,
    parse_parallelism: int | None = None,
    cache: str | None = None,
    repeat: bool | int = False,
    drop_remainder: bool = False,
    prefetch: int | None = None,
    read_buffer_bytes: int | None = None,
    num_workers: int | None = None,
    worker_index: int | None = None,
    input_context: Any = None,
    on_error: str = "raise",
    validate: str | None = None,
):
    """Reads TFRecord shards as a fast, batched `tf.data.Dataset`.

    The pipeline: shuffled file list -> parallel `interleave` of files ->
    (optional cache of the serialized records) -> shuffle buffer -> (repeat)
    -> batch -> one vectorised `tf.io.parse_example` per batch plus parallel
    decoding (raw tensors, images) -> prefetch. Batching *before* parsing is
    what makes it several times faster than parsing record by record.

    Elements are `(x, y)` when the schema has a label and one input feature,
    `({name: tensor}, y)` with several inputs, and `{name: tensor}` without a
    label. The chosen settings and the reasons are in
    `dataset.kerasfast_info.settings` (see `DatasetInfo`).

    Args:
        path_or_pattern: a folder written by `write_tfrecords`, a glob
            (`"data/*.tfrecord"`), a file, or a list of files.
        batch_size: records per batch produced by this pipeline (with an
            `input_context`, pass the per-replica batch size).
        shuffle: shuffle files and records (each epoch differently).
        seed: seed of both shuffles; giving one also makes the order
            deterministic unless `deterministic=False`.
        features: for files without schema.json: a `Schema` or a
            `{name: tf.io.FixedLenFeature}` dict.
        label: the label feature (default: the schema's); False for dicts.
        compression: "auto" (default: from schema.json, else detected per
            file), None, "GZIP" or "ZLIB". A file whose bytes do not match
            is reported before reading starts.
        image_size: `(height, width)` to resize images to while decoding
            (needed when the stored images differ in size).
        cycle_length: files read at once (default: one per CPU core, at
            least 4, at most the number of files).
        read_block: records taken from one file at a time and kept together
            through the shuffle (default: 16 when the records were shuffled
            at write time or shuffle=False, since it then costs no
            randomness; else 1).
        num_parallel_reads: threads for the interleave (default: autotune).
        deterministic: keep a reproducible element order at some speed cost
            (default: False; True with a seed, shuffle=False or data sharding).
        shuffle_buffer: records in the shuffle buffer (default: up to 10,000,
            limited to 128 MB of serialized records).
        parse_parallelism: batches parsed/decoded in parallel (default: autotune).
        cache: None, "memory", or a file path prefix: caches the serialized
            records, so files are read and decompressed once.
        repeat: False (one pass per iteration, as `model.fit` expects),
            True (forever) or a number of passes.
        drop_remainder: drop the last short batch (static batch shapes).
        prefetch: batches prepared ahead (default: autotune).
        read_buffer_bytes: read buffer per open file (default: TensorFlow's).
        num_workers: number of input pipelines (training workers).
        worker_index: index of this worker, `0 <= worker_index < num_workers`.
        input_context: a `tf.distribute.InputContext`, instead of the two above.
        on_error: "raise" (default): bad input raises a `DataError` naming
            the file and record; "skip": bad records and unreadable files are
            left out after a full check, reported in a warning and in
            `dataset.kerasfast_info.skipped`.
        validate: "quick" (default with "raise"; a few reads per file),
            "full" (every record, default and required with "skip") or "none".

    Returns:
        A `tf.data.Dataset`, with a `kerasfast_info` attribute (`DatasetInfo`).

    Example:

    >>> ds = kerasfast.data.tfrecord_dataset("data/train", batch_size=128)  # doctest: +SKIP
    >>> print(ds.kerasfast_info.settings)                                    # doctest: +SKIP
    >>> model.fit(ds, epochs=3)                                              # doctest: +SKIP
    """
    import tensorflow as tf

    request = _checked_request(_Request(
        batch_size=batch_size, shuffle=shuffle, seed=seed, compression=compression, image_size=image_size,
        cycle_length=cycle_length, read_block=read_block, num_parallel_reads=num_parallel_reads,
        deterministic=deterministic, shuffle_buffer=shuffle_buffer, parse_parallelism=parse_parallelism,
        cache=cache, repeat=repeat, drop_remainder=drop_remainder, prefetch=prefetch,
        read_buffer_bytes=read_buffer_bytes, on_error=on_error, validate=validate))
    resolved = resolve_files(path_or_pattern, features=features)
    elements = _elements(resolved, label, image_size)
    sharding = _shard_files(list(resolved.files), *_worker_layout(num_workers, worker_index, input_context))
    checked = _check_files(sharding.files, resolved, request, elements.decode)
    counts = _count_records(resolved, sharding, checked.validation)
    request, reasons = _resolve_auto(request, sharding, resolved, counts.worker)
    if request.cache not in (None, "memory"):
        request = dataclasses.replace(request, cache=_versioned_cache(request, sharding, checked, resolved))
        reasons["cache"] = ("caches serialized records: files are read and decompressed once; the prefix names "
                            "this version of the files, so a re-written dataset is cached anew")
    settings = _pipeline_settings(request, sharding, checked.comps, reasons)

    promised = _promised_counts(sharding.files, resolved.expected, checked)
    records = _read_stage(sharding, checked, settings, request.seed, promised)
    ds = _parse_stage(_batch_stage(records, request), request, settings, elements, sharding.files,
                      promised is not None)
    if sharding.num_workers > 1:
        # Sharded here already; a tf.distribute strategy must not shard again.
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        ds = ds.with_options(options)
    steps = _steps_per_epoch(request, counts.worker)
    if steps is not None:
        # Known from the schema (or the full check): telling tf.data lets Keras size its progress bar and
        # epochs instead of warning that the input "ran out of data" after the first epoch.
        ds = ds.apply(tf.data.experimental.assert_cardinality(steps))
    validation = checked.validation
    skipped = validation.problems if validation is not None else []
    ds.kerasfast_info = DatasetInfo(
        files=sharding.files, schema=resolved.schema, schema_path=resolved.schema_path, label=elements.label,
        input_names=elements.input_names, num_records=counts.worker, total_records=counts.total,
        batch_size=batch_size, steps_per_epoch=steps, settings=settings, skipped=skipped, validation=validation,
        expected=resolved.expected)
    if skipped:
        _warn_skipped(validation)
    return ds


# -- arguments and features ---------------------------------------------------

# Counts given as numbers of things (None: chosen or autotuned), with the least each may be.
_COUNTS = (("cycle_length", 1), ("read_block", 1), ("num_parallel_reads", 1), ("shuffle_buffer", 0),
           ("parse_parallelism", 1), ("prefetch", 0), ("read_buffer_bytes", 1))


def _whole_number(value) -> bool:
    import numpy as np

    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _checked_request(request: _Request) -> _Request:
    """Refuses bad arguments that need no file to judge; fills in the default of `validate`; NumPy integers
    become Python ints."""
    on_error, validate = request.on_error, request.validate
    request = dataclasses.replace(request, **_checked_counts(request), cache=_checked_cache(request.cache))
    if on_error not in ON_ERROR:
        raise DataError(f"on_error={on_error!r}: use 'raise' or 'skip'.")
    if validate is None:
        validate = "full" if on_error == "skip" else "quick"
    if validate not in ("quick", "full", "none"):
        raise DataError(f"validate={validate!r}: use 'quick', 'full' or 'none'.")
    if on_error == "skip" and validate != "full":
        raise DataError("on_error='skip' reads every record once to find the bad ones; use validate='full' "
                        "(the default with on_error='skip').")
    return dataclasses.replace(request, validate=validate)


def _checked_counts(request: _Request) -> dict:
    """The count arguments given, as Python ints; refuses one that is not a whole number in range."""
    batch_size = request.batch_size
    if not _whole_number(batch_size) or batch_size < 1:
        raise DataError(f"batch_size={batch_size!r}: pass a positive integer.")
    counts = {"batch_size": int(batch_size)}
    for name, least in _COUNTS:
        value = getattr(request, name)
        if value is None:
            continue
        if not _whole_number(value) or value < least:
            raise DataError(f"{name}={value!r}: pass an integer >= {least}, or leave it unset to have it chosen.")
        counts[name] = int(value)
    repeat = request.repeat
    if not isinstance(repeat, bool) and not (_whole_number(repeat) and repeat >= 1):
        raise DataError(f"repeat={repeat!r}: pass False (one pass), True (forever) or a number of passes >= 1.")
    return counts


def _checked_cache(cache):
    """`cache` as given, or a file path prefix as a string; refuses what would leave files where no one
    looks for them."""
    if cache is None or cache == "memory":
        return cache
    if not isinstance(cache, (str, os.PathLike)):
        raise DataError(f"cache={cache!r}: use None, 'memory' or a file path prefix.")
    cache = os.fspath(cache)
    if not os.path.dirname(cache):
        raise DataError(f"cache={cache!r} would write cache files named {cache}.* into the working directory: pass "
                        f"cache='memory', or a file path prefix in a folder, e.g. cache='cache/{cache}'.")
    return cache


def _elements(resolved, label, image_size) -> _Elements:
    """The label and input features of each element, and the batch decoder; refuses a label that cannot be."""
    schema = resolved.schema
    label_name = schema.label if label is None else (label or None)
    if label_name is not None and label_name not in schema.feature_names:
        raise DataError(f"label {label_name!r} is not a feature of {resolved.schema_path or 'features='}; the "
                        f"features are {schema.feature_names}: pass label= one of them, or label=False for dicts.")
    input_names = [n for n in schema.feature_names if n != label_name]
    if not input_names:
        raise DataError(f"the label {label_name!r} is the only feature; there is nothing to feed the model.")
    decode = schema.make_batch_decoder(image_size)  # raises early for unbatchable images
    stand_in = schema.layout.template() if schema.layout is not None else b""
    return _Elements(label_name, input_names, decode, schema.parse_spec(), stand_in)


# -- which files this worker reads ------------------------------------------------

def _shard_files(all_files: list, workers: int, index: int) -> _Sharding:
    """Splits the files between workers, or, with fewer files than workers, the records (with a warning)."""
    if workers > 1 and len(all_files) >= workers:
        files = all_files[index::workers]
        return _Sharding("file", workers, index, all_files, files,
                         f"{len(all_files)} files >= {workers} workers: each reads its own "
                         f"{len(files)} file(s), no record is read twice")
    if workers > 1:
        message = (f"only {len(all_files)} file(s) for {workers} workers, so every worker reads all files and "
                   f"keeps 1 record in {workers} (DATA sharding): {workers}x the reading work. Re-write the "
                   f"data with write_tfrecords(..., shards={workers * 4}) to let each worker read its own files.")
        warnings.warn(message, stacklevel=3)  # 3: the caller of tfrecord_dataset
        return _Sharding("data", workers, index, all_files, all_files, message)
    return _Sharding("off", workers, index, all_files, all_files, "one worker reads every file")


def _count_records(resolved, sharding: _Sharding, validation: ValidationReport | None) -> _Counts:
    """Records in the dataset and per epoch of this worker, from the schema or the full check."""
    if resolved.expected:
        per_file = {os.path.abspath(f): resolved.expected[os.path.abspath(f)].num_records
                    for f in sharding.all_files}
        total = sum(per_file.values())
        worker = sum(per_file[os.path.abspath(f)] for f in sharding.files)
    else:
        total = worker = None
    if validation is not None:
        worker = validation.num_good
    if sharding.mode == "data" and worker is not None:
        workers, index = sharding.num_workers, sharding.worker_index
        worker = worker // workers + (1 if index < worker % workers else 0)
    return _Counts(total, worker)


# -- checks -------------------------------------------------------------------------

def _check_files(files: list, resolved, request: _Request, decode) -> _Checked:
    """Runs the check `request.validate` asks for and finds each file's compression."""
    expected = expected_compression(resolved.schema, request.compression, resolved.schema_path is not None)
    if request.validate == "full":
        return _full_check(files, resolved, expected, request)
    if request.validate == "quick":
        return _Checked(_quick_check(files, resolved, expected, decode))
    # No checks, but compression must still be known: sniffing reads 64 bytes per file.
    comps = {f: file_compression(f, expected)[0] if expected == "auto" else expected for f in files}
    return _Checked({f: (None if c == NOT_TFRECORD else c) for f, c in comps.items()})


def _full_check(files: list, resolved, expected, request: _Request) -> _Checked:
    """Reads every record of `files`; raises on damage unless `on_error="skip"`."""
    schema = resolved.schema
    checked_decoder = make_checked_decoder(schema, request.image_size)
    reports = [check_file(f, schema, expected, resolved.expected.get(os.path.abspath(f)), checked_decoder)
               for f in files]
    validation = ValidationReport(reports, resolved.schema_path, promised_records(files, resolved.expected))
    if not validation.ok and request.on_error == "raise":
        raise DataError(validation.summary() + "\nFix the files, or pass on_error='skip' to read the good records.")
    return _Checked({r.file: r.compression for r in reports}, reports, validation)


def _quick_check(files: list, resolved, expected, decode) -> dict:
    """A few reads per file; raises listing the problems found. Returns each file's compression."""
    # One record is decoded eagerly: compiling a function would cost more than it saves.
    comps, problems = quick_check(files, resolved.schema, expected, resolved.expected, decode)
    if problems:
        shown = "\n".join(f"  - {p}" for p in problems[:5])
        more = f"\n  ... and {len(problems) - 5} more" if len(problems) > 5 else ""
        raise DataError(f"{len(problems)} problem(s) found before reading:\n{shown}{more}\nFix the files, or "
                        f"pass on_error='skip' to read the good records.")
    return comps


# -- settings ---------------------------------------------------------------------

# The settings tf.data tunes when left unset, and what tuning them decides.
_AUTOTUNED = (
    ("num_parallel_reads", "the reader threads"),
    ("parse_parallelism", "the parse/decode threads"),
    ("prefetch", "how many batches to prepare ahead"),
)


def _resolve_auto(request: _Request, sharding: _Sharding, resolved, worker_records) -> tuple:
    """`(request, reasons)`: every setting left unset chosen, with its reason; the ones given checked."""
    reasons = {"sharding": sharding.reason}
    written_in_turn = _written_in_turn(resolved, sharding.files)
    cycle_length = _cycle_length(request, sharding.files, written_in_turn)
    # Read in turn only when the cycle is the default one over all files: a given cycle_length is kept as given.
    in_turn = (written_in_turn and not request.shuffle and request.cycle_length is None
               and cycle_length[0] == len(sharding.files))
    chosen = {
        "cycle_length": cycle_length,
        "read_block": _read_block(request, sharding.mode, resolved.schema, in_turn),
        "deterministic": _deterministic(request, sharding.mode),
        "shuffle_buffer": _shuffle_buffer(request, resolved, worker_records),
    }
    for name, (_, reason) in chosen.items():
        if reason is not None:
            reasons[name] = reason
    for name, what in _AUTOTUNED:
        if getattr(request, name) is None:
            reasons[name] = f"tf.data autotunes {what}"
    reasons["cache"] = ("not cached (pass cache='memory' or a file path)" if request.cache is None else
                        "caches serialized records: files are read and decompressed once")
    return dataclasses.replace(request, **{name: value for name, (value, _) in chosen.items()}), reasons


def _cycle_length(request: _Request, files: list, written_in_turn: bool) -> tuple:
    """`(value, reason)` of the number of files read at once; reason None when given."""
    if request.cycle_length is not None:
        return request.cycle_length, None
    if not request.shuffle and len(files) > 1:
        if not written_in_turn:
            return 1, "shuffle=False: one file after another, in the order given"
        if len(files) <= MAX_ORDERED_FILES:
            return len(files), ("shuffle=False: all files at once, one record from each in turn, the order "
                                "write_tfrecords wrote them in")
    cpu = os.cpu_count() or 1
    reason = f"one open file per CPU core ({cpu}), at least 4, at most the {len(files)} file(s)"
    if not request.shuffle and len(files) > 1:
        reason += (f"; with more than {MAX_ORDERED_FILES} files the records do not come in the order they "
                   "were written (pass cycle_length=len(files) and read_block=1 for that order)")
    return max(1, min(len(files), max(4, cpu))), reason


def _written_in_turn(resolved, files: list) -> bool:
    """Whether `files` are shards `write_tfrecords` dealt records out to in turn (schema.json lists them)."""
    expected = resolved.expected or {}
    return len(files) > 1 and all(os.path.abspath(f) in expected for f in files)


def _read_block(request: _Request, sharding: str, schema: Schema, in_turn: bool) -> tuple:
    """`(value, reason)` of the records taken from one file at a time; reason None when given.

    `in_turn`: the files are read one record from each in turn (`_cycle_length`).
    """
    read_block = request.read_block
    if read_block is None:
        if sharding == "data":
            return 1, "data sharding splits records exactly, one at a time"
        if in_turn:
            return 1, "shuffle=False: one record from each file in turn, the order they were written in"
        if not request.shuffle or schema.shuffled:
            return DEFAULT_READ_BLOCK, (
                "records were shuffled when written, so neighbours are unrelated: blocks of "
                f"{DEFAULT_READ_BLOCK} cut per-record overhead at no cost in randomness"
                if request.shuffle else f"no shuffling: blocks of {DEFAULT_READ_BLOCK} cut per-record overhead")
        return 1, ("records were not shuffled when written (streamed source or other writer): "
                   "shuffle record by record")
    if read_block > 1 and sharding == "data":  # a whole number >= 1 already (`_checked_counts`)
        raise DataError("read_block > 1 cannot be combined with data sharding (records are split one by one); "
                        "leave read_block unset, or write more shards than workers.")
    return read_block, None


def _deterministic(request: _Request, sharding: str) -> tuple:
    """`(value, reason)` of whether the element order is reproducible; reason None when given."""
    seed, shuffle = request.seed, request.shuffle
    if request.deterministic is None:
        return seed is not None or sharding == "data" or not shuffle, (
            "data sharding needs the same record order on every worker" if sharding == "data" else
            "a seed was given: reproducible order" if seed is not None else
            "shuffle=False: records in a fixed order" if not shuffle else
            "order may vary between runs: faster, elements are not held back for a slow file")
    if sharding == "data" and not request.deterministic:
        raise DataError("deterministic=False with data sharding would give workers overlapping records; "
                        "leave deterministic unset, or write more shards than workers.")
    return request.deterministic, None


def _shuffle_buffer(request: _Request, resolved, worker_records) -> tuple:
    """`(value, reason)` of the records in the shuffle buffer; reason None when given."""
    if not request.shuffle:
        return 0, "shuffle=False"
    if request.shuffle_buffer is not None:
        return request.shuffle_buffer, None
    per_record = _record_bytes(resolved.schema, resolved.expected)
    by_memory = max(request.batch_size, SHUFFLE_BUFFER_BYTES // per_record)
    shuffle_buffer = min(MAX_SHUFFLE_BUFFER, by_memory)
    if worker_records:
        shuffle_buffer = min(shuffle_buffer, worker_records)
    return shuffle_buffer, (f"up to {MAX_SHUFFLE_BUFFER} records, {SHUFFLE_BUFFER_BYTES >> 20} MB at "
                            f"~{per_record} B/record, at most the records this worker reads")


def _pipeline_settings(request: _Request, sharding: _Sharding, comps: dict, reasons: dict) -> PipelineSettings:
    """The `PipelineSettings` of a resolved request: plain values, "autotune" for what tf.data tunes."""
    comp_values = sorted({c or "" for c in comps.values()})
    comp_shown = None if comp_values == [""] else "/".join(c or "none" for c in comp_values)

    def autotuned(value):
        """"autotune" when unset, else the value as an int."""
        return AUTOTUNE if value is None else int(value)

    return PipelineSettings(
        num_files=len(sharding.files), compression=comp_shown, sharding=sharding.mode,
        num_workers=sharding.num_workers, worker_index=sharding.worker_index, shuffle_files=bool(request.shuffle),
        cycle_length=int(request.cycle_length), read_block=request.read_block,
        num_parallel_reads=autotuned(request.num_parallel_reads), deterministic=bool(request.deterministic),
        shuffle_buffer=int(request.shuffle_buffer), batch_size=request.batch_size,
        drop_remainder=bool(request.drop_remainder), parse_parallelism=autotuned(request.parse_parallelism),
        cache=request.cache, repeat=request.repeat, prefetch=autotuned(request.prefetch),
        read_buffer_bytes=request.read_buffer_bytes, on_error=request.on_error, validate=request.validate,
        reasons=reasons,
    )


# -- the pipeline -------------------------------------------------------------------

def _promised_counts(files: list, expected: Mapping, checked: _Checked) -> list | None:
    """The records schema.json promises for each of `files`, when every pass must check them, else None.

    A full check before reading has counted every file already (and raised,
    or left out what it found with on_error="skip"); without a schema.json
    there is nothing to check against.
    """
    if checked.validation is not None or not files:
        return None
    counts = [expected.get(os.path.abspath(f)) for f in files]
    return None if any(c is None for c in counts) else [c.num_records for c in counts]


def _read_stage(sharding: _Sharding, checked: _Checked, settings: PipelineSettings, seed, promised):
    """Serialized records of this worker: its files interleaved, its share of the records, cached if asked."""
    # With data sharding all workers must see the same file order: a fixed seed.
    file_seed = seed if seed is not None else (0 if sharding.mode == "data" else None)
    records = _read_records(sharding.files, checked, settings, file_seed, promised)
    if sharding.mode == "data":
        records = records.shard(sharding.num_workers, sharding.worker_index)
    if settings.cache is not None:
        records = records.cache("" if settings.cache == "memory" else settings.cache)
    return records


def _versioned_cache(request: _Request, sharding: _Sharding, checked: _Checked, resolved) -> str:
    """The file cache's prefix for these files as they are now, its folder made.

    TensorFlow reuses a complete cache found under its prefix without
    looking at the files it came from, so a re-written dataset would be read
    as its old records: the prefix gets a digest of what the cached records
    depend on (each file's path, size and modification time, schema.json's,
    the worker's share, the blocks and the records left out).
    """
    def stat(path):
        try:
            info = os.stat(path)
        except OSError:
            return [os.path.abspath(path), None, None]
        return [os.path.abspath(path), info.st_size, info.st_mtime_ns]

    validation = checked.validation
    facts = {
        "files": [stat(f) for f in sharding.files], "schema": stat(resolved.schema_path) if resolved.schema_path else None,
        "share": [sharding.mode, sharding.num_workers, sharding.worker_index], "read_block": request.read_block,
        "compression": [checked.comps.get(f) for f in sharding.files],
        "left_out": [str(p) for p in validation.problems] if validation is not None else None,
    }
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    folder = os.path.dirname(request.cache)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise DataError(f"cache={request.cache!r}: cannot make its folder {folder} ({error}); pass a prefix in a "
                        "folder you can write, or cache='memory'.") from error
    prefix = f"{request.cache}.kf-{digest}"
    # TensorFlow only reads a complete cache (a shared, read-only one included); it writes a new one, and
    # fails at the first batch, inside the iterator, where it cannot.
    if not os.path.exists(f"{prefix}.index") and not os.access(folder, os.W_OK | os.X_OK):
        raise DataError(f"cache={request.cache!r}: its folder {folder} cannot be written by this process; pass a "
                        "prefix in a folder you can write, or cache='memory'.")
    return prefix


def _batch_stage(records, request: _Request):
    """Shuffles, repeats and batches `(record id, serialized record)` pairs."""
    # `records` holds blocks of `read_block` records when read_block > 1.
    if request.shuffle and request.shuffle_buffer > 1:
        records = records.shuffle(max(2, request.shuffle_buffer // request.read_block), seed=request.seed,
                                  reshuffle_each_iteration=True)
    if request.repeat is True:
        records = records.repeat()
    elif request.repeat:
        records = records.repeat(int(request.repeat))
    if request.read_block > 1:
        return records.rebatch(request.batch_size, drop_remainder=request.drop_remainder)
    return records.batch(request.batch_size, drop_remainder=request.drop_remainder)


def _parse_stage(batches, request: _Request, settings: PipelineSettings, elements: _Elements, files: list,
                 check_counts: bool):
    """Parses and decodes batches of `(record ids, records)` of `files` in parallel into model inputs, and
    prefetches them.

    With `check_counts`, a batch holding a short file's padding raises the
    error the padding carries (see `SHORT_FILE_MARK`).
    """
    import tensorflow as tf

    batch_size, drop_remainder = request.batch_size, request.drop_remainder
    label_name, input_names = elements.label, elements.input_names

    file_names = tf.constant(files or [""])

    def decode_batch(ids, serialized):
        if drop_remainder:
            # rebatch() loses the static batch size that drop_remainder promises; restore it.
            serialized = tf.ensure_shape(serialized, [batch_size])
        # A short file's padding never fits a record layout (its first byte differs from every Example's):
        # where the records are cut out by position, the misfit's explanation names it.
        decoded = elements.decode(serialized, names=lambda: _record_names(file_names, ids),
                                  guard=(lambda batch: _raise_on_short_files(ids, batch)) if check_counts else None,
                                  explain=lambda batch, at, text: _misfit_message(file_names, ids, batch, at, text,
                                                                                  elements))
        if drop_remainder:
            decoded = {k: tf.ensure_shape(v, [batch_size, *v.shape[1:]]) for k, v in decoded.items()}
        if label_name is None:
            return decoded
        y = decoded[label_name]
        if len(input_names) == 1:
            return decoded[input_names[0]], y
        return {n: decoded[n] for n in input_names}, y

    ds = batches.map(decode_batch, num_parallel_calls=_tune(settings.parse_parallelism),
                     deterministic=settings.deterministic)
    return ds.prefetch(_tune(settings.prefetch))


def _record_names(file_names, ids):
    """"FILE, record N" for each record id (see `RECORD_ID_STRIDE`)."""
    import tensorflow as tf

    return tf.strings.join([tf.gather(file_names, ids // RECORD_ID_STRIDE), ", record ",
                            tf.strings.as_string(ids % RECORD_ID_STRIDE)])


def _raise_on_short_files(ids, serialized):
    """`serialized` (a batch of records numbered `ids`), after an assertion that none is a short file's
    padding."""
    import tensorflow as tf

    padding = tf.strings.substr(serialized, 0, len(SHORT_FILE_MARK)) == SHORT_FILE_MARK

    def short():  # built only when a file is short
        first = tf.argmax(tf.cast(padding, tf.int32))
        message = _short_file_text(serialized[first], ids[first])
        with tf.control_dependencies([tf.debugging.Assert(False, [message], summarize=1)]):
            return tf.identity(serialized)

    return tf.cond(tf.reduce_any(padding), short, lambda: serialized)


def _short_file_text(record, record_id):
    """The error a short file's padding `record` (numbered `record_id`) carries, with the records read; for
    any other record, an empty string (a string tensor, made without raising whatever the bytes)."""
    import tensorflow as tf

    is_padding = tf.strings.substr(record, 0, len(SHORT_FILE_MARK)) == SHORT_FILE_MARK
    # Padding is MARK, its index among the padding, ":", the message. Any other record is swapped for
    # padding of an empty message first: the steps below would raise on arbitrary bytes.
    padding = tf.where(is_padding, record, SHORT_FILE_MARK + "0:")
    head, message = tf.unstack(tf.strings.split(padding, sep=":", maxsplit=1), num=2)
    among_padding = tf.strings.to_number(tf.strings.substr(head, len(SHORT_FILE_MARK), -1), tf.int64)
    read = record_id % RECORD_ID_STRIDE - among_padding
    return tf.strings.regex_replace(message, READ_COUNT, tf.strings.as_string(read))


def _misfit_message(file_names, ids, serialized, position, misfit_text, elements: _Elements):
    """The error of the batch's record at `position`, which does not fit the files' record layout: a short
    file's padding carries its own; any other record is named, followed by `misfit_text`.

    The record is parsed alone on the way: one missing a feature or holding another type fails there with
    TensorFlow's own error, which names the record and the feature. (Every batch pays for parsing one
    record, a stand-in when all fit; a branch taken only for misfits would cost more: see `RecordLayout`.)
    """
    import tensorflow as tf

    # `position` is past the batch's end when every record fits: nothing to explain, a valid record parsed.
    inside = position < tf.size(serialized, out_type=position.dtype)
    record = tf.strings.reduce_join(serialized[position:position + 1])
    short = _short_file_text(record, tf.reduce_sum(ids[position:position + 1]))
    name = tf.strings.reduce_join(_record_names(file_names, ids[position:position + 1]))[tf.newaxis]
    alone = tf.where(inside & (short == ""), record, elements.stand_in)[tf.newaxis]
    parsed = tf.nest.flatten(tf.io.parse_example(alone, elements.parse_spec, example_names=name))[0]
    # "", read from the parse: the message needs its result (a control dependency on a stateless op may be
    # pruned, and the parse with it).
    after_parse = tf.strings.substr(parsed if parsed.dtype == tf.string else tf.strings.as_string(parsed), 0, 0)[0]
    message = tf.where(short != "", short, tf.strings.join(["DataError: ", name[0], " ", misfit_text]))
    return tf.strings.join([message, after_parse])


def _short_file_message(path, promised):
    """The error a short file's padding carries, `READ_COUNT` standing for the records read (a string
    tensor; TensorFlow's assertion escapes quotes)."""
    import tensorflow as tf

    return tf.strings.join([
        "DataError: ", path, f" ends after {READ_COUNT} of the ", tf.strings.as_string(promised), " records that "
        f"schema.json promises for it: record {READ_COUNT} is damaged (reading stops at the first bad record), or "
        "the file was truncated, rewritten or removed after writing. kerasfast.data.check_tfrecords(", path, ") "
        "names the bad record and its byte offset; write the file again, or pass on_error=skip (to "
        "tfrecord_dataset or kerasfast.fit) to train on the records that are readable."])


def _steps_per_epoch(request: _Request, worker_records) -> int | None:
    """Batches per epoch when the records are known and the data does not repeat, else None."""
    if worker_records is None or request.repeat:
        return None
    if request.drop_remainder:
        if worker_records < request.batch_size:
            raise DataError(f"drop_remainder=True with batch_size={request.batch_size} drops all {worker_records} "
                            "records this pipeline reads (fewer than one batch): pass a smaller batch_size, or "
                            "drop_remainder=False.")
        return worker_records // request.batch_size
    return math.ceil(worker_records / request.batch_size)


def _warn_skipped(validation: ValidationReport) -> None:
    """Warns that `on_error="skip"` left records or files out, naming the first few."""
    skipped = validation.problems
    where = "; ".join(str(p).rstrip(".") for p in skipped[:3])
    longer = {f.file for f in validation.files if f.num_extra}
    extra = sum(f.num_extra for f in validation.files)
    if not [p for p in skipped if not (p.kind == "count_mismatch" and p.file in longer)]:
        # Only files holding more records than promised: their records are whole, so all of them are read.
        promised = f"the {validation.promised} that " if validation.promised is not None else ""
        warnings.warn(f"on_error='skip': reading all {validation.num_good} records, {extra} more than {promised}"
                      f"schema.json promises (whole records: only the count in schema.json is off): {where}"
                      + (" ..." if len(skipped) > 3 else "") + ". Full list: dataset.kerasfast_info.skipped.",
                      stacklevel=3)  # 3: the caller of tfrecord_dataset
        return
    if validation.promised is not None:
        beyond = f" and the {extra} the files hold beyond them" if extra else ""
        counts = (f"reading {validation.num_good} of the {validation.promised} records schema.json promises"
                  f"{beyond}, {max(0, validation.promised + extra - validation.num_good)} left out")
    else:  # without a schema the records after a truncation are not known
        counts = (f"reading {validation.num_good} records; {validation.num_records - validation.num_good} found "
                  "bad, and records after a truncation point cannot be counted")
    warnings.warn(f"on_error='skip': left out {len(skipped)} bad record(s)/file(s) ({counts}): {where}"
                  + (" ..." if len(skipped) > 3 else "") + ". Full list: dataset.kerasfast_info.skipped.",
                  stacklevel=3)  # 3: the caller of tfrecord_dataset


def _read_records(files, checked: _Checked, settings: PipelineSettings, file_seed, promised):
    """Dataset of `(record id, serialized record)` of `files` (ids: `RECORD_ID_STRIDE`), leaving out what
    the reports flag; a file read short (fewer records than `promised`, a list per file or None) is padded
    with its error."""
    import tensorflow as tf

    fast_files, fast_bad, slow_reports = _triage(files, checked.reports)
    by_file = {r.file: r for r in checked.reports}
    index_of = {f: i for i, f in enumerate(files)}
    parts, weights = [], []
    if fast_files:
        # `promised` is only given without a full check, when no report leaves a file out: fast_files == files.
        parts.append(_interleaved_records(fast_files, [index_of[f] for f in fast_files], fast_bad, checked.comps,
                                          settings, file_seed, promised))
        weights.append(sum(by_file[f].num_good if f in by_file else 1 for f in fast_files))
    if slow_reports:
        parts.append(_salvaged_records(slow_reports, [index_of[r.file] for r in slow_reports], settings))
        weights.append(sum(r.num_good for r in slow_reports))
    if not parts:
        raise DataError("no readable records are left after skipping bad input; see the warnings above.")
    if len(parts) == 1:
        return parts[0]
    if not settings.shuffle_files:
        return parts[0].concatenate(parts[1])
    total = float(sum(weights)) or 1.0
    return tf.data.Dataset.sample_from_datasets(
        parts, weights=[w / total for w in weights], seed=file_seed, stop_on_empty_dataset=False)


def _triage(files, reports) -> tuple:
    """`(fast_files, bad_indices_of_each, slow_reports)`: which files TensorFlow reads, which Python salvages."""
    by_file = {r.file: r for r in reports}
    fast_files, fast_bad, slow_reports = [], [], []
    for f in files:
        report: FileReport | None = by_file.get(f)
        if report is None or not report.problems:
            fast_files.append(f)
            fast_bad.append([])
        elif report.unreadable:
            continue  # missing, not TFRecord, wrong compression: reported, nothing to read
        elif report.framing_damaged:
            slow_reports.append(report)  # TensorFlow's reader stops at the damage; read in Python
        else:
            fast_files.append(f)
            fast_bad.append(sorted(report.bad_indices))
    return fast_files, fast_bad, slow_reports


def _interleaved_records(files, indices, bad, comps, settings: PipelineSettings, file_seed, promised=None):
    """`(record id, record)` of `files` (the worker's files number `indices`) read by TensorFlow in
    parallel, leaving out the `bad` record indices of each; with `promised` (records per file), each
    file's records padded to that count with its error."""
    import tensorflow as tf

    any_bad = any(bad)
    file_ds = tf.data.Dataset.from_tensor_slices((
        tf.constant(files),
        tf.constant(indices, dtype=tf.int64) * RECORD_ID_STRIDE,
        tf.constant([comps.get(f) or "" for f in files]),
        tf.ragged.constant(bad, dtype=tf.int64, ragged_rank=1) if any_bad else tf.zeros([len(files)]),
        tf.constant(promised or [0] * len(files), dtype=tf.int64),
    ))
    if settings.shuffle_files and len(files) > 1:
        file_ds = file_ds.shuffle(len(files), seed=file_seed, reshuffle_each_iteration=True)

    def read_file(path, first_id, comp, bad, count):
        records = tf.data.TFRecordDataset(path, compression_type=comp, buffer_size=settings.read_buffer_bytes)
        if promised is not None:
            return _counted_records(path, records, first_id, count, settings.read_block)
        ids_and_records = records.enumerate(start=first_id)
        if any_bad:
            ids_and_records = ids_and_records.filter(
                lambda i, r: tf.logical_not(tf.reduce_any(tf.equal(i - first_id, bad))))
        return ids_and_records.batch(settings.read_block) if settings.read_block > 1 else ids_and_records

    return file_ds.interleave(
        read_file, cycle_length=settings.cycle_length, block_length=1,
        num_parallel_calls=_tune(settings.num_parallel_reads), deterministic=settings.deterministic)


def _counted_records(path, records, first_id, count, read_block: int):
    """`(record id, record)` of one file's `records`, exactly `count` of them: a file read short is padded
    with records carrying its error (see `SHORT_FILE_MARK`), in blocks of `read_block`."""
    import tensorflow as tf

    # TensorFlow's error for a damaged record (a CRC mismatch, a truncated
    # record or GZIP stream) names no file; ending the file's records there
    # instead lets the count check raise an error that does. TFRecordDataset
    # moves past the file after a read error, but retries a failed open,
    # which ignore_errors() would repeat forever: reading the file's first
    # byte, unguarded, fails there instead, named by TensorFlow.
    opened = tf.data.FixedLengthRecordDataset(path, 1, buffer_size=1).take(1).filter(lambda _: False)
    message = _short_file_message(path, count)
    padding = tf.data.Dataset.range(count).map(
        lambda k: tf.strings.join([SHORT_FILE_MARK, tf.strings.as_string(k), ":", message]))
    counted = opened.concatenate(records.ignore_errors()).concatenate(padding).take(count)
    # Exactly `count` records: their ids are a range, paired block by block (cheaper than one by one).
    ids = tf.data.Dataset.range(first_id, first_id + count)
    if read_block > 1:
        return tf.data.Dataset.zip(ids.batch(read_block), counted.batch(read_block))
    return tf.data.Dataset.zip(ids, counted)


def _salvaged_records(reports, indices, settings: PipelineSettings):
    """`(record id, record)` of the good records of files whose framing is damaged (the worker's files
    number `indices`), read in Python up to and around the damage."""
    import tensorflow as tf

    def salvage():
        for report, file_index in zip(reports, indices, strict=True):
            for record_index, payload in good_records(report):
                yield file_index * RECORD_ID_STRIDE + record_index, payload

    salvaged = tf.data.Dataset.from_generator(
        salvage, output_signature=(tf.TensorSpec((), tf.int64), tf.TensorSpec((), tf.string)))
    return salvaged.batch(settings.read_block) if settings.read_block > 1 else salvaged


def dataset_info(dataset_or_path: Any, *, batch_size: int = 1, **kwargs) -> DatasetInfo:
    """The `DatasetInfo` of a dataset built by kerasfast, or of a path.

    Args:
        dataset_or_path: a dataset returned by `tfrecord_dataset` /
            `array_dataset`, or anything `tfrecord_dataset` accepts as a path.
        batch_size: batch size to compute `steps_per_epoch` for a path.
        **kwargs: further `tfrecord_dataset` arguments for a path.

    Returns:
        A `DatasetInfo` (for arrays: an `ArrayDatasetInfo`).

    Example:

    >>> info = kerasfast.data.dataset_info("data/train", batch_size=128)  # doctest: +SKIP
    >>> info.num_records, info.steps_per_epoch, info.label                 # doctest: +SKIP
    """
    info = getattr(dataset_or_path, "kerasfast_info", None)
    if info is not None:
        return info
    if hasattr(dataset_or_path, "element_spec"):
        raise DataError("this tf.data.Dataset was not built by kerasfast.data (or was transformed after), so its "
                        "size and structure are unknown; pass the path instead.")
    kwargs.setdefault("validate", "none")
    return tfrecord_dataset(dataset_or_path, batch_size=batch_size, **kwargs).kerasfast_info


def explain_data_error(error: BaseException, dataset_or_info: Any) -> DataError:
    """Finds the file and record behind an error raised while iterating a dataset.

    Use it around a training loop:
    `except tf.errors.OpError as e: raise explain_data_error(e, ds) from e`.

    Args:
        error: the exception raised by TensorFlow.
        dataset_or_info: the dataset from `tfrecord_dataset`, or its `DatasetInfo`.

    Returns:
        A `DataError` naming file(s), record index(es) and what to do.
    """
    info = dataset_or_info if isinstance(dataset_or_info, DatasetInfo) else dataset_info(dataset_or_info)
    comp = info.settings.compression
    expected = "auto" if comp is None or "/" in comp else comp
    decoder = make_checked_decoder(info.schema)
    reports = [check_file(f, info.schema, expected, info.expected.get(os.path.abspath(f)), decoder)
               for f in info.files]
    report = ValidationReport(reports, info.schema_path)
    if report.ok:
        return no_damage_error(info.files, error)
    return DataError(report.summary() + f"\n(TensorFlow said: {tf_error_text(error)}) Fix the files, or read with "
                     f"on_error='skip' to use the good records.")
