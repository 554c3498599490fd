"""Every pass over a kerasfast TFRecord dataset reads what schema.json promises, or names the file.

Damage is made in real files written by `write_tfrecords`: a GZIP/ZLIB file cut
where TensorFlow's reader ends it without an error, a plain file cut exactly at
a record boundary (no CRC breaks), a shard deleted after the dataset was made,
a flipped byte in a record's data or in a length header. Each is met in a
user's own loop, in `model.fit` and in `kerasfast.fit`.
"""

import os
import re
import struct

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasfast
import kerasfast.data as kd
from kerasfast.errors import DataError

N = 50


def write(tmp_path, compression=None, shards=1, name="ds"):
    x = np.random.default_rng(0).random((N, 16)).astype(np.float32)
    return kd.write_tfrecords((x, np.arange(N) % 2), tmp_path / name, shards=shards, compression=compression,
                              shuffle=False)


def offsets(path):
    data, out, pos = open(path, "rb").read(), [], 0
    while pos < len(data):
        out.append(pos)
        pos += 16 + struct.unpack_from("<Q", data, pos)[0]
    return out


def cut_silently(path, compression):
    """Cuts the file where TensorFlow's own reader ends it early without any error; returns the records left."""
    data = open(path, "rb").read()
    if compression is None:
        keep = 30
        boundary = offsets(path)[keep]
        open(path, "wb").write(data[:boundary])  # exactly at a record boundary
        return keep
    for cut in range(len(data) // 3, len(data), 7):
        open(path, "wb").write(data[:cut])
        try:
            read = sum(1 for _ in tf.data.TFRecordDataset(path, compression_type=compression))
        except tf.errors.DataLossError:
            continue
        if read < N:
            return read
    raise AssertionError("no cut point found where TensorFlow reads the file short without an error")


def records_read(ds):
    return sum(int(y.shape[0]) for _, y in ds)


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB", None])
def test_a_file_read_short_without_any_tensorflow_error_is_named(tmp_path, compression):
    written = write(tmp_path, compression)
    path = written.files[0]
    left = cut_silently(path, compression)
    assert 0 < left < N
    # The check before reading compares sizes and says how many records are left.
    with pytest.raises(DataError, match=rf"{re.escape(path)}: is \d+ bytes but was written as \d+ bytes: read "
                                        rf"{left} of the {N} records schema\.json promises"):
        kd.tfrecord_dataset(written.out_dir, batch_size=8)
    # Without it, the pass itself counts: before, it ended normally with `left` records.
    ds = kd.tfrecord_dataset(written.out_dir, batch_size=8, validate="none", shuffle=False)
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        records_read(ds)
    message = str(raised.value)
    assert f"{path} read {left} of {N} records: record {left} (byte offset" in message
    assert f"kerasfast.data.check_tfrecords({path})" in message and "on_error=skip" in message
    explained = str(kd.explain_data_error(raised.value, ds))
    assert path in explained and f"record {left}" in explained
    # on_error="skip" trains on what is readable and says how much that is.
    with pytest.warns(UserWarning, match=rf"{re.escape(path)}: read {left} of {N} records"):
        ds = kd.tfrecord_dataset(written.out_dir, batch_size=8, on_error="skip", shuffle=False)
    assert records_read(ds) == left


def test_a_shard_deleted_after_the_dataset_was_made_is_named_with_its_counts(tmp_path):
    written = write(tmp_path, shards=2)
    ds = kd.tfrecord_dataset(written.out_dir, batch_size=8)
    assert records_read(ds) == N
    os.remove(written.files[1])
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{re.escape(written.files[1])} read 0 of 25 "
                                                             r"records: record 0 \(byte offset 0\)"):
        records_read(ds)
    with pytest.raises(DataError, match=r"data-00001-of-00002\.tfrecord listed in .*schema\.json is missing"):
        kd.tfrecord_dataset(written.out_dir, batch_size=8)
    with pytest.warns(UserWarning, match=rf"{re.escape(written.files[1])}: read 0 of 25 records"):
        ds = kd.tfrecord_dataset(written.out_dir, batch_size=8, on_error="skip")
    assert records_read(ds) == 25


def test_a_replaced_file_with_more_records_is_named(tmp_path):
    small, big = write(tmp_path, name="small"), write(tmp_path, shards=1, name="big")
    ds = kd.tfrecord_dataset(small.out_dir, batch_size=8, validate="none")
    with open(big.files[0], "rb") as fh, open(small.files[0], "ab") as out:
        out.write(fh.read()[:offsets(big.files[0])[3]])  # three more whole records
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"read {N + 3} of {N} records: it holds more"):
        records_read(ds)


# -- damage named wherever the dataset is read ------------------------------------------

def flip_data_byte(path, index):
    data = bytearray(open(path, "rb").read())
    data[offsets(path)[index] + 12 + 5] ^= 0xFF
    open(path, "wb").write(bytes(data))


def flip_length_byte(path, index):
    data = bytearray(open(path, "rb").read())
    data[offsets(path)[index]] ^= 0x01
    open(path, "wb").write(bytes(data))


def cut_inside(path, index):
    open(path, "r+b").truncate(offsets(path)[index] + 20)


DAMAGE = {"flipped payload byte": flip_data_byte, "flipped length header": flip_length_byte,
          "truncated record": cut_inside}


def model():
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((16,)), keras.layers.Dense(2)])
    net.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer="sgd")
    return net


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damage_is_named_in_a_users_loop_in_model_fit_and_in_kerasfast_fit(tmp_path, damage):
    written = write(tmp_path, shards=2)
    path = written.files[1]
    offset = offsets(path)[7]
    DAMAGE[damage](path, 7)
    where = f"read 7 of 25 records: record 7 (byte offset {offset})"
    # validate="none": as when the file is damaged after the dataset was made.
    ds = kd.tfrecord_dataset(written.out_dir, batch_size=8, validate="none")
    with pytest.raises(tf.errors.InvalidArgumentError) as in_loop:
        for _ in ds:
            pass
    assert path in str(in_loop.value) and where in str(in_loop.value)
    with pytest.raises(tf.errors.InvalidArgumentError) as in_model_fit:
        model().fit(ds, epochs=1, verbose=0)
    assert path in str(in_model_fit.value) and where in str(in_model_fit.value)
    assert "check_tfrecords" in str(in_model_fit.value) and "on_error=skip" in str(in_model_fit.value)
    with pytest.raises(DataError) as in_kerasfast_fit:
        kerasfast.fit(model(), written.out_dir, epochs=1, batch_size=8, run_dir=False, verbose=0)
    message = str(in_kerasfast_fit.value)
    # Found mid-run (a bad CRC) or by the size check before it (a truncated file): either way named in full.
    assert path in message and f"record 7 (byte offset {offset})" in message and "on_error='skip'" in message


def test_skip_trains_on_the_readable_records_of_a_damaged_file(tmp_path):
    written = write(tmp_path, shards=2)
    cut_inside(written.files[1], 7)
    with pytest.warns(UserWarning, match=rf"{re.escape(written.files[1])}: read 7 of 25 records"):
        result = kerasfast.fit(model(), written.out_dir, epochs=1, batch_size=8, on_error="skip", run_dir=False,
                               verbose=0)
    assert np.isfinite(result.history.history["loss"][-1])
