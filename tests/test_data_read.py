"""tfrecord_dataset, array_dataset and benchmark: structure, settings, sharding, caching."""

import os
import time
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasfast.data as kd
from kerasfast.errors import DataError

N = 40


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """40 records of 4x4x3 uint8 images with labels 0..39, in 4 shards."""
    out = tmp_path_factory.mktemp("ds")
    x = np.random.default_rng(0).integers(0, 256, (N, 4, 4, 3), dtype=np.uint8)
    result = kd.write_tfrecords((x, np.arange(N)), out, shards=4)
    return out, x, result


def labels_of(ds):
    return [int(v) for _, y in ds for v in y.numpy()]


def test_elements_structure_and_info(written):
    out, x, result = written
    ds = kd.tfrecord_dataset(out, batch_size=16)
    assert ds.element_spec == (tf.TensorSpec((None, 4, 4, 3), tf.uint8), tf.TensorSpec((None,), tf.int64))
    info = ds.kerasfast_info
    assert (info.num_records, info.steps_per_epoch, info.batch_size, info.label) == (N, 3, 16, "y")
    assert info.input_names == ["x"] and len(info.files) == 4
    assert sorted(labels_of(ds)) == list(range(N))
    assert len(list(ds)) == ds.cardinality() == 3
    # The same facts from the path alone, without building by hand (what fit needs).
    assert kd.dataset_info(str(out), batch_size=8).steps_per_epoch == 5
    with pytest.raises(DataError, match="not built by kerasfast"):
        kd.dataset_info(ds.map(lambda a, b: a))


def test_settings_are_explained_and_overridable(written):
    out, _, _ = written
    settings = kd.tfrecord_dataset(out, batch_size=8).kerasfast_info.settings
    assert settings.cycle_length == 4 and settings.read_block == 16 and settings.deterministic is False
    assert settings.shuffle_buffer == N  # capped at the records there are
    for name in ("cycle_length", "read_block", "deterministic", "shuffle_buffer", "sharding", "prefetch"):
        assert settings.reasons[name], name
    text = str(settings)
    assert "cycle_length" in text and "one open file per CPU core" in text
    custom = kd.tfrecord_dataset(out, batch_size=8, cycle_length=2, read_block=1, shuffle_buffer=5,
                                 deterministic=True, parse_parallelism=1, prefetch=2).kerasfast_info.settings
    assert (custom.cycle_length, custom.read_block, custom.shuffle_buffer, custom.deterministic,
            custom.parse_parallelism, custom.prefetch) == (2, 1, 5, True, 1, 2)
    assert custom.as_dict()["cycle_length"] == 2


def test_dicts_without_label_and_label_override(written):
    out, _, _ = written
    ds = kd.tfrecord_dataset(out, batch_size=8, label=False)
    assert set(ds.element_spec) == {"x", "y"}
    ds = kd.tfrecord_dataset(out, batch_size=8, label="x")  # any feature can be the target
    assert ds.element_spec[0].shape == (None,)


def test_seed_gives_reproducible_order_and_epochs_differ(written):
    out, _, _ = written
    first = labels_of(kd.tfrecord_dataset(out, batch_size=8, seed=3))
    ds = kd.tfrecord_dataset(out, batch_size=8, seed=3)
    assert labels_of(ds) == first
    assert labels_of(ds) != first  # reshuffled each epoch
    assert first != sorted(first)


def test_file_sharding_splits_files_between_workers(written):
    out, _, _ = written
    seen = []
    for index in range(2):
        ds = kd.tfrecord_dataset(out, batch_size=8, num_workers=2, worker_index=index)
        assert ds.kerasfast_info.settings.sharding == "file" and ds.kerasfast_info.num_records == N // 2
        seen.append(set(labels_of(ds)))
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(N))
    ctx = tf.distribute.InputContext(num_input_pipelines=4, input_pipeline_id=3)
    ds = kd.tfrecord_dataset(out, batch_size=8, input_context=ctx)
    assert len(ds.kerasfast_info.files) == 1 and len(labels_of(ds)) == N // 4
    with pytest.raises(DataError, match="worker_index"):
        kd.tfrecord_dataset(out, batch_size=8, num_workers=2, worker_index=2)


