"""Kernels that fuse: Keras layers traced in the form TensorFlow's fused kernels match.

Keras 3's `Dense` on an input of rank > 2 (every projection of a
transformer) computes `tensordot` -- Reshape, MatMul, Reshape -- and then
adds its bias with `AddV2`. The reshape between the product and the add
hides the pair from TensorFlow's oneDNN remapper, which fuses
`MatMul + BiasAdd (+ activation)` into one `_FusedMatMul` kernel (and, under
"onednn_bfloat16", runs it in bfloat16): each unfused add and activation is
one more pass over the activations, forward and backward.

While kerasfast traces its own train and test steps without XLA (XLA fuses
on its own), `fused_dense()` makes such layers compute Reshape -> MatMul ->
BiasAdd -> activation -> Reshape: the same arithmetic in the order the
remapper matches. The user's model object, its `call` outside kerasfast's
steps and every saved file stay plain Keras.
"""

from __future__ import annotations

import contextlib
import threading


_patch_lock = threading.Lock()
_active = threading.local()


def _fusable(layer, inputs) -> bool:
    """Whether `layer`'s own Keras `Dense.call` runs on a dense input of rank > 2 (nothing else changes)."""
    import tensorflow as tf

    return (isinstance(inputs, tf.Tensor) and inputs.shape.rank is not None and inputs.shape.rank > 2
            and inputs.shape[-1] is not None and not getattr(layer, "lora_enabled", False)
            and getattr(layer, "quantization_mode", None) is None)


def _dense_as_2d_matmul(layer, inputs):
    """`layer(inputs)` as Reshape -> MatMul -> BiasAdd -> activation -> Reshape."""
    import tensorflow as tf
    from keras import ops

    leading = tf.shape(inputs)[:-1]
    outputs = ops.matmul(tf.reshape(inputs, [-1, inputs.shape[-1]]), layer.kernel)
    if layer.bias is not None:
        outputs = tf.nn.bias_add(outputs, ops.cast(layer.bias, outputs.dtype))
    if layer.activation is not None:
        outputs = layer.activation(outputs)
    return tf.reshape(outputs, tf.concat([leading, [layer.units]], axis=0))


@contextlib.contextmanager
def fused_dense(enabled: bool = True):
    """Traces `keras.layers.Dense` on inputs of rank > 2 as 2-D MatMul + BiasAdd (+ activation) inside the block.

    Only the thread that entered the block sees the change (a callback's
    `model.predict` on another thread traces plain Keras); subclasses that
    override `call` and LoRA or quantized layers keep their own.

    Args:
        enabled: False makes the block do nothing (the plan's choice).

    Example:

    >>> import numpy as np
    >>> layer = keras.layers.Dense(3, activation="gelu")
    >>> x = np.ones((2, 4, 5), "float32")
    >>> with fused_dense():
    ...     fused = layer(x)
    >>> bool(np.allclose(fused, layer(x), atol=1e-6))
    True
    """
    if not enabled:
        yield
        return
    _install()
    _active.depth = getattr(_active, "depth", 0) + 1
    try:
        yield
    finally:
        _active.depth -= 1
        _uninstall()


_installed = {"count": 0, "original": None}


def _install():
    """Puts the fusing `Dense.call` in place (once for all threads inside a block)."""
    from keras.layers import Dense

    with _patch_lock:
        if _installed["count"] == 0:
            original = _installed["original"] = Dense.call

            def call(self, inputs, training=None):
                if type(self).call is call and getattr(_active, "depth", 0) and _fusable(self, inputs):
                    return _dense_as_2d_matmul(self, inputs)
                return original(self, inputs, training=training)

            Dense.call = call
        _installed["count"] += 1


def _uninstall():
    """Puts Keras's own `Dense.call` back when the last block is left."""
    from keras.layers import Dense

    with _patch_lock:
        _installed["count"] -= 1
        if _installed["count"] == 0:
            Dense.call = _installed["original"]
