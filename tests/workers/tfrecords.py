"""A multi-worker run that reads a TFRecord folder, every worker its own files.

    python tests/workers/tfrecords.py TFRECORD_DIR OUT_DIR
"""

import json
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kerasfast  # noqa: E402

kerasfast.distribute.setup()

import keras  # noqa: E402

folder, out_dir = sys.argv[1], pathlib.Path(sys.argv[2])
index = kerasfast.distribute.cluster_from_env().index


def build():
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])


result = kerasfast.fit(build, folder, epochs=3, batch_size=64, loss="sparse_categorical_crossentropy",
                       learning_rate=0.01, run_dir=False, verbose=0)
report = {"strategy": result.plan.strategy, "loss": result.history.history["loss"],
          "weights": [w.tolist() for w in result.model.get_weights()]}
(out_dir / f"worker{index}.json").write_text(json.dumps(report))
