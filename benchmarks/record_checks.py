"""What the reader's per-file checks cost per record, on the raw record stream (no parsing).

kerasfast wraps each file's `TFRecordDataset` in two checks (see
`kerasfast/data/reader.py`, `_interleaved_records`): its records are padded
to the count schema.json promises, with records that carry the error (the
count check), and the file's records end at TensorFlow's read error, so that
the count check names the damaged file (the error ending). This reads the
same files with neither, with the count check only, and with both, in one
process, alternating, and prints the CPU time per record: the minimum over
the rounds (this machine's noise only ever adds) and the mean.

    python benchmarks/record_checks.py [--rounds 8] [--records 20000]
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
import time

MARK = "\x00padding"


def variants(count: int) -> dict:
    import tensorflow as tf

    def plain(path):
        return tf.data.TFRecordDataset(path)

    def padded(ds):
        return ds.concatenate(tf.data.Dataset.from_tensors(MARK).repeat()).take(count)

    def ended_at_errors(path):  # as the reader does it
        return plain(path).take(1).concatenate(plain(path).skip(1).ignore_errors())

    return {"no checks": plain, "count check": lambda path: padded(plain(path)),
            "count check + error ending": lambda path: padded(ended_at_errors(path))}


def cpu_us_per_record(files, read_file) -> float:
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
        read_file, cycle_length=len(files), num_parallel_calls=1, deterministic=True).batch(256)
    started, records = time.process_time(), 0
    for batch in dataset.with_options(options):
        records += int(batch.shape[0])
    return (time.process_time() - started) / records * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--records", type=int, default=20000)
    args = parser.parse_args(argv)
    import numpy as np

    import kerasfast

    with tempfile.TemporaryDirectory() as folder:
        rng = np.random.default_rng(0)
        x = rng.integers(0, 255, (args.records, 64), dtype=np.uint8)
        written = kerasfast.data.write_tfrecords((x, np.arange(args.records)), pathlib.Path(folder) / "d", shards=4)
        files = [str(f) for f in written.files]
        runs = {name: [] for name in variants(args.records // 4)}
        for _ in range(args.rounds):
            for name, read_file in variants(args.records // 4).items():
                runs[name].append(cpu_us_per_record(files, read_file))
    print(f"{args.records} records of 64 bytes in 4 files, {args.rounds} rounds, CPU us per record")
    print("| reading | min | mean |")
    print("|---|---:|---:|")
    for name, values in runs.items():
        print(f"| {name} | {min(values):.2f} | {sum(values) / len(values):.2f} |")


if __name__ == "__main__":
    main()
