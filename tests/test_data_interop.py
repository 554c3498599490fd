"""TFRecord interoperability, checked against a second implementation.

The reader/writer below follows the TFRecord format spec on its own (length,
masked CRC32C of the length, data, masked CRC32C of the data; GZIP/ZLIB wrap
the whole stream) using the `crc32c` package and Python's gzip/zlib, and
shares no code with kerasfast. Files go both ways: kerasfast -> spec reader,
spec writer -> kerasfast, and TensorFlow's own writer -> kerasfast.
"""

import gzip
import os
import struct
import zlib

import crc32c
import numpy as np
import pytest
import tensorflow as tf

import kerasfast.data as kd


# -- an independent implementation of the format ---------------------------

def _masked_crc(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def spec_write(path, records, compression=None):
    body = b"".join(
        struct.pack("<Q", len(r)) + struct.pack("<I", _masked_crc(struct.pack("<Q", len(r))))
        + r + struct.pack("<I", _masked_crc(r))
        for r in records
    )
    if compression == "GZIP":
        body = gzip.compress(body)
    elif compression == "ZLIB":
        body = zlib.compress(body)
    with open(path, "wb") as fh:
        fh.write(body)


def spec_read(path, compression=None):
    with open(path, "rb") as fh:
        data = fh.read()
    if compression == "GZIP":
        data = gzip.decompress(data)
    elif compression == "ZLIB":
        data = zlib.decompress(data)
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        (length_crc,) = struct.unpack_from("<I", data, pos + 8)
        assert length_crc == _masked_crc(data[pos:pos + 8]), f"bad length CRC at {pos}"
        payload = data[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack_from("<I", data, pos + 12 + length)
        assert data_crc == _masked_crc(payload), f"bad data CRC at {pos}"
        out.append(payload)
        pos += 16 + length
    return out


def example(i: int) -> bytes:
    """A tf.train.Example with an int64 label, a float and a bytes feature."""
    return tf.train.Example(features=tf.train.Features(feature={
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
        "weight": tf.train.Feature(float_list=tf.train.FloatList(value=[i / 4])),
        "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"item-{i}".encode()])),
    })).SerializeToString()


FOREIGN_SPEC = {
    "label": tf.io.FixedLenFeature([], tf.int64),
    "weight": tf.io.FixedLenFeature([], tf.float32),
    "name": tf.io.FixedLenFeature([], tf.string),
}


def read_all_labels(ds):
    labels, names = [], []
    for x, y in ds:
        labels.extend(y.numpy().tolist())
        names.extend(x["name"].numpy().tolist())
    return labels, names


# -- tests -------------------------------------------------------------------

def test_spec_implementation_matches_tensorflow_writer(tmp_path):
    # Guards the second implementation itself: byte-identical to TF for plain files.
    records = [example(i) for i in range(5)]
    ours, theirs = tmp_path / "ours.tfrecord", tmp_path / "tf.tfrecord"
    spec_write(ours, records)
    with tf.io.TFRecordWriter(str(theirs)) as w:
        for r in records:
            w.write(r)
    assert ours.read_bytes() == theirs.read_bytes()


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_kerasfast_files_read_by_spec_reader(tmp_path, compression):
    x = np.arange(12 * 3, dtype=np.float32).reshape(12, 3)
    y = np.arange(12, dtype=np.int64)
    result = kd.write_tfrecords((x, y), tmp_path / "out", shards=3, compression=compression, shuffle=False)
    got = {}
    for path in result.files:
        for payload in spec_read(path, compression):
            ex = tf.train.Example.FromString(payload)
            label = ex.features.feature["y"].int64_list.value[0]
            raw = ex.features.feature["x"].bytes_list.value[0]
            got[label] = np.frombuffer(raw, "<f4")
    assert sorted(got) == list(range(12))
    for i in range(12):
        np.testing.assert_array_equal(got[i], x[i])
    # The shard sizes in the schema are the real file sizes.
    assert [s.num_bytes for s in result.schema.shards] == [os.path.getsize(p) for p in result.files]


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_spec_writer_files_read_by_kerasfast(tmp_path, compression):
    files = []
    for shard in range(2):
        path = tmp_path / f"part-{shard}.tfrecord"
        spec_write(path, [example(i) for i in range(shard * 10, shard * 10 + 10)], compression)
        files.append(str(path))
    # compression is detected from the bytes ("auto"), the spec is explicit: no schema.json here.
    ds = kd.tfrecord_dataset(str(tmp_path / "*.tfrecord"), batch_size=4, features=FOREIGN_SPEC, label="label",
                             shuffle=False)
    labels, names = read_all_labels(ds)
    assert sorted(labels) == list(range(20))
    assert sorted(names) == sorted(f"item-{i}".encode() for i in range(20))
    assert ds.kerasfast_info.settings.compression == compression
    report = kd.check_tfrecords(files, features=FOREIGN_SPEC)
    assert report.ok and report.num_records == 20


@pytest.mark.parametrize("compression", ["", "GZIP", "ZLIB"])
def test_tensorflow_writer_files_read_by_kerasfast(tmp_path, compression):
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path), tf.io.TFRecordOptions(compression_type=compression)) as w:
        for i in range(9):
            w.write(example(i))
    ds = kd.tfrecord_dataset(str(path), batch_size=4, features=FOREIGN_SPEC, label="label", shuffle=False,
                             validate="full")
    labels, _ = read_all_labels(ds)
    assert labels == list(range(9))
    assert ds.kerasfast_info.validation.num_records == 9


def test_kerasfast_files_read_by_tensorflow_reader(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (6, 4, 4, 3), dtype=np.uint8)
    result = kd.write_tfrecords({"image": images, "label": np.arange(6)}, tmp_path, shards=2,
                                compression="GZIP", shuffle=False)
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    seen = {}
    for record in tf.data.TFRecordDataset(result.files, compression_type="GZIP"):
        ex = tf.io.parse_single_example(record, spec)
        seen[int(ex["label"])] = tf.reshape(tf.io.decode_raw(ex["image"], tf.uint8), (4, 4, 3)).numpy()
    assert sorted(seen) == list(range(6))
    for i in range(6):
        np.testing.assert_array_equal(seen[i], images[i])
