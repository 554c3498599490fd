"""Bad input: every case names the file (and record where it can be known) and the way out.

Damaged files are made by editing real TFRecord bytes: a flipped byte inside a
record's data breaks its CRC32C, a cut-off end truncates the last record, a
record re-written without a key no longer fits the schema.
"""

import json
import os
import re
import shutil
import struct
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasfast.data as kd
from kerasfast.errors import DataError
from tests.helpers import run_without_file_permissions_bypass

N = 12
SPEC = {"x": tf.io.FixedLenFeature([], tf.string), "y": tf.io.FixedLenFeature([], tf.int64)}


@pytest.fixture()
def dataset(tmp_path):
    """12 records (x: 8 float32, y: 0..11) in 2 shards of 6, written in order."""
    x = np.arange(N * 8, dtype=np.float32).reshape(N, 8)
    kd.write_tfrecords((x, np.arange(N)), tmp_path / "ds", shards=2, shuffle=False)
    return tmp_path / "ds"


def shard(ds_dir, i=0):
    return str(ds_dir / f"data-0000{i}-of-00002.tfrecord")


def record_offsets(path):
    data = open(path, "rb").read()
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        pos += 16 + struct.unpack_from("<Q", data, pos)[0]
    return offsets


def corrupt_data(path, index):
    """Flips one byte inside the data of record `index`: its CRC32C no longer matches."""
    data = bytearray(open(path, "rb").read())
    data[record_offsets(path)[index] + 12 + 5] ^= 0xFF
    open(path, "wb").write(bytes(data))


def truncate(path, nbytes=7):
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-nbytes])


def labels(ds):
    return sorted(int(v) for _, y in ds for v in y.numpy())


# -- missing files and patterns ------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"TFRecord file .*nope\.tfrecord not found"):
        kd.tfrecord_dataset(str(tmp_path / "nope.tfrecord"), batch_size=2, features=SPEC)


def test_empty_glob(tmp_path):
    with pytest.raises(DataError, match=r"pattern '.*\*\.tfrecord' matches no files"):
        kd.tfrecord_dataset(str(tmp_path / "*.tfrecord"), batch_size=2)


def test_shard_listed_in_schema_is_missing(dataset):
    os.remove(shard(dataset, 1))
    with pytest.raises(DataError, match=r"shard .*data-00001-of-00002\.tfrecord listed in .*schema\.json is missing"):
        kd.tfrecord_dataset(dataset, batch_size=2)


def test_files_without_schema_need_a_spec(dataset):
    os.remove(dataset / "schema.json")
    with pytest.raises(DataError, match=r"no schema\.json beside .*interrupted.*features="):
        kd.tfrecord_dataset(dataset, batch_size=2)


def test_stale_file_not_in_schema(dataset):
    shutil.copy(shard(dataset, 0), dataset / "data-00000-of-00008.tfrecord")
    with pytest.raises(DataError, match=r"data-00000-of-00008\.tfrecord is not listed in .*schema\.json"):
        kd.tfrecord_dataset(str(dataset / "*.tfrecord"), batch_size=2)


# -- damaged records -----------------------------------------------------

def test_truncated_last_record_of_kerasfast_file(dataset):
    truncate(shard(dataset, 1))
    with pytest.raises(DataError, match=r"data-00001-of-00002\.tfrecord: is \d+ bytes but was written as \d+ bytes"):
        kd.tfrecord_dataset(dataset, batch_size=4)
    with pytest.warns(UserWarning, match=r"left out 1 bad.*data-00001-of-00002\.tfrecord, record 5"):
        ds = kd.tfrecord_dataset(dataset, batch_size=4, on_error="skip")
    assert labels(ds) == list(range(11))  # everything but the cut-off last record
    assert ds.kerasfast_info.num_records == 11 and ds.kerasfast_info.skipped[0].kind == "truncated"


def test_truncated_last_record_of_foreign_file(tmp_path, dataset):
    # No schema, so no sizes to compare: the quick check passes and TensorFlow fails mid-read.
    path = str(tmp_path / "foreign.tfrecord")
    shutil.copy(shard(dataset, 0), path)
    truncate(path)
    ds = kd.tfrecord_dataset(path, batch_size=2, features=SPEC, label="y", shuffle=False)
    with pytest.raises(tf.errors.DataLossError) as caught:
        list(ds)
    explained = kd.explain_data_error(caught.value, ds)
    assert isinstance(explained, DataError)
    assert "foreign.tfrecord, record 5" in str(explained) and "truncated" in str(explained)
    with pytest.raises(DataError, match=r"foreign\.tfrecord, record 5 \(byte offset \d+\): record 5 is truncated"):
        kd.tfrecord_dataset(path, batch_size=2, features=SPEC, label="y", validate="full")


