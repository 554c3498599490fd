"""The GPT recipe's model against PyTorch: tokens/s, whole process, first epoch, and where kerasfast's time goes.

Each configuration trains the same model (the GPT recipe's defaults: 4
blocks, d_model 128, 4 heads, 128 tokens, batch 32) from the same initial
weights on the same byte sequences, in a process of its own, so that
"whole process" counts what a user waits for: interpreter and framework
start-up, model building, tracing/compilation and training.

- `keras`: plain `model.fit` (float32, Keras defaults), Adam 1e-3.
- `kerasfast`: `kerasfast.fit` with its auto plan, Adam 1e-3.
- `torch_eager` / `torch_compile`: the same network written in PyTorch as
  its users write it (nanoGPT style: `F.scaled_dot_product_attention` with
  `is_causal=True`), Adam 1e-3; `torch.compile` for the second. bf16
  autocast where the CPU has bf16 instructions (AVX512-BF16, AMX), float32
  elsewhere, where PyTorch's bf16 matmul is a slow reference kernel
  (`--torch-dtype` forces one). Run only when `torch` is installed (the `benchmark`
  extra: `pip install -e ".[benchmark]"`).

kerasfast's cache of tuned plans starts empty: round 1 is its first run of
the script, later rounds re-runs, as `torch.compile`'s later rounds read its
own cache.

Rates are steady state: the tokens of epochs 2.. over their time (epoch 1
holds tracing, compilation and kerasfast's tuning; it is reported as
"first epoch"). Each round also prints the first train step's time, wall
and CPU of all threads (tracing and compilation, less exposed to a busy
machine than wall time). Rounds alternate the configurations; the best round of
each is kept. `--profile` adds a TensorFlow profiler trace of a few of
kerasfast's steady steps, summarised as the op types that took the most
time, and the MFU (FLOPs per step counted by TensorFlow's profiler over the
peak FLOP/s of a dense matmul measured here).

    python benchmarks/transformer.py [--rounds 2] [--steps 60] [--epochs 3] [--profile]
        [--only keras,kerasfast,torch_eager,torch_compile] [--fit-options '{"jit_compile": false}']
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

PROCESS_START = time.perf_counter()
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's kerasfast, not an installed one: a worktree measures its own code
CONFIGS = ("keras", "kerasfast", "torch_eager", "torch_compile")
MODEL = dict(seq_len=128, layers=4, d_model=128, heads=4)
BATCH = 32
LEARNING_RATE = 1e-3


# ---------------------------------------------------------------------------
# The workers: one configuration per process
# ---------------------------------------------------------------------------

def _epoch_clock():
    """A Keras callback timing each epoch from the training call's start."""
    import keras

    class EpochClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.started = time.perf_counter()
            self.ends = []
            self.first_step = None  # (wall s, CPU s of all threads) of the first train step

        def on_train_begin(self, logs=None):
            self.step_started = (time.perf_counter(), time.process_time())

        def on_train_batch_end(self, batch, logs=None):
            if self.first_step is None:
                wall, cpu = self.step_started
                self.first_step = (time.perf_counter() - wall, time.process_time() - cpu)

        def on_epoch_end(self, epoch, logs=None):
            self.ends.append(time.perf_counter())

    return EpochClock()


def _keras_model(work):
    import keras
    import numpy as np

    from kerasfast.recipes import load_recipe

    model = load_recipe("gpt").build_gpt(**MODEL)
    weights = np.load(work / "weights.npz")
    for variable in model.weights:
        variable.assign(weights[variable.path])
    return model, keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def run_keras(work, epochs, profile):
    import keras
    import numpy as np

    x, y = np.load(work / "x.npy"), np.load(work / "y.npy")
    model, loss = _keras_model(work)
    model.compile(keras.optimizers.Adam(LEARNING_RATE), loss)
    clock = _epoch_clock()
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=[clock])
    return {"epoch_ends": [end - clock.started for end in clock.ends], "plan": "float32, Keras defaults",
            "dtype": "float32", "first_step": clock.first_step}


def run_kerasfast(work, epochs, profile, fit_options=None):
    import kerasfast  # first, as docs/fit.md advises: TensorFlow then loads with oneDNN's CPU kernels

    import keras
    import numpy as np
    from kerasfast.plan import compute_dtype

    x, y = np.load(work / "x.npy"), np.load(work / "y.npy")
    clock = _epoch_clock()
    callbacks = [clock] + ([_Profiler(work / "trace", epochs)] if profile else [])
    result = kerasfast.fit(lambda: _keras_model(work)[0], (x, y), batch_size=BATCH, epochs=epochs,
                           optimizer=keras.optimizers.Adam(LEARNING_RATE),
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                           shuffle=False, run_dir=False, verbose=0, callbacks=callbacks, **(fit_options or {}))
    plan = result.plan
    report = {"epoch_ends": [end - clock.started for end in clock.ends], "dtype": compute_dtype(plan.precision),
              "first_step": clock.first_step,
              "plan": f"{'plan as forced' if fit_options else 'auto plan'}: {plan.precision}, "
                      f"jit_compile={plan.jit_compile}, steps_per_execution={plan.steps_per_execution}"}
    if profile:
        report["top_ops"] = top_ops(work / "trace")
    return report


