"""Everything `write_tfrecords` can convert, turned into one stream of records.

Each source yields `(location, record)` pairs, where `location` says where the
record came from in words a user recognises ("row 17", "train.csv line 18",
"images/cat/003.png") and `record` is a `{feature name: value}` dict, or a
`BadRecord` when the source itself found the record unusable (an image that
does not decode, a CSV cell that is not a number). Sources stream: at most one
chunk (about a thousand records) is held in memory, except for in-memory
arrays and DataFrames, which the caller already holds.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import dataclasses
import difflib
import glob
import itertools
import os
import sys
import warnings
from typing import Any, Iterable, Mapping

import numpy as np

from kerasfast.data.messages import tf_error_text
from kerasfast.data.schema import SCHEMA_FILENAME
from kerasfast.errors import DataError

CHUNK_RECORDS = 1024
# A folder holding one of these is a dataset `write_tfrecords` wrote (or is writing), never an image class.
DATASET_MARKERS = (SCHEMA_FILENAME, SCHEMA_FILENAME + ".pending")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
TEXT_SUFFIXES = (".txt", ".text", ".md")
PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_SUFFIXES = (".csv", ".tsv")
SOURCE_TYPES = ("arrays", "dataframe", "parquet", "csv", "images", "text", "records")
AUTO = "auto"
LABEL_IF_PRESENT = "<'label' if the records have it>"


@dataclasses.dataclass(frozen=True)
class EncodedImage:
    """An already encoded image (kept as its file bytes) and the shape it is read back as."""

    data: bytes
    format: str  # "png" or "jpeg"
    shape: tuple


@dataclasses.dataclass(frozen=True)
class BadRecord:
    """A record the source could not turn into features, and why."""

    reason: str


@dataclasses.dataclass
class Source:
    """A stream of records plus what is known about it before reading it."""

    description: str
    records: Any  # a callable returning Iterator[(location, record | BadRecord)]
    num_records: int | None = None
    estimated_bytes: int | None = None
    label: str | None = None
    classes: list | None = None
    shuffled: bool = False  # records come out in random order
    notes: list = dataclasses.field(default_factory=list)


# ---------------------------------------------------------------------------
# detection
# ---------------------------------------------------------------------------

def open_source(
    source: Any,
    *,
    label: Any = AUTO,
    shuffle: bool = True,
    seed: int = 0,
    source_type: str | None = None,
    text_unit: str = "line",
    csv_dtypes: Mapping[str, str] | None = None,
    out_dir: str | os.PathLike | None = None,
) -> Source:
    """Recognises `source` and returns it as a `Source` (see module docstring).

    `out_dir`, where the records are written, is never read as part of the source (an image folder's
    class, say, when the dataset is written inside the folder it converts)."""
    if source_type is not None and source_type not in SOURCE_TYPES:
        raise DataError(f"source_type={source_type!r} is not one of {SOURCE_TYPES}.")
    kind = source_type or _detect_kind(source)
    if kind == "arrays":
        src = _arrays_source(source, shuffle=shuffle, seed=seed)
    elif kind == "dataframe":
        src = _dataframe_source(source, shuffle=shuffle, seed=seed)
    elif kind == "parquet":
        src = _parquet_source(_expand_files(source, PARQUET_SUFFIXES, "Parquet"))
    elif kind == "csv":
        src = _csv_source(_expand_files(source, CSV_SUFFIXES, "CSV"), csv_dtypes or {})
    elif kind == "images":
        if not isinstance(source, (str, os.PathLike)) or not os.path.isdir(source):
            shown = os.fspath(source) if isinstance(source, (str, os.PathLike)) else f"a {type(source).__name__}"
            raise DataError(f"source_type='images' reads a folder with one sub-folder of images per class "
                            f"(<folder>/<class name>/<image>.png); {shown} is not a folder.")
        src = _image_folder_source(os.fspath(source), shuffle=shuffle, seed=seed, out_dir=out_dir)
    elif kind == "text":
        src = _text_source(_expand_files(source, TEXT_SUFFIXES, "text"), text_unit)
    else:
        src = _records_source(source)
    if label != AUTO:
        src.label = label
    return src


def _detect_kind(source: Any) -> str:
    if isinstance(source, Mapping):
        return "arrays"
    if isinstance(source, (list, tuple)) and source and all(isinstance(p, (str, os.PathLike)) for p in source):
        return _kind_of_files([os.fspath(p) for p in source], f"the list of {len(source)} files")
    # (x,), (x, y) or (inputs_dict, y); a tuple ending in a dict is a sequence of records.
    if isinstance(source, tuple) and 1 <= len(source) <= 2 and not isinstance(source[-1], Mapping):
        return "arrays"
    if isinstance(source, tuple) and not any(isinstance(part, (Mapping, str, os.PathLike)) for part in source):
        raise DataError(
            f"a tuple of {len(source)} arrays: write_tfrecords takes (x,), (x, y) or a dict of named arrays "
            "(e.g. {'x': x, 'y': y, 'weight': w}, with label='y'); Keras's (x, y, sample_weight) has no place "
            "for the weights in (x, y) records.")
    if type(source).__module__.split(".")[0] == "pandas" and hasattr(source, "columns"):
        return "dataframe"
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if glob.has_magic(path):
            files = sorted(glob.glob(path))
            if not files:
                raise DataError(f"the pattern {path!r} matches no files (working directory {os.getcwd()}); "
                                f"check the path.")
            return _kind_of_files(files, path)
        if os.path.isfile(path):
            return _kind_of_files([path], path)
        if os.path.isdir(path):
            entries = sorted(os.scandir(path), key=lambda e: e.name)
            subdirs = [e.path for e in entries if e.is_dir() and not e.name.startswith(".")]
            if any(_has_files(d, IMAGE_SUFFIXES) for d in subdirs):
                return "images"
            files = [e.path for e in entries if e.is_file()]
            if not files:
                raise DataError(f"{path} is an empty folder; nothing to convert.")
            return _kind_of_files(files, path, directory=True)
        raise DataError(f"{path} does not exist; check the path (working directory {os.getcwd()}).")
    if isinstance(source, Iterable) and not isinstance(source, (bytes, np.ndarray)):
        return "records"
    raise DataError(
        f"cannot convert a {type(source).__name__}: pass a dict or (x, y) tuple of NumPy arrays, a pandas "
        f"DataFrame, a Parquet/CSV/text file, folder or glob, an image folder (one sub-folder per class), "
        f"or an iterable of dicts."
    )


def _has_files(folder: str, suffixes) -> bool:
    for _, _, names in os.walk(folder):
        if any(n.lower().endswith(suffixes) for n in names):
            return True
    return False


def _kind_of_files(files, shown, directory=False) -> str:
    kinds = set()
    for f in files:
        low = f.lower()
        if low.endswith(PARQUET_SUFFIXES):
            kinds.add("parquet")
        elif low.endswith(CSV_SUFFIXES):
            kinds.add("csv")
        elif low.endswith(TEXT_SUFFIXES):
            kinds.add("text")
        elif not directory:
            kinds.add("unknown")
    if len(kinds) != 1 or "unknown" in kinds:
        raise DataError(
            f"cannot tell what {shown} holds (file kinds found: {sorted(kinds) or 'none'}); use files ending "
            f"in .parquet, .csv/.tsv or .txt (one kind at a time), or pass source_type= (kerasfast convert: --source-type)."
        )
    return kinds.pop()


def _expand_files(source: Any, suffixes, what: str) -> list:
    path = os.fspath(source) if isinstance(source, (str, os.PathLike)) else None
    if path is None:
        files = [os.fspath(p) for p in source]
    elif glob.has_magic(path):
        files = sorted(glob.glob(path))
    elif os.path.isdir(path):
        files = sorted(
            os.path.join(root, n) for root, _, names in os.walk(path) for n in names if n.lower().endswith(suffixes)
        )
    else:
        files = [path]
    if not files:
        raise DataError(f"no {what} files found at {source!r}; check the path or pattern.")
    for f in files:
        if not os.path.isfile(f):
            raise DataError(f"{what} file {f} not found; check the path (working directory {os.getcwd()}).")
    return files


# ---------------------------------------------------------------------------
# in-memory sources
# ---------------------------------------------------------------------------

def _arrays_source(source, *, shuffle, seed) -> Source:
    if isinstance(source, Mapping):
        columns, label = dict(source), ("label" if "label" in source else None)
    else:
        x = source[0]
        columns = dict(x) if isinstance(x, Mapping) else {"x": x}
        label = None
        if len(source) == 2 and source[1] is not None:
            if "y" in columns:
                raise DataError("the inputs dict already has a key 'y'; pass a single dict with a 'label' key instead.")
            columns["y"], label = source[1], "y"
    _refuse_name_clashes(list(columns), "the keys", "rename the keys so that each array has its own name")
    columns = {str(k): _as_array(str(k), v, DataError) for k, v in columns.items()}
    lengths = {k: (len(v) if v.ndim else None) for k, v in columns.items()}
    scalars = [k for k, n in lengths.items() if n is None]
    if scalars:
        raise DataError(f"{scalars[0]!r} is a single value (0-d), not one entry per record: pass an array whose "
                        f"first dimension runs over the records (e.g. np.full(n, value) or value[None]).")
    if len(set(lengths.values())) != 1:
        raise DataError(f"all arrays need the same first dimension (one entry per record), got lengths {lengths}.")
    n = next(iter(lengths.values()))

    def records():
        order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
        for start in range(0, n, CHUNK_RECORDS):
            idx = order[start:start + CHUNK_RECORDS]
            chunk = {k: v[idx] for k, v in columns.items()}
            for j, i in enumerate(idx):
                yield f"row {i}", {k: c[j] for k, c in chunk.items()}

    nbytes = sum(v.nbytes for v in columns.values())
    return Source(f"{n} records of NumPy arrays {sorted(columns)}", records, n, nbytes, label, shuffled=shuffle)


def _as_array(name, value, error, location: str = "") -> np.ndarray:
    """`value` as a NumPy array; a nested list of uneven lengths (ragged) is refused naming the feature.

    Used for a dict's columns here and for each record's values by the writer."""
    try:
        return np.asarray(value)
    except ValueError as exc:
        where = f"{location}: " if location else ""
        raise error(f"{where}feature {name!r} is not a rectangular array ({exc}); every record's feature needs "
                    "one fixed shape: pad the lists to one length") from None


def _dataframe_source(df, *, shuffle, seed) -> Source:
    n = len(df)
    _refuse_name_clashes(list(df.columns), "the DataFrame's columns",
                         "rename them so that each column has its own name (df.columns = [...])")
    columns = [str(c) for c in df.columns]
    label = "label" if "label" in columns else None
    # Each column's NumPy dtype is decided here, once for the whole frame: pandas converts a nullable column
    # (Int64, boolean, Float64) to float64 or object only where a chunk holds <NA>, which would change the
    # feature's dtype from one chunk to the next (and round int64 ids beyond 2**53 on the way).
    conversions = {column: _column_conversion(df.iloc[:, position]) for position, column in enumerate(columns)}

    def records():
        order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
        for start in range(0, n, CHUNK_RECORDS):
            idx = order[start:start + CHUNK_RECORDS]
            part = df.iloc[idx]
            cols, missing = {}, {}
            for position, column in enumerate(columns):
                values = part.iloc[:, position]
                conversion = conversions[column]
                if conversion is None:
                    cols[column] = values.to_numpy()
                    continue
                cols[column] = conversion.to_numpy(values)
                if conversion.kind is not None:
                    missing[column] = (values.isna().to_numpy(), values)
            for j, i in enumerate(idx):
                absent = [c for c, (mask, _) in missing.items() if mask[j]]
                if absent:
                    yield f"row {i}", BadRecord(" and ".join(
                        conversions[c].refusal(c, missing[c][1].iloc[j]) for c in absent))
                    continue
                yield f"row {i}", {c: v[j] for c, v in cols.items()}

    nbytes = int(df.memory_usage(deep=False).sum())
    return Source(f"pandas DataFrame of {n} rows, columns {columns}", records, n, nbytes, label, shuffled=shuffle)


@dataclasses.dataclass(frozen=True)
class _ColumnConversion:
    """How a DataFrame column becomes NumPy, alike in every chunk: `to_numpy`'s `dtype` and `na_value` (None:
    the column's own); `kind`, the NumPy kind of its values ("i", "u", "b", "U" or "S") where a row with a
    missing value is refused, None where NaN stands for one; `column_type`, the pandas dtype the refusal names."""

    dtype: np.dtype | None
    na_value: Any
    kind: str | None
    column_type: str = ""

    def to_numpy(self, values) -> np.ndarray:
        if self.dtype is None:
            return values.to_numpy()
        return values.to_numpy(dtype=self.dtype, na_value=self.na_value)

    def refusal(self, name: str, value) -> str:
        """Why a row whose value in this column, `name`, is the missing `value` (<NA>, None, NaN) is refused."""
        shown = "NaN" if isinstance(value, (float, np.floating)) else str(value)
        return _missing_value_reason(name, shown, self.kind, self.column_type, pandas=True)


def _column_conversion(column) -> _ColumnConversion | None:
    """The conversion of DataFrame column `column` (a Series), or None for one that `to_numpy` converts alike
    in every chunk and that has no missing value the writer would misread (a NumPy dtype, a float column)."""
    import pandas as pd

    dtype = column.dtype
    numpy_dtype = getattr(dtype, "numpy_dtype", None)
    if numpy_dtype is not None and type(dtype).__module__.split(".")[0] == "pandas":
        # A nullable column (Int64, boolean, Float64, ...).
        numpy_dtype = np.dtype(numpy_dtype)
        if numpy_dtype.kind == "f":
            return _ColumnConversion(numpy_dtype, np.nan, None)
        if numpy_dtype.kind in "iub":
            # The value stored for <NA> is never written: the row is refused (or skipped) instead.
            return _ColumnConversion(numpy_dtype, False if numpy_dtype.kind == "b" else 0, numpy_dtype.kind,
                                     str(dtype))
    # Text (object in pandas 2, str or string in pandas 3, categories of strings, pyarrow strings): `to_numpy`
    # keeps a missing value as None, NaN or <NA>, which the writer would take for a value of another type.
    if dtype.kind not in "OSU" or not column.hasnans:
        return None
    values = dtype.categories if isinstance(dtype, pd.CategoricalDtype) else column
    kind = {"string": "U", "bytes": "S"}.get(pd.api.types.infer_dtype(values, skipna=True))
    return None if kind is None else _ColumnConversion(None, None, kind, str(dtype))


def _missing_value_reason(name: str, shown: str, kind: str, column_type, *, pandas: bool) -> str:
    """Why a row with a missing value (`shown` as <NA>, null, None or NaN) in column `name` is refused, with the
    fix that fits the column: `kind` is the NumPy kind of its values ("i" or "u" integers, "b" booleans, "U"
    strings, "S" bytes), `column_type` its type as its library names it; `pandas`: a DataFrame's column (else a
    Parquet file's). The one wording of DataFrame and Parquet nulls."""
    via = "" if pandas else "pandas: "
    if kind in ("i", "u", "b"):
        what = "a boolean" if kind == "b" else "an integer"
        fix = (f"fill the missing values ({via}df[{name!r}].fillna(...)) or give the column a float dtype "
               f"(df[{name!r}].astype('float64')), where a missing value becomes NaN")
    else:
        what, empty = ("a string", "''") if kind == "U" else ("a binary", "b''")
        # A categorical column takes only its categories: the empty value must become one first.
        categories = f".cat.add_categories({empty})" if str(column_type) == "category" else ""
        fix = f"fill the missing values, e.g. with an empty value ({via}df[{name!r}]{categories}.fillna({empty}))"
    return f"has a missing value ({shown}) in column {name!r}, {what} column ({column_type}) that cannot hold one: {fix}"


