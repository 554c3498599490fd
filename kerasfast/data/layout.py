"""Reading records of a fixed byte layout by position instead of with `tf.io.parse_example`.

A `tf.train.Example` whose features all have a fixed width (raw arrays of a
fixed shape, one float, one integer of 0..127) serializes to the same bytes in
every record except where the values sit: the feature names, the wire tags
and the length prefixes repeat. `RecordLayout.of` finds those fixed bytes and
the value positions from the features, by serializing probe records with
TensorFlow's own protobuf code.

`write_tfrecords` checks every record it writes against the layout and stores
it in schema.json only when all of them fit (an integer feature holding 128 or
more, whose varint then takes two bytes, keeps the dataset on the general
path). The reader then copies each batch once into a `[batch, record bytes]`
matrix and takes every feature as a slice of it, where `parse_example` copies
each value out into a string of its own and `decode_raw` copies it again. No
branch decides per batch (a `tf.cond` in a tf.data function costs more than
the parse it would save); the records are still checked, every batch, against
the layout's fixed bytes, and one that does not fit (a file re-written after
schema.json, a short file's padding) fails the batch with an error naming it.
"""

from __future__ import annotations

import dataclasses
import math
import struct
import sys

from kerasfast.errors import DataError

# A one-byte varint holds 0..127: larger or negative integers take more bytes.
_ONE_BYTE_VARINT = 128


@dataclasses.dataclass(frozen=True)
class _Value:
    """Where one feature's value sits in every record of the layout."""

    name: str
    start: int
    width: int


