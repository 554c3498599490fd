"""How the GPT recipe model's speed-up over plain Keras grows with its width.

The recipe's default (d_model 128) is small enough that elementwise ops,
which bfloat16 does not speed up on a CPU, take most of a step; wider models
spend more of it in matmuls. For each width: plain `model.fit` (float32,
Keras defaults) against `kerasfast.fit` (auto plan), alternating, best of
`--repeats`, steady state after the first execution, on the same byte
corpus as the recipe (a few dozen steps per epoch).

    python benchmarks/gpt_width.py [--widths 128 256 512] [--repeats 2]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `benchmarks` is a folder of the repository

import keras  # noqa: E402

import kerasfast  # noqa: E402
from benchmarks.run_all import Workload, side_by_side  # noqa: E402
from kerasfast.recipes import load_recipe  # noqa: E402

SEQ_LEN, BATCH, EPOCHS = 128, 32, 2
# Steps per epoch per width: enough for a steady rate, few enough to keep a width under ~4 minutes.
STEPS = {128: 60, 256: 30, 512: 12}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    kerasfast.configure_threads()
    gpt = load_recipe("gpt")
    files = gpt.corpus_files()
    rows = []
    for width in args.widths:
        steps = STEPS.get(width, 24)
        (x, y), _ = gpt.corpus_arrays(files, SEQ_LEN, max_bytes=steps * BATCH * SEQ_LEN)
        work = Workload(f"GPT d_model {width}", lambda width=width: gpt.build_gpt(seq_len=SEQ_LEN, d_model=width, heads=4),
                        x.astype("int32"), y.astype("int32"), BATCH, EPOCHS,
                        keras.losses.SparseCategoricalCrossentropy(from_logits=True), unit="tokens/s", scale=SEQ_LEN)
        keras_best, fast_best, result = side_by_side(work, args.repeats)
        rows.append((work, len(x) // BATCH, keras_best, fast_best, result.plan.precision))
    print()
    print("| model (4 layers, 128 tokens, batch 32) | steps/epoch | plain model.fit | kerasfast.fit | ratio | precision |")
    print("|---|---:|---:|---:|---:|---|")
    for work, steps, keras_rate, fast_rate, precision in rows:
        print(f"| {work.name} | {steps} | {keras_rate:,.0f} tokens/s | {fast_rate:,.0f} tokens/s | "
              f"{fast_rate / keras_rate:.2f}x | {precision} |")
    return rows


if __name__ == "__main__":
    main()
