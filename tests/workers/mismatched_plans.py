"""Two workers asked for different precisions: both must refuse before training."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kerasfast  # noqa: E402

kerasfast.distribute.setup()

import keras  # noqa: E402
import numpy as np  # noqa: E402

index = kerasfast.distribute.cluster_from_env().index
x = np.random.default_rng(0).random((64, 4), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)
try:
    kerasfast.fit(lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]), (x, y), loss="mse",
                  precision="float32" if index == 0 else "mixed_bfloat16", run_dir=False, verbose=0)
except kerasfast.PlanError as error:
    print(f"refused: {error}")
    raise SystemExit(3) from error
print("trained")
