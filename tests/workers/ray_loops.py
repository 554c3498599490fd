"""Training functions for Ray Train workers (tests/test_ray.py): the
documented script (tests/workers/ray_script.py: `kerasfast.distribute.setup()`
first, then a model, then `kerasfast.fit`, with the same data, model and
arguments), plus what the tests look at: each worker saves its final weights
in `config["out"]`, and one can be killed mid-run."""

import os
import pathlib
import signal


def _data():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    return x, (x[:, :4].sum(axis=1) > 0).astype("int32")


def _model():
    import keras

    keras.utils.set_random_seed(3)  # every worker starts from the same weights
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(2, activation="softmax")])


def _save_weights(out, result):
    import kerasfast
    import numpy as np

    index = kerasfast.distribute.cluster_from_env().index
    np.savez(out / f"weights.worker{index}.npz", *[w.astype("float64") for w in result.model.get_weights()])


def _kill_once(out, step):
    """A callback that SIGKILLs worker 1 at train step `step` of the first attempt only."""
    import keras
    import kerasfast

    class KillOnce(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch, logs=None):
            self.seen += 1
            marker = out / "killed"
            if self.seen == step and kerasfast.distribute.cluster_from_env().index == 1 and not marker.exists():
                marker.write_text("1")
                os.kill(os.getpid(), signal.SIGKILL)

    return KillOnce()


def train_loop(config):
    import kerasfast

    kerasfast.distribute.setup()  # first thing, as docs/distributed.md says
    out = pathlib.Path(config["out"])
    # What fit tells a launcher (a resume from its backup) goes to a file per worker.
    os.environ["KERASFAST_WORKER_STATE"] = str(out / f"state.worker{kerasfast.distribute.cluster_from_env().index}")
    callbacks = [_kill_once(out, config["kill_at_step"])] if config.get("kill_at_step") else []
    result = kerasfast.fit(_model(), _data(), epochs=3, batch_size=32, verbose=0, seed=0, optimizer="adam",
                           loss="sparse_categorical_crossentropy", backup_every=2, callbacks=callbacks)
    _save_weights(out, result)


def ray_data_loop(config):
    import kerasfast
    import numpy as np
    import ray.train

    kerasfast.distribute.setup()
    data = kerasfast.distribute.ray_dataset(ray.train.get_dataset_shard("train"), x="x", y="y")
    result = kerasfast.fit(_model(), data, epochs=2, batch_size=32, verbose=0, seed=0, optimizer="adam",
                           loss="sparse_categorical_crossentropy", run_dir=False)
    out, index = pathlib.Path(config["out"]), kerasfast.distribute.cluster_from_env().index
    _save_weights(out, result)
    np.save(out / f"rows.worker{index}.npy", data.x)  # the rows this worker read
    (out / f"data.worker{index}.txt").write_text(result.data)
    (out / f"loss.worker{index}.txt").write_text(" ".join(map(str, result.history["loss"])))


def network_loop(config):
    """`train_loop`, plus what crosses the network: each worker's Ray node address and `TF_CONFIG`."""
    import json

    import kerasfast
    import ray.util

    train_loop(config)
    index = kerasfast.distribute.cluster_from_env().index
    (pathlib.Path(config["out"]) / f"network.worker{index}.json").write_text(json.dumps(
        {"node_ip": ray.util.get_node_ip_address(), "tf_config": json.loads(os.environ["TF_CONFIG"])}))


def run_on_cluster(address, out, storage):
    """The driver: `network_loop` on 2 workers of the running Ray cluster at `address`, one CPU each."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    ray.init(address=address)
    result = TensorflowTrainer(
        network_loop, train_loop_config={"out": out},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name="across", storage_path=storage)).fit()
    if result.error is not None:
        raise result.error


if __name__ == "__main__":
    # python ray_loops.py cluster ADDRESS OUT STORAGE: the driver of tests/test_ray.py's 2-node job;
    # python ray_loops.py launch OUT: `train_loop` as a `kerasfast launch` worker.
    import sys

    import ray_loops  # by this name, so that Ray's workers import the loop rather than unpickle a copy

    if sys.argv[1] == "cluster":
        ray_loops.run_on_cluster(*sys.argv[2:5])
    else:
        ray_loops.train_loop({"out": sys.argv[2]})
