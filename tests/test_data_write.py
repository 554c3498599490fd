"""write_tfrecords: every source kind, shards, schema, atomic and repeated writes, CLI."""

import decimal
import json
import os
import re
import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from click.testing import CliRunner

import kerasfast.data as kd
from kerasfast.data import sources
from kerasfast.data.cli import convert_command
from kerasfast.errors import DataError


def read_everything(path, **kwargs):
    """All elements of a dataset as NumPy, concatenated over batches."""
    ds = kd.tfrecord_dataset(path, batch_size=kwargs.pop("batch_size", 7), shuffle=False, **kwargs)
    batches = [tf.nest.map_structure(lambda t: t.numpy(), b) for b in ds]
    return tf.nest.map_structure(lambda *parts: np.concatenate(parts), *batches)


def by_label(x, y):
    return {int(label): x[i] for i, label in enumerate(y)}


def test_tuple_of_arrays_roundtrip_and_schema(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, (20, 4, 4, 3), dtype=np.uint8)
    y = np.arange(20, dtype=np.int64)
    result = kd.write_tfrecords((x, y), tmp_path, shards=3)
    assert [os.path.basename(f) for f in result.files] == [f"data-0000{i}-of-00003.tfrecord" for i in range(3)]
    assert [s.num_records for s in result.schema.shards] == [7, 7, 6]  # round-robin: equal within one record
    schema = json.loads((tmp_path / "schema.json").read_text())
    assert schema["num_records"] == 20 and schema["label"] == "y" and schema["compression"] is None
    assert schema["features"] == [
        {"name": "x", "dtype": "uint8", "shape": [4, 4, 3], "encoding": "raw"},
        {"name": "y", "dtype": "int64", "shape": [], "encoding": "int64"},
    ]
    got_x, got_y = read_everything(tmp_path)
    assert sorted(got_y.tolist()) == list(range(20))
    got = by_label(got_x, got_y)
    for i in range(20):
        np.testing.assert_array_equal(got[i], x[i])


def test_dict_of_arrays_keeps_dtypes_shapes_and_strings(tmp_path):
    n = 6
    data = {
        "f64": np.linspace(0, 1, n),                          # float64 scalar: stored raw, exact
        "vec": np.arange(n * 3, dtype=np.float32).reshape(n, 3),
        "flag": np.array([True, False] * 3),
        "word": np.array([f"w{i}" for i in range(n)]),
        "label": np.arange(n, dtype=np.int32),
    }
    result = kd.write_tfrecords(data, tmp_path, shards=2, shuffle=False)
    assert result.schema.label == "label"
    encodings = {f.name: f.encoding for f in result.schema.features}
    assert encodings == {"f64": "raw", "vec": "raw", "flag": "int64", "word": "bytes", "label": "int64"}
    x, y = read_everything(tmp_path)
    order = np.argsort(y)
    assert y.dtype == np.int32 and x["flag"].dtype == bool and x["f64"].dtype == np.float64
    np.testing.assert_array_equal(x["f64"][order], data["f64"])
    np.testing.assert_array_equal(x["vec"][order], data["vec"])
    np.testing.assert_array_equal(x["flag"][order], data["flag"])
    assert [w.decode() for w in x["word"][order]] == list(data["word"])


def test_dataframe_source(tmp_path):
    df = pd.DataFrame({"a": np.arange(10, dtype=np.int64), "b": np.arange(10) / 2.0,
                       "name": [f"n{i}" for i in range(10)], "label": np.arange(10) % 2})
    result = kd.write_tfrecords(df, tmp_path, shards=2)
    assert result.num_records == 10 and result.schema.label == "label"
    x, y = read_everything(tmp_path)
    order = np.argsort(x["a"])
    np.testing.assert_array_equal(x["b"][order], df["b"].to_numpy())
    np.testing.assert_array_equal(y[order], df["label"].to_numpy())


def test_parquet_streams_in_record_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_RECORDS", 4)  # several record batches from a tiny file
    table = pa.table({"feat": pa.array(np.arange(11, dtype=np.float32)),
                      "vec": pa.array([[i, i + 1] for i in range(11)], type=pa.list_(pa.int32())),
                      "label": pa.array(np.arange(11, dtype=np.int64))})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=5)
    source = sources.open_source(str(tmp_path / "a.parquet"))
    records = source.records()
    assert source.num_records == 11 and next(records)[0].endswith("a.parquet row 0")  # a generator: lazy
    result = kd.write_tfrecords(str(tmp_path / "a.parquet"), tmp_path / "out", shards=2)
    assert result.num_records == 11
    x, y = read_everything(tmp_path / "out")
    order = np.argsort(y)
    np.testing.assert_array_equal(x["vec"][order], [[i, i + 1] for i in range(11)])


def test_csv_types_inferred_and_bad_row_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_RECORDS", 5)  # types inferred from the first 5 rows
    path = tmp_path / "t.csv"
    path.write_text("height,ratio,city,label\n" + "".join(f"{i},{i / 3:.3f},c{i},{i % 3}\n" for i in range(9)))
    result = kd.write_tfrecords(str(path), tmp_path / "out", shards=2)
    types = {f.name: f.dtype for f in result.schema.features}
    assert types == {"height": "int64", "ratio": "float32", "city": "string", "label": "int64"}
    x, y = read_everything(tmp_path / "out")
    assert sorted(x["height"].tolist()) == list(range(9))

    with open(path, "a") as fh:
        fh.write("tall,0.5,c9,1\n")
    with pytest.raises(DataError, match=r"t\.csv line 11 .*height"):
        kd.write_tfrecords(str(path), tmp_path / "out2")
    with pytest.warns(UserWarning, match="skipped 1 bad record"):
        skipped = kd.write_tfrecords(str(path), tmp_path / "out3", on_error="skip")
    assert skipped.num_records == 9 and skipped.skipped[0][0].endswith("t.csv line 11")


def _write_image(path, image, fmt):
    data = tf.io.encode_png(image) if fmt == "png" else tf.io.encode_jpeg(image, quality=100)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.numpy())


def test_image_folder_keeps_encoded_bytes_and_classes(tmp_path):
    rng = np.random.default_rng(1)
    for cls in ("cat", "dog"):
        for i in range(3):
            img = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
            _write_image(tmp_path / "src" / cls / f"{i}.png", img, "png")
    _write_image(tmp_path / "src" / "dog" / "x.jpg", np.full((6, 5, 3), 128, np.uint8), "jpeg")
    (tmp_path / "src" / "dog" / "notes.txt").write_text("not an image")
    result = kd.write_tfrecords(str(tmp_path / "src"), tmp_path / "out", shards=2)
    assert result.schema.classes == ["cat", "dog"]
    image = result.schema.feature("image")
    assert (image.encoding, image.shape, image.dtype) == ("image", (6, 5, 3), "uint8")  # PNG and JPEG mixed
    assert any("ignored" in n for n in result.notes)
    x, y = read_everything(tmp_path / "out")
    assert x.shape == (7, 6, 5, 3) and sorted(y.tolist()) == [0, 0, 0, 1, 1, 1, 1]


