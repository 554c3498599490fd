"""The schema file written beside TFRecord shards, and the parsing it drives.

A schema says, per feature, the dtype and shape of the decoded tensor and how
it is stored in the `tf.train.Example` (the *encoding*), plus which feature is
the label, the compression of the shards and how many records each holds.
Reading needs no hand-written feature spec because of it.

Encodings:

* ``"int64"`` / ``"float"``: a scalar stored as a one-element
  ``Int64List`` / ``FloatList`` (readable by any TFRecord tool).
* ``"bytes"``: a scalar string stored as a one-element ``BytesList``.
* ``"raw"``: an array of fixed shape stored as its little-endian bytes in a
  ``BytesList`` and decoded with ``tf.io.decode_raw`` (fast, exact).
* ``"png"`` / ``"jpeg"`` / ``"image"``: an encoded image (``"image"`` when a
  dataset mixes PNG and JPEG), decoded to ``uint8`` of shape ``(H, W, C)``.
"""

from __future__ import annotations

import math

import dataclasses
import json
import os
from typing import Any, Mapping, Sequence

import numpy as np

from kerasfast._atomic import replace_durably
from kerasfast.data.layout import RecordLayout
from kerasfast.errors import DataError

SCHEMA_FILENAME = "schema.json"
SCHEMA_FORMAT = "kerasfast.tfrecord"
SCHEMA_VERSION = 1

ENCODINGS = ("int64", "float", "bytes", "raw", "png", "jpeg", "image")
IMAGE_ENCODINGS = ("png", "jpeg", "image")
COMPRESSIONS = (None, "GZIP", "ZLIB")

# dtypes `tf.io.decode_raw` can produce; bool is stored as uint8 bytes.
RAW_DTYPES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
    "float16", "float32", "float64",
)
INT_LIST_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")
FLOAT_LIST_DTYPES = ("float16", "float32")


def normalize_compression(compression: Any) -> str | None:
    """Maps the spellings users write ("gzip", "", "none", None) to None/GZIP/ZLIB."""
    if compression is None:
        return None
    text = str(compression).strip().upper()
    if text in ("", "NONE"):
        return None
    if text in ("GZIP", "ZLIB"):
        return text
    raise DataError(
        f"compression={compression!r} is not supported; use None (uncompressed), 'GZIP' or 'ZLIB'."
    )


# Why a feature or model input with a size-0 dimension is refused (the schema's and fit's words).
NO_VALUES = ("no values (a size of 0): a model input of no values gives nothing to learn from, and "
             "TensorFlow's oneDNN CPU kernels abort the process on it.")

@dataclasses.dataclass(frozen=True)
class FeatureSchema:
    """One feature of a record: how it is stored and what it decodes to.

    Args:
        name: feature key in the `tf.train.Example`.
        dtype: NumPy dtype name of the decoded tensor ("uint8", "int64",
            "float32", ...) or "string".
        shape: shape of the decoded tensor for one record; `None` marks a
            dimension that varies (only image height/width may vary).
        encoding: one of "int64", "float", "bytes", "raw", "png", "jpeg", "image".
    """

    name: str
    dtype: str
    shape: tuple
    encoding: str

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(None if d is None else int(d) for d in self.shape))
        if self.encoding not in ENCODINGS:
            raise DataError(f"feature {self.name!r}: unknown encoding {self.encoding!r}; use one of {ENCODINGS}.")
        if self.encoding == "raw" and self.dtype not in RAW_DTYPES:
            raise DataError(
                f"feature {self.name!r}: dtype {self.dtype} cannot be stored raw; "
                f"cast it to one of {RAW_DTYPES}."
            )
        if self.encoding == "raw" and None in self.shape:
            raise DataError(f"feature {self.name!r}: shape {list(self.shape)} has a size that varies (None), which a "
                            f"feature stored raw cannot have: give its one fixed shape, whole numbers such as [4] "
                            f"or [28, 28] ([] for a scalar).")
        if 0 in self.shape:
            raise DataError(f"feature {self.name!r}: shape {list(self.shape)} holds {NO_VALUES} Leave the feature out, or "
                            "give it values.")
        if self.encoding in ("int64", "float", "bytes") and self.shape != ():
            raise DataError(f"feature {self.name!r}: encoding {self.encoding!r} holds scalars only.")
        if self.encoding in IMAGE_ENCODINGS and (len(self.shape) != 3 or self.shape[2] not in (1, 3, 4)):
            raise DataError(
                f"feature {self.name!r}: an image needs shape (height, width, channels) with 1, 3 or 4 "
                f"channels, got {self.shape}."
            )

    @property
    def is_image(self) -> bool:
        return self.encoding in IMAGE_ENCODINGS

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "encoding": self.encoding}

    @classmethod
    def from_json(cls, obj: Mapping) -> "FeatureSchema":
        return cls(obj["name"], obj["dtype"], tuple(obj["shape"]), obj["encoding"])