def _refuse_name_clashes(keys: list, what: str, fix: str) -> None:
    """Refuses keys that would share a feature name: feature names are strings, so 0 and "0" (or a pandas
    column name used twice) would end up as one feature, merged or with one of them lost."""
    by_name: dict = {}
    for position, key in enumerate(keys):
        by_name.setdefault(str(key), []).append((position, key))
    for name, found in by_name.items():
        if len(found) > 1:
            listed = " and ".join(f"{key!r} (position {position})" for position, key in found)
            raise DataError(f"{what} {listed} {'both' if len(found) == 2 else 'all'} become the feature name "
                            f"{name!r} (feature names are strings), so one would be lost or merged into another; "
                            f"{fix}.")


def _records_source(iterable) -> Source:
    def records():
        for i, rec in enumerate(iterable):
            if not isinstance(rec, Mapping):
                raise DataError(f"record {i} of the iterable is a {type(rec).__name__}, not a dict of features.")
            yield f"record {i}", rec

    n = len(iterable) if hasattr(iterable, "__len__") else None
    # The keys are known only once the first record is read: the writer resolves this.
    return Source("an iterable of dicts", records, n, None, LABEL_IF_PRESENT)


# ---------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------

def _parquet_source(files) -> Source:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise DataError("reading Parquet needs pyarrow: pip install 'pyarrow>=14'.") from exc

    num_rows = nbytes = 0
    columns = None
    for f in files:
        try:
            meta = pq.ParquetFile(f).metadata
        except Exception as exc:  # pyarrow raises ArrowInvalid and friends
            raise DataError(f"{f} is not a readable Parquet file ({exc}).") from exc
        num_rows += meta.num_rows
        nbytes += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        names = meta.schema.to_arrow_schema().names
        if columns is None:
            columns = names
        elif names != columns:
            raise DataError(f"{f} has columns {names}, but {files[0]} has {columns}; convert them separately.")

    def records():
        for f in files:
            row = 0
            for batch in pq.ParquetFile(f).iter_batches(batch_size=CHUNK_RECORDS):
                cols = {name: _arrow_values(batch.column(i), f, name, row) for i, name in enumerate(batch.schema.names)}
                for j in range(batch.num_rows):
                    record = {k: v[j] for k, v in cols.items()}
                    bad = next((v for v in record.values() if isinstance(v, BadRecord)), None)
                    yield f"{f} row {row + j}", bad or record
                row += batch.num_rows

    label = "label" if columns and "label" in columns else None
    return Source(f"{len(files)} Parquet file(s), {num_rows} rows", records, num_rows, nbytes, label)