def test_corrupted_record_is_located_and_skipped_without_losing_the_rest(dataset):
    corrupt_data(shard(dataset, 0), 2)  # shard 0 holds labels 0, 2, 4, ... (round-robin): record 2 is label 4
    report = kd.check_tfrecords(dataset)
    assert not report.ok and [(p.kind, p.index) for p in report.problems] == [("bad_data_crc", 2)]
    with pytest.raises(DataError, match=r"data-00000-of-00002\.tfrecord, record 2 .*fails the CRC32C check"):
        kd.tfrecord_dataset(dataset, batch_size=4, validate="full")
    with pytest.warns(UserWarning, match="left out 1 bad"):
        ds = kd.tfrecord_dataset(dataset, batch_size=4, on_error="skip")
    # TensorFlow's ignore_errors() would also drop the records after the bad one; kerasfast keeps them.
    assert labels(ds) == [i for i in range(N) if i != 4]
    assert ds.kerasfast_info.steps_per_epoch == 3


def flip_length(path, index):
    """Flips one byte of record `index`'s length header: its header CRC no longer matches."""
    data = bytearray(open(path, "rb").read())
    data[record_offsets(path)[index] + 1] ^= 0x01
    open(path, "wb").write(bytes(data))


def cut_inside(path, index):
    """Cuts the file in the middle of record `index`."""
    open(path, "r+b").truncate(record_offsets(path)[index] + 20)


@pytest.mark.parametrize("damage", [corrupt_data, flip_length, cut_inside],
                         ids=["flipped payload byte", "flipped length header", "truncated record"])
def test_damage_after_the_check_is_named_in_a_users_loop_and_in_model_fit(dataset, damage):
    ds = kd.tfrecord_dataset(dataset, batch_size=4, shuffle=False)  # the quick check passes: the files are whole
    damage(shard(dataset, 1), 4)
    # TensorFlow's own error ("corrupted record at 372", "truncated record at ...") names no file; the pass's
    # record count names it, and the tool that finds the record.
    # Reading stops at the damaged record 4: the count says where.
    named = re.escape(f"{shard(dataset, 1)} ends after 4 of the 6 records that schema.json promises for it: "
                      f"record 4 is damaged")
    with pytest.raises(tf.errors.InvalidArgumentError, match=named) as caught:
        labels(ds)
    assert re.search(re.escape(f"check_tfrecords({shard(dataset, 1)}) names the bad record"), str(caught.value))
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(tf.errors.InvalidArgumentError, match=named):
        model.fit(ds.map(lambda x, y: (x, tf.cast(y, "float32"))), verbose=0)
    offset = record_offsets(shard(dataset, 1))[4]
    explained = str(ds.kerasfast_info.explain(caught.value))
    assert f"data-00001-of-00002.tfrecord, record 4 (byte offset {offset})" in explained
    assert "on_error='skip'" in explained


@pytest.mark.parametrize("damage", [corrupt_data, flip_length], ids=["flipped payload byte", "flipped length header"])
def test_a_damaged_first_record_is_named_like_any_other(dataset, damage):
    ds = kd.tfrecord_dataset(dataset, batch_size=4, shuffle=False)
    damage(shard(dataset, 0), 0)
    named = re.escape(f"{shard(dataset, 0)} ends after 0 of the 6 records that schema.json promises for it: "
                      f"record 0 is damaged")
    with pytest.raises(tf.errors.InvalidArgumentError, match=named):
        labels(ds)


def test_a_damaged_record_is_named_by_the_count_read_whatever_the_shuffle(tmp_path):
    n = 200  # enough records that the shuffle buffer spreads a short file's padding over several batches
    kd.write_tfrecords({"x": np.arange(n), "label": np.arange(n) % 3}, tmp_path / "ds", shards=2, shuffle=False)
    corrupt_data(shard(tmp_path / "ds"), 50)
    assert kd.locate_damage(tmp_path / "ds").index == 50
    named = re.escape(f"{shard(tmp_path / 'ds')} ends after 50 of the 100 records that schema.json promises for "
                      f"it: record 50 is damaged")
    for seed in range(3):
        with pytest.raises(tf.errors.InvalidArgumentError, match=named):
            labels(kd.tfrecord_dataset(tmp_path / "ds", batch_size=8, seed=seed))


# -- never silently short: every pass counts each file against schema.json ---------

def cut_at_record(path, index):
    """Cuts the file at the start of record `index`: every record left is whole, so no CRC can tell."""
    open(path, "r+b").truncate(record_offsets(path)[index])


def test_a_file_cut_at_a_record_boundary_after_the_check_is_named_in_a_users_loop_and_in_model_fit(dataset):
    ds = kd.tfrecord_dataset(dataset, batch_size=4, shuffle=False)  # the quick check passes: the files are whole
    assert labels(ds) == list(range(N))
    cut_at_record(shard(dataset, 1), 3)  # 3 of its 6 records left
    named = re.escape(f"{shard(dataset, 1)} ends after 3 of the 6 records that schema.json promises")
    with pytest.raises(tf.errors.InvalidArgumentError, match=named) as caught:
        labels(ds)
    assert "pass on_error=skip" in str(caught.value)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(tf.errors.InvalidArgumentError, match=named):
        model.fit(ds.map(lambda x, y: (x, tf.cast(y, "float32"))), verbose=0)
    explained = str(kd.damage_error(ds, caught.value))
    assert "holds 3 records but schema.json says 6" in explained and shard(dataset, 1) in explained


