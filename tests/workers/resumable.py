"""A resumable training run, to be killed and restarted by the tests.

    python tests/workers/resumable.py RUN_DIR STRATEGY [KILL_EPOCH KILL_STEP [DELAY_MS]]

Trains a small model with backups every 4 steps into RUN_DIR/backup and
saves the final weights to RUN_DIR/weights.workerN.npz. With KILL_EPOCH and
KILL_STEP, worker 1 (or the only worker) kills itself with SIGKILL at that
point, as a crashed machine would (KILL_EPOCH -1: after KILL_STEP executions
of this process, wherever it resumed); with DELAY_MS, that many milliseconds
later, from another thread (so the kill can land anywhere, in the middle of
writing a backup included).

With the environment variable EXIT_BEFORE_FIT=1, worker 1 exits with status 0
before it calls fit, as a script ending early by mistake would.

Under `kerasfast launch --restarts`, the environment variable KILLS (JSON,
{"ATTEMPT": [WORKER, EXECUTIONS, DELAY_MS], ...}) instead has worker WORKER
of that attempt kill itself after EXECUTIONS executions, DELAY_MS later.
"""

import json
import os
import pathlib
import signal
import sys
import threading

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
run_dir, strategy = pathlib.Path(sys.argv[1]), sys.argv[2]
kill_at = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else None
kill_delay = float(sys.argv[5]) / 1000 if len(sys.argv) > 5 else 0.0
kill_worker = 1 if strategy == "multi_worker" else 0
planned = json.loads(os.environ.get("KILLS", "{}")).get(os.environ.get("KERASFAST_LAUNCH_ATTEMPT", ""))
if planned:
    kill_worker, kill_at, kill_delay = planned[0], (-1, planned[1]), planned[2] / 1000

import kerasfast  # noqa: E402

kerasfast.distribute.setup()

import keras  # noqa: E402
import numpy as np  # noqa: E402

from kerasfast import datasets  # noqa: E402

index = kerasfast.distribute.cluster_from_env().index
if index == 1 and os.environ.get("EXIT_BEFORE_FIT") == "1":
    sys.exit(0)
(x, y), _ = datasets.digits()
x, y = x[:640].reshape(640, 64), y[:640]


class KillSelf(keras.callbacks.Callback):
    executions = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def _due(self, batch) -> bool:
        self.executions += 1
        if kill_at[0] < 0:
            return self.executions >= kill_at[1]
        return (self.epoch, batch + 1) >= kill_at

    def on_train_batch_end(self, batch, logs=None):
        if kill_at and index == kill_worker and self._due(batch):
            if kill_delay:
                threading.Timer(kill_delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
            else:
                os.kill(os.getpid(), signal.SIGKILL)


def build():
    keras.utils.set_random_seed(11)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])


result = kerasfast.fit(
    build, (x, y), strategy=strategy, epochs=int(os.environ.get("EPOCHS", 3)), batch_size=32, steps_per_execution=2, seed=3,
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
    optimizer=keras.optimizers.Adam(1e-3), run_dir=run_dir, backup_every=int(os.environ.get("BACKUP_EVERY", 4)), callbacks=[KillSelf()], verbose=2,
)
np.savez(run_dir / f"weights.worker{index}.npz", *result.model.get_weights())
(run_dir / f"history.worker{index}.json").write_text(json.dumps(result.history.history))
print(f"worker {index} finished {len(result.history.epoch)} epoch(s) in this run")