def _arrow_values(column, f, name, row0):
    """The values of one column of a Parquet record batch (rows from `row0` of file `f`), one per row: a
    null that the column's type has no value for is a `BadRecord` for its row (a null float is NaN)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):
        # What pandas writes for a categorical column: the values, stored once, and an index per row.
        column = column.dictionary_decode()
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind) or pa.types.is_large_list(kind):
        return _arrow_list_values(column, name)
    if pa.types.is_floating(kind):
        return column.to_numpy(zero_copy_only=False)
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        if not column.null_count:
            return column.to_numpy(zero_copy_only=False)
        # The value filled in is never written: its row is refused (or skipped) instead.
        values = pc.fill_null(column, pa.scalar(False if pa.types.is_boolean(kind) else 0, kind))
        return _with_null_rows(column, list(values.to_numpy(zero_copy_only=False)), _null_reason(name, kind))
    if (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)):
        return _with_null_rows(column, column.to_pylist(), _null_reason(name, kind))
    raise DataError(f"{f}: column {name!r} has type {column.type}, which cannot be stored; "
                    f"convert it to numbers, strings or lists of numbers.")


def _with_null_rows(column, values: list, reason: str) -> list:
    """`values`, one per row of `column`, with a `BadRecord` for `reason` in place of each null."""
    if not column.null_count:
        return values
    bad = BadRecord(reason)
    return [bad if missing else v for v, missing in zip(values, column.is_null().to_pylist(), strict=True)]


def _null_reason(name: str, kind) -> str:
    """Why a row holding a null in column `name` (of pyarrow type `kind`) is refused, with the fix that fits
    the type."""
    import pyarrow as pa

    if pa.types.is_boolean(kind) or pa.types.is_integer(kind):
        numpy_kind = "b" if pa.types.is_boolean(kind) else "i"
    else:
        numpy_kind = "U" if pa.types.is_string(kind) or pa.types.is_large_string(kind) else "S"
    return _missing_value_reason(name, "null", numpy_kind, kind, pandas=False)


def _arrow_list_values(column, name: str) -> list:
    """Each list of a pyarrow list column as an array, or a `BadRecord` for a missing (null) list, or a
    list holding a null that its value type has no value for (a null becomes NaN in a float list, as a
    null float cell does)."""
    value_type = np.dtype(column.type.value_type.to_pandas_dtype())
    floats = value_type.kind == "f"
    missing_list = BadRecord(
        f"has a missing value (null) in column {name!r} where a list belongs: fill it with a list as long as "
        f"the others" + (" (of NaN, for missing values)" if floats else ""))

    def value(v):
        if v is None:
            return missing_list
        if floats or None not in v:
            return np.asarray(v, dtype=value_type)
        return BadRecord(
            f"has a missing value (null) at position {v.index(None)} of the list in column {name!r}, whose "
            f"{column.type.value_type} values cannot hold one; fill it, or store the column as a list of "
            f"floats, where a missing value becomes NaN")

    return [value(v) for v in column.to_pylist()]


def _parse_int(text):
    return np.int64(int(text))


FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).smallest_subnormal)


def _parse_float(text):
    if not text.strip():
        return np.float32("nan")
    value = float(text)
    # NumPy turns a finite value beyond float32's range into inf with only a RuntimeWarning.
    if abs(value) > FLOAT32_MAX and np.isfinite(value):
        with np.errstate(over="ignore"):
            if np.isinf(np.float32(value)):
                raise OverflowError(f"{text} is beyond float32's range (largest {FLOAT32_MAX:.4g})")
    stored = np.float32(value)
    if value != 0 and stored == 0:  # too small for float32, even as a subnormal
        raise OverflowError(f"{text} is below float32's smallest magnitude ({FLOAT32_TINY:.4g}) and would be stored "
                            "as 0")
    return stored


def _parse_float64(text):
    return np.float64(float(text)) if text.strip() else np.float64("nan")


CSV_PARSERS = {
    "int64": _parse_int,
    "float32": _parse_float,
    "float64": _parse_float64,
    "string": lambda text: text,
}


def _infer_csv_type(values) -> str:
    def all_parse(fn, values):
        for v in values:
            try:
                fn(v)
            except (ValueError, OverflowError):
                return False
        return True

    non_empty = [v for v in values if v.strip()]
    # An empty cell does not make a column of whole numbers float: float32 would round values beyond 2**24
    # (ids, labels) without a word. Such a cell is refused where it is met, naming csv_dtypes instead.
    if non_empty and all_parse(int, non_empty):
        return "int64"
    if non_empty and all(_is_float(v) for v in non_empty):
        return "float32"
    return "string"


def _is_float(text) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _csv_source(files, csv_dtypes) -> Source:
    for name, dtype in csv_dtypes.items():
        if dtype not in CSV_PARSERS:
            raise DataError(f"csv_dtypes[{name!r}]={dtype!r} (kerasfast convert: --csv-dtype {name}={dtype}): use "
                            f"one of {sorted(CSV_PARSERS)}.")

    # Column types come from the first rows (or csv_dtypes); the header fixes the names.
    rows = _csv_rows(files[0])
    try:
        header = next(rows, (0, None))[1]
        if not header:
            raise DataError(f"{files[0]} is empty; a CSV file needs a header row with the column names.")
        # Blank lines are no rows (as for csv.DictReader): one left at the end of a file would otherwise be
        # sampled as a row of empty cells and turn every int64 column into float32.
        sample = [row for _, row in itertools.islice((r for r in rows if r[1]), CHUNK_RECORDS)]
    finally:
        rows.close()
    if not sample:
        raise DataError(f"{files[0]} has a header but no rows; nothing to convert.")
    _check_csv_header(files[0], header, csv_dtypes)
    # A row with another number of fields is a bad record when written; its cells are not steered by the
    # header's columns, so they must not steer the columns' types either.
    sample = [row for row in sample if len(row) == len(header)]
    types = {}
    for c, name in enumerate(header):
        types[name] = csv_dtypes.get(name) or _infer_csv_type([row[c] for row in sample])
    parsers = [CSV_PARSERS[types[name]] for name in header]

    def records():
        for f in files:
            rows = _csv_rows(f)
            with contextlib.closing(rows):
                this_header = next(rows, (0, None))[1]
                if this_header != header:
                    raise DataError(f"{f} has header {this_header}, but {files[0]} has {header}; "
                                    f"convert files with different columns separately.")
                for line, row in rows:
                    if row:
                        yield f"{f} line {line}", _csv_record(header, parsers, types, csv_dtypes, row)

    nbytes = sum(os.path.getsize(f) for f in files)
    label = "label" if "label" in header else None
    src = Source(f"{len(files)} CSV file(s), columns {header}", records, None, nbytes, label)
    src.notes.append("column types: " + ", ".join(f"{k}={v}" for k, v in types.items()))
    with open(files[0], newline="", encoding="utf-8-sig") as fh:
        delimiter = _csv_delimiter(files[0], fh)
    if delimiter != ("\t" if files[0].lower().endswith(".tsv") else ","):
        src.notes.append(f"delimiter {delimiter!r}, found in the header of {files[0]}")
    return src


def _csv_rows(path):
    """Yields `(line number, row)` of a CSV (or, by its suffix, TSV) file, its header first.

    The encoding is UTF-8, with the byte-order mark Excel writes ("CSV UTF-8") dropped, which would
    otherwise become part of the first column's name.
    """
    _allow_long_csv_fields()
    with open(path, newline="", encoding="utf-8-sig") as fh:
        try:
            reader = csv.reader(fh, delimiter=_csv_delimiter(path, fh))
            for row in reader:
                yield reader.line_num, row
        except UnicodeDecodeError as exc:
            raise _not_utf8_error(path, exc) from exc
        except csv.Error as exc:
            raise DataError(f"{path} line {reader.line_num} cannot be read as CSV ({exc}); fix that line.") from exc


CSV_DELIMITERS = ",;\t|"


def _csv_delimiter(path, fh) -> str:
    """The delimiter of the CSV file open as `fh` (left at its start): a tab for .tsv; else a comma, unless
    the header holds no comma and csv.Sniffer finds one of ';', tab or '|' in it (Excel writes ';' where
    the comma is the decimal mark), which would otherwise be read as a single column without a word."""
    if path.lower().endswith(".tsv"):
        return "\t"
    header = fh.readline()
    fh.seek(0)
    if "," in header or not any(d in header for d in CSV_DELIMITERS[1:]):
        return ","
    try:
        return csv.Sniffer().sniff(header, delimiters=CSV_DELIMITERS[1:]).delimiter
    except csv.Error:
        return ","


def _allow_long_csv_fields() -> None:
    """Lifts Python's csv field limit (131,072 characters), which refuses valid files with long text cells
    (a document per row). A runaway quote then makes one long field, a bad record by its field count."""
    limit = sys.maxsize
    while csv.field_size_limit() < limit:
        try:
            csv.field_size_limit(limit)
        except OverflowError:  # a C long is 32 bits on Windows
            limit //= 2


def _not_utf8_error(path, exc: UnicodeDecodeError) -> DataError:
    """Names the first byte of `path` that is not UTF-8: the decoder's own position counts from the
    start of the chunk it was decoding, not from the start of the file."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    where, byte, line, start = f"a byte ({exc.reason})", exc.object[exc.start], 1, 0
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            data = decoder.getstate()[0] + chunk  # an unfinished character from the chunk before comes first
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as err:
                byte, line = data[err.start], line + data[:err.start].count(b"\n")
                where = f"byte {start + len(chunk) - len(data) + err.start} (line {line})"
                break
            line += chunk.count(b"\n")
            start += len(chunk)
    with open(path, "rb") as fh:
        utf16 = fh.read(2) in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
    suffix = os.path.splitext(path)[1]
    if utf16:
        return DataError(
            f"{path} is not UTF-8 text: it is UTF-16 (it starts with UTF-16's byte-order mark, 0x{byte:02x} at byte "
            f"0, which UTF-8 cannot decode); re-save it as UTF-8, e.g. iconv -f utf-16 -t utf-8 {path} > "
            f"utf8{suffix}.")
    excel = " (in Excel: 'CSV UTF-8')" if suffix.lower() in CSV_SUFFIXES else ""
    return DataError(
        f"{path} is not UTF-8 text: {where} is 0x{byte:02x}, which UTF-8 cannot decode (the file was likely "
        f"saved as Latin-1 or Windows-1252); re-save it as UTF-8{excel}, e.g. "
        f"iconv -f cp1252 -t utf-8 {path} > utf8{suffix}.")


