"""A worker of a distributed drop-in test: trains the keras-io VAE (its own
`train_step`, no `call()`, x only) and the multi-input multi-output ticket
model (dicts by name) with `kerasfast.fit`, and writes each one's History and
final weights.

    python tests/workers/custom_models.py OUT_DIR STRATEGY

STRATEGY "mirrored" splits the CPU into 2 logical devices first; under
"multi_worker" the script is started by `kerasfast launch` (TF_CONFIG).
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

import numpy as np  # noqa: E402

from tests.helpers import replica_gap as replica_gap_of  # noqa: E402

from tests import kerasio_models  # noqa: E402

results = {}
for name in ("vae", "ticket_model"):
    build = getattr(kerasio_models, f"build_{name}")
    data = getattr(kerasio_models, f"data_{name}")()
    data.pop("shuffle", None)
    data["epochs"] = 2  # enough to see the loss fall; keeps the two-process run short
    # A builder: kerasfast calls it in the strategy's scope, as Keras requires.
    result = kerasfast.fit(build, **data, strategy=strategy, run_dir=False, verbose=0, seed=0)
    np.savez(out_dir / f"{name}.worker{index}.npz", *[w.astype("float64") for w in result.model.get_weights()])
    replica_gap = replica_gap_of(result.model)  # per-device copies of each variable agree
    results[name] = {"history": result.history.history, "replicas": result.plan.num_replicas,
                     "train_step": result.plan.train_step, "replica_gap": replica_gap}
    if name == "ticket_model":
        # After fit the user's own evaluate works, under any strategy.
        results[name]["evaluate"] = result.model.evaluate(data["x"], data["y"], verbose=0, return_dict=True)
(out_dir / f"results.worker{index}.json").write_text(json.dumps(results))
print(f"worker {index} done")