def test_image_folder_with_undecodable_image(tmp_path):
    _write_image(tmp_path / "a" / "0.png", np.zeros((4, 4, 3), np.uint8), "png")
    broken = tmp_path / "a" / "1.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)  # PNG signature, garbage body
    with pytest.raises(DataError, match=r"1\.png cannot be decoded as PNG"):
        kd.write_tfrecords(str(tmp_path), tmp_path / "out")
    with pytest.warns(UserWarning, match="skipped 1 bad record"):
        result = kd.write_tfrecords(str(tmp_path), tmp_path / "out", on_error="skip")
    assert result.num_records == 1 and result.skipped[0][0] == str(broken)


def test_array_images_encoded_as_png_roundtrip_exactly(tmp_path):
    x = np.random.default_rng(2).integers(0, 256, (5, 8, 8, 3), dtype=np.uint8)
    result = kd.write_tfrecords((x, np.arange(5)), tmp_path, image_encoding="png", shards=1)
    assert result.schema.feature("x").encoding == "png"
    got_x, got_y = read_everything(tmp_path)
    got = by_label(got_x, got_y)
    for i in range(5):
        np.testing.assert_array_equal(got[i], x[i])


def test_text_corpus_one_record_per_line(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("first line\n\nsecond line\n")
    (corpus / "b.txt").write_text("third line\r\n")
    result = kd.write_tfrecords(str(corpus / "*.txt"), tmp_path / "out")
    assert result.num_records == 3 and result.schema.label is None and len(result.files) == 3
    text = read_everything(tmp_path / "out")["text"]
    assert sorted(text.tolist()) == [b"first line", b"second line", b"third line"]


def test_iterable_of_dicts_streams_and_checks_every_record(tmp_path):
    def gen(n, bad_at=None):
        for i in range(n):
            yield {"v": np.zeros(3 if i != bad_at else 4, np.float32), "label": i}

    result = kd.write_tfrecords(gen(10), tmp_path / "ok", shards=4)
    assert result.schema.label == "label"  # found among the keys of the first record
    assert result.num_records == 10 and [s.num_records for s in result.schema.shards] == [3, 3, 2, 2]
    with pytest.raises(DataError, match=r"record 6 feature 'v' has shape \(4,\), record 0 had \(3,\)"):
        kd.write_tfrecords(gen(10, bad_at=6), tmp_path / "bad", label="label")


def test_rewrite_replaces_old_shards_and_failed_write_keeps_previous(tmp_path):
    x, y = np.zeros((12, 2), np.float32), np.arange(12)
    kd.write_tfrecords((x, y), tmp_path, shards=4)
    (tmp_path / ".data-00000.partial-deadbeef").write_bytes(b"left by a killed run")
    (tmp_path / "keep-me.txt").write_text("not ours")
    kd.write_tfrecords((x, y), tmp_path, shards=2)
    assert sorted(os.listdir(tmp_path)) == ["data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord",
                                           "keep-me.txt", "schema.json"]

    before = {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)}

    def failing():
        for i in range(5):
            yield {"v": np.float32(i)}
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        kd.write_tfrecords(failing(), tmp_path, shards=2)
    after = {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)}
    assert after == before  # no partial shard left, previous dataset intact and still complete
    with pytest.raises(DataError, match="overwrite=True"):
        kd.write_tfrecords((x, y), tmp_path, overwrite=False)


def test_automatic_shard_count(tmp_path, monkeypatch):
    assert kd.write_tfrecords((np.zeros((20, 1)),), tmp_path / "a").schema.shards.__len__() == 8
    assert len(kd.write_tfrecords((np.zeros((5, 1)),), tmp_path / "b").files) == 5  # never an empty shard
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": [f"h:{i}" for i in range(12)]}}))
    assert len(kd.write_tfrecords((np.zeros((40, 1)),), tmp_path / "c").files) == 12
    from kerasfast.data.writer import auto_shard_count
    assert auto_shard_count(10**9, 10 * 2**30) == 80  # ~128 MB shards for 10 GiB


@pytest.mark.parametrize("compression,suffix,magic", [("GZIP", ".gz", b"\x1f\x8b"), ("ZLIB", ".zlib", b"\x78")])
def test_compressed_shards(tmp_path, compression, suffix, magic):
    x = np.tile(np.arange(64, dtype=np.uint8), (30, 1))  # compressible
    result = kd.write_tfrecords((x, np.arange(30)), tmp_path, shards=2, compression=compression.lower())
    assert result.schema.compression == compression and result.files[0].endswith(".tfrecord" + suffix)
    assert open(result.files[0], "rb").read(len(magic)) == magic
    got_x, got_y = read_everything(tmp_path)
    assert sorted(got_y.tolist()) == list(range(30)) and (got_x == x[0]).all()


def test_cli_convert(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,label\n" + "".join(f"{i},{i % 2}\n" for i in range(10)))
    runner = CliRunner()
    out = runner.invoke(convert_command, [str(path), str(tmp_path / "out"), "--shards", "2",
                                          "--compression", "GZIP"])
    assert out.exit_code == 0, out.output
    assert "wrote 10 records to 2 shard(s)" in out.output
    assert kd.dataset_info(str(tmp_path / "out")).schema.compression == "GZIP"
    missing = runner.invoke(convert_command, [str(tmp_path / "nope.csv"), str(tmp_path / "o2")])
    assert missing.exit_code == 1 and "nope.csv does not exist" in missing.output


def test_cli_convert_errors_say_which_option_to_use(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n3,4\n")
    runner = CliRunner()
    no_such_label = runner.invoke(convert_command, [str(path), str(tmp_path / "o1"), "--label", "nope"])
    assert no_such_label.exit_code == 1 and "Traceback" not in no_such_label.output
    assert "label 'nope' is not a feature of the records ['a', 'b']" in no_such_label.output
    assert "kerasfast convert: --label NAME, or --no-label" in no_such_label.output
    not_a_folder = runner.invoke(convert_command, [str(path), str(tmp_path / "o2"), "--source-type", "images"])
    assert not_a_folder.exit_code == 1 and "Traceback" not in not_a_folder.output
    assert "source_type='images' reads a folder with one sub-folder of images per class" in not_a_folder.output
    assert f"{path} is not a folder" in not_a_folder.output
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "a.bin").write_bytes(b"\x00\x01")
    unknown_kind = runner.invoke(convert_command, [str(tmp_path / "blobs"), str(tmp_path / "o3")])
    assert unknown_kind.exit_code == 1 and "pass source_type= (kerasfast convert: --source-type)" in unknown_kind.output
    bad_type = runner.invoke(convert_command, [str(path), str(tmp_path / "o4"), "--csv-dtype", "a=int8"])
    assert bad_type.exit_code == 1 and "csv_dtypes['a']='int8' (kerasfast convert: --csv-dtype a=int8): use one of" \
        in bad_type.output
    assert not any((tmp_path / name).exists() for name in ("o1", "o2", "o3", "o4"))


@pytest.mark.slow
def test_streaming_source_keeps_memory_bounded(tmp_path):
    import tracemalloc

    def big(n=30_000):
        for i in range(n):
            yield {"blob": np.full(1024, i % 251, np.uint8), "label": i}

    tracemalloc.start()
    try:
        result = kd.write_tfrecords(big(), tmp_path, label="label", shards=4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.num_records == 30_000 and result.num_bytes > 30_000 * 1024
    assert peak < 5 * 2**20, f"peak Python memory {peak / 2**20:.1f} MiB for a ~31 MB source"


def test_files_of_another_program_named_like_shards_are_never_replaced_or_removed(tmp_path):
    out = tmp_path / "mixed"
    out.mkdir()
    with tf.io.TFRecordWriter(str(out / "data-00000-of-00001.tfrecord")) as writer:
        writer.write(b"someone else's record")
    (out / "data-00003-of-00009.tfrecord.gz").write_bytes(b"another tool's shard")
    before = sorted(os.listdir(out))
    for overwrite in (False, True):
        with pytest.raises(DataError, match=r"holds TFRecord files that no kerasfast schema.json there lists "
                                            r"\(data-00000-of-00001.tfrecord, data-00003-of-00009.tfrecord.gz\)"):
            kd.write_tfrecords({"v": np.arange(6, dtype=np.float32)}, out, shards=2, overwrite=overwrite)
        assert sorted(os.listdir(out)) == before
    # Under another prefix the dataset is written beside them; rewriting it replaces only its own shards.
    kd.write_tfrecords({"v": np.arange(6, dtype=np.float32)}, out, shards=2, prefix="mine")
    kd.write_tfrecords({"v": np.arange(4, dtype=np.float32)}, out, shards=1, prefix="mine")
    assert sorted(os.listdir(out)) == sorted([*before, "mine-00000-of-00001.tfrecord", "schema.json"])


def test_a_folder_whose_name_looks_like_a_pattern_is_read_by_its_name(tmp_path):
    out = tmp_path / "run[1]*?"
    kd.write_tfrecords({"v": np.arange(6, dtype=np.float32)}, out, shards=2)
    values = np.concatenate([batch["v"].numpy() for batch in kd.tfrecord_dataset(str(out), batch_size=4,
                                                                               shuffle=False)])
    assert sorted(values.tolist()) == list(range(6))
    assert kd.check_tfrecords(str(out)).ok


def test_a_failed_write_leaves_no_folder_it_made(tmp_path):
    out = tmp_path / "new" / "dataset"
    labels = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, "nine"], dtype=object)  # the last one cannot be encoded
    with pytest.raises(DataError):
        kd.write_tfrecords({"v": np.arange(10, dtype=np.float32), "label": labels}, out, shards=2)
    assert not out.exists()