class _Profiler:
    """Traces the executions of the last epoch (steady state) with TensorFlow's profiler."""

    def __new__(cls, logdir, epochs):
        import keras
        import tensorflow as tf

        class Profiler(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                if epoch == epochs - 1:
                    tf.profiler.experimental.start(str(logdir))

            def on_epoch_end(self, epoch, logs=None):
                if epoch == epochs - 1:
                    tf.profiler.experimental.stop()

        return Profiler()


def top_ops(logdir, count: int = 12) -> list[tuple[str, float]]:
    """Op types by their share of the op time on TensorFlow's compute and Eigen threads in a profiler trace.

    Graph ops count by type ("scope/name:MatMul" -> "MatMul"); XLA's
    compiled kernels by name without their number ("XLA fusion.12" -> "XLA
    fusion"). The executors' own events (names with "::", callbacks) hold
    the ops and are left out.

    Returns:
        `[(op type, share), ...]`, largest first.
    """
    import re
    from collections import Counter

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    totals = Counter()
    for path in pathlib.Path(logdir).rglob("*.xplane.pb"):
        space = xplane_pb2.XSpace.FromString(path.read_bytes())
        for plane in space.planes:
            for line in plane.lines:
                if not line.name.startswith(("tf_Compute", "tf_numa")):
                    continue
                for event in line.events:
                    name = plane.event_metadata[event.metadata_id].name
                    if "::" in name or name in ("ExecutorDoneCallback", "BlockUntilReady"):
                        continue
                    op = name.rsplit(":", 1)[1] if ":" in name else "XLA " + re.sub(r"[._]?[.\d]+$", "", name)
                    totals[op] += event.duration_ps
    busy = sum(totals.values()) or 1
    return [(op, picoseconds / busy) for op, picoseconds in totals.most_common(count)]


def _torch_gpt(weights):
    """The recipe's network in PyTorch, initialised from the Keras model's weights."""
    import torch
    from torch import nn
    from torch.nn import functional

    d_model, heads, layers = MODEL["d_model"], MODEL["heads"], MODEL["layers"]

    def linear(path):
        layer = nn.Linear(*weights[f"{path}/kernel"].shape)
        layer.weight.data = torch.from_numpy(weights[f"{path}/kernel"].T.copy())
        layer.bias.data = torch.from_numpy(weights[f"{path}/bias"].copy())
        return layer

    def norm(path):
        layer = nn.LayerNorm(d_model, eps=1e-5)
        layer.weight.data = torch.from_numpy(weights[f"{path}/gamma"].copy())
        layer.bias.data = torch.from_numpy(weights[f"{path}/beta"].copy())
        return layer

    class Block(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.norm1, self.norm2 = norm(f"block{i}_norm1"), norm(f"block{i}_norm2")
            self.qkv, self.out = linear(f"block{i}_attn/qkv"), linear(f"block{i}_attn/out")
            self.mlp_in, self.mlp_out = linear(f"block{i}_mlp_in"), linear(f"block{i}_mlp_out")

        def forward(self, x):
            batch, length, _ = x.shape
            q, k, v = (t.view(batch, length, heads, d_model // heads).transpose(1, 2)
                       for t in self.qkv(self.norm1(x)).split(d_model, dim=-1))
            attended = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(attended.transpose(1, 2).reshape(batch, length, d_model))
            return x + self.mlp_out(functional.gelu(self.mlp_in(self.norm2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding.from_pretrained(torch.from_numpy(weights["token_embedding/embeddings"].copy()),
                                                       freeze=False)
            self.positions = nn.Parameter(torch.from_numpy(weights["position_embedding/positions"].copy()))
            self.blocks = nn.ModuleList(Block(i) for i in range(layers))
            self.norm, self.head = norm("final_norm"), linear("vocab_projection")

        def forward(self, tokens):
            x = self.tokens(tokens) + self.positions[: tokens.shape[1]]
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x)).float()

    return GPT()


def run_torch(work, epochs, profile, compiled: bool, dtype: str = "bfloat16"):
    import contextlib

    import numpy as np
    import torch

    x = torch.from_numpy(np.load(work / "x.npy").astype("int64"))
    y = torch.from_numpy(np.load(work / "y.npy").astype("int64"))
    model = _torch_gpt(dict(np.load(work / "weights.npz")))
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    step_model = torch.compile(model) if compiled else model
    started, ends, first_step = time.perf_counter(), [], None
    cpu_started = time.process_time()
    for _ in range(epochs):
        for start in range(0, len(x) - BATCH + 1, BATCH):
            with torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext():
                logits = step_model(x[start:start + BATCH])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     y[start:start + BATCH].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if first_step is None:
                first_step = (time.perf_counter() - started, time.process_time() - cpu_started)
        ends.append(time.perf_counter() - started)
    return {"epoch_ends": ends, "dtype": dtype, "first_step": first_step,
            "plan": f"PyTorch {torch.__version__}, {'bf16 autocast' if dtype == 'bfloat16' else 'float32'}"
                    + (", torch.compile" if compiled else ", eager")}


def worker(config, work, epochs, profile, fit_options, torch_dtype):
    runs = {"keras": run_keras, "kerasfast": lambda *a: run_kerasfast(*a, fit_options=fit_options),
            "torch_eager": lambda *a: run_torch(*a, compiled=False, dtype=torch_dtype),
            "torch_compile": lambda *a: run_torch(*a, compiled=True, dtype=torch_dtype)}
    report = runs[config](work, epochs, profile)
    report["import_to_exit_s"] = time.perf_counter() - PROCESS_START
    (work / f"{config}.json").write_text(json.dumps(report))


# ---------------------------------------------------------------------------
# The parent: data and weights once, then the configurations side by side
# ---------------------------------------------------------------------------

def prepare(work, steps):
    """Writes the byte sequences and the initial weights every configuration starts from."""
    import keras
    import numpy as np

    from kerasfast.recipes import load_recipe

    gpt = load_recipe("gpt")
    seq_len = MODEL["seq_len"]
    (x, y), _ = gpt.corpus_arrays(gpt.corpus_files(), seq_len, max_bytes=(steps * BATCH + 1) * seq_len * 2)
    np.save(work / "x.npy", x[: steps * BATCH].astype("int32"))
    np.save(work / "y.npy", y[: steps * BATCH].astype("int32"))
    keras.utils.set_random_seed(0)
    model = gpt.build_gpt(**MODEL)
    np.savez(work / "weights.npz", **{variable.path: variable.numpy() for variable in model.weights})


def flops_and_peaks() -> tuple[int, dict[str, float]]:
    """TensorFlow's profiler count of a training sequence's FLOPs (forward x 3), and the measured peak
    FLOP/s of a 2048x2048 matmul in float32 and bfloat16 (best of 2 x 5)."""
    from kerasfast import costs
    from kerasfast.recipes import load_recipe

    forward = costs.forward_flops_per_sample(load_recipe("gpt").build_gpt(**MODEL), (MODEL["seq_len"],), "int32")
    peaks = {dtype: max(costs.measure_peak_flops(dtype, size=2048, repeats=5) for _ in range(2))
             for dtype in ("float32", "bfloat16")}
    return costs.TRAIN_STEP_FLOPS_PER_FORWARD * forward, peaks


def torch_dtype_for_this_cpu() -> str:
    """bf16 autocast where the CPU multiplies bf16 natively (AVX512-BF16 / AMX), float32 elsewhere: on an
    AVX2-only CPU PyTorch's bf16 matmul falls back to a reference kernel hundreds of times slower, and
    no PyTorch user who measured would train in it."""
    from kerasfast.hardware import detect_hardware

    return "bfloat16" if detect_hardware().cpu_has_bf16 else "float32"


def measure(config, work, epochs, profile, steps, fit_options="{}", torch_dtype="bfloat16") -> dict:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--worker", config, "--work", str(work), "--epochs", str(epochs),
                           "--fit-options", fit_options, "--torch-dtype", torch_dtype,
                           *(["--profile"] if profile else [])],
                          capture_output=True, text=True,
                          # kerasfast's cache of tuned plans starts empty in each benchmark: round 1 is a
                          # first run, later rounds re-runs.
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "KERASFAST_CACHE_DIR": str(work / "cache")})
    whole = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"{config} failed:\n{done.stderr[-3000:]}")
    report = json.loads((work / f"{config}.json").read_text())
    ends = report["epoch_ends"]
    tokens_per_epoch = steps * BATCH * MODEL["seq_len"]
    report.update(whole_s=whole, first_epoch_s=ends[0],
                  steady=tokens_per_epoch * (len(ends) - 1) / (ends[-1] - ends[0]))
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--only", default=",".join(CONFIGS))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--fit-options", default="{}",
                        help='JSON of kerasfast.fit overrides, e.g. \'{"jit_compile": false}\' (default: the auto plan)')
    parser.add_argument("--torch-dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                        help="PyTorch's compute dtype (auto: bf16 autocast where the CPU has bf16 instructions, "
                             "float32 otherwise)")
    parser.add_argument("--worker", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first epoch holds compilation, the rate needs later ones")
    if args.worker:
        return worker(args.worker, pathlib.Path(args.work), args.epochs, args.profile, json.loads(args.fit_options),
                      args.torch_dtype)
    configs = [c for c in args.only.split(",") if c]
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        parser.error(f"--only: unknown configuration(s) {sorted(unknown)}; choose from {', '.join(CONFIGS)}")
    try:
        import torch  # noqa: F401
    except ImportError:
        configs = [c for c in configs if not c.startswith("torch")]
        print("torch is not installed: PyTorch configurations left out (pip install -e \".[benchmark]\")")
    torch_dtype = torch_dtype_for_this_cpu() if args.torch_dtype == "auto" else args.torch_dtype
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        prepare(work, args.steps)
        best: dict[str, dict] = {}
        for round_ in range(args.rounds):
            for config in configs:
                report = measure(config, work, args.epochs, args.profile and round_ == 0, args.steps, args.fit_options,
                                 torch_dtype)
                wall, cpu = report["first_step"]
                print(f"round {round_ + 1}{' (first run)' if round_ == 0 else ''} {config}: {report['steady']:,.0f} tokens/s, whole {report['whole_s']:.1f} s, "
                      f"first epoch {report['first_epoch_s']:.1f} s, first step {wall:.2f} s ({cpu:.2f} s CPU)",
                      flush=True)
                kept = best.get(config)
                if kept is None or report["steady"] > kept["steady"]:
                    best[config] = {**report, **({"top_ops": kept["top_ops"]} if kept and "top_ops" in kept else {})}
                best[config]["whole_s"] = min(report["whole_s"], (kept or report)["whole_s"])
                best[config]["first_epoch_s"] = min(report["first_epoch_s"], (kept or report)["first_epoch_s"])
        flops = flops_and_peaks() if args.profile else None
    print_tables(best, args, flops)
    return best


def print_tables(best, args, flops):
    print(f"\nGPT recipe model ({MODEL['layers']} blocks, d_model {MODEL['d_model']}, {MODEL['heads']} heads, "
          f"{MODEL['seq_len']} tokens, batch {BATCH}), {args.steps} steps/epoch x {args.epochs} epochs, "
          f"best of {args.rounds} round(s)\n")
    print("| configuration | tokens/s (steady) | whole process (s) | first epoch (s) | vs plain Keras (steady) |")
    print("|---|---:|---:|---:|---:|")
    base = best.get("keras", {}).get("steady")
    for config, report in best.items():
        ratio = f"{report['steady'] / base:.2f}x" if base else "n/a"
        print(f"| {config}: {report['plan']} | {report['steady']:,.0f} | {report['whole_s']:.1f} | "
              f"{report['first_epoch_s']:.1f} | {ratio} |")
    for torch_config in ("torch_eager", "torch_compile"):
        if "kerasfast" in best and torch_config in best:
            fast, peer = best["kerasfast"], best[torch_config]
            print(f"\nkerasfast / {torch_config}: steady {fast['steady'] / peer['steady']:.2f}x, "
                  f"whole process {peer['whole_s'] / fast['whole_s']:.2f}x (>1: kerasfast faster)")
    fast = best.get("kerasfast", {})
    if fast.get("top_ops"):
        print("\nkerasfast, steady-state steps (last epoch traced): op types by share of the op time\n")
        print("| op type | share |")
        print("|---|---:|")
        for op, share in fast["top_ops"]:
            print(f"| {op} | {share:.1%} |")
    if flops:
        per_sequence, peaks = flops
        print(f"\nMFU: {per_sequence / 1e6:,.1f} MFLOP per training sequence (TensorFlow's profiler, forward x 3) "
              f"over the measured peak of a 2048x2048 matmul in each configuration's compute dtype\n")
        for config, report in best.items():
            achieved = report["steady"] / MODEL["seq_len"] * per_sequence
            peak = peaks[report["dtype"]]
            print(f"- {config}: {achieved / 1e9:.1f} GFLOP/s of {peak / 1e9:.0f} GFLOP/s ({report['dtype']}) "
                  f"= {achieved / peak:.1%}")


if __name__ == "__main__":
    main()
