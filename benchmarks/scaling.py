"""The scaling model on paper for the recipe models, and its check against
loopback workers on this machine.

    python benchmarks/scaling.py                  # the table and the loopback check
    python benchmarks/scaling.py --part table     # the table only (or: comm, steps)
    python benchmarks/scaling.py --flops-per-second 5e13   # the table at your device's achieved rate

The table: per model, trainable parameters, bytes all-reduced per update,
training FLOPs per update at its per-replica batch, its step time measured
here on one worker (so the achieved FLOP rate), and the predicted efficiency
(`kerasfast.distribute.scaling`) at 2/4/8/16 workers on 10/25/100 Gb/s
Ethernet and NVLink, with the `grad_accum_steps` that restores 90% at 16.

The check (needs `kerasfast launch`): on 2 shared CPU cores, N loopback
workers compete for the same cores, so their step times mix communication
with compute contention. The communication is therefore timed alone
(`--part comm`): the all-reduce of single float32 tensors (4 B .. 16 MiB)
and of each model's gradient list, over 2 and 4 workers
(`benchmarks/scaling_worker.py comm`). The 2-worker single-tensor times fit
the model's two constants (loopback bandwidth and per-hop latency); the
model then predicts the 4-worker times and the model payloads, which are
printed next to what was measured. `--part steps` times train steps at 1,
2 and 4 workers (and at 2 with steps_per_execution=16) for a probe with
nothing to compute, an MLP and the GPT, against N x the 1-worker step (the
workers time-share the cores) + the all-reduce.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "benchmarks" / "scaling_worker.py"
WORKER_COUNTS = (2, 4, 8, 16)
TABLE_LINKS = ("10GbE", "25GbE", "100GbE", "NVLink")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model of the table: how to build it, random data of its shape, its
    loss, its input (for FLOP counting) and its per-replica batch."""

    build: object
    data: object
    loss: object
    input_shape: tuple
    input_dtype: str
    per_replica_batch: int


def _recipe(name):
    sys.path.insert(0, str(ROOT))
    from kerasfast.recipes import load_recipe

    return load_recipe(name)


def _tabular():
    from sklearn.datasets import load_breast_cancer

    cancer = load_breast_cancer()
    return _recipe("tabular").build_mlp(cancer.data.astype("float32"), cancer.target.astype("int32"), 2)


def _mlp():
    import keras

    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(512, activation="relu"),
                             keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)], name="digits_mlp")


def _floats(shape):
    def make(n):
        import numpy as np

        rng = np.random.default_rng(0)
        return rng.normal(size=(n, *shape)).astype("float32"), rng.integers(0, 2, n).astype("int32")
    return make


def _tokens(seq_len, vocab, classes=None):
    def make(n):
        import numpy as np

        rng = np.random.default_rng(0)
        x = rng.integers(0, vocab, (n, seq_len)).astype("int32")
        y = rng.integers(0, classes, n).astype("int32") if classes else rng.integers(0, vocab, (n, seq_len)).astype("int32")
        return x, y
    return make


def _sparse_ce(from_logits=False):
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)


# Imports stay inside the functions: the worker imports this module after
# kerasfast.distribute.setup(), and nothing here may start TensorFlow first.
MODELS = {
    "tabular MLP (recipe)": ModelSpec(_tabular, _floats((30,)), lambda: _sparse_ce(), (30,), "float32", 128),
    "digits MLP 64-512-512-10": ModelSpec(_mlp, _floats((64,)), lambda: _sparse_ce(True), (64,), "float32", 128),
    "digits small ResNet (recipe)": ModelSpec(lambda: _recipe("image_classification").small_resnet((8, 8, 1), 10),
                                              _floats((8, 8, 1)), lambda: _sparse_ce(), (8, 8, 1), "float32", 32),
    "text encoder (recipe)": ModelSpec(lambda: _recipe("text_classification").text_encoder(128, 10),
                                       _tokens(128, 256, 10), lambda: _sparse_ce(), (128,), "int32", 32),
    "GPT (recipe, 128 tokens)": ModelSpec(lambda: _recipe("gpt").build_gpt(seq_len=128), _tokens(128, 256),
                                          lambda: _sparse_ce(True), (128,), "int32", 16),
}
# A probe with next to nothing to compute or all-reduce (9 parameters): its
# step time on N workers is the distributed step's cost beyond the model.
PROBES = {
    "probe: Dense(1) on 8 features": ModelSpec(
        lambda: __import__("keras").Sequential([__import__("keras").Input((8,)), __import__("keras").layers.Dense(1)]),
        _floats((8,)), lambda: __import__("keras").losses.MeanSquaredError(), (8,), "float32", 128),
}
# The models whose train steps are timed on 1, 2 and 4 loopback workers.
STEP_CHECK_MODELS = ("probe: Dense(1) on 8 features", "digits MLP 64-512-512-10", "GPT (recipe, 128 tokens)")


