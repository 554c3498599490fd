"""Damaged TFRecords met inside `fit`: named (file, record, byte offset) in
a DataError with the way out, or skipped with on_error='skip'."""

import pathlib
import struct

import keras
import numpy as np
import pytest

import kerasfast
from kerasfast.errors import DataError


def _records(tmp_path, name="train", n=600):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    written = kerasfast.data.write_tfrecords((x, y), tmp_path / name, shards=3)
    return pathlib.Path(written.out_dir)


def _flip_a_byte(folder):
    """Flips one byte in the middle of the second shard (inside a record's payload)."""
    shard = sorted(folder.glob("*.tfrecord*"))[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return shard


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer="adam")
    return model


def test_damaged_training_records_are_named_inside_fit(tmp_path):
    folder = _records(tmp_path)
    shard = _flip_a_byte(folder)
    with pytest.raises(DataError) as raised:
        kerasfast.fit(_model(), folder, epochs=1, batch_size=32, run_dir=False, verbose=0)
    message = str(raised.value)
    assert shard.name in message and "record" in message and "byte offset" in message
    assert "on_error='skip'" in message


def test_damaged_validation_records_are_named_too(tmp_path):
    train, validation = _records(tmp_path), _records(tmp_path, "val", 300)
    shard = _flip_a_byte(validation)
    with pytest.raises(DataError, match=shard.name):
        kerasfast.fit(_model(), train, validation_data=validation, epochs=1, batch_size=32, run_dir=False, verbose=0)


@pytest.mark.parametrize("where", ["x", "validation_data"])
def test_damage_in_a_tfrecord_dataset_given_to_fit_is_named_as_for_its_folder(tmp_path, where):
    folder = _records(tmp_path)
    dataset = kerasfast.data.tfrecord_dataset(folder, batch_size=32)  # checked now; damaged below
    shard = _flip_a_byte(folder)
    x, y = np.zeros((64, 8), "float32"), np.zeros(64, "int64")
    data = {"x": dataset} if where == "x" else {"x": x, "y": y, "validation_data": dataset}
    with pytest.raises(DataError) as raised:
        kerasfast.fit(_model(), epochs=1, batch_size=32, run_dir=False, verbose=0, tune="off", **data)
    assert shard.name in str(raised.value) and "byte offset" in str(raised.value)


def test_on_error_skip_trains_on_the_readable_records(tmp_path):
    folder = _records(tmp_path)
    _flip_a_byte(folder)
    with pytest.warns(UserWarning, match="skip"):
        result = kerasfast.fit(_model(), folder, epochs=1, batch_size=32, on_error="skip", run_dir=False, verbose=0)
    assert np.isfinite(result.history.history["loss"][-1])


def test_an_unknown_on_error_is_refused(tmp_path):
    with pytest.raises(kerasfast.PlanError, match="on_error='ignore' is not valid"):
        kerasfast.fit(_model(), _records(tmp_path), on_error="ignore", run_dir=False, verbose=0)


class _CutAShardAfterTheFirstEpoch(keras.callbacks.Callback):
    """Cuts a shard after its first 100 records once fit has checked the files, before it reads them (later, a
    prefetching pipeline may already hold the whole file): every record left is whole."""

    def __init__(self, shard):
        super().__init__()
        self.shard = shard

    def on_train_begin(self, logs=None):
        data, end = self.shard.read_bytes(), 0
        for _ in range(100):  # each record: 8-byte length, 4-byte CRC, the data, 4-byte CRC
            end += 16 + struct.unpack_from("<Q", data, end)[0]
        self.shard.write_bytes(data[:end])


def test_a_shard_cut_short_during_the_run_is_named_with_its_counts(tmp_path):
    folder = _records(tmp_path)
    shard = sorted(folder.glob("*.tfrecord*"))[0]
    with pytest.raises(DataError) as raised:
        kerasfast.fit(_model(), folder, epochs=2, batch_size=32, run_dir=False, verbose=0,
                      callbacks=[_CutAShardAfterTheFirstEpoch(shard)])
    message = str(raised.value)
    assert f"{shard}: holds 100 records but schema.json says 200" in message, message