@dataclasses.dataclass(frozen=True)
class RecordLayout:
    """The byte layout shared by every serialized record of a dataset (see the module docstring).

    Args:
        length: the bytes of every record.
        fixed: `(start, bytes)` of each run of bytes that every record repeats.
        values: where each feature's value sits.
    """

    length: int
    fixed: tuple
    values: tuple

    @classmethod
    def of(cls, features) -> "RecordLayout | None":
        """The layout of records holding `features` (`FeatureSchema`s), or None when a feature's width varies.

        Example:

        >>> from kerasfast.data.schema import FeatureSchema
        >>> layout = RecordLayout.of([FeatureSchema("x", "uint8", (2, 2), "raw"),
        ...                           FeatureSchema("y", "int64", (), "int64")])
        >>> layout.length, sorted((v.name, v.width) for v in layout.values)
        (29, [('x', 4), ('y', 1)])
        """
        # decode of a float's bytes assumes the stored little-endian order is the machine's.
        if sys.byteorder != "little" or not features or any(_width(f) in (None, 0) for f in features):
            return None
        template = _serialized(features, moved=None)
        values = []
        for f in features:
            moved = _serialized(features, moved=f.name)
            if len(moved) != len(template):
                return None
            where = [i for i, (a, b) in enumerate(zip(template, moved, strict=True)) if a != b]
            if not where or where != list(range(where[0], where[0] + _width(f))):
                return None  # the probe did not find one run of the value's bytes
            values.append(_Value(f.name, where[0], _width(f)))
        values.sort(key=lambda v: v.start)
        fixed, at = [], 0
        for value in [*values, _Value("", len(template), 0)]:
            if value.start > at:
                fixed.append((at, template[at:value.start]))
            at = value.start + value.width
        return cls(len(template), tuple(fixed), tuple(values))

    def template(self) -> bytes:
        """A record of this layout, every value's bytes zero: a valid `tf.train.Example`."""
        record = bytearray(self.length)
        for start, run in self.fixed:
            record[start:start + len(run)] = run
        return bytes(record)

    def fits(self, record: bytes, features) -> bool:
        """Whether one serialized record has this layout (the writer's check of each record)."""
        integers = {f.name for f in features if f.encoding == "int64"}
        return (len(record) == self.length
                and all(record[start:start + len(run)] == run for start, run in self.fixed)
                and all(record[v.start] < _ONE_BYTE_VARINT for v in self.values if v.name in integers))

    def describes(self, features) -> bool:
        """Whether the layout places exactly `features`, each at its width, and every byte once."""
        widths = {f.name: _width(f) for f in features}
        if sorted(v.name for v in self.values) != sorted(widths) or any(
                widths[v.name] != v.width for v in self.values):
            return False
        runs = sorted([(start, len(run)) for start, run in self.fixed] + [(v.start, v.width) for v in self.values])
        at = 0
        for start, width in runs:
            if start != at:
                return False
            at += width
        if at != self.length:
            return False
        # Each value must follow its own feature's name and list type: two values of one width swapped in
        # an edited schema.json would tile the record as well, and read each other's bytes.
        before = {start + len(run): run for start, run in self.fixed}
        kinds = {f.name: f.encoding for f in features}
        return all(_leads_to(before.get(v.start, b""), v.name, kinds[v.name]) for v in self.values)

    def to_json(self) -> dict:
        return {"bytes": self.length, "fixed": [[start, run.hex()] for start, run in self.fixed],
                "values": [[v.name, v.start, v.width] for v in self.values]}

    @classmethod
    def from_json(cls, obj) -> "RecordLayout":
        """The layout a schema.json entry holds.

        Raises:
            DataError: when the entry is not one `to_json` writes (the message names what is wrong).
        """
        def whole(v):
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0

        try:
            length, fixed, values = obj["bytes"], obj["fixed"], obj["values"]
            fixed = tuple((start, bytes.fromhex(run)) for start, run in fixed)
            values = tuple(_Value(name, start, width) for name, start, width in values)
        except (TypeError, KeyError, ValueError) as error:
            raise DataError(f"an object with 'bytes', 'fixed' ([start, hex] pairs) and 'values' ([name, start, "
                            f"width] triples) ({type(error).__name__}: {error})") from error
        if not whole(length) or not all(whole(s) for s, _ in fixed) or not all(
                isinstance(v.name, str) and whole(v.start) and whole(v.width) for v in values):
            raise DataError("an object whose byte counts and positions are whole numbers")
        return cls(length, fixed, values)

    def decoder(self, features, explain=None):
        """`decode(serialized)`: a batch of records of this layout -> dict of decoded tensors (as
        `Schema.make_batch_decoder` decodes them).

        Args:
            features: the `FeatureSchema`s the layout places.
            explain: `(serialized, position, text) -> message` of the batch's first record that does not
                fit, a scalar string tensor; `text` says what a misfit is and the ways out, to follow the
                record's name (the reader names its file and index). It runs for every batch, the
                position past the batch's end when all records fit. By default: "a record".

        The decode fails, with that message, on a batch holding any record that does not fit.
        """
        import tensorflow as tf

        by_name = {f.name: f for f in features}
        explain = explain or self._default_explanation
        # The bytes every record must have: each fixed byte as it is, and the top bit of each integer's
        # varint byte clear (one byte, 0..127). Checked in one gather: each op in a tf.data function costs.
        checked = [(start + i, 0xFF, byte) for start, run in self.fixed for i, byte in enumerate(run)]
        checked += [(v.start, _ONE_BYTE_VARINT, 0) for v in self.values if by_name[v.name].encoding == "int64"]
        columns = tf.constant([column for column, _, _ in checked], tf.int32)
        masks = tf.constant([mask for _, mask, _ in checked], tf.uint8)
        expected = tf.constant([value for _, _, value in checked], tf.uint8)

        def decode(serialized):
            # One copy of the batch into a [batch, length] matrix; the values are slices of it.
            rows = tf.io.decode_raw(serialized, tf.uint8, fixed_length=self.length)
            kept = tf.bitwise.bitwise_and(tf.gather(rows, columns, axis=1), masks) == expected
            fits = tf.reduce_all(kept, axis=1) & (tf.strings.length(serialized) == self.length)
            # The batch size when every record fits (and for an empty batch): no record is explained then.
            first_misfit = tf.argmin(tf.concat([tf.cast(fits, tf.int32), [0]], axis=0))
            message = explain(serialized, first_misfit, self.misfit_text())
            check = tf.debugging.Assert(tf.reduce_all(fits), [message], summarize=1)
            with tf.control_dependencies([check]):
                return {v.name: tf.identity(_value(rows, v, by_name[v.name])) for v in self.values}

        return decode

    @staticmethod
    def _default_explanation(serialized, position, text):
        return "DataError: a record " + text  # the caller knows no more of the batch's records than this

    def misfit_text(self) -> str:
        """What a record that does not fit is, and the ways out (after the record's name)."""
        return (f"does not have the byte layout that schema.json records for these files (every record "
                f"{self.length} bytes, the features at fixed places): the file was re-written or schema.json "
                f"edited after writing. kerasfast.data.check_tfrecords names what is wrong with it; write the "
                f"data again, or remove the layout entry from schema.json to parse each record as a "
                f"tf.train.Example.")


