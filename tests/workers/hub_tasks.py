"""A worker of the distributed fine-tuning tests: a keras-hub BERT classifier with its preprocessor, on raw
strings, trained with `kerasfast.fit` (LoRA on), and its History and final weights written.

    python tests/workers/hub_tasks.py OUT_DIR STRATEGY

STRATEGY "mirrored" splits the CPU into 2 logical devices first; under "multi_worker" the script is started
by `kerasfast launch` (TF_CONFIG).
"""

import json
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

out_dir, strategy = pathlib.Path(sys.argv[1]), sys.argv[2]

from tests.workers.strategy_start import start  # noqa: E402

index = start(strategy)  # before any tensor exists

import kerasfast  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tests import hub_tasks  # noqa: E402
from tests.helpers import replica_gap  # noqa: E402

keras.utils.set_random_seed(0)
x, y = hub_tasks.text_labels(64)


def build():
    task = hub_tasks.bert_classifier()
    task.backbone.enable_lora(2)
    return task


# A builder, called in the strategy's scope, as Keras requires of a model trained under one.
result = kerasfast.fit(build, x, y, epochs=3, batch_size=16, validation_data=(x[:16], y[:16]), strategy=strategy,
                       run_dir=False, verbose=0, seed=0)
task = result.model
np.savez(out_dir / f"weights.worker{index}.npz", *[w.astype("float64") for w in task.get_weights()])
results = {"history": result.history.history, "replicas": result.plan.num_replicas, "data": result.data,
           "replica_gap": replica_gap(task), "predicted": task.predict(x[:4], verbose=0).tolist()}
(out_dir / f"results.worker{index}.json").write_text(json.dumps(results))
print(f"worker {index} done")
