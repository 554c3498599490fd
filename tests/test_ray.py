"""kerasfast.fit under Ray Train: real local Ray clusters (started here,
with their CPUs declared), 2 `TensorflowTrainer` workers each: the script
docs/distributed.md shows (tests/workers/ray_script.py), run as the page
says, and the same training in tests/workers/ray_loops.py with a worker
killed mid-run, under `kerasfast launch -n 2` (the same weights), and
across a network boundary: a 2-node Ray cluster whose nodes live in two
network namespaces joined by a veth pair."""

import contextlib
import json
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

# Token authentication on, as Ray's default, with a token of this cluster's own (nothing written to ~/.ray),
# set explicitly so Ray does not warn about choosing it. Ray reads the mode when it is imported.
RAY_SETTINGS = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
SAVED = {name: os.environ.get(name) for name in RAY_SETTINGS}
os.environ.update(RAY_SETTINGS)
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kerasfast[ray]')")
from ray.train import FailureConfig, Result, RunConfig, ScalingConfig  # noqa: E402
from ray.train.tensorflow import TensorflowTrainer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "workers" / "ray_script.py"  # docs/distributed.md shows it
LOOPS = ROOT / "tests" / "workers" / "ray_loops.py"
sys.path.insert(0, str(ROOT / "tests" / "workers"))
import ray_loops  # noqa: E402

from tests.test_launch import LAUNCH  # noqa: E402 - `kerasfast launch -n 2 -- python`

# Quiet workers: no TensorFlow start-up lines, no Ray usage-stats prompt.
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": os.pathsep.join(
    [str(ROOT), str(ROOT / "tests" / "workers")])}


@pytest.fixture(scope="module", autouse=True)
def _ray_settings_put_back():
    yield
    _put_back(SAVED)


def _put_back(saved):
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def local_ray():
    saved = {name: os.environ.get(name) for name in QUIET}
    os.environ.update(QUIET)
    ray.init(num_cpus=4, runtime_env={"env_vars": QUIET})
    yield
    ray.shutdown()
    _put_back(saved)


def _trainer(loop, out, name, storage, **kwargs):
    return TensorflowTrainer(
        loop, train_loop_config={"out": str(out), **kwargs.pop("config", {})},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=str(storage), failure_config=kwargs.pop("failure", None)),
        **kwargs)


def _weights(out, worker):
    with np.load(out / f"weights.worker{worker}.npz") as data:
        return [data[key] for key in sorted(data.files, key=lambda k: int(k.split("_")[1]))]


def _assert_same_weights(first, second):
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


def _checkpoint_weights(result):
    import kerasfast  # noqa: F401 - before keras: TensorFlow's start-up lines stay quiet here too
    import keras

    with result.checkpoint.as_directory() as folder:
        model = keras.saving.load_model(pathlib.Path(folder) / "model.keras")
    return [w.astype("float64") for w in model.get_weights()]


