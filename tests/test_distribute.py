"""Distributed training: strategy choice, the full matrix of fast paths under
MirroredStrategy (2 logical CPU devices) and MultiWorkerMirroredStrategy (2
real worker processes on loopback), equivalence with one replica, and the
launcher."""

import itertools
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import kerasfast
from kerasfast.distribute import cluster_from_env, resolve_strategy
from kerasfast.distribute.launch import launch, tf_config
from kerasfast.errors import PlanError
from tests.helpers import record_digests

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "workers" / "matrix.py"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}

MATRIX = [
    {"name": f"{precision}-accum{accum}-spe{spe}-jit{int(jit)}", "precision": precision, "grad_accum_steps": accum,
     "steps_per_execution": spe, "jit_compile": jit, "batch_size": 32, "epochs": 2}
    for precision, accum, spe, jit in itertools.product(
        ("float32", "mixed_bfloat16", "mixed_float16", "onednn_bfloat16"), (1, 4), (1, 8), (False, True))
    if not (precision == "onednn_bfloat16" and jit)  # refused: oneDNN's graph pass does not reach into XLA
]
# A pairwise covering of MATRIX: every value of each dimension, and every
# pair of values of any two dimensions, in 8 of its 28 configurations. Two
# workers run the full matrix; MirroredStrategy and four workers (4x the time
# of two workers' on 2 cores) run this covering.
COVERING = {
    "float32-accum1-spe1-jit0", "float32-accum4-spe8-jit1", "mixed_bfloat16-accum4-spe1-jit1",
    "mixed_bfloat16-accum1-spe8-jit0", "mixed_float16-accum1-spe8-jit1", "mixed_float16-accum4-spe1-jit0",
    "onednn_bfloat16-accum4-spe8-jit0", "onednn_bfloat16-accum1-spe1-jit0"}
# The covering's runs also save a ModelCheckpoint each epoch, which must load
# as the model the user built (float32) and predict as the trained model.
for config in MATRIX:
    config["checkpoint"] = config["name"] in COVERING
MATRIX_4 = [config for config in MATRIX if config["name"] in COVERING]
EQUIVALENCE = [{"name": "equivalence", "precision": "float32", "batch_size": 64, "epochs": 2, "shuffle": False,
                "steps_per_execution": 1, "learning_rate": 0.5},
               # fit's clipnorm= clips the summed gradient (its norm here 0.75-0.93 at the start), not each
               # replica's share of it.
               {"name": "equivalence_clipped", "precision": "float32", "batch_size": 64, "epochs": 2,
                "shuffle": False, "steps_per_execution": 1, "learning_rate": 0.5, "clipnorm": 0.2}]
# float32 sums of the same gradients in another order (per-replica partial
# sums, then the all-reduce) differ in the last bits; after 16 SGD updates
# the weights agree to this tolerance.
EQUIVALENCE_ATOL = 1e-5


