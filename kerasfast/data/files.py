"""Turning a path, folder, glob or list into TFRecord files and their schema."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import warnings
from typing import Any, Mapping, Sequence

from kerasfast.data.schema import SCHEMA_FILENAME, Schema, check_shard_name, schema_from_feature_spec
from kerasfast.errors import DataError

TFRECORD_GLOBS = ("*.tfrecord", "*.tfrecord.gz", "*.tfrecord.zlib", "*.tfrecords", "*.tfrec")
# The commit record of a write in progress (see writer._roll_forward): the new schema plus, per shard, the
# temporary name it has until it is renamed. While it exists it, not schema.json, describes the dataset.
PENDING_FILENAME = SCHEMA_FILENAME + ".pending"


@dataclasses.dataclass
class FolderDataset:
    """The dataset a folder holds right now, as `write_tfrecords` committed it.

    Attributes:
        schema: the `Schema`.
        schema_path: schema.json, or schema.json.pending when a write was
            interrupted after its commit point (the new dataset is then read
            from where its shards are, renamed or not).
        files: path of each shard, in schema order.
        pending: True in that second case.
    """

    schema: Schema
    schema_path: str
    files: list
    pending: bool = False

    @property
    def expected(self) -> dict:
        """Absolute shard path -> `ShardInfo` (record count and size as written)."""
        return {os.path.abspath(f): s for f, s in zip(self.files, self.schema.shards, strict=True)}


def load_folder(folder: str) -> FolderDataset | None:
    """The committed dataset in `folder`, or None when it holds none.

    Never writes: a reader may have no write access, and finishing an
    interrupted commit is the next `write_tfrecords` run's job.
    """
    pending_path = os.path.join(folder, PENDING_FILENAME)
    if os.path.exists(pending_path):
        obj = _load_json(pending_path)
        schema = Schema.from_json(obj, path=pending_path)
        partials = (obj.get("pending") or {}).get("partials") or {}
        files = []
        for shard in schema.shards:
            partial = partials.get(shard.file)
            if partial is not None:
                check_shard_name(partial, pending_path)
            # A rename is atomic: the temporary name exists until the instant the final one is the new shard.
            if partial is not None and os.path.exists(os.path.join(folder, partial)):
                files.append(os.path.join(folder, partial))
            else:
                files.append(os.path.join(folder, shard.file))
        return FolderDataset(schema, pending_path, files, pending=True)
    schema_path = os.path.join(folder, SCHEMA_FILENAME)
    if not os.path.exists(schema_path):
        return None
    schema = Schema.load(schema_path)
    return FolderDataset(schema, schema_path, [os.path.join(folder, s.file) for s in schema.shards])


def _load_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        # Written by rename, so never half-written by kerasfast: something else changed it.
        raise DataError(f"{path} is not valid JSON ({exc}); re-run the conversion.") from exc


@dataclasses.dataclass
class ResolvedFiles:
    """Files to read, the schema that describes them and where it came from."""

    files: list
    schema: Schema | None  # None only with require_schema=False and no schema found
    schema_path: str | None  # None when the schema came from an explicit feature spec (or there is none)
    expected: dict  # file path -> ShardInfo from schema.json (empty without one)


def resolve_files(
    path_or_pattern: Any,
    *,
    features: Schema | Mapping | None = None,
    label: Any = None,
    require_schema: bool = True,
) -> ResolvedFiles:
    """Expands `path_or_pattern` to files and finds their schema.

    Args:
        path_or_pattern: a folder written by `write_tfrecords`, a glob
            pattern, a single file, or a list of files.
        features: an explicit `Schema` or `{name: tf.io.FixedLenFeature}` for
            files without a schema.json beside them.
        label: label name to use with an explicit feature spec.
        require_schema: if False, files without a schema are resolved with
            `schema=None` (for framing-only checks) instead of refused.

    Returns:
        A `ResolvedFiles`.
    """
    files = _expand(path_or_pattern)
    if features is not None:
        schema = features if isinstance(features, Schema) else schema_from_feature_spec(features, label=label)
        return ResolvedFiles(files, schema, None, {})

    folders = sorted({os.path.dirname(os.path.abspath(f)) for f in files})
    found = [d for d in (load_folder(folder) for folder in folders) if d is not None]
    if not found:
        if not require_schema:
            return ResolvedFiles(files, None, None, {})
        raise DataError(
            f"no {SCHEMA_FILENAME} beside {_shown(files)}: the files were not written by kerasfast.data."
            f"write_tfrecords, or its conversion was interrupted (the schema is written last). Re-run the "
            f"conversion, or pass features={{'name': tf.io.FixedLenFeature([], tf.string), ...}} to describe them."
        )
    if len(found) != len(folders) or len(found) > 1:
        raise DataError(f"the files come from several folders ({folders}); read one kerasfast dataset at a time.")
    dataset = found[0]
    expected = dataset.expected
    unknown = [f for f in files if os.path.abspath(f) not in expected]
    if unknown:
        interrupted = (" A write into this folder was interrupted while renaming its shards: read the folder "
                       "itself, or re-run the conversion." if dataset.pending else "")
        raise DataError(
            f"{unknown[0]} is not listed in {dataset.schema_path}: it is not part of the dataset written there (a "
            f"stale shard or a file from elsewhere). Delete it, or use a pattern that matches only the dataset's "
            f"shards.{interrupted}"
        )
    return ResolvedFiles(files, dataset.schema, dataset.schema_path, expected)


def _warn_unlisted(folder: str, files: list, schema_path: str) -> None:
    """Warns of TFRecord files in a dataset's folder that its schema.json does not list, which are not read:
    `write_tfrecords` lists every shard it writes and removes the old ones, so they come from an edited or
    older schema.json, or were copied in (the records they hold would otherwise be left out without a word)."""
    listed = {os.path.abspath(f) for f in files}
    unlisted = sorted({f for g in TFRECORD_GLOBS for f in glob.glob(os.path.join(glob.escape(folder), g))
                       if os.path.abspath(f) not in listed})
    if unlisted:
        warnings.warn(
            f"{len(unlisted)} TFRecord file(s) in {folder} are not listed in {schema_path} and are not read: "
            f"{', '.join(os.path.basename(f) for f in unlisted[:3])}{' ...' if len(unlisted) > 3 else ''}. "
            "schema.json was edited or is from another write, or the files were copied in: re-run the conversion "
            "to read every record, or move the files out.", UserWarning, stacklevel=3)


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
    if glob.has_magic(path) and not os.path.exists(path):  # an existing "run[1]" is a name, not a pattern
        files = sorted(f for f in glob.glob(path) if os.path.isfile(f))
        if not files:
            raise DataError(
                f"the pattern {path!r} matches no files (working directory {os.getcwd()}); check the path, "
                f"or write the data first with kerasfast.data.write_tfrecords."
            )
        return files
    if os.path.isdir(path):
        dataset = load_folder(path)
        if dataset is not None:
            files = dataset.files
            missing = [f for f in files if not os.path.exists(f)]
            if missing:
                raise DataError(
                    f"shard {missing[0]} listed in {dataset.schema_path} is missing ({len(missing)} of {len(files)} "
                    f"missing); re-copy the folder or re-run the conversion."
                )
            _warn_unlisted(path, files, dataset.schema_path)
            return files
        files = sorted({f for g in TFRECORD_GLOBS for f in glob.glob(os.path.join(glob.escape(path), g))})
        if not files:
            raise DataError(f"the folder {path} holds no TFRecord files ({', '.join(TFRECORD_GLOBS)}); "
                            f"check the path or write the data first.")
        return files
    if not os.path.exists(path):
        raise DataError(f"TFRecord file {path} not found (working directory {os.getcwd()}); check the path.")
    return [path]