def _run_worker(workers: int, argv: list[str], out: pathlib.Path, timeout: int = 900) -> dict:
    command = [sys.executable, str(WORKER), *argv[:1], str(out), *argv[1:]]
    if workers > 1:
        command = [sys.executable, "-m", "kerasfast.cli", "launch", "-n", str(workers), "--", *command]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if done.returncode or not out.exists():
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{tail}")
    return json.loads(out.read_text())


def model_rows(flops_per_second: float | None, workdir: pathlib.Path) -> list[dict]:
    """Per model: its costs, its measured one-worker step time, and the rate used."""
    from kerasfast.distribute import scaling

    rows = []
    for name, spec in MODELS.items():
        model = spec.build()
        costs = scaling.ModelCosts.of(model, spec.input_shape, spec.input_dtype)
        step = _run_worker(1, ["steps", name, str(spec.per_replica_batch)], workdir / f"step1-{len(rows)}.json")
        achieved = costs.train_flops_per_sample * spec.per_replica_batch / step["step_seconds"]
        rows.append({"name": name, "costs": costs, "batch": spec.per_replica_batch, "step": step,
                     "achieved": achieved, "rate": flops_per_second or achieved})
        print(f"measured {name}: {costs.trainable_parameters:,} parameters, step {step['step_seconds'] * 1e3:.2f} ms "
              f"({step['precision']}, jit={step['jit_compile']})", flush=True)
    return rows


