"""Small real models and comparisons shared by the tests."""

import keras
import numpy as np
import tensorflow as tf


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
    """Records what the training steps computed in, as they are traced:
    each layer's compute and variable dtype, remat mode and output dtype
    (kerasfast gives the layers the plan's policies while its steps trace,
    and only then), and the model's steps per execution during training.

    It wraps the layers' `call` when fit hands it the model (before the
    first training step is traced; tuning must be off, or its steps were
    traced earlier) and unwraps them when training ends."""

    def __init__(self, probe_inputs=None):
        super().__init__()
        self.seen = None
        self._traced = {}

    def set_model(self, model):
        super().set_model(model)
        for layer in model.layers:
            if "call" not in vars(layer):
                layer.call = self._recording(layer, layer.call)

    def _recording(self, layer, call):
        def recorded(*args, **kwargs):
            outputs = call(*args, **kwargs)
            if not tf.executing_eagerly() and layer.name not in self._traced:  # the first trace: training
                self._traced[layer.name] = {
                    "compute_dtype": layer.compute_dtype, "variable_dtype": layer.variable_dtype,
                    "remat": getattr(getattr(layer, "_remat_mode", None), "mode", None),
                    "output_dtype": keras.backend.standardize_dtype(keras.tree.flatten(outputs)[0].dtype),
                }
            return outputs

        return recorded

    def on_train_batch_end(self, batch, logs=None):
        if self.seen is None:
            self.seen = {"steps_per_execution": self.model.steps_per_execution}

    def on_train_end(self, logs=None):
        for layer in self.model.layers:
            vars(layer).pop("call", None)
        traced = [self._traced.get(layer.name, {}) for layer in self.model.layers]
        self.seen = {**(self.seen or {}),
                     **{name: [entry.get(key) for entry in traced]
                        for name, key in (("compute_dtypes", "compute_dtype"), ("variable_dtypes", "variable_dtype"),
                                          ("remat", "remat"))}}
        if traced and traced[0]:
            self.seen["activation_dtype"] = traced[0]["output_dtype"]
            self.seen["output_dtype"] = traced[-1]["output_dtype"]


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


def run_without_file_permissions_bypass(command: list, **options):
    """Runs `command` (a subprocess) as a process that file permissions bind: as it is for a non-root user;
    under root, with util-linux's `setpriv` dropping the capabilities that let root read and write any file.

    Returns:
        The `subprocess.CompletedProcess` (text output captured).
    """
    import os
    import shutil
    import subprocess

    import pytest

    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("needs a non-root user, or util-linux's setpriv to drop root's file-access capabilities")
        dropped = "-dac_override,-dac_read_search"
        command = ["setpriv", "--bounding-set", dropped, "--inh-caps", dropped, *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, **options)
