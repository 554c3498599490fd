"""A worker of a distributed test: trains a list of configurations and
writes, per configuration, the loss curve and the final weights.

    python tests/workers/matrix.py OUT_DIR STRATEGY CONFIGS_JSON

STRATEGY "mirrored" splits the CPU into 2 logical devices first; under
"multi_worker" the script is started by `kerasfast launch` (TF_CONFIG).
"""

import json
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

out_dir, strategy, configs = pathlib.Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])

from tests.workers.strategy_start import start  # noqa: E402

index = start(strategy)  # before any tensor exists

import kerasfast  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tests.helpers import replica_gap as replica_gap_of  # noqa: E402

from kerasfast import datasets  # noqa: E402

(x, y), _ = datasets.digits()
x, y = x[:512].reshape(512, 64), y[:512]


def build():
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(10)])


def checkpoint_as_built(path, model) -> dict:
    """What a ModelCheckpoint saved during the run: its layers' dtype policies, and whether it predicts
    as the trained model does (it must be the model as the user built it, whatever the plan computed in)."""
    saved = keras.models.load_model(path)
    same_weights = all(np.array_equal(a, b) for a, b in zip(saved.get_weights(), model.get_weights(), strict=True))
    # The trained model predicts under its strategy (each device half a batch); oneDNN picks
    # its matmul blocking by shape, so the same weights can round the last bit differently.
    same_outputs = np.allclose(saved.predict(x[:64], verbose=0), model.predict(x[:64], verbose=0), rtol=0, atol=1e-6)
    same = same_weights and same_outputs
    return {"checkpoint_policies": sorted({layer.dtype_policy.name for layer in saved.layers}),
            "checkpoint_predicts_as_trained": bool(same)}


results = {}
for config in configs:
    name = config.pop("name")
    checkpoint = out_dir / f"{name}.worker{index}.keras" if config.pop("checkpoint", False) else None
    try:
        result = kerasfast.fit(
            build, (x, y), strategy=strategy, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            optimizer=keras.optimizers.SGD(config.pop("learning_rate", 0.1)), run_dir=False, verbose=0,
            callbacks=[keras.callbacks.ModelCheckpoint(str(checkpoint))] if checkpoint else [], **config,
        )
        weights = [w.astype("float64") for w in result.model.get_weights()]
        np.savez(out_dir / f"{name}.worker{index}.npz", *weights)
        replica_gap = replica_gap_of(result.train_model)  # per-device copies of each variable agree
        results[name] = {"loss": result.history.history["loss"], "replicas": result.plan.num_replicas,
                         "strategy": result.plan.strategy, "replica_gap": replica_gap,
                         "steps_per_epoch": result.plan.steps_per_epoch,
                         **(checkpoint_as_built(checkpoint, result.model) if checkpoint else {})}
    except kerasfast.KerasfastError as error:
        results[name] = {"refused": f"{type(error).__name__}: {error}"}
(out_dir / f"results.worker{index}.json").write_text(json.dumps(results))
print(f"worker {index} done: {len(results)} configurations")