@pytest.fixture(scope="module")
def documented_run(tmp_path_factory):
    """docs/distributed.md's Ray Train script run as the page says: `(process, Result, storage folder)`."""
    storage = tmp_path_factory.mktemp("documented") / "ray_results"
    env = {**os.environ, **QUIET, **RAY_SETTINGS}
    done = subprocess.run([sys.executable, str(SCRIPT), str(storage)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, Result.from_path(str(storage / "kerasfast-mlp")), storage


def test_the_documented_script_is_this_one():
    page = (ROOT / "docs" / "distributed.md").read_text()
    assert f"```python\n{SCRIPT.read_text()}```" in page


def test_the_documented_script_reports_each_epoch_and_ends_with_the_model(documented_run):
    done, result, storage = documented_run
    frame = result.metrics_dataframe
    assert list(frame["epoch"]) == [1, 2, 3]
    assert frame["loss"].notna().all() and frame["loss"].iloc[-1] < frame["loss"].iloc[0]
    assert result.metrics["epoch"] == 3
    run_folder = storage / "kerasfast-mlp" / "kerasfast"  # the chief's run folder is in the run's storage
    assert (run_folder / "model.keras").is_file() and (run_folder / "plan.json").is_file()
    assert not (run_folder / "backup").exists() or not any((run_folder / "backup").iterdir())  # cleared at the end
    assert "model: " in done.stdout
    console = done.stdout + done.stderr
    # What kerasfast decides stays quiet: TensorFlow's start-up lines (kerasfast.distribute.ray_runtime_env) and
    # Python notices in the workers; Ray's token notice and its line per report.
    for chatter in ("port.cc", "cudart_stub", "INFO:tensorflow", "Collective all_reduce",
                    "Token authentication is enabled", "Reporting training result"):
        assert chatter not in console, console[-3000:]


def test_a_ray_data_shard_trains_each_worker_on_its_own_rows(local_ray, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    x, y = ray_loops._data()
    dataset = ray.data.from_items([{"x": row, "y": int(label)} for row, label in zip(x, y, strict=True)])
    result = _trainer(ray_loops.ray_data_loop, out, "ray-data", tmp_path / "storage",
                      datasets={"train": dataset}).fit()
    assert result.error is None, result.error
    _assert_same_weights(_weights(out, 0), _weights(out, 1))
    rows = [np.load(out / f"rows.worker{worker}.npy") for worker in (0, 1)]
    assert len(rows[0]) == len(rows[1]) == 128  # Ray's equal split: each worker its own half, every row once
    np.testing.assert_array_equal(np.unique(np.concatenate(rows), axis=0), np.unique(x, axis=0))
    for worker in (0, 1):
        assert (out / f"data.worker{worker}.txt").read_text() == (
            "Ray Data shard, 128 rows on this worker; each of 2 worker(s) reads its own shard")
    losses = [float(value) for value in (out / "loss.worker0.txt").read_text().split()]
    assert len(losses) == 2 and losses[1] < losses[0]


def test_the_ray_job_ends_as_a_kerasfast_launch_run_of_the_same_loop(documented_run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([*LAUNCH, str(LOOPS), "launch", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, **QUIET}, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _assert_same_weights(_weights(out, 0), _weights(out, 1))
    _assert_same_weights(_weights(out, 0), _checkpoint_weights(documented_run[1]))  # bit for bit


@pytest.mark.slow
def test_a_killed_worker_restarts_resumes_and_ends_as_the_uninterrupted_run(documented_run, local_ray, tmp_path):
    from kerasfast.distribute import worker_state

    out = tmp_path / "out"
    out.mkdir()
    result = _trainer(ray_loops.train_loop, out, "killed", tmp_path / "storage", config={"kill_at_step": 13},
                      failure=FailureConfig(max_failures=1)).fit()
    assert result.error is None, result.error
    assert (out / "killed").is_file()  # worker 1 was killed, and Ray restarted the group
    # The restarted group resumed from kerasfast's backup in the run's storage (saved every 2 steps):
    # the kill came at step 13 of 24, step 5 of epoch 2.
    assert worker_state.resumed_from(worker_state.read(out / "state.worker0")) == "epoch 2, step 4"
    # The resumed attempt reports the epochs it ends. Whether the result also lists the first attempt's
    # epoch 1 depends on whether Ray persisted that report before the kill; no epoch is reported twice.
    assert list(result.metrics_dataframe["epoch"]) in ([2, 3], [1, 2, 3]) and result.metrics["epoch"] == 3
    _assert_same_weights(_weights(out, 0), _weights(out, 1))
    _assert_same_weights(_weights(out, 0), _checkpoint_weights(documented_run[1]))  # bit for bit
    _assert_same_weights(_checkpoint_weights(result), _checkpoint_weights(documented_run[1]))


# The 2-node cluster: two network namespaces of this machine joined by a veth pair, with addresses from a
# documentation range (RFC 5737). Each namespace has its own ports, so Ray's usual ones are free there.
HEAD_IP, NODE_IP = "198.51.100.1", "198.51.100.2"
RAY_PORT = 6379


def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True)


def _make_namespace(name):
    try:
        _ip("netns", "add", name)
    except (OSError, subprocess.CalledProcessError) as error:
        reason = error.stderr.strip() if isinstance(error, subprocess.CalledProcessError) else error
        pytest.skip(f"network namespaces cannot be created here (`ip netns add` failed: {reason}); the 2-node "
                    "test needs root or CAP_NET_ADMIN and iproute2's `ip`")


def _join(namespaces, tag):
    """A veth pair between the two namespaces, `HEAD_IP` at the first's end, `NODE_IP` at the second's."""
    ends = [f"{tag}h", f"{tag}n"]
    _ip("link", "add", ends[0], "type", "veth", "peer", "name", ends[1])
    for namespace, end, address in zip(namespaces, ends, (HEAD_IP, NODE_IP), strict=True):
        _ip("link", "set", end, "netns", namespace)
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", end)
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", namespace, "link", "set", end, "up")


def _remove_namespace(name):
    """Kills the processes in namespace `name` (the Ray node started there and its workers: only
    those, by pid; `ray stop` would stop every Ray process of the machine), then removes it, and
    with it its veth end."""
    deadline = time.monotonic() + 30
    while (pids := _ip("netns", "pids", name).stdout.split()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.2)
    _ip("netns", "delete", name)


def _in_namespace(namespace, command, env, timeout):
    done = subprocess.run(["ip", "netns", "exec", namespace, *command], capture_output=True, text=True, env=env,
                          timeout=timeout)
    assert done.returncode == 0, f"{command}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


@pytest.fixture
def two_node_cluster():
    """A Ray head node (1 CPU) in one network namespace at `HEAD_IP`, a second node (1 CPU) in another at
    `NODE_IP`; yields `run(command)`, which runs a command in the head's namespace. Everything is
    removed afterwards, also when the test fails."""
    if shutil.which("ip") is None:
        pytest.skip("network namespaces cannot be created here: iproute2's `ip` is not installed")
    tag = f"kf{os.getpid()}{secrets.token_hex(2)}"  # unique per run; interface names take at most 15 characters
    namespaces = [f"{tag}-head", f"{tag}-node"]
    temp = pathlib.Path(tempfile.mkdtemp(prefix="kfnet", dir="/tmp"))  # short: Ray's socket paths must fit
    env = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"}
    env.update({**QUIET, **RAY_SETTINGS})
    ray_cli = [str(pathlib.Path(sys.executable).with_name("ray")), "start", "--num-cpus=1", "--num-gpus=0",
               "--object-store-memory=100000000", "--disable-usage-stats"]
    made = []
    try:
        for namespace in namespaces:
            _make_namespace(namespace)
            made.append(namespace)
        _join(namespaces, tag)
        # Its own --temp-dir per node: the session and the "current cluster" file stay apart from
        # /tmp/ray, so a `ray.init()` elsewhere on this machine still starts its own local cluster.
        _in_namespace(namespaces[0], [*ray_cli, "--head", f"--port={RAY_PORT}", f"--node-ip-address={HEAD_IP}",
                                      f"--temp-dir={temp / 'head'}"], env, 180)
        _in_namespace(namespaces[1], [*ray_cli, f"--address={HEAD_IP}:{RAY_PORT}", f"--node-ip-address={NODE_IP}",
                                      f"--temp-dir={temp / 'node'}"], env, 180)
        yield lambda command: _in_namespace(namespaces[0], command, env, 600)
    finally:
        for namespace in made:
            _remove_namespace(namespace)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_a_two_node_cluster_across_a_network_boundary_ends_as_the_loopback_run(documented_run, two_node_cluster,
                                                                                  tmp_path):
    out, storage = tmp_path / "out", tmp_path / "storage"
    out.mkdir()
    two_node_cluster([sys.executable, str(LOOPS), "cluster", f"{HEAD_IP}:{RAY_PORT}", str(out), str(storage)])
    network = [json.loads((out / f"network.worker{worker}.json").read_text()) for worker in (0, 1)]
    assert sorted(seen["node_ip"] for seen in network) == [HEAD_IP, NODE_IP]  # one worker on each node
    for seen in network:  # TF_CONFIG names both nodes' addresses, each worker at its own node's
        workers = seen["tf_config"]["cluster"]["worker"]
        assert sorted(address.rsplit(":", 1)[0] for address in workers) == [HEAD_IP, NODE_IP]
        assert workers[seen["tf_config"]["task"]["index"]].startswith(seen["node_ip"] + ":")
    # The all-reduces went over the veth pair; the weights are bit for bit those of the loopback run.
    _assert_same_weights(_weights(out, 0), _weights(out, 1))
    _assert_same_weights(_weights(out, 0), _checkpoint_weights(documented_run[1]))
    _assert_same_weights(_checkpoint_weights(Result.from_path(str(storage / "across"))),
                         _checkpoint_weights(documented_run[1]))


def _recipe_on_two_ray_workers(folder, name: str, *flags) -> str:
    """`kerasfast recipe NAME --smoke FLAGS --ray-workers 2 --out run` in `folder` (a local Ray cluster the
    command starts); its console, after checking it succeeded."""
    env = {key: value for key, value in os.environ.items() if key not in ("TF_CPP_MIN_LOG_LEVEL", "RAY_ADDRESS")}
    done = subprocess.run(
        [sys.executable, "-m", "kerasfast.cli", "recipe", name, "--smoke", *flags, "--ray-workers", "2", "--out", "run"],
        cwd=folder, env={**env, **RAY_SETTINGS, "RAY_USAGE_STATS_ENABLED": "0"}, capture_output=True, text=True,
        timeout=600)
    console = done.stdout + done.stderr
    assert done.returncode == 0, console[-4000:]
    return console


@pytest.mark.slow
def test_a_recipe_runs_on_ray_workers_with_one_flag_and_a_quiet_console(tmp_path):
    """`kerasfast recipe tabular --ray-workers 2`: a local Ray cluster started by the command, the recipe on two
    Ray Train workers, the run folder written by the chief, Ray's records beside it, no TensorFlow start-up lines."""
    from tests.test_recipes import assert_run_folder

    out = tmp_path / "run"
    console = _recipe_on_two_ray_workers(tmp_path, "tabular", "--epochs", "4")
    metrics = assert_run_folder(out)
    assert metrics["strategy"] == "multi_worker" and metrics["num_replicas"] == 2
    assert metrics["test_accuracy"] > metrics["majority_class_accuracy"]
    assert console.count("tabular classification: test accuracy") == 1  # only the chief prints the summary
    assert f"run folder {out}" in console
    result = Result.from_path(str(out / "ray"))
    assert list(result.metrics_dataframe["epoch"]) == [1, 2, 3, 4]
    with result.checkpoint.as_directory() as folder:
        assert (pathlib.Path(folder) / "model.keras").is_file()
    # TensorFlow's start-up lines (oneDNN, cudart, cuInit) in the workers, and its Python notices.
    for chatter in ("port.cc", "cudart_stub", "cuInit", "INFO:tensorflow", "Token authentication is enabled",
                    "Reporting training result"):
        assert chatter not in console, console[-4000:]


@pytest.mark.slow
def test_the_fine_tuning_recipe_runs_on_ray_workers(tmp_path):
    """`kerasfast recipe finetune --ray-workers 2`: the keras-hub classifier (a task with its preprocessor, built
    on each worker) on two Ray Train workers; the chief's run folder and the task handed to Ray as model.keras."""
    pytest.importorskip("keras_hub", reason="keras-hub is in the [test] extra (pip install -e '.[test]')")
    console = _recipe_on_two_ray_workers(tmp_path, "finetune", "--epochs", "2")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["strategy"] == "multi_worker" and metrics["num_replicas"] == 2
    assert console.count("fine-tuning: test accuracy") == 1  # only the chief prints the summary
    result = Result.from_path(str(tmp_path / "run" / "ray"))
    with result.checkpoint.as_directory() as folder:
        assert (pathlib.Path(folder) / "model.keras").is_file()


def test_ray_workers_refuses_a_negative_count(tmp_path):
    from kerasfast import recipes
    from kerasfast.errors import PlanError

    with pytest.raises(PlanError, match=r"--ray-workers -1: give a number of workers"):
        recipes.load_recipe("tabular").main(["--smoke", "--ray-workers", "-1", "--out", str(tmp_path)])


def _shard_model():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])


def test_a_ray_data_shard_takes_class_weight_its_nan_check_and_refuses_itself_as_validation_data():
    # In one process (no cluster): class_weight was dropped for a shard, its NaN went unchecked until the
    # guard gave up, and a shard as validation_data failed after a whole epoch with Keras's "Unrecognized data".
    import keras

    import kerasfast
    from kerasfast.distribute.ray_train import RayShard

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(128, 8)).astype("float32"), rng.integers(0, 2, 128)
    options = dict(epochs=1, batch_size=32, verbose=0, seed=0, optimizer="adam", run_dir=False, tune="off",
                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), shuffle=False)
    weighted = kerasfast.fit(_shard_model(), (x, y), class_weight={0: 1.0, 1: 5.0}, **options).history["loss"]
    sharded = kerasfast.fit(_shard_model(), RayShard(x, y, None, 128), class_weight={0: 1.0, 1: 5.0},
                            **options).history["loss"]
    np.testing.assert_allclose(sharded, weighted, rtol=1e-6)
    holed = x.copy()
    holed[7, 2] = np.nan
    with pytest.raises(kerasfast.DataError, match=r"x holds NaN at sample 7, position \(2,\)"):
        kerasfast.fit(_shard_model(), RayShard(holed, y, None, 128), **options)
    with pytest.raises(kerasfast.PlanError, match="validation_data= is a Ray Data shard"):
        kerasfast.fit(_shard_model(), RayShard(x, y, None, 128), validation_data=RayShard(x, y, None, 128),
                      **options)


def test_a_run_a_callback_stops_early_hands_its_last_epoch_to_ray_with_the_model():
    # An EarlyStopping's last epoch was reported at once, without model.keras, so result.checkpoint had none.
    from kerasfast.training.ray_report import RayReport

    report = RayReport(run=None)
    model = _shard_model()
    report.set_model(model)
    report.set_params({"epochs": 5})
    model.stop_training = True
    report.on_epoch_end(1, {"loss": 0.5})
    assert report.pending == {"epoch": 2, "loss": 0.5}  # held back for finish(), which reports it with the model
