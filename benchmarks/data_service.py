"""tf.data service benchmark: an input-bound model fed locally vs by 1 and 2 service workers.

The workload is input-bound on purpose: 32x32x3 uint8 images in TFRecord
shards, a costly per-batch preprocessing map (`--work` rounds of a 3x3
convolution + tanh over every image, standing in for heavy augmentation) and
a tiny model (global average pooling + one Dense layer). Three ways to feed
the same `kerasfast.fit` run:

* local:        the pipeline runs in the training process;
* service x1:   `kerasfast data-service dispatcher` + 1 `worker`, as
                separate processes on loopback, `fit(..., data_service=)`;
* service x2:   the same with 2 service workers.

Each way trains `--epochs` epochs `--repeats` times (alternating); the best
run counts (on a shared machine the best is the least disturbed). Prints
kerasfast's measured samples/s (after the first, compiling execution; each
epoch's pass through the service is a new job, so its start-up is included)
and the ratio to local reading. Then times one tiny pass through the service
(in-process servers): the start-up every pass pays, with kerasfast's task
refresh period and TensorFlow's default.

On one machine the service workers run on the same cores as training, so
this measures the service's overhead and its scaling on those cores, not
what a cluster with spare CPU hosts gains.

Run:  python benchmarks/data_service.py [--records 4096] [--work 30] [--epochs 3] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def write_images(folder: str, records: int) -> str:
    import kerasfast

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (records, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, records).astype(np.int64)
    return str(kerasfast.data.write_tfrecords((images, labels), folder, shards=8).out_dir)


def heavy_dataset(folder: str, batch_size: int, work: int):
    """The records, batched, through `work` rounds of convolution per image."""
    import tensorflow as tf

    import kerasfast

    kernel = tf.constant(np.random.default_rng(1).normal(0, 0.3, (3, 3, 3, 3)).astype("float32"))

    def augment(images, labels):
        x = tf.cast(images, tf.float32) / 255.0
        for _ in range(work):
            x = tf.tanh(tf.nn.conv2d(x, kernel, strides=1, padding="SAME"))
        return x, labels

    # repeat=1: no record count asserted (each service worker reads a share).
    dataset = kerasfast.data.tfrecord_dataset(folder, batch_size=batch_size, repeat=1)
    return dataset.map(augment, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def build_model():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((32, 32, 3)), keras.layers.GlobalAveragePooling2D(),
                             keras.layers.Dense(10, activation="softmax")])


def _server(args: list[str], pattern: str) -> subprocess.Popen:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "kerasfast.cli", "data-service", *args], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        if re.search(pattern, line):
            return process
    raise RuntimeError(f"kerasfast data-service {' '.join(args)} did not start (exit {process.wait()})")


class Service:
    """A dispatcher and `workers` service workers on loopback, as processes."""

    def __init__(self, workers: int):
        from kerasfast.distribute.launch import free_ports

        port, *worker_ports = free_ports(1 + workers)
        self.address = f"grpc://localhost:{port}"
        self.processes = [_server(["dispatcher", "--port", str(port)], "serving grpc://")]
        self.processes += [_server(["worker", "--dispatcher", f"localhost:{port}", "--port", str(p)], "serving")
                           for p in worker_ports]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for process in reversed(self.processes):
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


def train(folder: str, args, data_service: str | None) -> float:
    import kerasfast

    steps = -(-args.records // args.batch_size)
    result = kerasfast.fit(build_model(), heavy_dataset(folder, args.batch_size, args.work), epochs=args.epochs,
                           steps_per_epoch=steps, loss="sparse_categorical_crossentropy", precision="float32",
                           tune="off", run_dir=False, verbose=0, data_service=data_service)
    return result.throughput.samples_per_second


def pass_startup(passes: int = 3) -> dict:
    """Seconds one tiny pass (100 batches of 10 int64) takes through the
    service: kerasfast's task-refresh period vs TensorFlow's default. Runs
    in-process servers (2 workers); the best of `passes` counts."""
    import tensorflow as tf

    from kerasfast.data import service as kf_service

    svc = tf.data.experimental.service
    dispatcher = svc.DispatchServer(svc.DispatcherConfig(port=0))
    workers = [svc.WorkerServer(svc.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1]))
               for _ in range(2)]
    dataset = tf.data.Dataset.range(1000).batch(10)
    ways = {f"kerasfast ({kf_service.TASK_REFRESH_MS} ms task refresh)":
            kf_service.distribute_pass(dataset, dispatcher.target, None),
            "tf.data.experimental.service.distribute (default, 1 s)":
            dataset.apply(svc.distribute(svc.ShardingPolicy.DYNAMIC, dispatcher.target))}
    seconds = {}
    for name, served in ways.items():
        times = []
        for _ in range(passes):
            start = time.perf_counter()
            for _ in served:
                pass
            times.append(time.perf_counter() - start)
        seconds[name] = min(times)
    del workers
    return seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--work", type=int, default=30, help="convolution rounds per image in the input map")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="kerasfast-data-service-bench-")
    folder = write_images(os.path.join(workdir, "images"), args.records)
    ways = {"local": None, "tf.data service, 1 worker": 1, "tf.data service, 2 workers": 2}
    best = {name: 0.0 for name in ways}
    for _ in range(args.repeats):
        for name, workers in ways.items():
            if workers is None:
                rate = train(folder, args, None)
            else:
                with Service(workers) as service:
                    time.sleep(1.0)  # let the workers register with the dispatcher
                    rate = train(folder, args, service.address)
            best[name] = max(best[name], rate)
    print(f"{args.records} records of 32x32x3 uint8, batch {args.batch_size}, {args.work} conv rounds per image in "
          f"the input map, tiny model, {args.epochs} epochs; best of {args.repeats}; {os.cpu_count()} CPU cores "
          "shared by training and every service worker")
    print("")
    print("| input | samples/s | vs local |")
    print("|---|---:|---:|")
    for name, rate in best.items():
        print(f"| {name} | {rate:,.0f} | {rate / best['local']:.2f}x |")
    print("")
    print("| one pass of 100 tiny batches through the service (a new job) | seconds |")
    print("|---|---:|")
    for name, seconds in pass_startup().items():
        print(f"| {name} | {seconds:.2f} |")
    return best


if __name__ == "__main__":
    main()
