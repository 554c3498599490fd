"""Turning a path, folder, glob or list into TFRecord files and their schema."""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Any, Mapping, Sequence

from kerasfast.data.schema import SCHEMA_FILENAME, Schema, schema_from_feature_spec
from kerasfast.errors import DataError

TFRECORD_GLOBS = ("*.tfrecord", "*.tfrecord.gz", "*.tfrecord.zlib", "*.tfrecords", "*.tfrec")


@dataclasses.dataclass
class ResolvedFiles:
    """Files to read, the schema that describes them and where it came from."""

    files: list
    schema: Schema
    schema_path: str | None  # None when the schema came from an explicit feature spec
    expected: dict  # file path -> ShardInfo from schema.json (empty without one)


def resolve_files(
    path_or_pattern: Any,
    *,
    features: Schema | Mapping | None = None,
    label: Any = None,
) -> ResolvedFiles:
    """Expands `path_or_pattern` to files and finds their schema.

    Args:
        path_or_pattern: a folder written by `write_tfrecords`, a glob
            pattern, a single file, or a list of files.
        features: an explicit `Schema` or `{name: tf.io.FixedLenFeature}` for
            files without a schema.json beside them.
        label: label name to use with an explicit feature spec.

    Returns:
        A `ResolvedFiles`.
    """
    files = _expand(path_or_pattern)
    if features is not None:
        schema = features if isinstance(features, Schema) else schema_from_feature_spec(features, label=label)
        return ResolvedFiles(files, schema, None, {})

    folders = sorted({os.path.dirname(os.path.abspath(f)) for f in files})
    candidates = [os.path.join(d, SCHEMA_FILENAME) for d in folders]
    found = [c for c in candidates if os.path.exists(c)]
    if not found:
        raise DataError(
            f"no {SCHEMA_FILENAME} beside {_shown(files)}: the files were not written by kerasfast.data."
            f"write_tfrecords, or its conversion was interrupted (the schema is written last). Re-run the "
            f"conversion, or pass features={{'name': tf.io.FixedLenFeature([], tf.string), ...}} to describe them."
        )
    if len(found) != len(candidates) or len(found) > 1:
        raise DataError(f"the files come from several folders ({folders}); read one kerasfast dataset at a time.")
    schema_path = found[0]
    schema = Schema.load(schema_path)
    folder = os.path.dirname(schema_path)
    expected = {os.path.join(folder, s.file): s for s in schema.shards}
    unknown = [f for f in files if os.path.abspath(f) not in {os.path.abspath(k) for k in expected}]
    if unknown:
        raise DataError(
            f"{unknown[0]} is not listed in {schema_path}: it is not part of the dataset written there (a stale "
            f"shard or a file from elsewhere). Delete it, or use a pattern that matches only the dataset's shards."
        )
    return ResolvedFiles(files, schema, schema_path, {os.path.abspath(k): v for k, v in expected.items()})


def _shown(files: Sequence[str]) -> str:
    return files[0] if len(files) == 1 else f"{files[0]} (and {len(files) - 1} more)"


def _expand(path_or_pattern: Any) -> list:
    if isinstance(path_or_pattern, (list, tuple)):
        if not path_or_pattern:
            raise DataError("the list of files is empty; pass at least one TFRecord file.")
        out = []
        for p in path_or_pattern:
            out.extend(_expand(p))
        return out
    path = os.fspath(path_or_pattern)
    if glob.has_magic(path):
        files = sorted(f for f in glob.glob(path) if os.path.isfile(f))
        if not files:
            raise DataError(
                f"the pattern {path!r} matches no files (working directory {os.getcwd()}); check the path, "
                f"or write the data first with kerasfast.data.write_tfrecords."
            )
        return files
    if os.path.isdir(path):
        schema_path = os.path.join(path, SCHEMA_FILENAME)
        if os.path.exists(schema_path):
            schema = Schema.load(schema_path)
            files = [os.path.join(path, s.file) for s in schema.shards]
            missing = [f for f in files if not os.path.exists(f)]
            if missing:
                raise DataError(
                    f"shard {missing[0]} listed in {schema_path} is missing ({len(missing)} of {len(files)} "
                    f"missing); re-copy the folder or re-run the conversion."
                )
            return files
        files = sorted({f for g in TFRECORD_GLOBS for f in glob.glob(os.path.join(glob.escape(path), g))})
        if not files:
            raise DataError(f"the folder {path} holds no TFRecord files ({', '.join(TFRECORD_GLOBS)}); "
                            f"check the path or write the data first.")
        return files
    if not os.path.exists(path):
        raise DataError(f"TFRecord file {path} not found (working directory {os.getcwd()}); check the path.")
    return [path]
