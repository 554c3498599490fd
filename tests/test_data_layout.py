"""Records of a fixed byte layout are cut out by position: the same values as protobuf parsing, always.

Every test reads real files written by `write_tfrecords` (or re-written here
with TensorFlow's own protobuf code) and compares what the reader returns with
the arrays that were written.
"""

import json
import re

import numpy as np
import pytest
import tensorflow as tf

import kerasfast.data as kd
from kerasfast.data.layout import RecordLayout, _varint
from kerasfast.data.schema import FeatureSchema, Schema
from kerasfast.errors import DataError

N = 40


def read_all(folder, batch_size=8, **kwargs):
    """Every record of the dataset in written order, as NumPy arrays per feature."""
    ds = kd.tfrecord_dataset(folder, batch_size=batch_size, shuffle=False, label=False, **kwargs)
    batches = list(ds.as_numpy_iterator())
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def records_of(folder):
    files = sorted(str(p) for p in folder.glob("*.tfrecord"))
    return [r.numpy() for r in tf.data.TFRecordDataset(files)]


def rewrite(folder, index, change):
    """Re-writes record `index` of the dataset's one shard through `change(tf.train.Example)`, TensorFlow's
    protobuf serializing it again; the other records keep their bytes (protobuf may order a map's entries
    differently each time it serializes one)."""
    path = str(next(folder.glob("*.tfrecord")))
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    example = tf.train.Example.FromString(records[index])
    change(example)
    records[index] = example.SerializeToString()
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)


@pytest.fixture()
def mixed(tmp_path):
    """Records with a fixed-width feature of every kind the layout cuts out: raw arrays of several dtypes
    (bool, int8, uint16, int64, float16, a float64 scalar), one float, one small integer."""
    rng = np.random.default_rng(0)
    columns = {
        "image": rng.integers(0, 256, (N, 4, 5, 3), dtype=np.uint8),
        "vector": rng.normal(size=(N, 7)).astype(np.float32),
        "counts": rng.integers(-30_000, 30_000, (N, 3), dtype=np.int16),
        "signed": rng.integers(-128, 128, (N, 5), dtype=np.int8),
        "ports": rng.integers(0, 65_536, (N, 2), dtype=np.uint16),
        "ids": rng.integers(-2**62, 2**62, (N, 2), dtype=np.int64),
        "mask": rng.integers(0, 2, (N, 6)).astype(bool),
        "half": rng.normal(size=(N, 2)).astype(np.float16),
        "wide": rng.normal(size=N),
        "score": rng.normal(size=N).astype(np.float32),
        "label": rng.integers(0, 10, N),
    }
    kd.write_tfrecords(columns, tmp_path / "mixed", shards=2, shuffle=False)
    return tmp_path / "mixed", columns


def test_records_written_by_write_tfrecords_match_their_layout(mixed):
    folder, _ = mixed
    schema = Schema.load(str(folder / "schema.json"))
    layout = schema.layout
    assert layout is not None and layout.describes(schema.features)
    assert sorted(v.name for v in layout.values) == sorted(schema.feature_names)
    for record in records_of(folder):
        assert len(record) == layout.length
        assert layout.fits(record, schema.features)
        for start, run in layout.fixed:
            assert record[start:start + len(run)] == run


def test_every_fixed_width_kind_reads_back_exactly(mixed):
    folder, columns = mixed
    got = read_all(folder)
    assert set(got) == set(columns)
    for name, written in columns.items():
        assert got[name].dtype == written.dtype and got[name].shape == written.shape, name
        np.testing.assert_array_equal(got[name], written, err_msg=name)


def test_the_layout_gives_what_protobuf_parsing_gives(mixed):
    folder, _ = mixed
    schema = Schema.load(str(folder / "schema.json"))
    serialized = tf.constant(records_of(folder))
    cut = schema.make_batch_decoder()(serialized)
    parsed = tf.io.parse_example(serialized, schema.parse_spec())
    assert parsed["image"].dtype == tf.string  # the general path parses into strings, decoded after
    assert np.array_equal(cut["image"].numpy().reshape(N, -1),
                          tf.io.decode_raw(parsed["image"], tf.uint8).numpy())
    np.testing.assert_array_equal(cut["label"].numpy(), parsed["label"].numpy())
    np.testing.assert_array_equal(cut["score"].numpy(), parsed["score"].numpy())