def run_worker(out_dir, strategy, configs, timeout=900, workers=2):
    command = [sys.executable, str(WORKER), str(out_dir), strategy, json.dumps(configs)]
    if strategy == "multi_worker":
        command = [sys.executable, "-m", "kerasfast.cli", "launch", "-n", str(workers), "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    processes = workers if strategy == "multi_worker" else 1
    return [json.loads((out_dir / f"results.worker{i}.json").read_text()) for i in range(processes)]


def weights(out_dir, name, worker=0):
    with np.load(out_dir / f"{name}.worker{worker}.npz") as data:
        return [data[key] for key in sorted(data.files, key=lambda k: int(k.split("_")[1]))]


def assert_matrix_trained(results, strategy, matrix=MATRIX, replicas=2):
    for config in matrix:
        outcome = results[config["name"]]
        assert "refused" not in outcome, f"{config['name']} was refused: {outcome}"
        assert outcome["replicas"] == replicas and outcome["strategy"] == strategy
        assert outcome["loss"][-1] < outcome["loss"][0], f"{config['name']}: loss did not fall {outcome['loss']}"
        if config["checkpoint"]:  # a checkpoint saved during the run is the model the user built, as trained
            assert outcome["checkpoint_policies"] == ["float32"], (config["name"], outcome["checkpoint_policies"])
            assert outcome["checkpoint_predicts_as_trained"], config["name"]


@pytest.mark.slow
def test_mirrored_matrix_trains_with_every_fast_path(tmp_path):
    # The pairwise covering: the full product runs under MultiWorkerMirroredStrategy
    # below, through the same step functions.
    (results,) = run_worker(tmp_path, "mirrored", MATRIX_4)
    assert_matrix_trained(results, "mirrored", MATRIX_4)
    for config in MATRIX_4:
        assert results[config["name"]]["replica_gap"] == 0.0, config["name"]


@pytest.mark.slow
def test_multi_worker_matrix_trains_with_identical_weights_on_both_workers(tmp_path):
    chief, other = run_worker(tmp_path, "multi_worker", MATRIX)
    assert chief == other  # same loss curves, logged on both workers
    assert_matrix_trained(chief, "multi_worker")
    for config in MATRIX:
        for a, b in zip(weights(tmp_path, config["name"], 0), weights(tmp_path, config["name"], 1), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=config["name"])


@pytest.mark.slow
def test_four_worker_matrix_trains_with_identical_weights_on_every_worker(tmp_path):
    results = run_worker(tmp_path, "multi_worker", MATRIX_4, workers=4)
    assert all(other == results[0] for other in results[1:])  # same loss curves, logged on every worker
    assert_matrix_trained(results[0], "multi_worker", MATRIX_4, replicas=4)
    for config in MATRIX_4:
        chief = weights(tmp_path, config["name"], 0)
        for worker in (1, 2, 3):
            for a, b in zip(chief, weights(tmp_path, config["name"], worker), strict=True):
                np.testing.assert_array_equal(a, b, err_msg=f"{config['name']}, worker {worker}")


def _one_replica_reference(tmp_path, config):
    import keras

    from kerasfast import datasets

    (x, y), _ = datasets.digits()
    x, y = x[:512].reshape(512, 64), y[:512]
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(10)])
    config = dict(config)
    config.pop("name")
    kerasfast.fit(model, (x, y), strategy="none", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(config.pop("learning_rate")), run_dir=False, verbose=0, **config)
    return model.get_weights()


@pytest.mark.parametrize("strategy, workers", [("mirrored", 1), ("multi_worker", 2), ("multi_worker", 4)])
def test_several_replicas_reach_the_weights_of_one_replica_at_the_same_global_batch(tmp_path, strategy, workers):
    results = run_worker(tmp_path, strategy, EQUIVALENCE, workers=workers)
    for config in EQUIVALENCE:
        assert results[0][config["name"]]["replicas"] == max(workers, 2)
        reference = _one_replica_reference(tmp_path, config)
        for worker in range(workers):
            for a, b in zip(weights(tmp_path, config["name"], worker), reference, strict=True):
                np.testing.assert_allclose(a, b, atol=EQUIVALENCE_ATOL, err_msg=config["name"])