@dataclasses.dataclass
class ShardInfo:
    """One written shard: file name (relative to the schema), records and bytes."""

    file: str
    num_records: int
    num_bytes: int


def check_shard_name(name: Any, schema_path: str) -> None:
    """Refuses a shard entry that is not a plain file name in the folder of its schema.

    A schema.json is data that may come from elsewhere (a downloaded dataset):
    an absolute path or a '..' in it would make the reader open any file on
    the machine. `write_tfrecords` only ever writes plain file names.

    Raises:
        DataError: naming the schema file and the entry.
    """
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name \
            or os.path.splitdrive(name)[0]:
        raise DataError(
            f"{schema_path} lists shard {name!r}, which is not a file inside the dataset folder (shards must be "
            f"plain file names beside the schema, so that a schema cannot make the reader open other files); "
            f"fix the entry, or re-run the conversion."
        )


@dataclasses.dataclass
class Schema:
    """Everything needed to read a set of TFRecord shards without a feature spec.

    Args:
        features: the features of every record, in a fixed order.
        label: name of the feature that is the training target, or None.
        compression: None, "GZIP" or "ZLIB".
        num_records: total records over all shards, or None if unknown.
        shards: per-shard file name, record count and byte size.
        classes: class names for integer labels (image folders), if any.
        source: a short description of what was converted.
        shuffled: True when records were written in random order, so that
            neighbouring records in a file are unrelated (the reader may then
            take them in small blocks at no cost in randomness).
        layout: the byte layout every record has (`RecordLayout`), when the
            writer found all of them to share one; None otherwise.
    """

    features: list
    label: str | None = None
    compression: str | None = None
    num_records: int | None = None
    shards: list = dataclasses.field(default_factory=list)
    classes: list | None = None
    source: str | None = None
    shuffled: bool = False
    layout: RecordLayout | None = None

    def __post_init__(self):
        names = [f.name for f in self.features]
        if len(set(names)) != len(names):
            raise DataError(f"feature names must be unique, got {names}.")
        if self.label is not None and self.label not in names:
            raise DataError(f"label {self.label!r} is not one of the features {names}.")
        self.compression = normalize_compression(self.compression)

    # -- structure ---------------------------------------------------------
    @property
    def feature_names(self) -> list:
        return [f.name for f in self.features]

    @property
    def input_names(self) -> list:
        """Names of the model inputs: every feature except the label."""
        return [f.name for f in self.features if f.name != self.label]

    def feature(self, name: str) -> FeatureSchema:
        for f in self.features:
            if f.name == name:
                return f
        raise DataError(f"no feature {name!r}; the schema has {self.feature_names}.")

    def shard_records(self) -> dict:
        return {s.file: s.num_records for s in self.shards}

    # -- JSON ----------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "format": SCHEMA_FORMAT,
            "version": SCHEMA_VERSION,
            "features": [f.to_json() for f in self.features],
            "label": self.label,
            "compression": self.compression,
            "num_records": self.num_records,
            "shards": [dataclasses.asdict(s) for s in self.shards],
            "classes": self.classes,
            "source": self.source,
            "shuffled": self.shuffled,
            "layout": self.layout.to_json() if self.layout is not None else None,
        }

    @classmethod
    def from_json(cls, obj: Mapping, *, path: str = "<schema>") -> "Schema":
        """The schema that `obj` (the JSON of a schema file at `path`) describes.

        Raises:
            DataError: naming `path`, the entry (e.g. ``features[0].shape``) and
                its value, when the JSON is not a kerasfast schema (a file
                edited by hand, damaged or written by another program).
        """
        if not isinstance(obj, Mapping):
            raise DataError(f"{path} is not a kerasfast schema: it holds a JSON {type(obj).__name__}, not an object "
                            f"with 'format': {SCHEMA_FORMAT!r}; re-run the conversion to write it again.")
        if obj.get("format") != SCHEMA_FORMAT:
            raise DataError(f"{path} is not a kerasfast schema (format={obj.get('format')!r}).")
        entry = _SchemaEntries(path)
        version = entry.check("version", obj.get("version", 0), _is_count, "a whole number")
        if version > SCHEMA_VERSION:
            raise DataError(
                f"{path} has schema version {obj.get('version')}, newer than this kerasfast reads "
                f"({SCHEMA_VERSION}); upgrade kerasfast."
            )
        if "features" not in obj:
            raise DataError(f"{path} has no 'features' entry; re-run the conversion to write it again.")
        features = entry.check("features", obj["features"], lambda v: isinstance(v, list), "a list of features")
        shards = entry.check("shards", obj.get("shards", []), lambda v: isinstance(v, list), "a list of shards")
        try:
            schema = cls(
                features=[entry.feature(f"features[{i}]", f) for i, f in enumerate(features)],
                label=entry.check("label", obj.get("label"), _is_name_or_none, "a feature name or null"),
                compression=obj.get("compression"),
                num_records=entry.check("num_records", obj.get("num_records"),
                                        lambda v: v is None or _is_count(v), "a whole number of records or null"),
                shards=[entry.shard(f"shards[{i}]", s) for i, s in enumerate(shards)],
                classes=entry.check("classes", obj.get("classes"), lambda v: v is None or isinstance(v, list),
                                    "a list of class names or null"),
                source=obj.get("source"),
                shuffled=entry.check("shuffled", obj.get("shuffled", False), lambda v: isinstance(v, bool),
                                     "true or false"),
            )
            schema.layout = entry.layout("layout", obj.get("layout"), schema.features)
        except DataError as exc:
            if str(exc).startswith(path):
                raise
            # FeatureSchema and Schema check their own arguments, without knowing the file.
            raise DataError(f"{path}: {exc} (re-run the conversion, or correct the entry there)") from exc
        for shard in schema.shards:
            check_shard_name(shard.file, path)
        return schema

    def save(self, path: str, extra: Mapping | None = None) -> None:
        """Writes the schema atomically and durably (see `kerasfast._atomic.replace_durably`).

        Args:
            path: where to write.
            extra: further top-level keys to store beside the schema's own
                (`from_json` ignores them).
        """
        text = json.dumps({**self.to_json(), **(extra or {})}, indent=2) + "\n"
        # The writer's clean-up of killed runs removes leftovers by this name.
        replace_durably(path, lambda temporary: temporary.write_text(text, encoding="utf-8"),
                        temporary=f"{path}.tmp-{os.getpid()}")

    @classmethod
    def load(cls, path: str) -> "Schema":
        try:
            with open(path, encoding="utf-8") as fh:
                obj = json.load(fh)
        except FileNotFoundError as exc:
            raise DataError(f"schema file {path} not found; write the data with kerasfast.data.write_tfrecords "
                            f"or pass features=... to describe it.") from exc
        except json.JSONDecodeError as exc:
            raise DataError(f"schema file {path} is not valid JSON ({exc}); re-run the conversion.") from exc
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise DataError(f"schema file {path} cannot be read ({why}); check its permissions, or re-run the "
                            "conversion.") from exc
        return cls.from_json(obj, path=path)

    # -- parsing -----------------------------------------------------------
    def parse_spec(self) -> dict:
        """The `tf.io.parse_example` feature spec for these features."""
        import tensorflow as tf

        spec = {}
        for f in self.features:
            if f.encoding == "int64":
                spec[f.name] = tf.io.FixedLenFeature([], tf.int64)
            elif f.encoding == "float":
                spec[f.name] = tf.io.FixedLenFeature([], tf.float32)
            else:
                spec[f.name] = tf.io.FixedLenFeature([], tf.string)
        return spec

    def make_batch_decoder(self, image_size: Sequence[int] | None = None):
        """Returns `decode(serialized, names=None, guard=None, explain=None)`:
        a batch of serialized Examples -> dict of decoded tensors.

        Parsing a whole batch with one `tf.io.parse_example` call is what makes
        the reader fast; per-record work is limited to image decoding. When
        schema.json records the files' byte layout (`RecordLayout`), every
        feature is cut out by position instead, with no protobuf parsing.

        Args of `decode`:
            names: the records' names in TensorFlow's parse errors, or a
                function making them (called only where records are parsed).
            guard: a function run on the batch before it is parsed.
            explain: `(serialized, position, text) -> message` for a record
                that does not fit the layout (see `RecordLayout.decoder`).
        """
        if self.layout is not None:
            cut = self.layout.decoder
            return lambda serialized, names=None, guard=None, explain=None: cut(self.features, explain)(serialized)
        spec = self.parse_spec()
        decoders = {f.name: _feature_decoder(f, image_size) for f in self.features}

        def decode(serialized, names=None, guard=None, explain=None):
            parsed = _parse_examples(serialized, spec, names, guard)
            return {name: decoders[name](parsed[name]) for name in self.feature_names}

        return decode

    def output_signature(self, image_size=None) -> dict:
        """Per-record (unbatched) `tf.TensorSpec` of each decoded feature."""
        import tensorflow as tf

        out = {}
        for f in self.features:
            shape = f.shape
            if f.is_image and image_size is not None:
                shape = (int(image_size[0]), int(image_size[1]), shape[2])
            out[f.name] = tf.TensorSpec(shape, tf.string if f.dtype == "string" else tf.as_dtype(f.dtype))
        return out


