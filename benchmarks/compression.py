"""Compression benchmark (not a test): dense float32 vs pruned + quantised.

Trains a small convnet on scikit-learn's digits (8x8x1, float32), exports it
dense, then prunes it to 80% sparsity by fine-tuning and exports every
format. All accuracies are measured on held-out digits from each artifact's
own outputs (TFLite files run in ai_edge_litert); latency is the LiteRT
median per sample at batch 1 on one thread. Ratios are against the dense
float32 .tflite file.

    python benchmarks/compression.py [--sparsity 0.8] [--epochs 15] [--out /tmp/kerasfast-compression]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's kerasfast, not an installed one: a worktree measures its own code

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

from kerasfast.compress import prune  # noqa: E402
from kerasfast.export import export_model  # noqa: E402


def digits():
    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    return train_test_split(x, data.target.astype("int32"), test_size=0.25, random_state=0, stratify=data.target)


def digits_convnet():
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv1"),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu", name="conv2"),
            keras.layers.MaxPooling2D(name="pool"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(128, activation="relu", name="dense"),
            keras.layers.Dense(10, name="logits"),
        ],
        name="digits_convnet",
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sparsity", type=float, default=0.8)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--prune-epochs", type=int, default=8)
    parser.add_argument("--out", default="/tmp/kerasfast-compression")
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    x_train, x_test, y_train, y_test = digits()
    model = digits_convnet()
    model.compile(
        keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    started = time.perf_counter()
    model.fit(x_train, y_train, epochs=args.epochs, batch_size=32, verbose=0)
    train_s = time.perf_counter() - started
    calibration = x_train[:300]

    dense = export_model(
        model, os.path.join(args.out, "dense"),
        formats=["tflite_float32", "tflite_int8"],
        representative_data=calibration, eval_data=(x_test, y_test),
    )
    started = time.perf_counter()
    pruned_run = prune(
        model, (x_train, y_train), target_sparsity=args.sparsity, epochs=args.prune_epochs, batch_size=32, verbose=0
    )
    prune_s = time.perf_counter() - started
    pruned = export_model(
        model, os.path.join(args.out, "pruned"),
        formats=["keras", "saved_model", "saved_model_int8", "tflite_float32", "tflite_dynamic_int8",
                 "tflite_int8", "tflite_float16"],
        representative_data=calibration, eval_data=(x_test, y_test),
    )

    baseline = dense.row("tflite_float32")
    rows = [("dense", r) for r in dense.rows] + [(f"pruned {args.sparsity:.0%}", r) for r in pruned.rows]
    print(f"TF {tf.__version__}, Keras {keras.__version__}, {platform.machine()}, {os.cpu_count()} CPUs; "
          f"train {train_s:.1f}s, prune fine-tune {prune_s:.1f}s; {len(x_test)} test digits\n")
    print("| model | format | size KB | gzip KB | size x | gzip x | accuracy | delta acc (pt) | "
          "LiteRT ms/sample | latency x |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, r in rows:
        latency = "" if r.latency_ms is None else f"{r.latency_ms:.4f}"
        latency_ratio = "" if r.latency_ms is None else f"{r.latency_ms / baseline.latency_ms:.2f}"
        print(
            f"| {label} | {r.format} | {r.size_bytes / 1024:.1f} | {r.gzip_bytes / 1024:.1f} | "
            f"{baseline.size_bytes / r.size_bytes:.1f} | {baseline.gzip_bytes / r.gzip_bytes:.1f} | "
            f"{r.accuracy:.4f} | {100 * (r.accuracy - baseline.accuracy):+.2f} | {latency} | {latency_ratio} |"
        )
    print("\nPer-layer sparsity after pruning:\n")
    print(pruned_run.table())


if __name__ == "__main__":
    main()