def test_an_out_dir_that_is_a_file_or_under_one_is_named(tmp_path):
    afile = tmp_path / "t.parquet"
    afile.write_bytes(b"not a folder")
    data = {"v": np.arange(4, dtype=np.float32)}
    with pytest.raises(DataError, match=rf"out_dir {afile} is a file, not a folder"):
        kd.write_tfrecords(data, afile)
    with pytest.raises(DataError, match=rf"out_dir {afile / 'sub'} cannot be created \(Not a directory\)"):
        kd.write_tfrecords(data, afile / "sub")
    assert afile.read_bytes() == b"not a folder"


def test_sources_keras_users_pass_by_habit_are_named_or_read(tmp_path):
    x, y = np.ones((6, 3), np.float32), np.arange(6)
    with pytest.raises(DataError, match=r"a tuple of 3 arrays: write_tfrecords takes \(x,\), \(x, y\) or a dict"):
        kd.write_tfrecords((x, y, np.ones(6)), tmp_path / "weights")  # Keras's (x, y, sample_weight)
    with pytest.raises(DataError, match=r"'x' is a single value \(0-d\), not one entry per record"):
        kd.write_tfrecords((np.float32(3.0), np.int64(1)), tmp_path / "scalar")
    assert not (tmp_path / "weights").exists() and not (tmp_path / "scalar").exists()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("one\ntwo\n")
    (corpus / "b.txt").write_text("three\n")
    files = (str(corpus / "a.txt"), corpus / "b.txt")  # a tuple of paths reads like a list of them
    assert kd.write_tfrecords(files, tmp_path / "text").num_records == 3


def test_image_folder_with_alpha_and_grayscale_images_reads_back_as_rgb(tmp_path):
    rng = np.random.default_rng(3)
    photo, rgba, gray = (rng.integers(0, 256, (6, 5, c), dtype=np.uint8) for c in (3, 4, 1))
    _write_image(tmp_path / "src" / "a" / "photo.jpg", photo, "jpeg")
    _write_image(tmp_path / "src" / "b" / "icon.png", rgba, "png")  # TensorFlow decodes no JPEG with 4 channels
    _write_image(tmp_path / "src" / "c" / "scan.png", gray, "png")
    result = kd.write_tfrecords(str(tmp_path / "src"), tmp_path / "out", shards=1)
    assert result.schema.feature("image").shape == (6, 5, 3)  # as Keras's color_mode="rgb"
    assert any("1 image(s) with an alpha channel" in n and "icon.png" in n for n in result.notes)
    assert kd.check_tfrecords(str(tmp_path / "out")).ok
    x, y = read_everything(tmp_path / "out")
    got = by_label(x, y)
    np.testing.assert_array_equal(got[0], tf.io.decode_jpeg((tmp_path / "src/a/photo.jpg").read_bytes()).numpy())
    np.testing.assert_array_equal(got[1], rgba[..., :3])
    np.testing.assert_array_equal(got[2], np.repeat(gray, 3, axis=-1))

    # Grayscale with alpha (2 channels) among grayscale: read as grayscale, not refused for its 2 channels.
    gray_alpha = rng.integers(0, 256, (6, 5, 2), dtype=np.uint8)
    _write_image(tmp_path / "gray" / "a" / "0.png", gray, "png")
    _write_image(tmp_path / "gray" / "b" / "1.png", gray_alpha, "png")
    result = kd.write_tfrecords(str(tmp_path / "gray"), tmp_path / "gray-out", shards=1)
    assert result.schema.feature("image").shape == (6, 5, 1)
    got = by_label(*read_everything(tmp_path / "gray-out"))
    np.testing.assert_array_equal(got[0], gray)
    np.testing.assert_array_equal(got[1], gray_alpha[..., :1])


def test_image_folder_written_with_four_channels_by_an_earlier_version_reads_back(tmp_path):
    rng = np.random.default_rng(4)
    rgba = rng.integers(0, 256, (6, 5, 4), dtype=np.uint8)
    _write_image(tmp_path / "src" / "a" / "photo.jpg", rng.integers(0, 256, (6, 5, 3), dtype=np.uint8), "jpeg")
    _write_image(tmp_path / "src" / "b" / "icon.png", rgba, "png")
    kd.write_tfrecords(str(tmp_path / "src"), tmp_path / "out", shards=1)
    schema_path = tmp_path / "out" / "schema.json"
    schema = json.loads(schema_path.read_text())
    schema["features"][0]["shape"] = [6, 5, 4]  # what earlier versions wrote for this folder
    schema_path.write_text(json.dumps(schema))
    assert kd.check_tfrecords(str(tmp_path / "out")).ok
    got = by_label(*read_everything(tmp_path / "out"))
    photo = tf.io.decode_jpeg((tmp_path / "src/a/photo.jpg").read_bytes()).numpy()
    np.testing.assert_array_equal(got[0], np.concatenate([photo, np.full((6, 5, 1), 255, np.uint8)], axis=-1))
    np.testing.assert_array_equal(got[1], rgba)


