"""Which precision pays on this machine: kernels first, then whole training runs.

1. The ceiling: forward + backward of single matmuls and convolutions of the
   recipe models' shapes, float32 against bfloat16, in GFLOP/s.
2. Whole runs: plain `model.fit` (float32, Keras defaults) against
   `kerasfast.fit` with each precision forced (`float32`, `mixed_bfloat16`,
   `onednn_bfloat16`), everything else on the auto plan. Runs alternate, best
   of `--repeats`, steady state after the first execution.

    python benchmarks/precision_ablation.py [--workloads gpt cnn image text tabular] [--repeats 2]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `benchmarks` is a folder of the repository

import kerasfast  # noqa: E402

PRECISIONS = ("float32", "mixed_bfloat16", "onednn_bfloat16")
# (name, input shape, weight shape): NHWC convolutions with HWIO filters, or a matmul.
KERNELS = [
    ("matmul 4096x128 @ 128x384 (GPT qkv)", (4096, 128), (128, 384)),
    ("matmul 4096x128 @ 128x512 (GPT MLP in)", (4096, 128), (128, 512)),
    ("matmul 4096x512 @ 512x128 (GPT MLP out)", (4096, 512), (512, 128)),
    ("matmul 2048x2048 @ 2048x2048", (2048, 2048), (2048, 2048)),
    ("conv 3x3 32->32 on 64x8x8 (ResNet stage 1)", (64, 8, 8, 32), (3, 3, 32, 32)),
    ("conv 3x3 64->64 on 64x4x4 (ResNet stage 2)", (64, 4, 4, 64), (3, 3, 64, 64)),
    ("conv 3x3 128->128 on 64x2x2 (ResNet stage 3)", (64, 2, 2, 128), (3, 3, 128, 128)),
    ("conv 3x3 32->32 on 128x32x32 (6-conv CNN)", (128, 32, 32, 32), (3, 3, 32, 32)),
]


def kernel_rate(x_shape, w_shape, dtype, repeats=30) -> float:
    """GFLOP/s of forward + backward (3x the forward FLOPs) of one matmul or convolution."""
    import numpy as np
    import tensorflow as tf

    x, w = tf.Variable(tf.random.normal(x_shape)), tf.Variable(tf.random.normal(w_shape))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            xs, ws = tf.cast(x, dtype), tf.cast(w, dtype)
            y = tf.nn.conv2d(xs, ws, 1, "SAME") if len(x_shape) == 4 else tf.matmul(xs, ws)
            loss = tf.reduce_sum(tf.cast(y, tf.float32))
        return tape.gradient(loss, [x, w])

    for _ in range(3):
        step()
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    seconds = (time.perf_counter() - started) / repeats
    # Each output position (all but the input's last axis) multiplies-adds every weight once.
    forward = 2 * np.prod(x_shape[:-1]) * np.prod(w_shape)
    return 3 * forward / seconds / 1e9


def workloads(names, workdir):
    import numpy as np

    from benchmarks import run_all
    from benchmarks.fit_vs_keras import cifar_like_cnn

    found = {work.name.split(":")[0].lower(): work for work in run_all.workloads(True, workdir)}
    rng = np.random.default_rng(0)
    found["cnn"] = run_all.Workload(
        "6-conv CNN (32x32x3, batch 128)", cifar_like_cnn, rng.random((2048, 32, 32, 3), dtype=np.float32),
        rng.integers(0, 10, 2048).astype("int32"), 128, 2, "sparse_categorical_crossentropy")
    return [found[name] for name in names]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["gpt", "cnn", "image", "text", "tabular"],
                        choices=["gpt", "cnn", "image", "text", "tabular"])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    kerasfast.configure_threads()
    import keras

    from benchmarks.run_all import plain_keras

    print("| kernel (forward + backward) | float32 GFLOP/s | bfloat16 GFLOP/s | bf16 / f32 |")
    print("|---|---:|---:|---:|")
    for name, x_shape, w_shape in KERNELS:
        f32, bf16 = kernel_rate(x_shape, w_shape, "float32"), kernel_rate(x_shape, w_shape, "bfloat16")
        print(f"| {name} | {f32:,.0f} | {bf16:,.0f} | {bf16 / f32:.2f}x |", flush=True)
    print()
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for work in workloads(args.workloads, pathlib.Path(workdir)):
            best = dict.fromkeys(("keras", *PRECISIONS), 0.0)
            for _ in range(args.repeats):
                best["keras"] = max(best["keras"], plain_keras(work))
                for precision in PRECISIONS:
                    keras.utils.set_random_seed(0)
                    result = kerasfast.fit(work.build, work.kerasfast_data, batch_size=work.batch_size,
                                           epochs=work.epochs, loss=work.loss, optimizer="adam", run_dir=False,
                                           verbose=0, precision=precision)
                    best[precision] = max(best[precision], result.throughput.samples_per_second * work.scale)
            rows.append((work, best))
            print(f"# {work.name}: " + ", ".join(f"{k} {v:,.0f}" for k, v in best.items()), flush=True)
    print()
    print("| workload | plain model.fit | " + " | ".join(f"`{p}`" for p in PRECISIONS) + " |")
    print("|---|---:|" + "---:|" * len(PRECISIONS))
    for work, best in rows:
        cells = " | ".join(f"{best[p] / best['keras']:.2f}x" for p in PRECISIONS)
        print(f"| {work.name} | {best['keras']:,.0f} {work.unit} | {cells} |")
    return rows


if __name__ == "__main__":
    main()
