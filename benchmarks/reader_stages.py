"""Where a record's CPU time goes in kerasfast's TFRecord reader: the pipeline built up stage by stage.

The same 32x32x3 image records as `benchmarks/input_pipeline.py`, read by:

1. TensorFlow's reader alone (`TFRecordDataset(files).batch`), the floor;
2. + kerasfast's read layout: a parallel interleave of the files taking
   blocks of 16 records from each, re-batched;
3. + each file's records counted against schema.json, ended at a read
   error, and numbered (the reader's `_counted_records`: errors then name
   the file and record);
4. + the shuffle buffer (10,000 records, in blocks);
5. + one `parse_example` and the decode per batch;
6. + the record names `parse_example` puts in its errors;
7. `kerasfast.data.tfrecord_dataset`, shuffle=False and default (the
   records cut out by the byte layout schema.json records), and default
   with that layout entry removed (every record parsed, as rows 5-6);
8. a layout kerasfast does not write: 32 records packed into each TFRecord
   record (each feature a list of 32 values), parsed 16 packed records at a
   time, shuffled within that window, re-batched. It has none of the checks
   of rows 3-6; it shows what the per-record stages above cost together.

Every row is timed in one process, rows alternating, for `--rounds` full
passes after one untimed pass; the CPU time per record (all threads) is the
minimum over the rounds (this machine's noise only ever adds) and the median.

    python benchmarks/reader_stages.py [--records 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BATCH = 128
BLOCK = 16
PACKED = 32
WINDOW = 16
SHUFFLE_RECORDS = 10_000


def write_packed(x, y, folder: pathlib.Path, shards: int) -> list[str]:
    """The records, shuffled, `PACKED` to a TFRecord record: feature lists of `PACKED` values."""
    import numpy as np
    import tensorflow as tf

    folder.mkdir(parents=True)
    order = np.random.default_rng(0).permutation(len(y))
    files = []
    for shard in range(shards):
        path = str(folder / f"packed-{shard}.tfrecord")
        rows = order[shard::shards]
        with tf.io.TFRecordWriter(path) as writer:
            for start in range(0, len(rows), PACKED):
                block = rows[start:start + PACKED]
                feature = {"x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[x[i].tobytes() for i in block])),
                           "y": tf.train.Feature(int64_list=tf.train.Int64List(value=y[block].tolist()))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        files.append(path)
    return files


def without_layout(folder: pathlib.Path, into: pathlib.Path) -> str:
    """A copy of the dataset whose schema.json has no byte layout: the reader then parses every record."""
    import shutil

    shutil.copytree(folder, into)
    schema = json.loads((into / "schema.json").read_text())
    schema["layout"] = None
    (into / "schema.json").write_text(json.dumps(schema))
    return str(into)


def stages(files: list[str], counts: list[int], folder: str, packed_files: list[str], parsed_folder: str) -> dict:
    """Row name -> a function making that row's dataset."""
    import tensorflow as tf

    import kerasfast.data as kd
    from kerasfast.data import reader
    from kerasfast.data.schema import Schema

    tune = tf.data.AUTOTUNE
    # Rows 5-6: the general decoder, each record parsed (rows 7a-7b cut them out by the files' byte layout).
    decode = dataclasses.replace(Schema.load(os.path.join(folder, "schema.json")), layout=None).make_batch_decoder()
    names = tf.constant(files)
    sources = tf.data.Dataset.from_tensor_slices((files, tf.range(len(files), dtype=tf.int64) * reader.RECORD_ID_STRIDE,
                                                  tf.constant(counts, tf.int64)))

    def interleaved(read_file):
        return sources.interleave(read_file, cycle_length=4, num_parallel_calls=tune, deterministic=False)

    def blocks(path, first, count):
        return tf.data.TFRecordDataset(path).batch(BLOCK)

    def counted(path, first, count):
        return reader._counted_records(path, tf.data.TFRecordDataset(path), first, count, BLOCK)

    def shuffled():
        return interleaved(counted).shuffle(SHUFFLE_RECORDS // BLOCK).rebatch(BATCH)

    def parsed(named: bool):
        def parse(ids, serialized):
            serialized = reader._raise_on_short_files(ids, serialized)
            return decode(serialized, names=reader._record_names(names, ids) if named else None)

        return shuffled().map(parse, num_parallel_calls=tune, deterministic=False).prefetch(tune)

    spec = {"x": tf.io.RaggedFeature(tf.string), "y": tf.io.RaggedFeature(tf.int64)}

    def parse_packed(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        order = tf.random.shuffle(tf.range(tf.shape(parsed["y"].flat_values)[0]))
        images = tf.reshape(tf.io.decode_raw(tf.gather(parsed["x"].flat_values, order), tf.uint8), [-1, 32, 32, 3])
        return images, tf.gather(parsed["y"].flat_values, order)

    def packed():
        records = tf.data.Dataset.from_tensor_slices(packed_files).shuffle(len(packed_files)).interleave(
            tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tune, deterministic=False)
        windows = records.shuffle(SHUFFLE_RECORDS // PACKED).batch(WINDOW)
        return windows.map(parse_packed, num_parallel_calls=tune, deterministic=False).rebatch(BATCH).prefetch(tune)

    return {
        "1. TensorFlow's reader alone": lambda: tf.data.TFRecordDataset(files).batch(BATCH),
        f"2. + interleave, blocks of {BLOCK}, rebatch": lambda: interleaved(blocks).rebatch(BATCH),
        "3. + count check, error ending, record ids": lambda: interleaved(counted).rebatch(BATCH),
        f"4. + shuffle ({SHUFFLE_RECORDS:,} records)": shuffled,
        "5. + parse and decode per batch": lambda: parsed(named=False),
        "6. + record names in parse errors": lambda: parsed(named=True),
        "7a. kerasfast, shuffle=False": lambda: kd.tfrecord_dataset(folder, batch_size=BATCH, shuffle=False),
        "7b. kerasfast, default": lambda: kd.tfrecord_dataset(folder, batch_size=BATCH),
        "7c. kerasfast, default, schema.json's layout entry removed": lambda: kd.tfrecord_dataset(
            parsed_folder, batch_size=BATCH),
        f"8. packed layout ({PACKED} per TFRecord record)": packed,
    }


def cpu_us_per_record(dataset, expected: int) -> float:
    """CPU time per record of one full pass; raises when the pass read another number of records."""
    import tensorflow as tf

    started, records = time.process_time(), 0
    for element in dataset:
        records += int(tf.nest.flatten(element)[0].shape[0])
    if records != expected:
        raise RuntimeError(f"a pass read {records} records of {expected}")
    return (time.process_time() - started) / records * 1e6


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shards", type=int, default=8)
    args = parser.parse_args(argv)

    import kerasfast.data as kd
    from benchmarks.input_pipeline import make_images

    x, y = make_images(args.records)
    with tempfile.TemporaryDirectory() as work:
        written = kd.write_tfrecords((x, y), pathlib.Path(work) / "images", shards=args.shards)
        packed_files = write_packed(x, y, pathlib.Path(work) / "packed", args.shards)
        makers = stages([str(f) for f in written.files], [s.num_records for s in written.schema.shards],
                        str(written.out_dir), packed_files,
                        without_layout(pathlib.Path(written.out_dir), pathlib.Path(work) / "parsed"))
        datasets = {name: make() for name, make in makers.items()}
        for dataset in datasets.values():
            cpu_us_per_record(dataset, args.records)  # untimed: page cache, thread pools, autotuning
        runs = {name: [] for name in datasets}
        for _ in range(args.rounds):
            for name, dataset in datasets.items():
                runs[name].append(cpu_us_per_record(dataset, args.records))
    print(f"\n{args.records} images 32x32x3 uint8 + label in {args.shards} files, batch {BATCH}, {args.rounds} "
          f"rounds, {os.cpu_count()} CPU(s): CPU us per record (all threads)\n")
    print("| pipeline | min | median |")
    print("|---|---:|---:|")
    for name, values in runs.items():
        print(f"| {name} | {min(values):.1f} | {statistics.median(values):.1f} |")
    return runs


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
