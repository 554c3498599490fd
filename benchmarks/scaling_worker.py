"""One worker of `benchmarks/scaling.py`: times what data-parallel training
communicates, and a few real train steps, on this machine's workers.

    python -m kerasfast.cli launch -n N -- python benchmarks/scaling_worker.py comm OUT.json
    python -m kerasfast.cli launch -n N -- python benchmarks/scaling_worker.py steps OUT.json MODEL PER_REPLICA_BATCH [SPE]

`comm` all-reduces float32 payloads (single tensors of several sizes, and
each recipe model's list of gradient shapes) the way Keras's optimizer
does: one `ReplicaContext.all_reduce(SUM, gradients)` inside
`strategy.run`, under kerasfast's MultiWorkerMirroredStrategy (RING,
unpacked). Nothing else runs in the timed function, so the time is the
communication alone.

`steps` trains MODEL with `kerasfast.fit` at a fixed per-replica batch
(weak scaling: the global batch grows with the workers) and reports the
steady-state seconds per step. Without TF_CONFIG both run on one worker.

The chief (worker 0) writes OUT.json.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kerasfast  # noqa: E402

kerasfast.distribute.setup()  # multi-worker: before any tensor exists

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from benchmarks.scaling import MODELS, PROBES  # noqa: E402

# Single-tensor payloads: latency-bound (4 B) up to bandwidth-bound (16 MiB).
SIZES_BYTES = (4, 4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)


def _strategy():
    cluster = kerasfast.distribute.cluster_from_env()
    if cluster.num_workers > 1:
        return kerasfast.distribute.multi_worker_strategy(), cluster
    return None, cluster


def _time_all_reduce(strategy, shapes, repeats: int) -> float:
    """Median seconds of one all-reduce of float32 tensors of `shapes`."""
    tensors = [tf.ones(shape, tf.float32) for shape in shapes]

    def replica_fn(*values):
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, list(values))

    @tf.function
    def all_reduce():
        # One local replica per worker: strategy.run returns plain tensors.
        # A scalar of each goes back to the host, so the call returns only
        # once every reduced tensor exists.
        reduced = tf.nest.flatten(strategy.run(replica_fn, args=tuple(tensors)))
        return tf.add_n([tf.reshape(r, [-1])[0] for r in reduced])

    for _ in range(3):  # trace, then let the collective's groups form
        all_reduce().numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        all_reduce().numpy()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def comm(out: pathlib.Path) -> None:
    strategy, cluster = _strategy()
    if strategy is None:
        raise SystemExit("comm needs several workers: start it with `python -m kerasfast.cli launch -n N -- ...`")
    rows = []
    for size in SIZES_BYTES:
        elements = max(1, size // 4)
        rows.append({"payload": f"{size} B tensor", "bytes": elements * 4, "tensors": 1,
                     "seconds": _time_all_reduce(strategy, [(elements,)], repeats=20)})
    for name, spec in MODELS.items():
        model = spec.build()
        shapes = [tuple(v.shape) for v in model.trainable_variables]
        nbytes = 4 * sum(int(np.prod(shape)) for shape in shapes)
        rows.append({"payload": name, "bytes": nbytes, "tensors": len(shapes),
                     "seconds": _time_all_reduce(strategy, shapes, repeats=10)})
    if cluster.is_chief:
        out.write_text(json.dumps({"workers": cluster.num_workers, "rows": rows}, indent=2))


def steps(out: pathlib.Path, name: str, per_replica_batch: int, steps_per_execution: int = 1) -> None:
    _, cluster = _strategy()
    workers = max(1, cluster.num_workers)
    spec = {**MODELS, **PROBES}[name]
    x, y = spec.data(per_replica_batch * workers * 24)
    result = kerasfast.fit(spec.build, (x, y), batch_size=per_replica_batch * workers, epochs=3, loss=spec.loss(),
                           optimizer="adam", run_dir=False, verbose=0, tune="off", steps_per_execution=steps_per_execution)
    if cluster.is_chief:
        sps = result.throughput.samples_per_second
        out.write_text(json.dumps({"workers": workers, "model": name, "per_replica_batch": per_replica_batch,
                                   "step_seconds": per_replica_batch * workers / sps,
                                   "steps_per_execution": steps_per_execution,
                                   "precision": result.plan.precision, "jit_compile": result.plan.jit_compile},
                                  indent=2))


if __name__ == "__main__":
    mode, target = sys.argv[1], pathlib.Path(sys.argv[2])
    if mode == "comm":
        comm(target)
    elif mode == "steps":
        steps(target, sys.argv[3], int(sys.argv[4]), *(int(a) for a in sys.argv[5:6]))
    else:
        raise SystemExit(f"unknown mode {mode!r}: use comm or steps")