@pytest.mark.parametrize("columns", [{0: [1.0, 2.0], "0": [3.0, 4.0]}, ["a", "a"]], ids=["0 and '0'", "a twice"])
def test_dataframe_columns_that_share_a_feature_name_are_refused(tmp_path, columns):
    if isinstance(columns, dict):
        df, shown = pd.DataFrame(columns), r"0 \(position 0\) and '0' \(position 1\)"
    else:
        df, shown = pd.DataFrame([[1.0, 2.0], [3.0, 4.0]], columns=columns), r"'a' \(position 0\) and 'a' \(position 1\)"
    with pytest.raises(DataError, match=rf"the DataFrame's columns {shown} both become the feature name"):
        kd.write_tfrecords(df, tmp_path / "out", shards=1)
    with pytest.raises(DataError, match=r"the keys 0 \(position 0\) and '0' \(position 1\) both become"):
        kd.write_tfrecords({0: np.zeros(2), "0": np.ones(2)}, tmp_path / "out", shards=1)
    assert not (tmp_path / "out").exists()


def test_csv_header_problems_are_named_and_an_excel_bom_is_dropped(tmp_path):
    dup = tmp_path / "dup.csv"
    dup.write_text("a,b,a,label\n1,2,3,0\n")
    with pytest.raises(DataError, match=r"dup\.csv has two columns named 'a' \(columns 1 and 3"):
        kd.write_tfrecords(str(dup), tmp_path / "out", shards=1)
    unnamed = tmp_path / "unnamed.csv"
    unnamed.write_text("a,,label\n1,2,0\n")
    with pytest.raises(DataError, match=r"unnamed\.csv's header leaves column 2 \(counting from 1\) without a name"):
        kd.write_tfrecords(str(unnamed), tmp_path / "out", shards=1)
    typo = tmp_path / "typo.csv"
    typo.write_text("price,label\n1,0\n2,1\n")
    with pytest.raises(DataError, match=r"csv_dtypes \(kerasfast convert: --csv-dtype\) names column\(s\) \['prcie'\] "
                                        r"that .*typo\.csv does not have "
                                        r"\('prcie': did you mean 'price'\?\); its columns are \['price', 'label'\]"):
        kd.write_tfrecords(str(typo), tmp_path / "out", csv_dtypes={"prcie": "float32"})
    assert not (tmp_path / "out").exists()

    bom = tmp_path / "excel.csv"
    bom.write_bytes("label,città\n0,1.5\n1,2.5\n".encode("utf-8-sig"))  # Excel's "CSV UTF-8"
    result = kd.write_tfrecords(str(bom), tmp_path / "out", shards=1)
    assert result.schema.label == "label" and result.schema.feature_names == ["label", "città"]


