"""The benchmark suite: plain Keras vs kerasfast for every recipe model, side by side.

For each recipe's model, in one run on this machine: plain Keras
(`model.fit` on in-memory NumPy arrays, float32, Keras defaults: batch as
given, one step per execution, no XLA on CPU) against `kerasfast.fit` (auto
plan, kerasfast's input pipeline; the image model reads TFRecords). Runs
alternate (Keras, kerasfast, Keras, ...) so that machine noise hits both, the
best steady-state rate of each is kept (the first, compiling execution is
excluded from both), and the ratio is printed. Then the GPT recipe's model
FLOPs utilisation, the input-pipeline table and the compression table, and
everything is written to docs/benchmarks.md with the machine and command.

    python benchmarks/run_all.py [--repeats 2] [--quick] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

import kerasfast
from kerasfast import costs, datasets
from kerasfast.plan import compute_dtype
from kerasfast.recipes import load_recipe
from kerasfast.training.throughput import ThroughputMeter, samples_counter

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPARSE_CE = "sparse_categorical_crossentropy"


class Workload:
    """One recipe model: how to build it, its data and its loss."""

    def __init__(self, name, build, x, y, batch_size, epochs, loss, unit="samples/s", scale=1.0, kerasfast_data=None):
        self.name, self.build, self.x, self.y = name, build, x, y
        self.batch_size, self.epochs, self.loss = batch_size, epochs, loss
        self.unit, self.scale = unit, scale
        self.kerasfast_data = kerasfast_data if kerasfast_data is not None else (x, y)


def workloads(quick: bool, workdir: pathlib.Path) -> list[Workload]:
    image = load_recipe("image_classification")
    tabular = load_recipe("tabular")
    text = load_recipe("text_classification")
    gpt = load_recipe("gpt")
    epochs = 2 if quick else 3  # the first execution compiles; a rate needs later ones

    (x_digits, y_digits), _ = datasets.digits(test_fraction=0.0)
    records = kerasfast.data.write_tfrecords((x_digits, y_digits), workdir / "digits", shards=8)

    from sklearn.datasets import load_breast_cancer

    cancer = load_breast_cancer()
    x_tab = np.tile(cancer.data.astype("float32"), (8, 1))
    y_tab = np.tile(cancer.target.astype("int32"), 8)

    (x_text, y_text), _, packages = text.stdlib_chunks(128, 200 if quick else 400, 10)

    seq_len = gpt.DEFAULTS["seq_len"]
    (x_gpt, y_gpt), _ = gpt.corpus_arrays(gpt.corpus_files(), seq_len, max_bytes=(64 if quick else 256) * seq_len * 32)
    x_gpt, y_gpt = x_gpt.astype("int32"), y_gpt.astype("int32")

    return [
        Workload("image: small ResNet (digits 8x8, batch 64)", lambda: image.small_resnet((8, 8, 1), 10),
                 x_digits, y_digits, 64, epochs, SPARSE_CE, kerasfast_data=str(records.out_dir)),
        Workload("tabular: MLP (breast cancer x8, batch 256)", lambda: tabular.build_mlp(x_tab, y_tab, 2),
                 x_tab, y_tab, 256, epochs, SPARSE_CE),
        Workload("text: transformer encoder (stdlib chunks, 128 bytes, batch 64)",
                 lambda: text.text_encoder(128, len(packages)), x_text, y_text, 64, epochs, SPARSE_CE),
        Workload(f"GPT: decoder LM (stdlib bytes, {seq_len} tokens, batch 32)",
                 lambda: gpt.build_gpt(seq_len=seq_len),
                 x_gpt, y_gpt, 32, epochs, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 unit="tokens/s", scale=seq_len),
    ]


def plain_keras(work: Workload) -> float:
    keras.utils.set_random_seed(0)
    model = work.build()
    model.compile("adam", work.loss)
    meter = ThroughputMeter(samples_counter(work.batch_size, len(work.x)), -(-len(work.x) // work.batch_size))
    model.fit(work.x, work.y, batch_size=work.batch_size, epochs=work.epochs, verbose=0, callbacks=[meter])
    return meter.result().samples_per_second * work.scale


def with_kerasfast(work: Workload):
    keras.utils.set_random_seed(0)
    result = kerasfast.fit(work.build, work.kerasfast_data, batch_size=work.batch_size, epochs=work.epochs,
                           loss=work.loss, optimizer="adam", run_dir=False, verbose=0)
    return result.throughput.samples_per_second * work.scale, result


def side_by_side(work: Workload, repeats: int):
    """Alternates plain Keras and kerasfast `repeats` times; returns the best
    rate of each and the kerasfast run that gave its best."""
    keras_best = fast_best = 0.0
    best_run = None
    for _ in range(repeats):
        keras_best = max(keras_best, plain_keras(work))
        rate, run = with_kerasfast(work)
        if rate >= fast_best:
            fast_best, best_run = rate, run
    print(f"{work.name}: keras {keras_best:,.0f} vs kerasfast {fast_best:,.0f} {work.unit} "
          f"= {fast_best / keras_best:.2f}x", flush=True)
    return keras_best, fast_best, best_run


def model_flops_utilisation(work: Workload, result) -> dict:
    """Achieved training FLOP/s over the measured peak in the plan's compute dtype."""
    model = result.train_model
    dtype = compute_dtype(result.plan.precision)
    forward = costs.forward_flops_per_sample(model, tuple(work.x.shape[1:]), tf.as_dtype(work.x.dtype))
    peak = costs.measure_peak_flops(dtype, size=2048, repeats=5)
    achieved = costs.TRAIN_STEP_FLOPS_PER_FORWARD * forward * result.throughput.samples_per_second
    return {"forward_flops_per_sequence": forward, "achieved_flops": achieved, "peak_flops": peak,
            "peak_dtype": dtype, "mfu": achieved / peak}


