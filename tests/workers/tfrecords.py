"""A multi-worker run that reads a TFRecord folder, every worker its own share.

    python tests/workers/tfrecords.py TFRECORD_DIR OUT_DIR

Besides the training result, each worker reports how its share was cut
(by file or by record) and a digest of every record in it, read with the
same layout as `fit`'s input pipeline.
"""

import json
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kerasfast  # noqa: E402

kerasfast.distribute.setup()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.helpers import record_digests  # noqa: E402

folder, out_dir = sys.argv[1], pathlib.Path(sys.argv[2])
index = kerasfast.distribute.cluster_from_env().index


def build():
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])


result = kerasfast.fit(build, folder, epochs=3, batch_size=64, loss="sparse_categorical_crossentropy",
                       learning_rate=0.01, run_dir=False, verbose=0)
workers = result.plan.num_replicas
share = kerasfast.data.tfrecord_dataset(folder, batch_size=16, shuffle=False, input_context=tf.distribute.InputContext(
    num_input_pipelines=workers, input_pipeline_id=index, num_replicas_in_sync=workers))


report = {"strategy": result.plan.strategy, "replicas": workers, "loss": result.history.history["loss"],
          "weights": [w.tolist() for w in result.model.get_weights()],
          "sharding": share.kerasfast_info.settings.sharding, "records": record_digests(share)}
(out_dir / f"worker{index}.json").write_text(json.dumps(report))