# The tag of each encoding's list in a `tf.train.Feature`: bytes_list, float_list, int64_list.
_LIST_TAGS = {"raw": 0x0A, "float": 0x12, "int64": 0x1A}


def _leads_to(run: bytes, name: str, encoding: str) -> bool:
    """Whether the fixed bytes `run` before a value hold its `Features` map entry's header: the key
    `name`, then a `Feature` holding the encoding's list."""
    key = name.encode("utf-8")
    header = b"\x0a" + _varint(len(key)) + key + b"\x12"  # the key field, then the value (Feature) field
    at = run.find(header)
    if at < 0:
        return False
    at += len(header)
    while at < len(run) and run[at] & 0x80:  # the Feature's length, a varint
        at += 1
    return at + 1 < len(run) and run[at + 1] == _LIST_TAGS[encoding]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _value(rows, value: _Value, feature):
    """One feature's decoded batch, cut out of the records' bytes `rows` (`uint8`, `[batch, length]`)."""
    import tensorflow as tf

    dtype = tf.as_dtype("uint8" if feature.dtype == "bool" else feature.dtype)
    if feature.encoding == "int64":
        return tf.cast(rows[:, value.start], tf.as_dtype(feature.dtype))
    data = rows[:, value.start:value.start + value.width]
    if feature.encoding == "float":
        return tf.cast(tf.reshape(tf.bitcast(tf.reshape(data, [-1, 4]), tf.float32), [-1]), dtype)
    if dtype.size > 1:  # each value's stored little-endian bytes, on a little-endian machine
        data = tf.bitcast(tf.reshape(data, [-1, value.width // dtype.size, dtype.size]), dtype)
    elif dtype != tf.uint8:  # int8: the same bytes, read as signed
        data = tf.bitcast(data, dtype)
    values = tf.reshape(data, [-1, *feature.shape])
    return tf.cast(values, tf.bool) if feature.dtype == "bool" else values


def _width(f) -> int | None:
    """The bytes of one feature's value in a record, or None when it varies."""
    if f.encoding == "int64":
        return 1
    if f.encoding == "float":
        return 4
    if f.encoding != "raw":
        return None
    import numpy as np

    return math.prod(f.shape) * (1 if f.dtype == "bool" else np.dtype(f.dtype).itemsize)


def _serialized(features, moved: str | None) -> bytes:
    """One record of `features`, every value's bytes zero except those of the feature `moved`."""
    import tensorflow as tf

    feature = {}
    for f in features:
        on = f.name == moved
        if f.encoding == "raw":
            feature[f.name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[(b"\x01" if on else b"\x00")
                                                                                     * _width(f)]))
        elif f.encoding == "int64":
            feature[f.name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[1 if on else 0]))
        else:
            # 0x01010101 as a float: all four bytes differ from 0.0's.
            value = struct.unpack("<f", b"\x01\x01\x01\x01")[0] if on else 0.0
            feature[f.name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