@pytest.mark.parametrize("workers, shards, sharding", [
    (2, 4, "file"),
    pytest.param(4, 2, "data", marks=pytest.mark.slow),  # fewer files than workers: each keeps 1 record in 4
])
def test_multi_worker_training_from_tfrecords_gives_each_worker_its_own_share(tmp_path, digits, workers, shards,
                                                                                 sharding):
    (x, y), _ = digits
    kerasfast.data.write_tfrecords((x, y), tmp_path / "records", shards=shards)
    command = [sys.executable, "-m", "kerasfast.cli", "launch", "-n", str(workers), "--", sys.executable,
               str(ROOT / "tests" / "workers" / "tfrecords.py"), str(tmp_path / "records"), str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    reports = [json.loads((tmp_path / f"worker{i}.json").read_text()) for i in range(workers)]
    chief = reports[0]
    assert chief["strategy"] == "multi_worker" and chief["replicas"] == workers
    assert chief["loss"][-1] < chief["loss"][0]
    for other in reports[1:]:
        assert other["loss"] == chief["loss"] and other["weights"] == chief["weights"]
    # Every record is read by exactly one worker.
    assert {report["sharding"] for report in reports} == {sharding}
    expected = sorted(record_digests(kerasfast.data.tfrecord_dataset(tmp_path / "records", batch_size=16,
                                                                     shuffle=False)))
    assert len(expected) == len(x)
    assert sorted(digest for report in reports for digest in report["records"]) == expected


_AFTER_THE_USERS_STRATEGY = """
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import kerasfast
import keras

rng = np.random.default_rng(0)
x, y = rng.normal(size=(256, 8)).astype("float32"), rng.integers(0, 2, 256)

def model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.BatchNormalization(synchronized=True), keras.layers.Dense(2)])

loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
    theirs = model()
    theirs.compile(keras.optimizers.SGD(0.1), loss)
keras_losses = theirs.fit(x, y, epochs=2, batch_size=32, shuffle=False, verbose=0).history["loss"]
result = kerasfast.fit(model(), x, y, epochs=2, batch_size=32, shuffle=False, strategy="mirrored", loss=loss,
                       optimizer=keras.optimizers.SGD(0.1), steps_per_execution=1, tune="off", run_dir=False,
                       verbose=0)
json.dump({"keras": keras_losses, "kerasfast": result.history.history["loss"]}, open(sys.argv[1], "w"))
"""


def test_a_model_all_reducing_in_its_forward_pass_trains_after_the_users_own_mirrored_strategy(tmp_path):
    # Synchronized batch norm all-reduces inside the forward pass; a MirroredStrategy the user made earlier in the
    # process numbered its collectives from the same start as kerasfast's ("Shape mismatch in the collective").
    out = tmp_path / "losses.json"
    done = subprocess.run([sys.executable, "-c", _AFTER_THE_USERS_STRATEGY, str(out)], capture_output=True,
                          text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = json.loads(out.read_text())
    np.testing.assert_allclose(losses["kerasfast"], losses["keras"], rtol=1e-5)


def test_workers_with_different_plans_refuse_before_training():
    command = [sys.executable, "-m", "kerasfast.cli", "launch", "-n", "2", "--", sys.executable,
               str(ROOT / "tests" / "workers" / "mismatched_plans.py")]
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 3, done.stdout[-3000:]
    assert "refused: the workers resolved different plans" in done.stdout
    assert "trained" not in done.stdout.replace("untrained", "")


def test_pruning_under_multi_worker_gives_identical_exact_masks(tmp_path):
    config = {"name": "pruned", "precision": "float32", "batch_size": 32, "epochs": 2, "prune": 0.5}
    chief, other = run_worker(tmp_path, "multi_worker", [config])
    assert "refused" not in chief["pruned"], chief
    for a, b in zip(weights(tmp_path, "pruned", 0), weights(tmp_path, "pruned", 1), strict=True):
        np.testing.assert_array_equal(a, b)
    kernels = [w for w in weights(tmp_path, "pruned", 0) if w.ndim == 2]
    for kernel in kernels:  # exactly half of every Dense kernel is zero
        assert int(np.sum(kernel == 0)) == round(0.5 * kernel.size)


def test_tf_config_is_read_like_cluster_schedulers_write_it():
    env = {"TF_CONFIG": tf_config(["127.0.0.1:1111", "127.0.0.1:2222"], 1)}
    cluster = cluster_from_env(env)
    assert cluster.num_workers == 2 and cluster.index == 1 and not cluster.is_chief
    chief_style = json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:2", "c:3"]},
                              "task": {"type": "worker", "index": 0}})
    assert cluster_from_env({"TF_CONFIG": chief_style}).index == 1
    assert cluster_from_env({}).num_workers == 1
    with pytest.raises(PlanError, match="TF_CONFIG is not valid"):
        cluster_from_env({"TF_CONFIG": "{not json"})
    with pytest.raises(PlanError, match="task index 5"):
        cluster_from_env({"TF_CONFIG": tf_config(["a:1"], 5)})


def test_strategy_names_are_checked():
    assert resolve_strategy("none").strategy is None
    auto = resolve_strategy("auto")
    assert auto.name == "none" and auto.reason.startswith("auto")
    with pytest.raises(PlanError, match="strategy='ring' is not known"):
        resolve_strategy("ring")
    with pytest.raises(PlanError, match="needs TF_CONFIG listing several workers"):
        resolve_strategy("multi_worker")
    with pytest.raises(PlanError, match="needs at least 2 devices"):
        resolve_strategy("mirrored")


def test_launcher_prefixes_output_and_propagates_success(tmp_path):
    script = "import os, json; c = json.loads(os.environ['TF_CONFIG']); print('index', c['task']['index'])"
    lines = []

    class Collect:
        def write(self, text):
            lines.append(text)

        def flush(self):
            pass

    assert launch([sys.executable, "-c", script], 3, out=Collect()) == 0
    text = "".join(lines)
    for index in range(3):
        assert f"[worker {index}] index {index}" in text


def test_launcher_stops_the_others_when_one_worker_dies(tmp_path):
    script = (
        "import os, json, sys, time\n"
        "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
        "sys.exit(3) if index == 1 else time.sleep(120)\n"
    )
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kerasfast.cli", "launch", "-n", "2", "--", sys.executable, "-c",
                           script], capture_output=True, text=True, env=ENV, timeout=60)
    assert done.returncode == 3
    assert time.monotonic() - start < 30
    assert "worker 1 exited with code 3; stopping the others" in done.stdout
