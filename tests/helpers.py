"""Small real models and comparisons shared by the tests."""

import keras
import numpy as np


def small_convnet(name="convnet"):
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name=name,
    )


def weights_equal(a, b, atol=0.0):
    return all(np.allclose(x, y, atol=atol) for x, y in zip(a.get_weights(), b.get_weights()))