def _is_count(value) -> bool:
    """A whole number >= 0 as JSON gives it (bool is an int in Python, but not a count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_name_or_none(value) -> bool:
    return value is None or isinstance(value, str)


# dtypes a feature of a schema file may have: what `write_tfrecords` stores.
SCHEMA_DTYPES = tuple(dict.fromkeys((*RAW_DTYPES, *INT_LIST_DTYPES, *FLOAT_LIST_DTYPES, "string")))


class _SchemaEntries:
    """Checks the entries of a schema file, each error naming the file, the entry and its value."""

    def __init__(self, path: str):
        self.path = path

    def check(self, key: str, value, ok, expected: str):
        """`value` (the entry `key`) if `ok(value)`; else a DataError saying what it should be."""
        if not ok(value):
            raise DataError(f"{self.path}: {key} is {json.dumps(value)}, which should be {expected}; the file was "
                            f"edited or damaged: re-run the conversion to write it again, or correct {key} there.")
        return value

    def fields(self, key: str, obj, names: tuple) -> Mapping:
        self.check(key, obj, lambda v: isinstance(v, Mapping), "an object with " + ", ".join(map(repr, names)))
        missing = [n for n in names if n not in obj]
        if missing:
            raise DataError(f"{self.path}: {key} has no {missing[0]!r} entry ({json.dumps(obj)}); re-run the "
                            f"conversion to write it again.")
        return obj

    def feature(self, key: str, obj) -> FeatureSchema:
        obj = self.fields(key, obj, ("name", "dtype", "shape", "encoding"))
        name = self.check(f"{key}.name", obj["name"], lambda v: isinstance(v, str), "a string")
        dtype = self.check(f"{key}.dtype", obj["dtype"], lambda v: v in SCHEMA_DTYPES,
                           f"one of {list(SCHEMA_DTYPES)}")
        shape = self.check(f"{key}.shape", obj["shape"], lambda v: isinstance(v, list) and all(
            d is None or _is_count(d) for d in v), "a list of whole numbers (null for a size that varies)")
        encoding = self.check(f"{key}.encoding", obj["encoding"], lambda v: v in ENCODINGS, f"one of {list(ENCODINGS)}")
        if encoding == "raw":
            # Only images may vary in size (null); raw values are reshaped to the one shape given here.
            self.check(f"{key}.shape", shape, lambda v: None not in v,
                       f"a list of whole numbers for feature {name!r}, stored raw with one fixed shape (such as "
                       f"[4] or [28, 28], [] for a scalar; null, a size that varies, is for images only)")
        return FeatureSchema(name, dtype, tuple(shape), encoding)

    def layout(self, key: str, obj, features) -> RecordLayout | None:
        """The records' byte layout, or None when there is none or it no longer places these features (the
        features entry was edited: the records are then parsed, and checked against the features)."""
        if obj is None:
            return None
        try:
            layout = RecordLayout.from_json(obj)
        except DataError as error:
            self.check(key, obj, lambda v: False, str(error))  # raises, naming the entry
            raise
        return layout if layout.describes(features) else None

    def shard(self, key: str, obj) -> "ShardInfo":
        obj = self.fields(key, obj, ("file", "num_records", "num_bytes"))
        return ShardInfo(self.check(f"{key}.file", obj["file"], lambda v: isinstance(v, str), "a file name"),
                         self.check(f"{key}.num_records", obj["num_records"], _is_count, "a whole number"),
                         self.check(f"{key}.num_bytes", obj["num_bytes"], _is_count, "a whole number"))


def _parse_examples(serialized, spec: dict, names, guard) -> dict:
    """`tf.io.parse_example` of the batch (see `Schema.make_batch_decoder` for `names` and `guard`)."""
    import tensorflow as tf

    if guard is not None:
        serialized = guard(serialized)
    return tf.io.parse_example(serialized, spec, example_names=names() if callable(names) else names)


def _feature_decoder(f: FeatureSchema, image_size):
    """Builds the batch decoder of one feature (input: parsed batch tensor)."""
    import tensorflow as tf

    if f.encoding in ("int64", "float"):
        dtype = tf.as_dtype(f.dtype)
        return lambda t: t if t.dtype == dtype else tf.cast(t, dtype)
    if f.encoding == "bytes":
        return lambda t: t
    if f.encoding == "raw":
        dtype = tf.as_dtype(f.dtype)
        stored = tf.uint8 if f.dtype == "bool" else dtype
        known = all(d is not None for d in f.shape)
        size = math.prod(f.shape) if known else None
        # Without this check, records holding another number of values than the
        # schema's shape (an edited schema.json) reshape into misaligned batches
        # whenever the sizes divide: 8 records of 4 floats read as 16 of 2.
        mismatch = (f"feature {f.name}: a record holds another number of {f.dtype} values than the shape "
                    f"{list(f.shape)} ({size} values) in schema.json, which does not describe these records: "
                    f"write the data again, or correct the feature shape and dtype in schema.json")

        def decode_raw(t):
            flat = tf.io.decode_raw(t, stored, little_endian=True)
            if known:
                values = tf.shape(flat)[-1]
                with tf.control_dependencies([tf.debugging.assert_equal(values, size, message=mismatch)]):
                    out = tf.reshape(flat, [*tf.unstack(tf.shape(flat)[:-1]), *f.shape])
            else:
                out = tf.reshape(flat, [-1, *f.shape])
            return tf.cast(out, tf.bool) if f.dtype == "bool" else out

        return decode_raw

    # Images: decoding is per record, so it runs inside map_fn over the batch;
    # the batch itself is decoded in parallel with other batches.
    height, width, channels = f.shape
    if image_size is not None:
        height, width = int(image_size[0]), int(image_size[1])
    if height is None or width is None:
        raise DataError(
            f"feature {f.name!r}: the images have different sizes, so they cannot be batched as they are; "
            f"pass image_size=(height, width) to resize them while reading."
        )

    def decode_one(encoded):
        if f.encoding == "png":
            img = tf.io.decode_png(encoded, channels=channels)
        elif channels == 4:
            img = _decode_rgba(encoded)
        elif f.encoding == "jpeg":
            img = tf.io.decode_jpeg(encoded, channels=channels)
        else:
            img = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        if image_size is not None:
            img = tf.image.resize(img, (height, width), antialias=True)
            img = tf.saturate_cast(tf.round(img), tf.uint8)
        return tf.ensure_shape(img, (height, width, channels))

    sig = tf.TensorSpec((height, width, channels), tf.uint8)
    return lambda t: tf.map_fn(decode_one, t, fn_output_signature=sig)


def _decode_rgba(encoded):
    """One image as RGBA, a JPEG with an opaque alpha channel (what `decode_png` gives an RGB PNG).

    TensorFlow decodes no JPEG with 4 channels, and image folders written by earlier versions (before
    RGBA files were read as RGB) hold RGBA PNGs and JPEGs in one 4-channel feature: without this they
    cannot be read.
    """
    import tensorflow as tf

    def jpeg():
        rgb = tf.io.decode_jpeg(encoded, channels=3)
        opaque = tf.fill(tf.concat([tf.shape(rgb)[:2], [1]], 0), tf.constant(255, tf.uint8))
        return tf.concat([rgb, opaque], axis=-1)

    return tf.cond(tf.io.is_jpeg(encoded), jpeg,
                   lambda: tf.io.decode_image(encoded, channels=4, expand_animations=False))


def schema_from_feature_spec(features: Mapping, label: str | None = None) -> Schema:
    """Builds a Schema from a plain `{name: tf.io.FixedLenFeature}` spec.

    This is the way to read TFRecords that another program wrote: the features
    are parsed as they are (int64, float32 or string scalars or fixed-shape
    lists), with no raw/image decoding.
    """
    import tensorflow as tf

    feats = []
    for name, conf in features.items():
        if not isinstance(conf, tf.io.FixedLenFeature):
            raise DataError(
                f"feature {name!r}: only tf.io.FixedLenFeature is supported in features=, got "
                f"{type(conf).__name__}; use a kerasfast Schema for raw or image features."
            )
        shape = tuple(int(d) for d in conf.shape)
        dtype = conf.dtype.name
        feats.append(_PassThroughFeature(name, dtype, shape, conf))
    return _ExternalSchema(features=feats, label=label)


class _PassThroughFeature(FeatureSchema):
    """A feature described by a tf.io.FixedLenFeature (files written elsewhere)."""

    def __init__(self, name, dtype, shape, conf):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "encoding", "external")
        object.__setattr__(self, "conf", conf)

    def to_json(self):
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "encoding": "external"}


class _ExternalSchema(Schema):
    """Schema built from an explicit feature spec instead of a schema file."""

    def parse_spec(self) -> dict:
        return {f.name: f.conf for f in self.features}

    def make_batch_decoder(self, image_size=None):
        spec = self.parse_spec()
        return lambda serialized, names=None, guard=None, explain=None: _parse_examples(serialized, spec, names, guard)

    def output_signature(self, image_size=None) -> dict:
        import tensorflow as tf

        return {f.name: tf.TensorSpec(f.shape, tf.as_dtype(f.dtype)) for f in self.features}


def numpy_dtype_name(dtype: Any) -> str:
    return np.dtype(dtype).name
