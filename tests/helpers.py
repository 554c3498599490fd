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
    return all(np.allclose(x, y, atol=atol) for x, y in zip(a.get_weights(), b.get_weights(), strict=True))


class TrainingProbe(keras.callbacks.Callback):
    """Records, while training runs, what kerasfast set on the model: layer
    compute dtypes, remat modes, steps per execution and the dtype of the
    first layer's activations (kerasfast undoes all of it when fit ends)."""

    def __init__(self, probe_inputs=None):
        super().__init__()
        self.probe_inputs = probe_inputs
        self.seen = None

    def on_train_batch_end(self, batch, logs=None):
        if self.seen is not None:
            return
        model = self.model
        self.seen = {
            "compute_dtypes": [layer.compute_dtype for layer in model.layers],
            "variable_dtypes": [layer.variable_dtype for layer in model.layers],
            "remat": [getattr(getattr(layer, "_remat_mode", None), "mode", None) for layer in model.layers],
            "steps_per_execution": model.steps_per_execution,
        }
        if self.probe_inputs is not None:
            first = keras.Model(model.inputs[0], model.layers[0].output)
            self.seen["activation_dtype"] = keras.backend.standardize_dtype(first(self.probe_inputs).dtype)
            self.seen["output_dtype"] = keras.backend.standardize_dtype(model(self.probe_inputs).dtype)


def replica_gap(model) -> float:
    """Largest difference between the per-device copies of any variable
    (MirroredStrategy keeps one copy per device; 0.0 on one device)."""
    gap = 0.0
    for variable in model.weights:
        copies = getattr(getattr(variable, "_value", None), "values", None)
        if copies and len(copies) > 1:
            values = [np.asarray(c.numpy(), dtype="float64") for c in copies]
            gap = max(gap, max(float(np.max(np.abs(v - values[0]))) for v in values))
    return gap


def record_digests(dataset) -> list[str]:
    """A SHA-1 digest of every example a batched `tf.data.Dataset` yields
    (all its tensors' bytes for that row), in the order it yields them."""
    import hashlib

    import tensorflow as tf

    digests = []
    for batch in dataset:
        leaves = [leaf.numpy() for leaf in tf.nest.flatten(batch)]
        for row in range(len(leaves[0])):
            digests.append(hashlib.sha1(b"".join(leaf[row].tobytes() for leaf in leaves)).hexdigest())
    return digests


class CountsTrainingTraces(keras.layers.Layer):
    """A Dense layer counting how often its call is traced in training mode."""

    traces = 0

    def __init__(self, units=3, activation="softmax", **kwargs):
        super().__init__(**kwargs)
        self.units, self.activation = units, activation

    def build(self, input_shape):
        self.dense = keras.layers.Dense(self.units, activation=self.activation)
        self.dense.build(input_shape)

    def call(self, x, training=None):
        if training:
            type(self).traces += 1
        return self.dense(x)