def _checked_text(path, data: bytes, start: int, line: int) -> bytes:
    """`data` (the text of `path` from byte `start`, line `line`) if it is UTF-8 without NUL bytes. Text
    records are stored as bytes, but a corpus in another encoding (UTF-16 above all, whose every other
    byte is 0 for Latin letters, and whose line breaks are two bytes) would become garbage records."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _not_utf8_error(path, exc) from exc
    nul = data.find(b"\x00")
    if nul >= 0:
        line += data[:nul].count(b"\n")
        raise DataError(
            f"{path} is not UTF-8 text: byte {start + nul} (line {line}) is 0x00 (NUL), "
            f"which text does not hold: the file is likely UTF-16 without a byte-order mark; re-save it as UTF-8, "
            f"e.g. iconv -f utf-16le -t utf-8 {path} > utf8{os.path.splitext(path)[1]}.")
    return data


def _check_csv_header(path, header, csv_dtypes) -> None:
    """Refuses a column without a name, a name used twice (one column would replace the other) and
    csv_dtypes naming no column (a misspelt name would leave the column to inference without a word)."""
    seen: dict = {}
    for position, name in enumerate(header, start=1):
        if not name.strip():
            raise DataError(f"{path}'s header leaves column {position} (counting from 1) without a name, which "
                            f"would become a feature named {name!r}; name it in the header, or drop the column (a DataFrame's "
                            "index, which df.to_csv() writes unnamed: write it with index=False).")
        if name in seen:
            raise DataError(f"{path} has two columns named {name!r} (columns {seen[name]} and {position}, "
                            f"counting from 1), which would become one feature; rename one of them in the header.")
        seen[name] = position
    unknown = [name for name in csv_dtypes if name not in seen]
    if unknown:
        hints = {name: difflib.get_close_matches(name, header, n=1) for name in unknown}
        hint = "".join(f" ({name!r}: did you mean {close[0]!r}?)" for name, close in hints.items() if close)
        raise DataError(f"csv_dtypes (kerasfast convert: --csv-dtype) names column(s) {unknown} that {path} does "
                        f"not have{hint}; its columns are {header}.")


def _csv_record(header, parsers, types, csv_dtypes, row):
    """The row as a record, or a `BadRecord` naming each column whose value does not fit its type."""
    if len(row) != len(header):
        return BadRecord(f"has {len(row)} fields, the header has {len(header)}")
    try:
        return {name: parse(v) for name, parse, v in zip(header, parsers, row, strict=True)}
    except (ValueError, OverflowError):
        pass
    problems = []
    for name, parse, value in zip(header, parsers, row, strict=True):
        try:
            parse(value)
        except OverflowError:
            wider = "float64" if types[name] == "float32" else "string"
            problems.append(f"{value} in column {name!r}, beyond the range of {types[name]} (pass "
                            f"{_csv_dtype_hint(name, wider)} to keep it)")
        except ValueError:
            how = "given in csv_dtypes" if name in csv_dtypes else "inferred from the first rows"
            if not value.strip():
                problems.append(f"an empty cell in column {name!r}, whose type {types[name]} ({how}) cannot hold "
                                f"a missing value (fill the cell, or pass {_csv_dtype_hint(name, 'float64')} to "
                                f"read the column as float64, where an empty cell becomes NaN)")
                continue
            problems.append(f"{value!r} in column {name!r}, which is not {types[name]} ({how}; pass "
                            f"{_csv_dtype_hint(name, 'string')}, or 'float32', to read the column as that)")
    return BadRecord("has " + " and ".join(problems))


def _csv_dtype_hint(name: str, dtype: str) -> str:
    """How to give column `name` the type `dtype`, in Python and on the command line (CSV errors reach both)."""
    return f"csv_dtypes={{{name!r}: {dtype!r}}} (kerasfast convert: --csv-dtype {name}={dtype})"


def _image_format(data: bytes) -> str | None:
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    return None


# Channels each image is read back with, by the channels it decodes to: Keras's color_mode="rgb" (alpha
# dropped), since TensorFlow cannot decode a JPEG with 4 channels and one RGBA file would otherwise change
# the channels of a whole folder of photos. Grayscale stays 1 channel; a folder mixing grayscale and colour
# is read as RGB (the writer keeps the widest count and the decoder converts).
IMAGE_READ_CHANNELS = {1: 1, 2: 1, 3: 3, 4: 3}


def _image_files(root, classes, skip) -> tuple:
    """`(items, ignored, empty)`: `(path, label)` of each image under the class folders, the count of other
    files, and `(label, class)` of each class folder without images; the folder `skip` is not entered."""
    items, ignored, empty = [], 0, []
    for label, cls in enumerate(classes):
        found = len(items)
        for dirpath, dirnames, names in os.walk(os.path.join(root, cls)):
            dirnames[:] = sorted(d for d in dirnames if os.path.realpath(os.path.join(dirpath, d)) != skip)
            for n in sorted(names):
                if n.lower().endswith(IMAGE_SUFFIXES):
                    items.append((os.path.join(dirpath, n), label))
                elif not n.startswith("."):
                    ignored += 1
        if len(items) == found:
            empty.append((label, cls))
    return items, ignored, empty


def _image_folder_source(root, *, shuffle, seed, out_dir=None) -> Source:
    # A dataset written inside the folder it converts would be read back as a class on the next run,
    # shifting every label after it.
    skip = os.path.realpath(out_dir) if out_dir is not None else None
    folders = sorted((e for e in os.scandir(root)
                      if e.is_dir() and not e.name.startswith(".") and os.path.realpath(e.path) != skip),
                     key=lambda e: e.name)
    # So is a dataset written there earlier into another folder: it holds no images, only TFRecords.
    datasets = [e.path for e in folders if any(os.path.exists(os.path.join(e.path, n)) for n in DATASET_MARKERS)]
    classes = [e.name for e in folders if e.path not in datasets]
    items, ignored, empty = _image_files(root, classes, skip)
    if not items:
        raise DataError(f"no PNG/JPEG images found under {root}; expected {root}/<class name>/<image>.png.")
    if shuffle:
        # Files are listed class by class; shuffling them spreads classes over shards and over each shard.
        order = np.random.default_rng(seed).permutation(len(items))
        items = [items[i] for i in order]

    def records():
        import tensorflow as tf

        alpha, first_alpha = 0, None
        for path, label in items:
            with open(path, "rb") as fh:
                data = fh.read()
            fmt = _image_format(data)
            if fmt is None:
                yield path, BadRecord("is not a PNG or JPEG file (by its first bytes)")
                continue
            try:
                height, width, channels = tf.io.decode_image(data, expand_animations=False).shape
            except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as exc:
                yield path, BadRecord(f"cannot be decoded as {fmt.upper()} ({tf_error_text(exc)})")
                continue
            if channels in (2, 4):
                alpha, first_alpha = alpha + 1, first_alpha or path
            shape = (height, width, IMAGE_READ_CHANNELS[channels])
            yield path, {"image": EncodedImage(data, fmt, shape), "label": np.int64(label)}
        if alpha:
            src.notes.append(
                f"{alpha} image(s) with an alpha channel (transparency), first {first_alpha}, are read without it, "
                f"as RGB (or grayscale), as Keras's image_dataset_from_directory does by default")

    nbytes = sum(os.path.getsize(p) for p, _ in items)
    src = Source(f"image folder {root}: {len(items)} images in {len(classes)} classes", records, len(items),
                 nbytes, "label", classes, shuffled=shuffle)
    if ignored:
        src.notes.append(f"{ignored} file(s) that are not .png/.jpg/.jpeg were ignored")
    if datasets:
        src.notes.append(f"{len(datasets)} folder(s) holding a kerasfast dataset ({SCHEMA_FILENAME}) are no class "
                         f"and were not read: {', '.join(datasets)}")
    if empty:
        # Kept as classes, as Keras's image_dataset_from_directory keeps them, so that the labels match
        # Keras's; but a folder that is no class (another dataset, a checkpoint folder) shifts every label
        # after it, so it is named.
        listed = ", ".join(f"{os.path.join(root, cls)} (class {label})" for label, cls in empty)
        note = (f"{len(empty)} class folder(s) hold no PNG/JPEG image: {listed}; they stay classes (with no "
                f"records), so the labels of the classes after them count them: move such a folder out of "
                f"{root} if it is not a class")
        src.notes.append(note)
        warnings.warn(f"{note}.", stacklevel=4)  # the caller of write_tfrecords
    return src


def _text_source(files, text_unit) -> Source:
    if text_unit not in ("line", "file"):
        raise DataError(f"text_unit={text_unit!r}: use 'line' (one record per non-empty line) or 'file'.")

    def records():
        for f in files:
            if text_unit == "file":
                with open(f, "rb") as fh:
                    yield f, {"text": _checked_text(f, fh.read(), 0, 1).removeprefix(codecs.BOM_UTF8)}
                continue
            with open(f, "rb", buffering=1 << 20) as fh:
                start = 0
                for n, line in enumerate(fh, start=1):
                    # A line break is one byte in UTF-8 and never part of a longer character: each line
                    # decodes on its own.
                    _checked_text(f, line, start, n)
                    start += len(line)
                    # An editor's byte-order mark is no text (CSV files drop it too: "utf-8-sig").
                    line = (line.removeprefix(codecs.BOM_UTF8) if n == 1 else line).rstrip(b"\r\n")
                    if line.strip():
                        yield f"{f} line {n}", {"text": line}

    nbytes = sum(os.path.getsize(f) for f in files)
    n = len(files) if text_unit == "file" else None
    return Source(f"text corpus of {len(files)} file(s), one record per {text_unit}", records, n, nbytes, None)
