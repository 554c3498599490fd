"""A resumable training run, to be killed and restarted by the tests.

    python tests/workers/resumable.py RUN_DIR STRATEGY [KILL_EPOCH KILL_STEP]

Trains a small model with backups every 4 steps into RUN_DIR/backup and
saves the final weights to RUN_DIR/weights.workerN.npz. With KILL_EPOCH and
KILL_STEP, worker 1 (or the only worker) kills itself with SIGKILL at that
point, as a crashed machine would.
"""

import json
import os
import pathlib
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
run_dir, strategy = pathlib.Path(sys.argv[1]), sys.argv[2]
kill_at = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else None

import kerasfast  # noqa: E402

kerasfast.distribute.setup()

import keras  # noqa: E402
import numpy as np  # noqa: E402

from kerasfast import datasets  # noqa: E402

index = kerasfast.distribute.cluster_from_env().index
(x, y), _ = datasets.digits()
x, y = x[:640].reshape(640, 64), y[:640]


class KillSelf(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if kill_at and index == (1 if strategy == "multi_worker" else 0) and (self.epoch, batch + 1) >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def build():
    keras.utils.set_random_seed(11)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])


result = kerasfast.fit(
    build, (x, y), strategy=strategy, epochs=3, batch_size=32, steps_per_execution=2, seed=3,
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
    optimizer=keras.optimizers.Adam(1e-3), run_dir=run_dir, backup_every=4, callbacks=[KillSelf()], verbose=2,
)
np.savez(run_dir / f"weights.worker{index}.npz", *result.model.get_weights())
(run_dir / f"history.worker{index}.json").write_text(json.dumps(result.history.history))
print(f"worker {index} finished {len(result.history.epoch)} epoch(s) in this run")
