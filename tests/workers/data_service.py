"""Training worker fed by a tf.data service; counts every record it trains on.

    python tests/workers/data_service.py TFRECORD_DIR grpc://HOST:PORT OUT_DIR EPOCHS

Writes OUT_DIR/worker{index}.json: the loss per epoch and, per epoch, how
many times each record id went through a train step on any worker (the
counting layer's variable sums its updates over all replicas).
"""

import json
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kerasfast  # noqa: E402

kerasfast.distribute.setup()


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from tests.workers.data_service_model import PerEpochCounts, counting_model  # noqa: E402

folder, address, out_dir, epochs = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), int(sys.argv[4])
index = kerasfast.distribute.cluster_from_env().index
counts = PerEpochCounts()
result = kerasfast.fit(counting_model, folder, epochs=epochs, batch_size=16, loss="sparse_categorical_crossentropy",
                       learning_rate=0.05, precision="float32", jit_compile=False, tune="off", run_dir=False,
                       verbose=0, callbacks=[counts], data_service=address)
report = {"strategy": result.plan.strategy, "loss": result.history.history["loss"], "counts": counts.per_epoch,
          "data": result.data}
(out_dir / f"worker{index}.json").write_text(json.dumps(report))