def subprocess_tables(script: str, argv: list[str]) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *argv], capture_output=True, text=True,
                          timeout=1800)
    if done.returncode:
        return f"(benchmarks/{script} failed: {done.stderr.strip().splitlines()[-1] if done.stderr else done.returncode})"
    keep = [line for line in done.stdout.splitlines() if line.startswith(("|", "#")) or line.strip() == ""]
    return "\n".join(keep).strip()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="two epochs per run, smaller data (a smoke test)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--skip-tables", action="store_true", help="leave out the input-pipeline and compression runs")
    args = parser.parse_args(argv)
    kerasfast.configure_threads()
    hardware = kerasfast.detect_hardware()
    machine = (f"{hardware.cpu_model}, {hardware.cpu_cores} cores, flags {', '.join(hardware.cpu_flags) or 'none'}, "
               f"GPUs: {', '.join(g.name for g in hardware.gpus) or 'none'}; Python {platform.python_version()}, "
               f"TensorFlow {tf.__version__}, Keras {keras.__version__}")
    print(f"machine: {machine}", flush=True)
    started = time.time()
    rows, mfu = [], None
    with tempfile.TemporaryDirectory() as workdir:
        for work in workloads(args.quick, pathlib.Path(workdir)):
            keras_best, fast_best, result = side_by_side(work, args.repeats)
            rows.append((work, keras_best, fast_best, result.plan))
            if work.unit == "tokens/s":
                mfu = model_flops_utilisation(work, result)
    table = ["| workload | plain model.fit | kerasfast.fit | ratio | kerasfast plan |", "|---|---:|---:|---:|---|"]
    for work, keras_rate, fast_rate, plan in rows:
        choices = (f"{plan.precision}, jit={plan.jit_compile}, steps_per_execution={plan.steps_per_execution}")
        table.append(f"| {work.name} | {keras_rate:,.0f} {work.unit} | {fast_rate:,.0f} {work.unit} | "
                     f"{fast_rate / keras_rate:.2f}x | {choices} |")
    mfu_text = (
        f"GPT recipe model: {mfu['forward_flops_per_sequence'] / 1e6:,.1f} MFLOP per sequence forward (TensorFlow "
        f"profiler), x{costs.TRAIN_STEP_FLOPS_PER_FORWARD} for a training step; achieved "
        f"{mfu['achieved_flops'] / 1e9:,.1f} GFLOP/s against a peak of {mfu['peak_flops'] / 1e9:,.0f} GFLOP/s "
        f"(a 2048x2048 {mfu['peak_dtype']} matmul measured in the same run): **MFU {mfu['mfu']:.1%}**."
        if mfu else "GPT MFU: not measured."
    )
    tables = ""
    if not args.skip_tables:
        tables = ("\n## Quick check: `benchmarks/fit_vs_keras.py`\n\n"
                  + subprocess_tables("fit_vs_keras.py", ["--repeats", "2"])
                  + "\n\n## Divergence guard: `benchmarks/guard_overhead.py`\n\n"
                  + subprocess_tables("guard_overhead.py", ["--repeats", "2"] if args.quick else [])
                  + "\n\n## Tuning: `benchmarks/tune.py`\n\n"
                  + subprocess_tables("tune.py", ["--quick", "--seconds", "10"] if args.quick else [])
                  + "\n\n## GPT width: `benchmarks/gpt_width.py`\n\n"
                  + subprocess_tables("gpt_width.py", ["--widths", "128", "256"] if args.quick else [])
                  + "\n\n## Scaling model (`benchmarks/scaling.py --part table`; docs/scaling.md)\n\n"
                  + subprocess_tables("scaling.py", ["--part", "table"])
                  + "\n\n## Input pipeline (`benchmarks/input_pipeline.py`)\n\n"
                  + subprocess_tables("input_pipeline.py", ["--records", "5000" if args.quick else "20000"])
                  + "\n\n## tf.data service (`benchmarks/data_service.py`)\n\n"
                  + subprocess_tables("data_service.py", ["--records", "2048", "--repeats", "1"] if args.quick
                                      else [])
                  + "\n\n## Compression (`benchmarks/compression.py`)\n\n"
                  + subprocess_tables("compression.py", []) + "\n")
    command = "python benchmarks/run_all.py" + (" " + " ".join(argv) if argv else "")
    text = f"""# Benchmarks

Measured {datetime.date.today().isoformat()} with `{command}` ({time.time() - started:,.0f} s).

Machine: {machine}.

## kerasfast.fit vs plain model.fit

Same model, data and batch size; plain Keras is `model.fit` on in-memory
NumPy arrays, float32, Keras defaults; kerasfast is `kerasfast.fit` with the
auto plan (the image model reads TFRecords through kerasfast's pipeline).
Steady-state rates after the first (compiling) execution, best of
{args.repeats} alternating runs of {rows[0][0].epochs} epoch(s) each.

{chr(10).join(table)}

{mfu_text}
{tables}"""
    pathlib.Path(args.out).write_text(text, encoding="utf-8")
    print(f"\nwrote {args.out}")
    return rows


if __name__ == "__main__":
    main()
