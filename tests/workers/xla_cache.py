"""A process of the XLA cache tests: one small `kerasfast.fit` under XLA,
with kerasfast's cache folder `CACHE_DIR`; prints what it found as JSON.

    python tests/workers/xla_cache.py CACHE_DIR [tensorflow_first]

`tensorflow_first`: TensorFlow is imported before kerasfast.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["KERASFAST_CACHE_DIR"] = sys.argv[1]
if sys.argv[2:] == ["tensorflow_first"]:
    import tensorflow  # noqa: F401

import kerasfast  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 12)).astype("float32")
y = (x[:, :3].sum(axis=1) > 0).astype("int32")
model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, activation="gelu"),
                          keras.layers.LayerNormalization(), keras.layers.Dense(2)])
result = kerasfast.fit(model, x, y, epochs=2, batch_size=32, jit_compile=True, tune="off", run_dir=False, verbose=0,
                       loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
print(json.dumps({"xla_cache": result.plan.xla_cache, "reason": result.plan.reasons["xla_cache"],
                  "jit_compile": result.plan.jit_compile, "loss": [float(v) for v in result.history.history["loss"]],
                  "tf_xla_flags": os.environ.get("TF_XLA_FLAGS")}))
