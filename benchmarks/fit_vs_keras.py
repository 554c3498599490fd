"""Plain `model.fit` vs `kerasfast.fit`, side by side in one run.

The same model, data and batch size are trained with plain Keras (float32,
Keras defaults: no XLA on CPU, one step per execution) and with
`kerasfast.fit` (auto plan). Runs alternate (Keras, kerasfast, Keras, ...)
so that machine noise hits both alike, and the best steady-state samples/s
of each is compared (the first, compiling execution is excluded from both).

    python benchmarks/fit_vs_keras.py [--repeats 3] [--epochs 3]
"""

from __future__ import annotations

import argparse
import pathlib
import platform
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's kerasfast, not an installed one: a worktree measures its own code

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kerasfast  # noqa: E402
from kerasfast.quickstart import digits_convnet  # noqa: E402
from kerasfast.training.throughput import ThroughputMeter, samples_counter  # noqa: E402


def cifar_like_cnn():
    """Six 3x3 convolutions on 32x32x3 inputs, the shape of a small vision model."""
    layers = [keras.Input((32, 32, 3))]
    for filters in (32, 64, 128):
        layers.append(keras.layers.Conv2D(filters, 3, padding="same", activation="relu"))
        layers.append(keras.layers.Conv2D(filters, 3, padding="same", activation="relu"))
        layers.append(keras.layers.MaxPooling2D())
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10, activation="softmax")]
    return keras.Sequential(layers, name="cifar_like_cnn")


def workloads():
    (x, y), _ = kerasfast.datasets.digits(test_fraction=0.0)
    rng = np.random.default_rng(0)
    images = rng.random((4096, 32, 32, 3), dtype=np.float32)
    labels = rng.integers(0, 10, 4096).astype("int32")
    return [
        ("digits convnet (8x8x1, batch 64)", digits_convnet, x, y, 64),
        ("6-conv CNN (32x32x3, batch 128)", cifar_like_cnn, images, labels, 128),
    ]


def plain_keras(build, x, y, batch_size, epochs):
    keras.utils.set_random_seed(0)
    model = build()
    model.compile("adam", "sparse_categorical_crossentropy")
    meter = ThroughputMeter(samples_counter(batch_size, len(x)))
    model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, callbacks=[meter])
    return meter.result().samples_per_second


def with_kerasfast(build, x, y, batch_size, epochs):
    keras.utils.set_random_seed(0)
    result = kerasfast.fit(build, (x, y), batch_size=batch_size, epochs=epochs, verbose=0, run_dir=False,
                           loss="sparse_categorical_crossentropy", optimizer="adam")
    return result.throughput.samples_per_second, result.plan


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    kerasfast.configure_threads()
    hardware = kerasfast.detect_hardware()
    print(f"machine: {hardware.cpu_model}, {hardware.cpu_cores} cores, flags {', '.join(hardware.cpu_flags)}, "
          f"GPUs: {len(hardware.gpus)}; Python {platform.python_version()}, keras {keras.__version__}")
    rows = []
    for name, build, x, y, batch_size in workloads():
        keras_best, fast_best, plan = 0.0, 0.0, None
        for _ in range(args.repeats):
            keras_best = max(keras_best, plain_keras(build, x, y, batch_size, args.epochs))
            rate, plan = with_kerasfast(build, x, y, batch_size, args.epochs)
            fast_best = max(fast_best, rate)
        rows.append((name, keras_best, fast_best, plan))
    print()
    print("| workload | plain model.fit (samples/s) | kerasfast.fit (samples/s) | ratio | kerasfast plan |")
    print("|---|---|---|---|---|")
    for name, keras_rate, fast_rate, plan in rows:
        choices = f"{plan.precision}, jit={plan.jit_compile}, steps_per_execution={plan.steps_per_execution}"
        print(f"| {name} | {keras_rate:,.0f} | {fast_rate:,.0f} | {fast_rate / keras_rate:.2f}x | {choices} |")
    return rows


if __name__ == "__main__":
    main()