@pytest.mark.parametrize("label", [200, -3, 2**40], ids=["two-byte varint", "negative", "large"])
def test_a_label_that_does_not_fit_one_byte_keeps_the_dataset_on_protobuf_parsing(tmp_path, label):
    x = np.arange(N * 4, dtype=np.float32).reshape(N, 4)
    y = np.arange(N) % 5
    y[13] = label  # one record of 40
    kd.write_tfrecords((x, y), tmp_path / "ds", shards=1, shuffle=False)
    assert Schema.load(str(tmp_path / "ds" / "schema.json")).layout is None
    got = read_all(tmp_path / "ds")
    np.testing.assert_array_equal(got["y"], y)
    np.testing.assert_array_equal(got["x"], x)


def small_dataset(tmp_path):
    x = np.arange(N * 4, dtype=np.float32).reshape(N, 4)
    y = np.arange(N) % 7
    kd.write_tfrecords((x, y), tmp_path / "ds", shards=1, shuffle=False)
    return tmp_path / "ds", x, y


def misfit_named(folder, index):
    return re.escape(f"{next(folder.glob('*.tfrecord'))}, record {index} does not have the byte layout that "
                     "schema.json records")


def test_a_record_of_the_same_length_under_another_feature_name_is_named_with_the_feature(tmp_path):
    """A record whose bytes differ from the layout only in a feature's name (same length): cut by position
    it would read as the feature it no longer holds."""
    folder, _, _ = small_dataset(tmp_path)

    def rename(example):
        example.features.feature["z"].CopyFrom(example.features.feature["y"])
        del example.features.feature["y"]

    rewrite(folder, 5, rename)
    assert len(set(map(len, records_of(folder)))) == 1  # every record still of the layout's length
    # The misfit is parsed alone, so TensorFlow's own error names the record and the feature it lacks.
    path = next(folder.glob("*.tfrecord"))
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(f"Name: {path}, record 5, Feature: y")):
        read_all(folder)
    # check_tfrecords parses the record and names what is wrong with it; on_error="skip" leaves it out.
    problem = kd.locate_damage(folder)
    assert (problem.index, problem.kind) == (5, "parse") and "Feature: y" in problem.message
    with pytest.warns(UserWarning, match="left out 1 bad"):
        assert len(read_all(folder, on_error="skip")["y"]) == N - 1


def varint(data, at):
    """`(value, next position)` of the protobuf varint at `at`."""
    value, shift = 0, 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def features_reversed(record):
    """The same `tf.train.Example`, its feature map's entries serialized in the reverse order (protobuf
    leaves a map's order to the writer)."""
    assert record[0] == 0x0A  # Example.features
    size, at = varint(record, 1)
    entries = []
    while at < len(record):
        assert record[at] == 0x0A  # Features.feature, one map entry
        length, start = varint(record, at + 1)
        entries.append(record[at:start + length])
        at = start + length
    body = b"".join(reversed(entries))
    assert len(body) == size
    return b"\x0a" + _varint(len(body)) + body


def test_files_rewritten_in_another_field_order_are_named_and_read_once_the_layout_entry_is_removed(tmp_path):
    """Another program re-writing the files may put the features in another order: the reader says so, and
    removing schema.json's "layout" entry, as the message says, reads them by parsing each record."""
    folder, x, y = small_dataset(tmp_path)
    records = records_of(folder)
    with tf.io.TFRecordWriter(str(next(folder.glob("*.tfrecord")))) as writer:
        for i, record in enumerate(records):
            writer.write(features_reversed(record) if i >= 3 else record)
    assert tf.train.Example.FromString(features_reversed(records[3])) == tf.train.Example.FromString(records[3])
    with pytest.raises(tf.errors.InvalidArgumentError, match=misfit_named(folder, 3) + r".*"
                       r"remove the layout entry from schema\.json"):
        read_all(folder)
    # check_tfrecords finds the first such record, naming the layout.
    problem = kd.locate_damage(folder)
    assert (problem.index, problem.kind) == (3, "parse")
    assert "parses, but does not have the byte layout" in problem.message
    entries = json.loads((folder / "schema.json").read_text())
    del entries["layout"]
    (folder / "schema.json").write_text(json.dumps(entries))
    got = read_all(folder)
    np.testing.assert_array_equal(got["x"], x)
    np.testing.assert_array_equal(got["y"], y)


def test_a_label_byte_that_is_not_a_whole_varint_is_named_by_the_parse(tmp_path):
    """Bytes no protobuf writer makes (a varint cut short: its continuation bit set) in a record of the
    layout's length: cut by position it would read as a label of 200."""
    folder, _, _ = small_dataset(tmp_path)
    schema = Schema.load(str(folder / "schema.json"))
    label_at = next(v.start for v in schema.layout.values if v.name == "y")
    records = records_of(folder)
    bad = bytearray(records[5])
    assert bad[label_at] < 128
    bad[label_at] = 200
    records[5] = bytes(bad)
    with tf.io.TFRecordWriter(str(next(folder.glob("*.tfrecord")))) as writer:
        for record in records:
            writer.write(record)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=re.escape(f"Name: {next(folder.glob('*.tfrecord'))}, record 5, Key: y")):
        read_all(folder)