def test_a_shard_cut_short_without_checks_still_fails_and_on_error_skip_reads_what_is_left(dataset):
    cut_at_record(shard(dataset, 0), 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(f"{shard(dataset, 0)} ends after 4 of the 6")):
        labels(kd.tfrecord_dataset(dataset, batch_size=4, shuffle=False, validate="none"))
    with pytest.warns(UserWarning, match="holds 4 records but schema.json says 6"):
        ds = kd.tfrecord_dataset(dataset, batch_size=4, shuffle=False, on_error="skip")
    assert labels(ds) == sorted([0, 2, 4, 6, *range(1, N, 2)])  # shard 0 holds the even labels, 4 of them left


def test_a_file_holding_more_records_than_schema_json_promises_is_named_by_the_full_check(dataset):
    schema = json.loads((dataset / "schema.json").read_text())
    schema["shards"][1]["num_records"] -= 2  # a hand edit: the byte sizes still match, so the quick check passes
    schema["num_records"] -= 2
    (dataset / "schema.json").write_text(json.dumps(schema))
    # The full check (and check_tfrecords) counts every file's records. Each pass
    # reads what schema.json promises: a per-record check there cost a quarter of
    # the image reader's speed and two thirds of the text reader's (benchmarks/input_pipeline.py).
    with pytest.raises(DataError, match=re.escape(
            f"{shard(dataset, 1)}: holds more records than schema.json promises: 6 records where schema.json "
            f"says 4")):
        kd.tfrecord_dataset(dataset, batch_size=4, shuffle=False, validate="full")
    assert kd.check_tfrecords(dataset).summary().startswith(
        f"1 file(s) hold more records than schema.json promises (2 more; 12 readable, 10 promised): first "
        f"problem at {shard(dataset, 1)};")
    # on_error="skip": the extra records are whole, so every record is read, with a warning.
    with pytest.warns(UserWarning, match="reading all 12 records, 2 more than the 10 that schema.json promises"):
        ds = kd.tfrecord_dataset(dataset, batch_size=4, shuffle=False, on_error="skip")
    assert labels(ds) == list(range(N))


def test_a_shard_deleted_after_the_check_is_named(dataset):
    ds = kd.tfrecord_dataset(dataset, batch_size=4, shuffle=False)
    os.remove(shard(dataset, 1))
    with pytest.raises(tf.errors.NotFoundError, match=re.escape(shard(dataset, 1))):
        labels(ds)


def test_a_shard_that_cannot_be_read_after_the_check_is_named_and_never_retried(dataset):
    ds = kd.tfrecord_dataset(dataset, batch_size=4, shuffle=False)
    os.remove(shard(dataset, 1))
    os.mkdir(shard(dataset, 1))  # opens, but every read fails: the error is raised, not skipped or retried
    with pytest.raises(tf.errors.OpError, match=re.escape(shard(dataset, 1))):
        labels(ds)


# -- whole files that are not what they claim -----------------------------

def test_not_a_tfrecord_file(tmp_path):
    path = tmp_path / "notes.tfrecord"
    path.write_text("just some text, not records\n")
    with pytest.raises(DataError, match=r"notes\.tfrecord: is not a TFRecord file .*remove it"):
        kd.tfrecord_dataset(str(path), batch_size=2, features=SPEC)


def test_skip_leaves_out_an_unreadable_file_and_names_it(tmp_path, dataset):
    good = shutil.copy(shard(dataset, 0), tmp_path / "good.tfrecord")
    (tmp_path / "junk.tfrecord").write_bytes(b"PK\x03\x04 a zip file, not records")
    with pytest.warns(UserWarning, match=r"junk\.tfrecord: is not a TFRecord file"):
        ds = kd.tfrecord_dataset(str(tmp_path / "*.tfrecord"), batch_size=4, features=SPEC, label="y",
                                 on_error="skip")
    assert labels(ds) == [0, 2, 4, 6, 8, 10] and ds.kerasfast_info.files[0] == str(good)


def test_a_shard_that_is_a_folder_is_named_before_reading_and_skip_leaves_it_out(dataset):
    os.remove(shard(dataset, 1))
    os.mkdir(shard(dataset, 1))
    with pytest.raises(DataError, match=re.escape(shard(dataset, 1)) + r": is a folder, not a TFRecord file"):
        kd.tfrecord_dataset(dataset, batch_size=4)
    report = kd.check_tfrecords(dataset)
    assert not report.ok and f"{shard(dataset, 1)}: is a folder, not a TFRecord file" in report.summary()
    with pytest.warns(UserWarning, match=r"reading 6 of the 12 records .* is a folder"):
        ds = kd.tfrecord_dataset(dataset, batch_size=4, shuffle=False, on_error="skip")
    assert labels(ds) == [0, 2, 4, 6, 8, 10]


