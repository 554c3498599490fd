"""A model that counts the records it trains on, for the tf.data service tests.

Each record carries its id as an input. The counting layer adds one per id
seen to a variable each replica keeps for itself and that reads as the sum
over all replicas (`synchronization="on_read"`, `aggregation="sum"`), so
under any strategy a read says how often each record went through a train
step on any worker.
"""

import keras
import numpy as np
import tensorflow as tf

NUM_RECORDS = 120


def write_records(folder, shards=4):
    """NUM_RECORDS records {id, x} -> label (x's sign), in `shards` files."""
    import kerasfast

    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_RECORDS, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    return kerasfast.data.write_tfrecords(({"id": np.arange(NUM_RECORDS), "x": x}, y), folder, shards=shards)


class CountIds(keras.layers.Layer):
    def build(self, input_shape):
        # On read: each replica counts its own batches, and a read (outside
        # the train step) sums the replicas of every worker.
        self.seen = keras.Variable(np.zeros(NUM_RECORDS, "float32"), trainable=False, aggregation="sum",
                                   synchronization="on_read", name="seen")

    def call(self, inputs):
        ids, features = inputs
        ids = tf.cast(tf.reshape(ids, [-1]), tf.int32)
        self.seen.assign_add(tf.math.bincount(ids, minlength=NUM_RECORDS, maxlength=NUM_RECORDS, dtype=tf.float32))
        return features


def counting_model():
    keras.utils.set_random_seed(1)
    ids = keras.Input((), name="id", dtype="int64")
    features = keras.Input((8,), name="x")
    hidden = CountIds(name="count")([ids, features])
    return keras.Model([ids, features], keras.layers.Dense(2, activation="softmax")(hidden))


class PerEpochCounts(keras.callbacks.Callback):
    """`per_epoch[e][i]`: times record i was trained on in epoch e (what the
    model's build or anything before the epoch counted is left out)."""

    def __init__(self):
        super().__init__()
        self.per_epoch = []

    def _seen(self):
        return keras.ops.convert_to_numpy(self.model.get_layer("count").seen).copy()

    def on_epoch_begin(self, epoch, logs=None):
        self._before = self._seen()

    def on_epoch_end(self, epoch, logs=None):
        self.per_epoch.append((self._seen() - self._before).astype(int).tolist())
