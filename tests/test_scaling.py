"""The scaling model on paper (`kerasfast.distribute.scaling`): its arithmetic
on cases worked by hand, its direction (efficiency falls with workers and
rises with bandwidth), the accumulation / batch it says would restore
efficiency, and the line a distributed `fit`'s plan carries."""

import itertools
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import keras
import pytest
import tensorflow as tf

from kerasfast.distribute import scaling
from kerasfast.errors import KerasfastError, PlanError

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _dense_model(dtype=None):
    # 10 -> 7 -> 3, no activations: (10*7 + 7) + (7*3 + 3) = 101 parameters.
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(7, dtype=dtype),
                             keras.layers.Dense(3, dtype=dtype)])


def test_bytes_and_flops_of_a_dense_model_match_the_hand_count():
    costs = scaling.ModelCosts.of(_dense_model(), (10,))
    assert costs.trainable_parameters == 101
    assert costs.allreduce_bytes == 101 * 4
    # Forward: 2*10*7 + 7 bias adds + 2*7*3 + 3 bias adds = 192; training is 3x.
    assert costs.train_flops_per_sample == 3 * 192


def test_mixed_precision_gradients_of_float32_variables_are_float32():
    model = _dense_model(dtype="mixed_bfloat16")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.cast(model(tf.ones((2, 10))), "float32"))
    gradients = tape.gradient(loss, model.trainable_variables)
    assert {v.dtype for v in model.trainable_variables} == {"float32"}
    assert {g.dtype for g in gradients} == {tf.float32}  # so 4 bytes per parameter all-reduced


def test_ring_all_reduce_time_on_a_case_worked_by_hand():
    link = scaling.Link("test", gbps=8.0, latency_s=1e-3, source="")  # 1 GB/s each way
    # 4 workers: each sends 2*3/4 = 1.5 x 1 GB over 1 GB/s = 1.5 s, plus 6 hops of 1 ms.
    assert scaling.ring_allreduce_seconds(1e9, 4, link) == pytest.approx(1.506)
    assert scaling.ring_allreduce_seconds(1e9, 1, link) == 0.0


def test_efficiency_falls_with_workers_and_rises_with_bandwidth():
    costs = scaling.ModelCosts(trainable_parameters=3_500_000, train_flops_per_sample=3e8)
    common = dict(per_replica_batch=16, flops_per_second=5e10)
    by_workers = [scaling.predict(costs, workers=n, link=scaling.LINKS["10GbE"], **common).efficiency
                  for n in (1, 2, 4, 8, 16, 64)]
    assert by_workers[0] == 1.0
    assert all(a > b for a, b in itertools.pairwise(by_workers))
    by_link = [scaling.predict(costs, workers=8, link=scaling.LINKS[key], **common).efficiency
               for key in ("10GbE", "25GbE", "100GbE", "NVLink")]
    assert all(a < b for a, b in itertools.pairwise(by_link))


@pytest.mark.parametrize("target, fixed", [(0.8, 0.0), (0.9, 0.0), (0.95, 0.0), (0.9, 2e-4)])
def test_restoring_reaches_the_target_with_the_smallest_value(target, fixed):
    costs = scaling.ModelCosts(trainable_parameters=1_000_000, train_flops_per_sample=6e6)
    setup = dict(workers=8, link=scaling.LINKS["25GbE"], flops_per_second=1e12, fixed_seconds_per_step=fixed)
    assert scaling.predict(costs, per_replica_batch=32, **setup).efficiency < target
    fix = scaling.restoring(costs, per_replica_batch=32, target=target, **setup)
    accumulated = scaling.predict(costs, per_replica_batch=32, grad_accum_steps=fix.grad_accum_steps, **setup)
    one_less = scaling.predict(costs, per_replica_batch=32, grad_accum_steps=fix.grad_accum_steps - 1, **setup)
    assert accumulated.efficiency >= target > one_less.efficiency
    bigger = scaling.predict(costs, per_replica_batch=fix.per_replica_batch, **setup)
    smaller = scaling.predict(costs, per_replica_batch=fix.per_replica_batch - 1, **setup)
    assert bigger.efficiency >= target > smaller.efficiency


def test_plan_note_names_the_fix_only_below_the_target():
    costs = scaling.ModelCosts(trainable_parameters=1_000_000, train_flops_per_sample=6e6)
    common = dict(workers=4, grad_accum_steps=1, flops_per_second=1e12, strategy_name="multi_worker",
                  accelerator="gpu")
    slow = scaling.plan_note(costs, per_replica_batch=64, environ={}, **common)
    assert "10 Gb/s Ethernet (assumed" in slow and "below 80%: grad_accum_steps=" in slow
    # TensorFlow's per-hop latency stays whatever the bandwidth: a large batch is what pays for it.
    fast = scaling.plan_note(costs, per_replica_batch=20_000, environ={"KERASFAST_LINK_GBPS": "100"}, **common)
    assert "over 100 Gb/s (your KERASFAST_LINK_GBPS)" in fast
    assert "predicted efficiency 9" in fast and "below 80%" not in fast
    unknown = scaling.plan_note(scaling.ModelCosts(1000, None), per_replica_batch=64, environ={}, **common)
    assert "no efficiency is predicted" in unknown


@pytest.mark.parametrize("value", ["fast", "0", "-3", "inf"])
def test_a_bad_link_variable_is_refused_by_name(value):
    with pytest.raises(PlanError, match="KERASFAST_LINK_GBPS") as caught:
        scaling.link_from_env({"KERASFAST_LINK_GBPS": value})
    assert isinstance(caught.value, KerasfastError)


def test_a_distributed_fit_plan_carries_the_scaling_line(tmp_path):
    # MirroredStrategy over 2 logical CPU devices, as tests/workers/matrix.py,
    # in a fresh process (the devices must be split before TensorFlow starts).
    script = textwrap.dedent("""
        import json, sys
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import keras, numpy as np, kerasfast
        x = np.random.default_rng(0).normal(size=(64, 10)).astype("float32")
        y = (x[:, 0] > 0).astype("int32")
        build = lambda: keras.Sequential([keras.Input((10,)), keras.layers.Dense(7), keras.layers.Dense(3)])
        reasons = {}
        for strategy in ("mirrored", "none"):
            result = kerasfast.fit(build, (x, y), strategy=strategy, batch_size=16, epochs=1, run_dir=False,
                                   verbose=0, tune="off", steps_per_execution=1,
                                   loss="sparse_categorical_crossentropy")
            reasons[strategy] = result.plan.reasons["num_replicas"]
        print("PLAN" + str(result.plan))
        json.dump(reasons, open(sys.argv[1], "w"))
    """)
    out = tmp_path / "reasons.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT), "KERASFAST_LINK_GBPS": "0.01"}
    done = subprocess.run([sys.executable, "-c", script, str(out)], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    reasons = json.loads(out.read_text())
    mirrored = reasons["mirrored"]
    # 101 float32 gradients = 404 bytes over 0.01 Gb/s: slow enough to be below 80% at any CPU's peak.
    assert "scaling: the logical CPU devices share this CPU's cores" in mirrored
    assert "ring all-reduce of 0.000404 MB per update (101 float32 gradients) over 0.01 Gb/s" in mirrored
    assert "predicted efficiency" in mirrored and "below 80%: grad_accum_steps=" in mirrored
    assert "scaling" not in reasons["none"]
