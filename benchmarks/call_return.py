"""How long a training call takes to return after its last step, per kind of stream.

tf.data's autotuning thread can hold an iterator's teardown until its
current optimisation period ends (up to a minute in TensorFlow 2.21), and
that teardown runs when `fit` releases its iterator: the call "hangs" after
the last step. This runs `kerasfast.fit` and plain `model.fit` for
`--epochs` epochs on each kind of stream (in-memory arrays, a TFRecord
folder, the user's own `tf.data.Dataset` with autotuned map and prefetch,
a Python generator), each call in its own process, and prints the time
from the end of the last epoch to the call's return.

    python benchmarks/call_return.py [--epochs 100] [--repeats 2] [--streams arrays,tfrecords]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

STREAMS = ("arrays", "tfrecords", "tf.data", "generator")
RUNNERS = ("kerasfast.fit", "model.fit")
SAMPLES, FEATURES, BATCH = 2048, 16, 64


def _data():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    return x, (x[:, :4].sum(axis=1) > 0).astype("int64")


def _stream(kind: str, folder: pathlib.Path):
    """`(data, steps_per_epoch)` for `fit`: the same samples as each kind of stream."""
    import tensorflow as tf

    import kerasfast

    x, y = _data()
    steps = SAMPLES // BATCH
    if kind == "arrays":
        return (x, y), None
    if kind == "tfrecords":
        kerasfast.data.write_tfrecords((x, y), folder / "records", shards=4)
        return kerasfast.data.tfrecord_dataset(folder / "records", batch_size=BATCH, repeat=True), steps
    if kind == "tf.data":
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(SAMPLES).repeat().batch(BATCH)
        dataset = dataset.map(lambda a, b: (a * 1.0, b), num_parallel_calls=tf.data.AUTOTUNE)
        return dataset.prefetch(tf.data.AUTOTUNE), steps

    def batches():
        while True:
            for start in range(0, SAMPLES, BATCH):
                yield x[start:start + BATCH], y[start:start + BATCH]

    return batches(), steps


def one_call(stream: str, runner: str, epochs: int) -> dict:
    """Runs one call in this process; returns its seconds from the last epoch's end to the return."""
    import keras

    import kerasfast

    # Epoch ends, not batch ends: a per-batch hook would make kerasfast run one step per execution.
    class LastEpoch(keras.callbacks.Callback):
        ended = 0.0

        def on_epoch_end(self, epoch, logs=None):
            LastEpoch.ended = time.perf_counter()

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2)])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tempfile.TemporaryDirectory() as folder:
        data, steps = _stream(stream, pathlib.Path(folder))
        x, y = data if isinstance(data, tuple) else (data, None)
        started = time.perf_counter()
        if runner == "kerasfast.fit":
            kerasfast.fit(model, x, y, epochs=epochs, batch_size=BATCH, steps_per_epoch=steps, verbose=0,
                          run_dir=False, loss=loss, optimizer="adam", callbacks=[LastEpoch()])
        else:
            model.compile(optimizer="adam", loss=loss)
            model.fit(x, y, epochs=epochs, batch_size=None if steps else BATCH, steps_per_epoch=steps, verbose=0,
                      callbacks=[LastEpoch()])
        returned = time.perf_counter()
    return {"stream": stream, "runner": runner, "call_s": returned - started, "return_s": returned - LastEpoch.ended}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--streams", default=",".join(STREAMS), help="comma-separated: " + ", ".join(STREAMS))
    parser.add_argument("--one", nargs=2, metavar=("STREAM", "RUNNER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one_call(*args.one, args.epochs)))
        return
    print(f"| stream | call | seconds from the last step to the return ({args.repeats} runs) | whole call s |")
    print("|---|---|---:|---:|")
    for stream in args.streams.split(","):
        for runner in RUNNERS:
            runs = []
            for _ in range(args.repeats):
                done = subprocess.run([sys.executable, __file__, "--epochs", str(args.epochs), "--one", stream, runner],
                                      capture_output=True, text=True, check=True)
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            returns = ", ".join(f"{run['return_s']:.3f}" for run in runs)
            calls = ", ".join(f"{run['call_s']:.1f}" for run in runs)
            print(f"| {stream} | {runner} | {returns} | {calls} |", flush=True)


if __name__ == "__main__":
    main()