def test_a_schema_json_of_another_dataset_is_what_the_check_leads_with(dataset, tmp_path):
    other = kd.write_tfrecords({"img": np.zeros((20, 3, 3), np.uint8), "label": np.arange(20)}, tmp_path / "other",
                               shards=2)
    shutil.copy(os.path.join(other.out_dir, "schema.json"), dataset / "schema.json")
    summary = kd.check_tfrecords(dataset).summary()
    # It led with "2 file(s) hold more records than schema.json promises", a consequence of this.
    assert summary.startswith(f"none of the {N} records matches {dataset / 'schema.json'}: it probably describes "
                              "another dataset"), summary


_READ_WITHOUT_PERMISSIONS = """
import sys, warnings
import kerasfast.data as kd
from kerasfast.errors import DataError
for options in ({}, {"on_error": "skip"}):
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ds = kd.tfrecord_dataset(sys.argv[1], batch_size=4, shuffle=False, **options)
            print("read", sorted(int(v) for _, y in ds for v in y.numpy()), [str(w.message) for w in caught])
    except DataError as error:
        print("DataError", str(error).replace("\\n", " "))
"""


def test_files_without_read_permission_are_named_and_skip_leaves_a_shard_out(dataset):
    command = [sys.executable, "-c", _READ_WITHOUT_PERMISSIONS, str(dataset)]
    os.chmod(shard(dataset, 1), 0)
    done = run_without_file_permissions_bypass(command)
    assert done.returncode == 0, done.stderr[-3000:]
    refused, skipped = done.stdout.strip().splitlines()[-2:]
    assert refused.startswith("DataError") and f"{shard(dataset, 1)}: cannot be read (Permission denied)" in refused
    assert skipped.startswith("read [0, 2, 4, 6, 8, 10]") and "cannot be read (Permission denied)" in skipped
    os.chmod(shard(dataset, 1), 0o644)
    os.chmod(dataset / "schema.json", 0)
    done = run_without_file_permissions_bypass(command)
    assert done.stdout.count(f"schema file {dataset / 'schema.json'} cannot be read (Permission denied)") == 2, \
        done.stdout + done.stderr[-3000:]


_CACHE_IN = """
import sys
import kerasfast.data as kd
from kerasfast.errors import DataError
try:
    kd.tfrecord_dataset(sys.argv[1], batch_size=4, cache=sys.argv[2])
except DataError as error:
    print("DataError", error)
"""


def test_a_file_cache_in_a_folder_that_cannot_be_written_is_refused_when_the_dataset_is_made(dataset, tmp_path):
    # TensorFlow's own error came at the first batch: PermissionDeniedError from IteratorGetNext.
    (tmp_path / "read_only").mkdir(mode=0o555)
    done = run_without_file_permissions_bypass(
        [sys.executable, "-c", _CACHE_IN, str(dataset), str(tmp_path / "read_only" / "cache")])
    assert f"DataError cache='{tmp_path / 'read_only' / 'cache'}': its folder {tmp_path / 'read_only'} cannot be " \
           "written" in done.stdout, done.stdout + done.stderr[-3000:]
    assert not list((tmp_path / "read_only").iterdir())


def test_gzip_file_read_as_uncompressed_and_the_reverse(tmp_path):
    x, y = np.zeros((6, 3), np.float32), np.arange(6)
    gz = kd.write_tfrecords((x, y), tmp_path / "gz", shards=1, compression="GZIP").files[0]
    plain = kd.write_tfrecords((x, y), tmp_path / "plain", shards=1).files[0]
    with pytest.raises(DataError, match=r"is GZIP-compressed but is read as uncompressed; pass compression='GZIP'"):
        kd.tfrecord_dataset(gz, batch_size=2, compression=None)
    with pytest.raises(DataError, match=r"is uncompressed but is read as GZIP-compressed; pass compression=None"):
        kd.tfrecord_dataset(plain, batch_size=2, compression="GZIP")
    # The default detects it instead.
    assert labels(kd.tfrecord_dataset(gz, batch_size=2)) == list(range(6))


