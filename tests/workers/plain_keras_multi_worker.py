"""Plain Keras `model.fit` under MultiWorkerMirroredStrategy, without kerasfast.

Keras 3.15 fails here (keras issue 20585); tests/test_resume.py checks that
it still does, so that we notice when upstream fixes it and
kerasfast/_compat.py can shrink.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()

import keras  # noqa: E402
import numpy as np  # noqa: E402

with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
x = np.random.rand(64, 4).astype("float32")
y = np.random.rand(64, 1).astype("float32")
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1, verbose=0)
print("plain keras multi-worker fit succeeded")