def print_tables(rows: list[dict], rate_given: bool) -> None:
    from kerasfast.distribute import scaling

    rate_words = "the rate you gave" if rate_given else "the achieved rate measured here"
    print("\n| model | parameters | all-reduced / update | train FLOPs / update (per replica) | per-replica batch "
          "| step, 1 worker, here | achieved FLOP/s here |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        costs = row["costs"]
        print(f"| {row['name']} | {costs.trainable_parameters:,} | {costs.allreduce_bytes / 1e6:.3g} MB | "
              f"{costs.train_flops_per_sample * row['batch'] / 1e9:.3g} GFLOP | {row['batch']} | "
              f"{row['step']['step_seconds'] * 1e3:.3g} ms | {row['achieved'] / 1e9:.3g} G |")
    print(f"\nPredicted efficiency (compute / (compute + ring all-reduce), no overlap) at {rate_words}:\n")
    print("| model | link | " + " | ".join(f"{n} workers" for n in WORKER_COUNTS)
          + f" | grad_accum_steps for 90% at {WORKER_COUNTS[-1]} |")
    print("|---|---|" + "---:|" * (len(WORKER_COUNTS) + 1))
    for row in rows:
        for key in TABLE_LINKS:
            link = scaling.LINKS[key]
            cells = []
            for n in WORKER_COUNTS:
                p = scaling.predict(row["costs"], workers=n, per_replica_batch=row["batch"], link=link,
                                    flops_per_second=row["rate"])
                cells.append(f"{p.efficiency:.0%}")
            fix = scaling.restoring(row["costs"], workers=WORKER_COUNTS[-1], per_replica_batch=row["batch"],
                                    link=link, flops_per_second=row["rate"], target=0.9)
            print(f"| {row['name']} | {link.name} | " + " | ".join(cells) + f" | {fix.grad_accum_steps} |")


def fit_link(two_workers: dict):
    """Loopback bandwidth and per-hop latency fitted to the 2-worker
    single-tensor all-reduces: least squares on t = bytes / B + 2 alpha in
    relative error, so that the small, latency-bound payloads count as much
    as the large ones."""
    import numpy as np

    from kerasfast.distribute import scaling

    points = [(r["bytes"], r["seconds"]) for r in two_workers["rows"] if r["tensors"] == 1]
    nbytes, seconds = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    # For N=2: 2(N-1)/N = 1 and 2(N-1) = 2 hops.
    design = np.stack([nbytes, 2 * np.ones_like(nbytes)], axis=1)
    (per_byte, hop), *_ = np.linalg.lstsq(design / seconds[:, None], np.ones_like(seconds), rcond=None)
    return scaling.Link("loopback (fitted)", float(8 / per_byte / 1e9), float(hop), "fitted to 2-worker all-reduces")


def check_comm(workdir: pathlib.Path):
    """The all-reduce alone over 2 and 4 loopback workers, against the model."""
    from kerasfast.distribute import scaling

    comm = {n: _run_worker(n, ["comm"], workdir / f"comm{n}.json") for n in (2, 4)}
    link = fit_link(comm[2])
    print(f"\nLoopback link fitted to the 2-worker single-tensor all-reduces: {link.gbps:.3g} Gb/s per direction, "
          f"{link.latency_s * 1e6:.0f} us per hop.\n")
    print("| payload | tensors | bytes | 2 workers measured | 2 workers model | 4 workers measured | 4 workers model |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for two, four in zip(comm[2]["rows"], comm[4]["rows"], strict=True):
        cells = []
        for n, measured in ((2, two), (4, four)):
            predicted = scaling.ring_allreduce_seconds(measured["bytes"], n, link)
            cells += [f"{measured['seconds'] * 1e3:.3g} ms", f"{predicted * 1e3:.3g} ms"]
        print(f"| {two['payload']} | {two['tensors']} | {two['bytes']:,} | " + " | ".join(cells) + " |")
    return link


def check_steps(workdir: pathlib.Path, link) -> None:
    """Train steps on 1, 2 and 4 loopback workers against the model with
    compute contention: N workers time-share the cores one worker used, so
    a step is N x the 1-worker step, then the all-reduce."""
    from kerasfast.distribute import scaling

    # Without --part comm in the same run: the fit that --part comm printed here.
    link = link or scaling.Link("loopback (as fitted by --part comm)", 3.2, scaling.TF_RING_HOP_LATENCY_S, "")
    print(f"\nTrain steps at a fixed per-replica batch on N loopback workers sharing 2 cores; model = N x the "
          f"1-worker step + the ring all-reduce over {link.gbps:.3g} Gb/s, {link.latency_s * 1e6:.0f} us per hop:\n")
    print("| model | per-replica batch | 1 worker | 2 workers | model | 4 workers | model "
          "| 2 workers, steps_per_execution=16 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for index, name in enumerate(STEP_CHECK_MODELS):
        spec = {**MODELS, **PROBES}[name]
        batch = str(spec.per_replica_batch)
        times = {n: _run_worker(n, ["steps", name, batch], workdir / f"steps{index}-{n}.json")["step_seconds"]
                 for n in (1, 2, 4)}
        amortised = _run_worker(2, ["steps", name, batch, "16"], workdir / f"steps{index}-2-16.json")["step_seconds"]
        costs = scaling.ModelCosts.of(spec.build(), spec.input_shape, spec.input_dtype)
        model = {n: n * times[1] + scaling.ring_allreduce_seconds(costs.allreduce_bytes, n, link) for n in (2, 4)}
        print(f"| {name} | {batch} | {times[1] * 1e3:.3g} ms | {times[2] * 1e3:.3g} ms | {model[2] * 1e3:.3g} ms | "
              f"{times[4] * 1e3:.3g} ms | {model[4] * 1e3:.3g} ms | {amortised * 1e3:.3g} ms |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flops-per-second", type=float,
                        help="achieved training FLOP/s of one replica on your device (default: measured here)")
    parser.add_argument("--part", choices=("all", "table", "comm", "steps"), default="all",
                        help="run one part (each is a few minutes on 2 cores)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        workdir = pathlib.Path(workdir)
        if args.part in ("all", "table"):
            rows = model_rows(args.flops_per_second, workdir)
            print_tables(rows, args.flops_per_second is not None)
        link = check_comm(workdir) if args.part in ("all", "comm") else None
        if args.part in ("all", "steps"):
            check_steps(workdir, link)


if __name__ == "__main__":
    main()