def test_truncated_gzip_file(tmp_path):
    x, y = np.random.default_rng(0).random((30, 16)).astype(np.float32), np.arange(30)
    path = kd.write_tfrecords((x, y), tmp_path, shards=1, compression="GZIP", shuffle=False).files[0]
    os.remove(tmp_path / "schema.json")  # as if copied without it: only the bytes can tell
    truncate(path, 200)
    spec = {"x": tf.io.FixedLenFeature([], tf.string), "y": tf.io.FixedLenFeature([], tf.int64)}
    with pytest.warns(UserWarning, match=r"left out 1 bad"):
        ds = kd.tfrecord_dataset(path, batch_size=8, features=spec, label="y", on_error="skip")
    problem = ds.kerasfast_info.skipped[0]
    assert problem.kind == "truncated" and "GZIP-compressed stream breaks" in problem.message
    got = labels(ds)
    assert got == list(range(len(got))) and 0 < len(got) < 30  # the records before the cut, in order


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_a_compressed_file_cut_short_is_never_read_short(tmp_path, compression):
    x, y = np.random.default_rng(0).random((50, 64)).astype(np.float32), np.arange(50)
    written = kd.write_tfrecords((x, y), tmp_path, shards=2, compression=compression, shuffle=False)
    cut, whole = written.files
    open(cut, "r+b").truncate(os.path.getsize(cut) // 3)
    with pytest.raises(DataError, match=re.escape(f"{cut}: is ")):  # the check before reading: its size
        kd.tfrecord_dataset(tmp_path, batch_size=8)
    # Without that check, the pass's count: TensorFlow alone read the first records and stopped without an error.
    promised = re.escape(f"{cut} ends after ") + r"\d+" + re.escape(" of the 25 records that schema.json promises")
    with pytest.raises(tf.errors.InvalidArgumentError, match=promised):
        labels(kd.tfrecord_dataset(tmp_path, batch_size=8, shuffle=False, validate="none"))
    with pytest.warns(UserWarning) as caught:
        ds = kd.tfrecord_dataset(tmp_path, batch_size=8, shuffle=False, on_error="skip")
    got = labels(ds)
    read_of_cut = sum(1 for v in got if v % 2 == 0)  # shard 0 holds the even labels, in order
    assert 0 < read_of_cut < 25 and got == sorted([*range(0, 2 * read_of_cut, 2), *range(1, 50, 2)])
    message = str(caught[0].message)
    assert f"reading {len(got)} of the 50 records schema.json promises, {50 - len(got)} left out" in message
    assert f"{cut}, record {read_of_cut} (byte offset" in message and whole not in message


# -- content that does not match ------------------------------------------

def test_schema_not_matching_the_records(dataset):
    schema = json.loads((dataset / "schema.json").read_text())
    schema["features"][0]["name"] = "pixels"  # the records hold "x"
    (dataset / "schema.json").write_text(json.dumps(schema))
    with pytest.raises(DataError, match=r"record 0 .*does not match the schema .*pixels"):
        kd.tfrecord_dataset(dataset, batch_size=2)


@pytest.mark.parametrize("shape, dtype", [([9], None), ([4], None), ([2], None), ([], None), ([4], "int16")],
                         ids=["9 values", "4 values", "2 values", "a scalar", "16-bit integers"])
def test_schema_with_wrong_shape(dataset, shape, dtype):
    # The records hold 8 float32; shapes that divide the bytes evenly must not read as misaligned batches.
    schema = json.loads((dataset / "schema.json").read_text())
    schema["features"][0]["shape"] = shape
    if dtype:
        schema["features"][0]["dtype"] = dtype
    (dataset / "schema.json").write_text(json.dumps(schema))
    with pytest.raises(DataError, match=r"record 0 .*does not decode with the schema"):
        kd.tfrecord_dataset(dataset, batch_size=2)
    assert not kd.check_tfrecords(dataset).ok
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature x: a record holds another number"):
        labels(kd.tfrecord_dataset(dataset, batch_size=2, validate="none"))


def test_images_that_fail_to_decode(tmp_path):
    good = tf.io.encode_png(np.full((4, 4, 3), 7, np.uint8)).numpy()
    broken = good[:20] + b"\x00" * 30  # a PNG header with a garbage body
    kd.write_tfrecords(({"image": good if i != 3 else broken, "label": i} for i in range(6)),
                       tmp_path, label="label", shards=1)
    schema = json.loads((tmp_path / "schema.json").read_text())
    schema["features"][0].update(dtype="uint8", shape=[4, 4, 3], encoding="png")  # bytes are PNG images
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    with pytest.raises(DataError, match=r"data-00000-of-00001\.tfrecord, record 3 .*image feature 'image' cannot be "
                                        r"decoded"):
        kd.tfrecord_dataset(tmp_path, batch_size=2, validate="full")
    with pytest.warns(UserWarning, match="left out 1 bad"):
        ds = kd.tfrecord_dataset(tmp_path, batch_size=2, on_error="skip", shuffle=False)
    assert labels(ds) == [0, 1, 2, 4, 5]
    assert ds.kerasfast_info.skipped[0].kind == "decode"


def test_invalid_arguments_are_refused_clearly(dataset):
    with pytest.raises(DataError, match="batch_size"):
        kd.tfrecord_dataset(dataset, batch_size=0)
    with pytest.raises(DataError, match="on_error"):
        kd.tfrecord_dataset(dataset, batch_size=2, on_error="ignore")
    with pytest.raises(DataError, match="validate='full'"):
        kd.tfrecord_dataset(dataset, batch_size=2, on_error="skip", validate="quick")
    with pytest.raises(DataError, match="compression"):
        kd.write_tfrecords((np.zeros((2, 1)),), dataset / "x", compression="bz2")
    with pytest.raises(DataError, match="label 'nope'"):
        kd.tfrecord_dataset(dataset, batch_size=2, label="nope")


@pytest.mark.parametrize("arguments, message", [
    ({"cycle_length": 0}, r"cycle_length=0: pass an integer >= 1"),
    ({"prefetch": -5}, r"prefetch=-5: pass an integer >= 0"),
    ({"shuffle_buffer": 2.5}, r"shuffle_buffer=2.5: pass an integer"),
    ({"repeat": "yes"}, r"repeat='yes': pass False \(one pass\), True \(forever\) or a number of passes"),
    ({"repeat": 2.5}, r"repeat=2.5"),
    ({"cache": "disk"}, r"cache='disk' would write cache files named disk\.\* into the working directory"),
    ({"cache": 3}, r"cache=3: use None, 'memory' or a file path prefix"),
    ({"worker_index": 1}, r"worker_index=1 needs num_workers= too"),
    ({"batch_size": 64, "drop_remainder": True}, r"drops all 12 records this pipeline reads"),
], ids=["cycle_length", "prefetch", "shuffle_buffer", "repeat word", "repeat fraction", "cache bare name",
        "cache number", "worker_index alone", "drop every record"])
def test_bad_reading_arguments_name_themselves_before_reading(dataset, arguments, message):
    with pytest.raises(DataError, match=message):
        kd.tfrecord_dataset(dataset, **{"batch_size": 4, **arguments})


def test_numpy_counts_are_taken_as_keras_takes_them(dataset):
    ds = kd.tfrecord_dataset(dataset, batch_size=np.int64(5), cycle_length=np.int32(2), repeat=np.int64(2),
                             shuffle=False)
    assert ds.kerasfast_info.settings.batch_size == 5 and isinstance(ds.kerasfast_info.settings.batch_size, int)
    assert labels(ds) == sorted(list(range(N)) * 2)


def test_a_file_cache_is_never_served_after_the_dataset_is_written_again(tmp_path):
    # TensorFlow reuses a complete cache by its prefix alone: each version of the files gets a prefix of its own.
    folder, cache = tmp_path / "ds", tmp_path / "cache" / "train"
    x = np.zeros((10, 2), np.float32)
    kd.write_tfrecords((x, np.arange(10)), folder, shards=2)
    assert labels(kd.tfrecord_dataset(folder, batch_size=4, cache=str(cache))) == list(range(10))
    kd.write_tfrecords((x, np.arange(10) + 100), folder, shards=2)
    again = kd.tfrecord_dataset(folder, batch_size=4, cache=str(cache))
    assert labels(again) == list(range(100, 110))
    assert again.kerasfast_info.settings.cache.startswith(f"{cache}.kf-")
    assert labels(again) == list(range(100, 110))  # the second pass reads the new cache


@pytest.mark.parametrize("records, message", [
    ([np.int8(1), np.int8(2), 1000], r"record 2 feature 'v' holds 1000, which the first record's int8 cannot hold"),
    ([np.int16(1), np.array([2, 70000])[1]], r"record 1 feature 'v' holds 70000, which the first record's int16"),
    ([np.array([0.5, 1], np.float16), np.array([1e6, 0.1])],
     r"record 1 feature 'v' holds 1000000.0, which the first record's float16 cannot hold"),
    ([[1, 2], [[1, 2], [3]]], r"record 1 feature 'v' is not a rectangular array"),
], ids=["int8 wraps", "int16 wraps", "float16 overflows", "ragged"])
def test_a_value_the_first_records_feature_cannot_hold_is_refused(tmp_path, records, message):
    with pytest.raises(DataError, match=message):
        kd.write_tfrecords(iter([{"v": value, "label": 0} for value in records]), tmp_path / "out", shards=1)
    assert not (tmp_path / "out").exists()


# -- counts against the schema, locating damage after TensorFlow failed ---------

def drop_key(path, index, key="x"):
    """Rewrites the file with record `index` re-serialized without `key` (a record the schema does not fit)."""
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    example = tf.train.Example.FromString(records[index])
    del example.features.feature[key]
    records[index] = example.SerializeToString()
    with tf.io.TFRecordWriter(path) as w:
        for r in records:
            w.write(r)


def retype_key(path, index, key="y"):
    """Rewrites the file with record `index`'s int64 `key` stored as a float instead."""
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    example = tf.train.Example.FromString(records[index])
    value = float(example.features.feature[key].int64_list.value[0])
    example.features.feature[key].CopyFrom(tf.train.Feature(float_list=tf.train.FloatList(value=[value])))
    records[index] = example.SerializeToString()
    with tf.io.TFRecordWriter(path) as w:
        for r in records:
            w.write(r)


@pytest.mark.parametrize("change", [drop_key, retype_key], ids=["missing key", "mistyped key"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["in order", "shuffled"])
def test_a_record_that_does_not_fit_the_schema_after_the_check_is_named_in_a_users_loop_and_in_model_fit(
        dataset, change, shuffle):
    ds = kd.tfrecord_dataset(dataset, batch_size=4, shuffle=shuffle)  # the quick check passes: the files are whole
    change(shard(dataset, 1), 4)
    # TensorFlow's own parse error, with the record's file and index as its name.
    named = re.escape(f"Name: {shard(dataset, 1)}, record 4, ")
    feature = "Feature: x (data type: string) is required" if change is drop_key else "Key: y, Index: "
    with pytest.raises(tf.errors.InvalidArgumentError, match=named) as caught:
        labels(ds)
    assert feature in str(caught.value)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(tf.errors.InvalidArgumentError, match=named):
        model.fit(ds.map(lambda x, y: (x, tf.cast(y, "float32"))), verbose=0)
    explained = str(kd.damage_error(ds, caught.value))
    assert "data-00001-of-00002.tfrecord, record 4" in explained and "on_error='skip'" in explained


def test_check_counts_readable_records_against_what_the_schema_promises(dataset):
    corrupt_data(shard(dataset, 0), 2)
    path = shard(dataset, 1)
    cut = record_offsets(path)[3] + 20  # inside record 3: it and the two after it are lost
    open(path, "r+b").truncate(cut)
    report = kd.check_tfrecords(dataset)
    assert (report.promised, report.num_records, report.num_good) == (12, 9, 8)  # 9 whole records found
    offset = record_offsets(shard(dataset, 0))[2]
    assert report.summary().startswith(
        f"8 of 12 records readable (schema.json promises 12): first damage at {shard(dataset, 0)}, record 2 "
        f"(byte offset {offset}); 2 problem(s) in 2 of 2 file(s):")
    assert "record 3 is truncated" in report.summary()
    with pytest.raises(DataError, match=r"8 of 12 records readable \(schema\.json promises 12\)"):
        kd.tfrecord_dataset(dataset, batch_size=4, validate="full")


def test_locate_damage_finds_a_flipped_byte_with_file_record_and_offset(dataset):
    assert kd.locate_damage(dataset) is None
    corrupt_data(shard(dataset, 1), 4)
    problem = kd.locate_damage(dataset)
    assert (problem.file, problem.index, problem.offset, problem.kind) == (
        shard(dataset, 1), 4, record_offsets(shard(dataset, 1))[4], "bad_data_crc")
    assert str(problem).startswith(f"{shard(dataset, 1)}, record 4 (byte offset {problem.offset}): ")
    # The same for a plain list of files without a schema: framing and CRC only.
    os.remove(dataset / "schema.json")
    assert kd.locate_damage([shard(dataset, 0), shard(dataset, 1)]).index == 4


def test_locate_damage_finds_a_truncated_file(dataset):
    truncate(shard(dataset, 0), 30)
    problem = kd.locate_damage(str(dataset / "*.tfrecord"))
    assert (problem.file, problem.index, problem.kind) == (shard(dataset, 0), 5, "truncated")
    assert problem.offset == record_offsets(shard(dataset, 0))[5]


def test_locate_damage_finds_a_record_missing_a_key(dataset):
    drop_key(shard(dataset, 1), 4)
    problem = kd.locate_damage(dataset)
    assert (problem.file, problem.index, problem.kind) == (shard(dataset, 1), 4, "parse")
    assert problem.offset == record_offsets(shard(dataset, 1))[4]
    assert "Feature: x" in problem.message and "required" in problem.message
    # on_error="skip" leaves that one record out and keeps the rest (shard 1 record 4 is label 9).
    with pytest.warns(UserWarning, match=r"left out 1 bad.*data-00001-of-00002\.tfrecord, record 4"):
        ds = kd.tfrecord_dataset(dataset, batch_size=4, on_error="skip")
    assert labels(ds) == [i for i in range(N) if i != 9]


def test_damage_error_turns_tensorflow_errors_into_data_errors(dataset):
    corrupt_data(shard(dataset, 1), 4)  # past the quick check: TensorFlow fails mid-read, without the file
    ds = kd.tfrecord_dataset(dataset, batch_size=4, shuffle=False, validate="none")
    schema = (dataset / "schema.json").read_text()
    os.remove(dataset / "schema.json")  # no counts to check: TensorFlow's own DataLossError
    with pytest.raises(tf.errors.DataLossError) as caught:
        list(kd.tfrecord_dataset(str(dataset / "*.tfrecord"), batch_size=4, shuffle=False, features=SPEC, label="y"))
    error = kd.damage_error(str(dataset / "*.tfrecord"), caught.value, features=SPEC)
    offset = record_offsets(shard(dataset, 1))[4]
    assert isinstance(error, DataError)
    assert str(error).startswith(f"{shard(dataset, 1)}, record 4 (byte offset {offset}): record 4 is corrupted")
    assert "on_error='skip'" in str(error) and "TensorFlow said: DataLossError" in str(error)
    assert str(kd.damage_error(ds, caught.value)) == str(error)  # a dataset from before will do as well
    (dataset / "schema.json").write_text(schema)

    corrupt_data(shard(dataset, 1), 4)  # flipped back: intact again
    drop_key(shard(dataset, 1), 4)  # now a parse error instead (InvalidArgumentError in TensorFlow)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        list(kd.tfrecord_dataset(dataset, batch_size=4, shuffle=False, validate="none"))
    message = str(kd.damage_error(dataset, caught.value))
    assert f"{shard(dataset, 1)}, record 4" in message and "Feature: x" in message
    assert "pass on_error='skip' to skip damaged records" in message


def test_damage_error_falls_back_to_the_original_message_and_the_files(dataset, tmp_path):
    error = tf.errors.InvalidArgumentError(None, None, "logits and labels must have the same first dimension")
    message = str(kd.damage_error(dataset, error))
    assert "finds no damage" in message and shard(dataset, 0) in message and "same first dimension" in message
    missing = str(kd.damage_error(tmp_path / "gone", tf.errors.DataLossError(None, None, "corrupted record at 0")))
    assert "gone not found" in missing and "TensorFlow said: DataLossError: corrupted record at 0" in missing


def _edit_schema(path, edit):
    schema = json.loads(path.read_text())
    path.write_text(json.dumps(edit(schema)))


@pytest.mark.parametrize("edit, message", [
    (lambda s: [], r" is not a kerasfast schema: it holds a JSON list, not an object"),
    (lambda s: {**s, "features": [{**s["features"][0], "shape": "abc"}, *s["features"][1:]]},
     r": features\[0\]\.shape is \"abc\", which should be a list of whole numbers"),
    (lambda s: {**s, "features": [{**s["features"][0], "dtype": "float99"}, *s["features"][1:]]},
     r": features\[0\]\.dtype is \"float99\", which should be one of \['bool'"),
    (lambda s: {**s, "features": [{"name": "x"}, *s["features"][1:]]}, r": features\[0\] has no 'dtype' entry"),
    (lambda s: {**s, "shards": [{**s["shards"][0], "num_records": "x"}, *s["shards"][1:]]},
     r": shards\[0\]\.num_records is \"x\", which should be a whole number"),
    (lambda s: {**s, "num_records": -3}, r": num_records is -3, which should be a whole number of records"),
    (lambda s: {**s, "features": None}, r": features is null, which should be a list of features"),
    (lambda s: {**s, "label": 5}, r": label is 5, which should be a feature name or null"),
    (lambda s: {**s, "label": "z"}, r": label 'z' is not one of the features \['x', 'y'\]"),
    (lambda s: {**s, "compression": "lz4"}, r": compression='lz4' is not supported"),
    (lambda s: {**s, "version": "one"}, r": version is \"one\", which should be a whole number"),
    (lambda s: {**s, "features": [{**s["features"][0], "shape": [None]}, *s["features"][1:]]},
     r": features\[0\]\.shape is \[null\], which should be a list of whole numbers for feature 'x', stored raw "
     r"with one fixed shape \(such as \[4\]"),
], ids=["top-level list", "shape", "dtype", "feature entry missing", "shard count", "num_records", "features null",
        "label type", "label name", "compression", "version", "raw shape that varies"])
def test_a_malformed_schema_json_is_named_with_its_entry_and_value(dataset, edit, message):
    _edit_schema(dataset / "schema.json", edit)
    for read in (lambda: kd.tfrecord_dataset(dataset, batch_size=2), lambda: kd.check_tfrecords(dataset)):
        with pytest.raises(DataError, match=re.escape(str(dataset / "schema.json")) + message) as caught:
            read()
        assert "re-run the conversion" in str(caught.value)


# -- shard names must stay inside the dataset folder ---------------------------

@pytest.mark.parametrize("entry", ["../x.tfrecord", "/etc/passwd", "sub/../../x.tfrecord", "..\\x.tfrecord", ""])
def test_schema_naming_files_outside_its_folder_is_refused(dataset, entry):
    schema = json.loads((dataset / "schema.json").read_text())
    schema["shards"][1]["file"] = entry
    (dataset / "schema.json").write_text(json.dumps(schema))
    pattern = rf"{re.escape(str(dataset / 'schema.json'))} lists shard {re.escape(repr(entry))}, which is not a " \
              rf"file inside the dataset folder"
    with pytest.raises(DataError, match=pattern):
        kd.tfrecord_dataset(dataset, batch_size=2)
    with pytest.raises(DataError, match=pattern):
        kd.check_tfrecords(str(dataset / "*.tfrecord"))


def test_record_keys_that_become_one_feature_name_are_refused(tmp_path):
    with pytest.raises(DataError, match=r"keys \[0, '0'\] all become the feature name\(s\) \['0'\]"):
        kd.write_tfrecords(iter([{0: 1.0, "0": 2.0, "label": 0}]), tmp_path / "out", shards=1)
    assert not (tmp_path / "out").exists()


def test_shards_in_the_folder_that_schema_json_does_not_list_are_named(tmp_path):
    # An edited (or older) schema.json listing 2 of 4 shards read half the records, and check_tfrecords passed.
    kd.write_tfrecords((np.zeros((40, 2), "float32"), np.arange(40) % 3), tmp_path / "data", shards=4)
    schema_path = tmp_path / "data" / "schema.json"
    schema = json.loads(schema_path.read_text())
    schema["shards"] = schema["shards"][:2]
    schema["num_records"] = sum(shard["num_records"] for shard in schema["shards"])
    schema_path.write_text(json.dumps(schema))
    pattern = r"2 TFRecord file\(s\) in .* are not listed in .*schema\.json and are not read: data-00002-of-00004"
    with pytest.warns(UserWarning, match=pattern):
        kd.tfrecord_dataset(tmp_path / "data", batch_size=8)
    with pytest.warns(UserWarning, match=pattern):
        kd.check_tfrecords(tmp_path / "data")
