"""Trains a small MLP with kerasfast on 2 Ray Train workers.

    python train_ray.py STORAGE_DIR     # the run's files: STORAGE_DIR/kerasfast-mlp
"""

import sys

import kerasfast
import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.tensorflow import TensorflowTrainer


def train_loop_per_worker(config):
    kerasfast.distribute.setup()  # first thing: before any model or tensor

    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")
    keras.utils.set_random_seed(3)  # every worker starts from the same weights
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(2, activation="softmax")])
    kerasfast.fit(model, (x, y), epochs=3, batch_size=32, verbose=0, seed=0, optimizer="adam",
                  loss="sparse_categorical_crossentropy", backup_every=2)


if __name__ == "__main__":
    # Workers that print as kerasfast does everywhere: no TensorFlow start-up lines.
    ray.init(num_cpus=4, runtime_env=kerasfast.distribute.ray_runtime_env())
    trainer = TensorflowTrainer(
        train_loop_per_worker,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name="kerasfast-mlp", storage_path=sys.argv[1],
                             failure_config=FailureConfig(max_failures=1)),
    )
    result = trainer.fit()
    print(result.metrics_dataframe[["epoch", "loss"]].to_string(index=False))
    print("model:", result.checkpoint.path + "/model.keras")