def test_a_layout_entry_that_no_longer_places_the_features_is_not_used(tmp_path):
    """schema.json edited by hand: a layout that does not describe the features is set aside (the records
    are parsed and checked against the features); one that is not a layout at all is refused, named."""
    folder, x, y = small_dataset(tmp_path)
    entries = json.loads((folder / "schema.json").read_text())
    entries["layout"]["values"][0][2] += 1  # a width that no feature has
    (folder / "schema.json").write_text(json.dumps(entries))
    assert Schema.load(str(folder / "schema.json")).layout is None
    np.testing.assert_array_equal(read_all(folder)["x"], x)
    entries["layout"] = {"bytes": "many"}
    (folder / "schema.json").write_text(json.dumps(entries))
    with pytest.raises(DataError, match=r"schema\.json: layout is .*which should be an object with 'bytes'"):
        Schema.load(str(folder / "schema.json"))


def test_a_short_file_of_a_layout_dataset_is_named_with_its_counts(tmp_path):
    folder, _, _ = small_dataset(tmp_path)
    path = str(next(folder.glob("*.tfrecord")))
    records = records_of(folder)
    ds = kd.tfrecord_dataset(folder, batch_size=8)  # the quick check passes: the file is whole
    with tf.io.TFRecordWriter(path) as writer:
        for record in records[:30]:  # cut at a record boundary: no CRC notices
            writer.write(record)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=re.escape(f"DataError: {path} ends after 30 of the {N} records")):
        for _ in ds:
            pass


def test_features_whose_width_varies_have_no_layout():
    fixed = [FeatureSchema("x", "float32", (3,), "raw"), FeatureSchema("y", "int64", (), "int64")]
    assert RecordLayout.of(fixed) is not None
    assert RecordLayout.of([*fixed, FeatureSchema("text", "string", (), "bytes")]) is None
    assert RecordLayout.of([*fixed, FeatureSchema("photo", "uint8", (None, None, 3), "png")]) is None
    # A feature of no values has no layout to give: it is refused as a feature at all (a model input of
    # no values aborts TensorFlow's oneDNN kernels).
    with pytest.raises(DataError, match=r"feature 'empty': shape \[0\] holds no values"):
        FeatureSchema("empty", "float32", (0,), "raw")


def test_a_layout_whose_values_were_swapped_by_hand_is_not_used(tmp_path):
    """Two values of one width swapped in schema.json still tile the record: the layout is checked against
    the feature names before each value, so each feature is not read from the other's bytes."""
    a, b = np.arange(N, dtype=np.float32), -np.arange(N, dtype=np.float32)
    kd.write_tfrecords({"a": a, "b": b, "y": np.ones(N, np.int64)}, tmp_path / "ds", shards=1, shuffle=False)
    path = tmp_path / "ds" / "schema.json"
    assert Schema.load(str(path)).layout is not None
    entries = json.loads(path.read_text())
    values = entries["layout"]["values"]
    (i, first), (j, second) = [(k, v) for k, v in enumerate(values) if v[0] in ("a", "b")]
    values[i], values[j] = [first[0], second[1], first[2]], [second[0], first[1], second[2]]
    path.write_text(json.dumps(entries))
    assert Schema.load(str(path)).layout is None
    got = read_all(tmp_path / "ds")
    np.testing.assert_array_equal(got["a"], a)
    np.testing.assert_array_equal(got["b"], b)


def test_an_empty_batch_decodes_to_empty_tensors(tmp_path):
    folder, _, _ = small_dataset(tmp_path)
    decoded = Schema.load(str(folder / "schema.json")).make_batch_decoder()(tf.constant([], tf.string))
    assert decoded["x"].shape == (0, 4) and decoded["y"].shape == (0,)


def test_kerasfast_fit_names_a_record_that_left_the_layout(tmp_path):
    import keras

    import kerasfast

    folder, _, _ = small_dataset(tmp_path)
    records = records_of(folder)
    ds = kd.tfrecord_dataset(folder, batch_size=8)  # checked now: the files are whole
    with tf.io.TFRecordWriter(str(next(folder.glob("*.tfrecord")))) as writer:
        for i, record in enumerate(records):
            writer.write(features_reversed(record) if i == 17 else record)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(7, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy")
    with pytest.raises(DataError, match=r"data-00000-of-00001\.tfrecord, record 17 .*parses, but does not have "
                                        r"the byte layout"):
        kerasfast.fit(model, ds, epochs=1, run_dir=False, verbose=0, tune="off")
