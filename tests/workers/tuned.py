"""A worker of the distributed tuning test: `kerasfast.fit(tune="full")`
under MultiWorkerMirroredStrategy; writes the plan it trained with.

Each worker keeps its own tuning cache (`OUT_DIR/cache<index>`), so that a
second run (RUN_NAME "second") shows every worker taking the chief's
cached choice, not its own.

    python tests/workers/tuned.py OUT_DIR [RUN_NAME]   (started by `kerasfast launch`)
"""

import json
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
out_dir = pathlib.Path(sys.argv[1])
run_name = sys.argv[2] if len(sys.argv) > 2 else "first"

import kerasfast  # noqa: E402

kerasfast.distribute.setup()

import keras  # noqa: E402
import numpy as np  # noqa: E402

index = kerasfast.distribute.cluster_from_env().index
os.environ["KERASFAST_CACHE_DIR"] = str(out_dir / f"cache{index}")
rng = np.random.default_rng(0)
x = rng.normal(size=(1024, 16)).astype("float32")
y = (x[:, :4].sum(axis=1) > 0).astype("int32")


def build():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer="adam")
    return model


result = kerasfast.fit(build, x, y, strategy="multi_worker", tune="full", tune_budget_s=15, epochs=1, batch_size=64,
                       run_dir=False, verbose=0)
plan = result.plan
(out_dir / f"plan.{run_name}.worker{index}.json").write_text(json.dumps({
    "chosen": {name: getattr(plan, name) for name in ("precision", "jit_compile", "steps_per_execution")},
    "measured": len(plan.tuning), "weights": [float(np.sum(w)) for w in result.model.get_weights()],
    "reason": plan.reasons["precision"],
}))
print(f"worker {index} done")