def test_data_sharding_with_too_few_files_warns_and_stays_disjoint(written):
    out, _, _ = written
    seen = []
    for index in range(6):
        with pytest.warns(UserWarning, match=r"only 4 file\(s\) for 6 workers.*DATA sharding.*shards=24"):
            ds = kd.tfrecord_dataset(out, batch_size=4, num_workers=6, worker_index=index)
        assert ds.kerasfast_info.settings.sharding == "data" and ds.kerasfast_info.settings.deterministic
        seen.append(labels_of(ds))
        assert ds.kerasfast_info.num_records == len(seen[-1])
    flat = [v for s in seen for v in s]
    assert sorted(flat) == list(range(N))  # every record exactly once over all workers


def test_cache_repeat_and_drop_remainder(written, tmp_path):
    out, _, _ = written
    ds = kd.tfrecord_dataset(out, batch_size=16, cache=str(tmp_path / "cache"), repeat=2, drop_remainder=True)
    assert ds.element_spec[0].shape == (16, 4, 4, 3)
    labels = labels_of(ds)
    assert len(labels) == 80 // 16 * 16 and set(labels) <= set(range(N))
    assert any(name.startswith("cache") for name in os.listdir(tmp_path))
    mem = kd.tfrecord_dataset(out, batch_size=16, cache="memory")
    assert sorted(labels_of(mem)) == sorted(labels_of(mem)) == list(range(N))


def test_unshuffled_streamed_source_reads_record_by_record(tmp_path):
    kd.write_tfrecords(({"v": float(i)} for i in range(30)), tmp_path, shards=2)
    info = kd.tfrecord_dataset(tmp_path, batch_size=4).kerasfast_info
    assert info.schema.shuffled is False and info.settings.read_block == 1
    assert "not shuffled when written" in info.settings.reasons["read_block"]


@pytest.mark.parametrize("validate", ["quick", "full", "none"])
def test_shuffle_false_reads_records_in_the_order_they_were_written(tmp_path, validate):
    # 101 records dealt out to 4 shards in turn: a model's predictions line up with the source's rows.
    x = np.arange(101, dtype=np.float32).reshape(101, 1)
    kd.write_tfrecords((x, np.arange(101)), tmp_path / "ds", shards=4, shuffle=False)
    ds = kd.tfrecord_dataset(tmp_path / "ds", batch_size=8, shuffle=False, validate=validate)
    assert labels_of(ds) == list(range(101))
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, kernel_initializer="ones")])
    np.testing.assert_array_equal(model.predict(ds, verbose=0)[:, 0], x[:, 0])
    assert "the order write_tfrecords wrote them in" in ds.kerasfast_info.settings.reasons["cycle_length"]
    # The same shards without schema.json, read as plain TFRecord files: one file after another.
    files = sorted(str(p) for p in (tmp_path / "ds").glob("*.tfrecord"))
    spec = {"x": tf.io.FixedLenFeature([], tf.string), "y": tf.io.FixedLenFeature([], tf.int64)}  # x raw bytes
    plain = kd.tfrecord_dataset(files, batch_size=8, shuffle=False, features=spec, label="y", validate=validate)
    assert labels_of(plain) == [i for shard in range(4) for i in range(shard, 101, 4)]


def test_images_of_different_sizes_need_image_size(tmp_path):
    def gen():
        for i, (h, w) in enumerate([(4, 6), (8, 5), (6, 6)]):
            yield {"img": np.full((h, w, 3), 10 * i, np.uint8), "label": i}

    kd.write_tfrecords(gen(), tmp_path, image_encoding="png", label="label", shards=1)
    with pytest.raises(DataError, match=r"different sizes.*image_size=\(height, width\)"):
        kd.tfrecord_dataset(tmp_path, batch_size=2)
    ds = kd.tfrecord_dataset(tmp_path, batch_size=3, image_size=(5, 5), shuffle=False)
    x, y = next(iter(ds))
    assert x.shape == (3, 5, 5, 3) and x.dtype == tf.uint8
    assert [int(x[i, 2, 2, 0]) for i in np.argsort(y.numpy())] == [0, 10, 20]  # flat images stay flat


