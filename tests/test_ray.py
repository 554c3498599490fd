"""kerasfast.fit under Ray Train: real local Ray clusters (started here,
with their CPUs declared), 2 `TensorflowTrainer` workers running the
documented script shape (tests/workers/ray_loops.py)."""

import os
import pathlib
import secrets
import sys

import numpy as np
import pytest

# Token authentication on, as Ray's default, with a token of this cluster's own (nothing written to ~/.ray),
# set explicitly so Ray does not warn about choosing it. Ray reads the mode when it is imported.
RAY_SETTINGS = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
SAVED = {name: os.environ.get(name) for name in RAY_SETTINGS}
os.environ.update(RAY_SETTINGS)
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kerasfast[ray]')")
from ray.train import FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.tensorflow import TensorflowTrainer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "workers"))
import ray_loops  # noqa: E402

# Quiet workers: no TensorFlow start-up lines, no Ray usage-stats prompt.
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": os.pathsep.join(
    [str(ROOT), str(ROOT / "tests" / "workers")])}


@pytest.fixture(scope="module")
def local_ray():
    saved = {**{name: os.environ.get(name) for name in QUIET}, **SAVED}
    os.environ.update(QUIET)
    ray.init(num_cpus=4, runtime_env={"env_vars": QUIET})
    yield
    ray.shutdown()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name)
        else:
            os.environ[name] = value


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


@pytest.fixture(scope="module")
def plain_run(local_ray, tmp_path_factory):
    """A 2-worker job, uninterrupted: `(Result, output folder, storage folder)`."""
    tmp_path = tmp_path_factory.mktemp("plain")
    out = tmp_path / "out"
    out.mkdir()
    result = _trainer(ray_loops.train_loop, out, "plain", tmp_path / "storage").fit()
    assert result.error is None, result.error
    return result, out, tmp_path / "storage"


def test_fit_on_two_ray_workers_reports_each_epoch_and_the_model(plain_run):
    import kerasfast  # noqa: F401 - before keras: TensorFlow's start-up lines stay quiet here too
    import keras

    result, out, storage = plain_run
    _assert_same_weights(_weights(out, 0), _weights(out, 1))
    frame = result.metrics_dataframe
    assert list(frame["epoch"]) == [1, 2, 3]
    assert frame["loss"].notna().all() and frame["loss"].iloc[-1] < frame["loss"].iloc[0]
    assert result.metrics["epoch"] == 3
    run_folder = storage / "plain" / "kerasfast"  # the chief's run folder is in the run's storage
    assert (run_folder / "model.keras").is_file() and (run_folder / "plan.json").is_file()
    assert not (run_folder / "backup").exists() or not any((run_folder / "backup").iterdir())  # cleared at the end
    with result.checkpoint.as_directory() as folder:
        model = keras.saving.load_model(pathlib.Path(folder) / "model.keras")
    _assert_same_weights([w.astype("float64") for w in model.get_weights()], _weights(out, 0))


@pytest.mark.slow
def test_a_worker_killed_mid_run_restarts_resumes_and_ends_bit_identical(plain_run, tmp_path):
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
    # The resumed attempt reports the epochs it ends (Ray 2.60's result then lists that attempt's reports).
    assert list(result.metrics_dataframe["epoch"]) == [2, 3] and result.metrics["epoch"] == 3
    for worker in (0, 1):
        _assert_same_weights(_weights(out, worker), _weights(plain_run[1], worker))
