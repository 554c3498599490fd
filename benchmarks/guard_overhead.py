"""What the divergence guard costs: `on_nan="recover"` (the default) vs
`on_nan="ignore"` (no checks, as Keras), side by side in one run.

The guard reads two scalars per execution and copies the training state to
host memory every `backup_every` steps. Workloads with the shortest steps
show its cost most. Runs alternate; the best steady-state rate of each
counts.

    python benchmarks/guard_overhead.py [--repeats 3] [--epochs 3]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's kerasfast, not an installed one: a worktree measures its own code

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kerasfast  # noqa: E402
from kerasfast.quickstart import digits_convnet  # noqa: E402


def workloads():
    from sklearn.datasets import load_breast_cancer

    (x, y), _ = kerasfast.datasets.digits(test_fraction=0.0)
    features, labels = load_breast_cancer(return_X_y=True)
    features = np.tile(((features - features.mean(0)) / features.std(0)).astype("float32"), (8, 1))
    labels = np.tile(labels.astype("int32"), 8)

    def mlp():
        return keras.Sequential([keras.Input((30,)), keras.layers.Dense(64, activation="relu"),
                                 keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)])

    return [
        ("digits convnet (8x8x1, batch 64)", digits_convnet, x, y, 64),
        ("tabular MLP (breast cancer x8, batch 32)", mlp, features, labels, 32),
    ]


def rate(build, x, y, batch_size, epochs, on_nan):
    keras.utils.set_random_seed(0)
    result = kerasfast.fit(build, x, y, batch_size=batch_size, epochs=epochs, verbose=0, run_dir=False,
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), on_nan=on_nan)
    return result.throughput.samples_per_second, result.plan


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    print("| workload | on_nan='ignore' | on_nan='recover' | cost | steps_per_execution |")
    print("|---|---:|---:|---:|---:|")
    for name, build, x, y, batch_size in workloads():
        best = {"ignore": 0.0, "recover": 0.0}
        for _ in range(args.repeats):
            for on_nan in best:
                value, plan = rate(build, x, y, batch_size, args.epochs, on_nan)
                best[on_nan] = max(best[on_nan], value)
        cost = 1 - best["recover"] / best["ignore"]
        print(f"| {name} | {best['ignore']:,.0f} samples/s | {best['recover']:,.0f} samples/s | {cost:+.1%} | "
              f"{plan.steps_per_execution} |", flush=True)


if __name__ == "__main__":
    main()