def test_trains_a_keras_model(written):
    out, _, _ = written
    ds = kd.tfrecord_dataset(out, batch_size=8)
    model = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(N, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    history = model.fit(ds, epochs=2, verbose=0, shuffle=False)  # the dataset shuffles itself
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()


def test_array_dataset(tmp_path):
    x = np.arange(50, dtype=np.float32).reshape(25, 2)
    y = np.arange(25)
    ds = kd.array_dataset(x, y, batch_size=10, seed=1)
    assert ds.kerasfast_info.steps_per_epoch == 3 and ds.kerasfast_info.num_records == 25
    epoch1 = [(a.numpy(), b.numpy()) for a, b in ds]
    epoch2 = [b.numpy() for _, b in ds]
    got_y = np.concatenate([b for _, b in epoch1])
    assert sorted(got_y.tolist()) == list(range(25))
    assert not np.array_equal(got_y, np.concatenate(epoch2))  # reshuffled
    for a, b in epoch1:
        np.testing.assert_array_equal(a, x[b])  # rows stay with their labels
    multi = kd.array_dataset({"a": x, "b": y}, None, batch_size=25, shuffle=False)
    batch = next(iter(multi))
    np.testing.assert_array_equal(batch["b"].numpy(), y)
    with pytest.raises(DataError, match="same number of records"):
        kd.array_dataset(x, y[:3])


def test_benchmark_reports_rates(written):
    out, _, result = written
    ds = kd.tfrecord_dataset(out, batch_size=8, repeat=True)
    res = kd.benchmark(ds, steps=6, warmup=2)
    assert res.batches == 6 and res.records == 48
    assert res.records_per_second > 0 and res.mb_per_second == pytest.approx(
        res.records_per_second * (4 * 4 * 3 + 8) / 1e6)
    per_record = result.num_bytes / result.num_records
    assert res.file_mb_per_second == pytest.approx(res.records_per_second * per_record / 1e6)
    # The timed part's CPU time only: inside the call's, which traces the consumer first.
    started = time.process_time()
    timed = kd.benchmark(kd.tfrecord_dataset(out, batch_size=8), steps=None, warmup=0)
    assert 0 < timed.cpu_seconds < time.process_time() - started
    one_pass = kd.benchmark(kd.tfrecord_dataset(out, batch_size=8), steps=None, warmup=0)
    assert one_pass.records == N and one_pass.batches == 5
    text = kd.benchmark(tf.data.Dataset.from_tensor_slices(["ab", "cde"]).batch(2), steps=None, warmup=0)
    assert text.file_mb_per_second is None and text.mb_per_second == pytest.approx(5 / text.seconds / 1e6)
    with pytest.raises(DataError, match="warm-up"):
        kd.benchmark(tf.data.Dataset.range(3).batch(2), warmup=5)


def test_no_warnings_on_the_normal_path(written):
    out, _, _ = written
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        labels_of(kd.tfrecord_dataset(out, batch_size=8))


@pytest.mark.slow
def test_benchmark_script_runs_end_to_end(tmp_path):
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.input_pipeline import main

    rows = main(["--records", "2000", "--text-lines", "400", "--passes", "1", "--workdir", str(tmp_path)])
    names = [r["pipeline"] for r in rows]
    assert names[0].startswith("ceiling") and "kerasfast images (GZIP)" in names and "naive text corpus" in names
    assert all(r["records_per_s"] > 0 and r["file_mb_per_s"] > 0 for r in rows)


def test_the_printed_plan_shows_the_pipeline_as_a_table_of_its_own(written, capsys):
    """The data line is one line; the TFRecord pipeline's settings follow as
    their own block, never folded into the data and model lines."""
    import kerasfast

    out, _, _ = written
    model = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Flatten(), keras.layers.Dense(40)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    result = kerasfast.fit(model, str(out), epochs=1, batch_size=8, tune="off", run_dir=False, verbose=1)
    lines = capsys.readouterr().out.splitlines()
    data = next(i for i, line in enumerate(lines) if line.startswith("  data: "))
    assert lines[data] == f"  data: TFRecords {out}, {N} records" == f"  data: {result.data}"
    assert lines[data + 1].startswith("  model: ")
    assert lines[data + 2] == "  input pipeline:" and lines[data + 3].split()[0] == "num_files"


def test_reader_stages_benchmark_reads_every_record_in_every_row():
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.reader_stages import main

    runs = main(["--records", "600", "--rounds", "1", "--shards", "4"])  # a row reading short raises
    assert len(runs) == 10 and all(len(values) == 1 and values[0] > 0 for values in runs.values())