def test_csv_that_is_not_utf8_names_the_file_and_byte(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_RECORDS", 4)  # the bad byte is met while writing, past the sampled rows
    good = "name,label\n" + "".join(f"caf\u00e9 {i},{i % 2}\n" for i in range(3000))  # more than a decode chunk
    path = tmp_path / "latin1.csv"
    path.write_bytes(good.encode("utf-8") + "caf\u00e9,1\n".encode("latin-1"))
    offset = len(good.encode("utf-8")) + 3
    with pytest.raises(DataError, match=rf"latin1\.csv is not UTF-8 text: byte {offset} \(line 3002\) is 0xe9, .*"
                                        r"re-save it as UTF-8"):
        kd.write_tfrecords(str(path), tmp_path / "out", shards=1)
    assert not (tmp_path / "out").exists()


def test_csv_floats_beyond_float32_are_refused_and_float64_keeps_them_exactly(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("a,label\n0.1,0\n1e300,1\n-2.5e-310,2\ninf,3\n")
    with pytest.raises(DataError, match=r"big\.csv line 3 has 1e300 in column 'a', beyond the range of float32 "
                                        r"\(pass csv_dtypes=\{'a': 'float64'\} \(kerasfast convert: --csv-dtype a=float64\) to keep it\)"):
        kd.write_tfrecords(str(path), tmp_path / "out", shards=1)
    result = kd.write_tfrecords(str(path), tmp_path / "out", shards=1, csv_dtypes={"a": "float64"})
    assert result.schema.feature("a").dtype == "float64"
    x, y = read_everything(tmp_path / "out")
    assert x.dtype == np.float64 and x[np.argsort(y)].tolist() == [0.1, 1e300, -2.5e-310, float("inf")]


def test_a_nullable_int_column_keeps_one_dtype_and_a_missing_value_refuses_only_its_row(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_RECORDS", 4)  # the <NA> falls in the third of several chunks
    ids = pd.array(np.arange(12) + 2**53, dtype="Int64")  # int64 ids float64 would round
    ids[9] = pd.NA
    df = pd.DataFrame({"id": ids, "score": pd.array([0.5] * 11 + [None], dtype="Float64"), "label": np.arange(12)})
    with pytest.raises(DataError, match=r"row 9 has a missing value \(<NA>\) in column 'id', an integer column "
                                        r"\(Int64\) .*df\['id'\]\.fillna\(\.\.\.\).*astype\('float64'\)"):
        kd.write_tfrecords(df, tmp_path / "out", shards=1, shuffle=False)
    with pytest.warns(UserWarning, match="skipped 1 bad record"):
        result = kd.write_tfrecords(df, tmp_path / "out", shards=1, shuffle=False, on_error="skip")
    assert [location for location, _ in result.skipped] == ["row 9"]
    assert result.schema.feature("id").dtype == "int64" and result.schema.feature("score").dtype == "float64"
    x, y = read_everything(tmp_path / "out")
    assert x["id"].dtype == np.int64 and x["id"].tolist() == [2**53 + i for i in range(12) if i != 9]
    assert np.isnan(x["score"][-1]) and x["score"][:-1].tolist() == [0.5] * 10  # a float column keeps NaN


def test_csv_blank_lines_and_short_rows_leave_int_columns_int64(tmp_path):
    path = tmp_path / "ids.csv"
    path.write_text("id,label\n16777217,0\n\n16777219,1\n5\n16777221,2\n\n")  # blank lines, a short row
    with pytest.warns(UserWarning, match="skipped 1 bad record"):
        result = kd.write_tfrecords(str(path), tmp_path / "out", shards=1, on_error="skip")
    assert result.skipped == [(f"{path} line 5", "has 1 fields, the header has 2")]  # blank lines are no rows
    assert {f.name: f.dtype for f in result.schema.features} == {"id": "int64", "label": "int64"}
    x, y = read_everything(tmp_path / "out")
    assert x.tolist() == [16777217, 16777219, 16777221] and y.tolist() == [0, 1, 2]  # float32 would round them


def test_csv_empty_cell_in_an_int_column_is_refused_and_float64_reads_it_as_nan(tmp_path):
    path = tmp_path / "gaps.csv"
    path.write_text("id,label\n16777217,0\n,1\n16777219,0\n")
    with pytest.raises(DataError, match=r"gaps\.csv line 3 has an empty cell in column 'id', whose type int64 "
                                        r"\(inferred from the first rows\) cannot hold a missing value .*"
                                        r"csv_dtypes=\{'id': 'float64'\} \(kerasfast convert: --csv-dtype id=float64\)"):
        kd.write_tfrecords(str(path), tmp_path / "out", shards=1)
    kd.write_tfrecords(str(path), tmp_path / "out", shards=1, csv_dtypes={"id": "float64"})
    x, y = read_everything(tmp_path / "out")
    assert x[0] == 16777217 and np.isnan(x[1]) and x[2] == 16777219 and y.tolist() == [0, 1, 0]


def test_an_out_dir_inside_the_image_folder_is_no_class_and_an_empty_class_folder_is_named(tmp_path):
    root = tmp_path / "photos"
    for label, cls in enumerate(["cat", "dog"]):
        _write_image(root / cls / "0.png", np.full((4, 4, 3), label, np.uint8), "png")
    for _ in range(2):  # the second run finds the first run's dataset inside the folder
        result = kd.write_tfrecords(str(root), root / "_tfr", shards=1)
        assert result.schema.classes == ["cat", "dog"] and result.notes == []
        x, y = read_everything(root / "_tfr")
        assert {int(label): int(image[0, 0, 0]) for image, label in zip(x, y, strict=True)} == {0: 0, 1: 1}

    (root / "bird").mkdir()  # no images: still a class, as for Keras, but named
    with pytest.warns(UserWarning, match=r"1 class folder\(s\) hold no PNG/JPEG image: .*bird \(class 0\)"):
        result = kd.write_tfrecords(str(root), tmp_path / "out", shards=1)
    assert result.schema.classes == ["bird", "cat", "dog"]  # the dataset in photos/_tfr is no class either
    assert "1 folder(s) holding a kerasfast dataset" in result.notes[0] and "bird (class 0)" in result.notes[1]


def test_parquet_categorical_columns_are_decoded_and_a_null_in_an_int_list_refuses_its_row(tmp_path):
    df = pd.DataFrame({"color": pd.Categorical(["red", "blue", "red"]), "label": [0, 1, 0]})
    df.to_parquet(tmp_path / "cat.parquet")  # a dictionary<string> column
    kd.write_tfrecords(str(tmp_path / "cat.parquet"), tmp_path / "out", shards=1, shuffle=False)
    x, y = read_everything(tmp_path / "out")
    assert x.tolist() == [b"red", b"blue", b"red"] and y.tolist() == [0, 1, 0]

    table = pa.table({"v": pa.array([[1, 2], [3, None], [5, 6]]), "w": pa.array([[0.5], [1.5], [None]]),
                      "label": [0, 1, 2]})
    pq.write_table(table, tmp_path / "nulls.parquet")
    with pytest.raises(DataError, match=r"nulls\.parquet row 1 has a missing value \(null\) at position 1 of the "
                                        r"list in column 'v', whose int64 values cannot hold one; fill it"):
        kd.write_tfrecords(str(tmp_path / "nulls.parquet"), tmp_path / "out2", shards=1)
    with pytest.warns(UserWarning, match="skipped 1 bad record"):
        result = kd.write_tfrecords(str(tmp_path / "nulls.parquet"), tmp_path / "out2", shards=1, on_error="skip")
    assert result.num_records == 2 and result.skipped[0][0].endswith("nulls.parquet row 1")
    x, y = read_everything(tmp_path / "out2")
    assert x["v"].tolist() == [[1, 2], [5, 6]] and y.tolist() == [0, 2]
    assert x["w"][0].tolist() == [0.5] and np.isnan(x["w"][1][0])  # a null in a float list is NaN


def test_parquet_nulls_in_int_bool_string_and_list_columns_refuse_only_their_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_RECORDS", 2)  # record batches of 2 rows: rows are counted over the file
    table = pa.table({
        "i": pa.array([1, 2, 3, None, 5, 6, 7]), "b": pa.array([True, False, True, True, None, False, True]),
        "s": pa.array(["a", "b", "c", "d", "e", None, "g"]),
        "l": pa.array([[0.5, 1.0], None, [2.0, 3.0], [4.0, 5.0], [6.0, 7.0], [8.0, 9.0], [1.0, None]]),
        "label": range(7)})
    pq.write_table(table, tmp_path / "nulls.parquet")
    with pytest.raises(DataError, match=r"nulls\.parquet row 1 has a missing value \(null\) in column 'l' where a "
                                        r"list belongs: fill it"):
        kd.write_tfrecords(str(tmp_path / "nulls.parquet"), tmp_path / "out", shards=1)
    with pytest.warns(UserWarning, match="skipped 4 bad record"):
        result = kd.write_tfrecords(str(tmp_path / "nulls.parquet"), tmp_path / "out", shards=1, on_error="skip")
    assert [where.rsplit(" ", 1)[1] for where, _ in result.skipped] == ["1", "3", "4", "5"]
    reasons = dict((where.rsplit(" ", 1)[1], reason) for where, reason in result.skipped)
    assert "column 'i', an integer column (int64)" in reasons["3"] and "astype('float64')" in reasons["3"]
    assert "column 'b', a boolean column (bool)" in reasons["4"]
    # A string column gets a hint that fits it: a float column would not hold its text.
    assert "column 's', a string column" in reasons["5"] and "fillna('')" in reasons["5"]
    assert "float" not in reasons["5"]
    x, y = read_everything(tmp_path / "out")
    assert y.tolist() == [0, 2, 6] and x["i"].tolist() == [1, 3, 7] and x["s"].tolist() == [b"a", b"c", b"g"]
    assert x["b"].tolist() == [True, True, True] and np.isnan(x["l"][2][1])  # a null inside a float list is NaN


def test_a_ragged_column_of_a_dict_of_lists_is_named_with_the_fix(tmp_path):
    with pytest.raises(DataError, match=r"feature 'tokens' is not a rectangular array .*pad the lists to one length"):
        kd.write_tfrecords({"tokens": [[1, 2], [3], [4, 5]], "label": [0, 1, 0]}, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_image_encoding_jpeg_refuses_rgba_arrays_and_an_encoding_that_applies_to_nothing_is_named(tmp_path):
    rgba = np.random.default_rng(0).integers(0, 256, (3, 8, 8, 4), dtype=np.uint8)
    with pytest.raises(DataError, match=r"feature 'image' is a uint8 image with 4 channels \(RGBA\), which "
                                        r"image_encoding='jpeg' cannot store: JPEG has no alpha channel. Pass "
                                        r"image_encoding='png'"):
        kd.write_tfrecords({"image": rgba}, tmp_path / "out", image_encoding="jpeg", shards=1)
    result = kd.write_tfrecords({"image": rgba}, tmp_path / "out", image_encoding="png", shards=1, shuffle=False)
    assert result.schema.feature("image").encoding == "png"
    np.testing.assert_array_equal(read_everything(tmp_path / "out")["image"], rgba)

    floats = rgba.astype(np.float32)
    with pytest.warns(UserWarning, match=r"image_encoding='jpeg' applies to no feature: none is a uint8 array"):
        result = kd.write_tfrecords({"image": floats}, tmp_path / "out", image_encoding="jpeg", shards=1)
    assert result.schema.feature("image").encoding == "raw" and "applies to no feature" in result.notes[0]


def test_cli_convert_takes_csv_dtypes_and_refuses_label_with_no_label(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_RECORDS", 4)  # 'N/A' comes after the rows the types are inferred from
    path = tmp_path / "late.csv"
    path.write_text("a,label\n" + "".join(f"{i},{i % 2}\n" for i in range(6)) + "N/A,0\n")
    runner = CliRunner()
    refused = runner.invoke(convert_command, [str(path), str(tmp_path / "out")])
    assert refused.exit_code == 1 and "(kerasfast convert: --csv-dtype a=string)" in refused.output
    assert "(kerasfast convert: --on-error skip)" in refused.output
    out = runner.invoke(convert_command, [str(path), str(tmp_path / "out"), "--csv-dtype", "a=string",
                                          "--csv-dtype", "label=int64", "--shards", "1"])
    assert out.exit_code == 0, out.output
    assert "column types: a=string, label=int64" in out.output
    x, y = read_everything(tmp_path / "out")
    assert sorted(x.tolist()) == [b"0", b"1", b"2", b"3", b"4", b"5", b"N/A"] and len(y) == 7
    bad = runner.invoke(convert_command, [str(path), str(tmp_path / "o2"), "--csv-dtype", "a"])
    assert bad.exit_code == 2 and "'a': use COLUMN=DTYPE" in bad.output
    both = runner.invoke(convert_command, [str(path), str(tmp_path / "o2"), "--label", "a", "--no-label"])
    assert both.exit_code == 2 and "--label a and --no-label contradict each other" in both.output
    assert not (tmp_path / "o2").exists()


@pytest.mark.parametrize("delimiter", [";", "|", "\t"], ids=["semicolon", "pipe", "tab"])
def test_csv_delimiter_is_found_in_the_header(tmp_path, delimiter):
    path = tmp_path / "semi.csv"
    path.write_text("".join(delimiter.join(row) + "\n" for row in [["a", "b", "label"], ["1", "2,5", "0"],
                                                                       ["3", "4", "1"]]))
    result = kd.write_tfrecords(str(path), tmp_path / "out", shards=1, shuffle=False)
    assert result.schema.feature_names == ["a", "b", "label"] and result.schema.label == "label"
    assert f"delimiter {delimiter!r}, found in the header of {path}" in result.notes
    x, y = read_everything(tmp_path / "out")
    assert x["a"].tolist() == [1, 3] and x["b"].tolist() == [b"2,5", b"4"] and y.tolist() == [0, 1]


def test_csv_fields_longer_than_pythons_default_limit_are_read(tmp_path):
    text = "word " * 40_000  # 200,000 characters, beyond csv.field_size_limit()'s default of 131,072
    path = tmp_path / "docs.csv"
    path.write_text(f'text,label\n"{text}",1\nshort,0\n')
    kd.write_tfrecords(str(path), tmp_path / "out", shards=1, shuffle=False)
    x, y = read_everything(tmp_path / "out")
    assert x.tolist() == [text.encode(), b"short"] and y.tolist() == [1, 0]


@pytest.mark.parametrize("text_unit", ["line", "file"])
def test_a_text_corpus_that_is_not_utf8_is_named_with_the_byte(tmp_path, text_unit):
    (tmp_path / "bom.txt").write_bytes("first line\nsecond line\n".encode("utf-16"))  # Notepad's "Unicode"
    with pytest.raises(DataError, match=r"bom\.txt is not UTF-8 text: it is UTF-16 \(it starts with UTF-16's "
                                        r"byte-order mark, 0xff at byte 0.*iconv -f utf-16 -t utf-8"):
        kd.write_tfrecords(str(tmp_path / "bom.txt"), tmp_path / "out", text_unit=text_unit)
    (tmp_path / "nobom.txt").write_bytes("ok\n".encode() + "first line\n".encode("utf-16-le"))
    with pytest.raises(DataError, match=r"nobom\.txt is not UTF-8 text: byte 4 \(line 2\) is 0x00 \(NUL\)"):
        kd.write_tfrecords(str(tmp_path / "nobom.txt"), tmp_path / "out", text_unit=text_unit)
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9\n".encode("utf-8") + "caf\u00e9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.txt is not UTF-8 text: byte 9 \(line 2\) is 0xe9.*> utf8\.txt\."):
        kd.write_tfrecords(str(tmp_path / "latin1.txt"), tmp_path / "out", text_unit=text_unit)
    assert not (tmp_path / "out").exists()


def test_cli_convert_names_its_prefix_option_for_files_named_like_its_shards(tmp_path):
    out = tmp_path / "other"
    out.mkdir()
    (out / "data-00000-of-00004.tfrecord").write_bytes(b"another tool's shard")
    path = tmp_path / "t.csv"
    path.write_text("a,label\n" + "".join(f"{i},{i % 2}\n" for i in range(6)))
    runner = CliRunner()
    refused = runner.invoke(convert_command, [str(path), str(out), "--shards", "2"])
    assert refused.exit_code == 1
    assert ("Move them away, write to another folder, or name the shards with a prefix other than 'data' "
            "(e.g. prefix='train'; kerasfast convert: --prefix train)." in " ".join(refused.output.split()))
    beside = runner.invoke(convert_command, [str(path), str(out), "--shards", "2", "--prefix", "train"])
    assert beside.exit_code == 0, beside.output
    assert sorted(os.listdir(out)) == ["data-00000-of-00004.tfrecord", "schema.json",
                                       "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]


def test_cli_convert_says_each_warning_once_as_a_note(tmp_path, recwarn, monkeypatch):
    from kerasfast.data import writer

    path = tmp_path / "bad.csv"
    path.write_text("a,b\n1,2\n3,x\n5,6\n")
    runner = CliRunner()
    skip = runner.invoke(convert_command, [str(path), str(tmp_path / "f9"), "--csv-dtype", "b=float32",
                                           "--on-error", "skip"])
    assert skip.exit_code == 0, skip.output
    assert "result.skipped" not in skip.output and skip.output.count("\nskipped: ") == 1
    png = runner.invoke(convert_command, [str(path), str(tmp_path / "f10"), "--image-encoding", "png"])
    assert png.exit_code == 0, png.output
    assert png.output.count("applies to no feature") == 1
    assert "note: image_encoding='png' applies to no feature" in png.output
    assert not [w for w in recwarn if "write_tfrecords" in str(w.message)]  # none escaped as a raw warning

    real = writer.write_tfrecords

    def warning_twice(*args, **kwargs):
        for _ in range(2):
            warnings.warn("something the result does not say.", stacklevel=2)
        return real(*args, **kwargs)

    monkeypatch.setattr(writer, "write_tfrecords", warning_twice)
    other = runner.invoke(convert_command, [str(path), str(tmp_path / "f11"), "--csv-dtype", "b=string"])
    assert other.exit_code == 0, other.output
    assert other.output.count("note: something the result does not say\n") == 1
    assert not [w for w in recwarn if "something" in str(w.message)]


def test_a_label_that_is_the_only_feature_is_refused_before_anything_is_written(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("one\ntwo\n")
    with pytest.raises(DataError, match=r"label 'text' is the only feature of the records, so a model would have "
                                        r"no input to learn it from; pass label=None \(kerasfast convert: "
                                        r"--no-label\)"):
        kd.write_tfrecords(corpus, tmp_path / "new", label="text")
    assert not (tmp_path / "new").exists()
    previous = kd.write_tfrecords(corpus, tmp_path / "old", shards=1)
    before = sorted(os.listdir(tmp_path / "old"))
    refused = CliRunner().invoke(convert_command, [str(corpus), str(tmp_path / "old"), "--label", "text"])
    assert refused.exit_code == 1 and "label 'text' is the only feature" in refused.output
    assert sorted(os.listdir(tmp_path / "old")) == before  # the previous dataset is untouched
    assert kd.dataset_info(str(tmp_path / "old")).schema.num_records == previous.num_records


@pytest.mark.parametrize("missing", [None, np.nan], ids=["None", "NaN"])
@pytest.mark.parametrize("dtype", [None, object], ids=["default dtype", "object"])
def test_a_missing_value_in_a_dataframe_string_column_is_named_as_one(tmp_path, missing, dtype):
    # It was "row 1 feature 's' is a float, the first record had a string", for a float the user never wrote.
    df = pd.DataFrame({"s": pd.Series(["x", missing, "z"], dtype=dtype), "label": [0, 1, 0]})
    with pytest.raises(DataError, match=r"row 1 has a missing value \((None|NaN)\) in column 's', a string column "
                                        r"\((object|str)\) that cannot hold one: fill the missing values, e.g. with an "
                                        r"empty value \(df\['s'\]\.fillna\(''\)\)\. Fix or remove it"):
        kd.write_tfrecords(df, tmp_path / "out", label="label")
    with pytest.warns(UserWarning, match="skipped 1 bad record"):
        result = kd.write_tfrecords(df, tmp_path / "out", label="label", shards=1, shuffle=False, on_error="skip")
    assert [location for location, _ in result.skipped] == ["row 1"]
    x, y = read_everything(tmp_path / "out")
    assert x.tolist() == [b"x", b"z"] and y.tolist() == [0, 0]
    # The wording is the one of a null in a Parquet string column, and a categorical column gets a fill it takes.
    df.to_parquet(tmp_path / "s.parquet")
    with pytest.warns(UserWarning, match="skipped 1 bad record"):
        parquet = kd.write_tfrecords(str(tmp_path / "s.parquet"), tmp_path / "pq", on_error="skip")
    assert parquet.skipped[0][1].startswith("has a missing value (null) in column 's', a string column (")
    assert parquet.skipped[0][1].endswith("that cannot hold one: fill the missing values, e.g. with an empty value "
                                          "(pandas: df['s'].fillna(''))")
    with pytest.raises(DataError, match=r"row 1 has a missing value \(NaN\) in column 's', a string column "
                                        r"\(category\) .*\(df\['s'\]\.cat\.add_categories\(''\)\.fillna\(''\)\)"):
        kd.write_tfrecords(df.astype({"s": "category"}), tmp_path / "cat")


@pytest.mark.parametrize("records, message", [
    ([{"a": 1.0, "label": 0}, {"a": None, "label": 1}],
     r"record 1 feature 'a' is None \(a missing value\), which a feature cannot hold: fill it \(e\.g\. with NaN or "
     r"0 for a number, '' for a string\)\. Fix or remove it"),
    ([{"a": "x", "label": 0}, {"a": None, "label": 1}],
     r"record 1 feature 'a' is None \(a missing value\), which a string feature cannot hold: fill it \(e\.g\. "
     r"with ''\)\. Fix or remove it"),
    ([{"a": [1.0, 2.0], "label": 0}, {"a": [3.0, None], "label": 1}],
     r"record 1 feature 'a' holds None \(a missing value\) at index 1, which a feature cannot hold: fill it"),
    ([{"a": 1, "label": 0}, {"a": 2**70, "label": 1}],
     r"record 1 feature 'a' is 1180591620717411303424, an integer beyond int64's range \(-2\*\*63 to 2\*\*63-1\), "
     r"which a feature cannot hold: store the feature as a float \(float\(value\), in every record; about 16 "
     r"significant digits\) or as a string \(str\(value\)\)\. Fix or remove it"),
    ([{"a": -(2**70), "label": 0}, {"a": 1, "label": 1}],
     r"record 0 feature 'a' is -1180591620717411303424, an integer beyond int64's range"),
], ids=["None", "None for a string", "None in a list", "int beyond int64", "int beyond int64 first"])
def test_a_missing_value_or_an_int_beyond_int64_in_an_iterable_of_dicts_is_named(tmp_path, records, message):
    # It was "record 1 feature 'a' is object, the first record had float64" (or int64).
    with pytest.raises(DataError, match=message):
        kd.write_tfrecords(iter(records), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # A bad record, which on_error="skip" leaves out, even the first one: the next record then fixes the features.
    with pytest.warns(UserWarning, match="skipped 1 bad record"):
        result = kd.write_tfrecords(iter(records), tmp_path / "out", shards=1, on_error="skip")
    location, reason = result.skipped[0]
    assert result.num_records == 1 and re.fullmatch(message.split(r"\. Fix")[0] + ".*", f"{location} {reason}")


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "in order"])
def test_a_mismatch_names_the_record_that_fixed_the_features_by_its_row_in_the_source(tmp_path, shuffle):
    # With the write-time shuffle, "the first record had (3,)" meant row 2, the first written, not row 0.
    ragged = np.array([[1, 2], [3], [4, 5, 6]], dtype=object)
    pattern = r"row (\d) feature 's' has shape \((\d),\), row (\d) had \((\d),\); all records need the same shape"
    with pytest.raises(DataError, match=pattern) as caught:
        kd.write_tfrecords({"s": ragged, "label": np.arange(3)}, tmp_path / "out", shuffle=shuffle)
    row, length, reference, reference_length = map(int, re.search(pattern, str(caught.value)).groups())
    assert len(ragged[row]) == length and len(ragged[reference]) == reference_length and row != reference
    if shuffle:  # seed 0 writes row 2 first
        assert (row, reference) == (0, 2)
    mixed = pd.DataFrame({"v": pd.Series([1.5, 2.5, "a", 3.5], dtype=object), "label": [0, 1, 0, 1]})
    with pytest.raises(DataError, match=r"row \d feature 'v' is .*, row \d had ") as caught:
        kd.write_tfrecords(mixed, tmp_path / "out", shuffle=shuffle)
    row, reference = map(int, re.findall(r"row (\d)", str(caught.value)))
    said = str(caught.value).split(f"row {reference} had ")[1]
    assert said.startswith("a string" if reference == 2 else "float64") and (row == 2) != (reference == 2)


@pytest.mark.parametrize("records, message", [
    ([{"a": 1}, {"a": 2**63 + 5}],
     r"record 1 feature 'a' holds 9223372036854775813, which the first record's int64 cannot hold .*TFRecord "
     r"integers are int64, which stops at 2\*\*63 - 1: store such values as strings"),
    ([{"a": np.int8(1)}, {"a": np.uint8(200)}],
     r"record 1 feature 'a' holds 200, which the first record's int8 cannot hold"),
    ([{"a": np.int32(1)}, {"a": np.uint32(3_000_000_000)}],
     r"record 1 feature 'a' holds 3000000000, which the first record's int32 cannot hold"),
    ([{"a": 0.5}, {"a": 2**60 + 1}],
     r"record 1 feature 'a' holds 1152921504606846977, which the first record's float64 cannot hold \(it would be "
     r"stored as 1\.152921504606847e\+18\) .*float64 holds integers exactly only up to 2\*\*53"),
    ([{"a": np.zeros(2, np.float32)}, {"a": np.array([16777217, 3])}],
     r"record 1 feature 'a' holds 16777217, which the first record's float32 cannot hold \(it would be stored as "
     r"16777216\.0\) .*give record 0 float64"),
    ([{"a": 1}, {"a": True}], r"record 1 feature 'a' is bool, record 0 had int64"),
    ([{"a": np.float32(1)}, {"a": 1e-50}], r"record 1 feature 'a' holds 1e-50, which the first record's float32 "
                                           r"cannot hold"),
], ids=["uint64 into int64", "uint8 into int8", "uint32 into int32", "int rounded by float64",
        "int rounded by float32", "bool among ints", "float32 underflow"])
def test_a_value_the_first_records_dtype_would_change_is_refused(tmp_path, records, message):
    # Each was written changed: wrapped to a negative, rounded, or True stored as 1.
    with pytest.raises(DataError, match=message):
        kd.write_tfrecords(iter(records), tmp_path / "out", shuffle=False)
    assert not (tmp_path / "out").exists()


def test_values_every_record_holds_exactly_are_written_across_dtypes(tmp_path):
    kd.write_tfrecords(iter([{"a": 0.5, "b": np.int64(5), "c": np.float32(0.25)},
                             {"a": 3, "b": np.uint64(7), "c": 0.1}]), tmp_path / "out", shards=1, shuffle=False,
                       label=None)
    got = read_everything(tmp_path / "out", label=False)
    np.testing.assert_array_equal(got["a"], [0.5, 3.0])
    np.testing.assert_array_equal(got["b"], [5, 7])
    np.testing.assert_array_equal(got["c"], np.float32([0.25, 0.1]))


@pytest.mark.parametrize("text_unit", ["line", "file"])
def test_a_text_files_byte_order_mark_is_not_part_of_its_text(tmp_path, text_unit):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_bytes(b"\xef\xbb\xbffirst line\nsecond\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)  # each file is closed as it is read
        kd.write_tfrecords(str(tmp_path / "corpus"), tmp_path / "out", shards=1, shuffle=False, text_unit=text_unit)
    texts = list(read_everything(tmp_path / "out", label=False)["text"])
    assert texts == ([b"first line", b"second"] if text_unit == "line" else [b"first line\nsecond\n"])


def test_a_csv_value_float32_would_store_as_zero_is_a_bad_record(tmp_path):
    (tmp_path / "tiny.csv").write_text("v,label\n1e-50,0\n2,1\n")
    with pytest.raises(DataError, match=r"line 2 has 1e-50 in column 'v', beyond the range of float32 \(pass "
                                        r"csv_dtypes=\{'v': 'float64'\}"):
        kd.write_tfrecords(str(tmp_path / "tiny.csv"), tmp_path / "out")


@pytest.mark.parametrize("shards", [True, 0, 2.5, "3"])
def test_a_shard_count_that_is_not_a_positive_integer_is_refused(tmp_path, shards):
    with pytest.raises(DataError, match=re.escape(f"shards={shards!r}: pass a positive integer")):
        kd.write_tfrecords((np.zeros((4, 2)), np.zeros(4)), tmp_path / "out", shards=shards)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("column, shown", [
    (lambda: pd.date_range("2020", periods=4, tz="UTC"), r"is a Timestamp \(2020-01-0\d 00:00:00\+00:00\)"),
    (lambda: pd.date_range("2020", periods=4).as_unit("us"), r"is datetime64\[us\] \(dates or durations\)"),
    (lambda: pd.to_timedelta([1, 2, 3, 4], unit="s"), r"is timedelta64\[\w+\] \(dates or durations\)"),
    (lambda: pd.period_range("2020", periods=4, freq="D"), r"is a Period \(2020-01-0\d\)"),
    (lambda: [decimal.Decimal("1.5")] * 4, r"is a Decimal \(1\.5\)"),
], ids=["tz-aware", "datetime64", "timedelta64", "period", "decimal"])
def test_dates_durations_and_decimals_are_named_with_their_conversion(tmp_path, column, shown):
    # They were "a object array of shape ()" or "dtype datetime64[us] cannot be stored raw", naming no row.
    frame = pd.DataFrame({"when": column(), "label": [0, 1, 0, 1]})
    unit = "microseconds" if "datetime64" in shown else r"the column's time unit" if "Timestamp" in shown else ""
    with pytest.raises(DataError, match=r"row \d feature 'when' " + shown + r", which a feature cannot hold: store it "
                                        r"as a number \(a DataFrame column: df\['when'\]\.astype\('int64'\), a count of "
                                        + unit):
        kd.write_tfrecords(frame, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("source, message", [
    (lambda: pd.DataFrame({"id": np.array([1, 2, 3], np.uint64), "label": [0, 1, 0]}),
     r"row \d: feature 'id' is uint64 \(one value\), which a feature cannot hold \(an unsigned 64-bit id: cast it to "
     r"int64 if every value is below 2\*\*63, or store it as a string\): cast it to one of \(.*'uint32'"),
    (lambda: (np.zeros((4, 2), np.complex64), np.zeros(4)),
     r"row \d: feature 'x' is complex64, which a feature cannot hold: cast it to one of \('bool'"),
], ids=["uint64 column", "complex array"])
def test_a_dtype_no_feature_holds_is_named_with_the_row_and_the_casts(tmp_path, source, message):
    # It was "feature 'id': dtype uint64 cannot be stored raw; cast it to one of (...)", naming no row and
    # leaving out uint32, which a single value may be.
    with pytest.raises(DataError, match=message):
        kd.write_tfrecords(source(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_feature_of_no_values_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(DataError, match=r"feature 'x': shape \[0\] holds no values"):
        kd.write_tfrecords((np.zeros((20, 0), "float32"), np.zeros(20, "int64")), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_more_shards_than_files_can_be_open_are_refused_before_the_folder_is_made(tmp_path):
    import resource

    csv = tmp_path / "rows.csv"
    csv.write_text("a,b\n" + "".join(f"{i},{i % 2}\n" for i in range(600)))
    with pytest.raises(DataError, match=r"shards=\d+: at most 99,999"):
        kd.write_tfrecords(str(csv), tmp_path / "huge", shards=10**30)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(400, hard), hard))
    try:
        with pytest.raises(DataError, match=r"shards=500: every shard is written at once.*ulimit -n"):
            kd.write_tfrecords(str(csv), tmp_path / "many", shards=500)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not (tmp_path / "huge").exists() and not (tmp_path / "many").exists()
