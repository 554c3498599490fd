"""Float32 copies of mixed-precision models, for TFLite conversion.

A model built under `mixed_bfloat16` (kerasfast's choice on CPUs with
bf16 math) traces to bfloat16 TensorFlow ops, which the TFLite converter
cannot map to builtin kernels. TFLite files are therefore converted from a
float32 copy with the same (float32 master) weights; its own quantisation
options (float16, int8) then pick the serving precision.
"""

from __future__ import annotations

import keras

from kerasfast import _compat


def reduced_float_dtypes(model) -> list[str]:
    """The floating-point compute dtypes other than float32 of `model`'s layers (e.g. ["bfloat16"])."""
    found = {
        str(getattr(layer, "compute_dtype", "float32"))
        for layer in _compat.flatten_layers(model)
        if not isinstance(layer, keras.layers.InputLayer)
    }
    # Integer and string layers (StringLookup, Embedding ids) are not reduced precision.
    return sorted(d for d in found if d in ("float16", "bfloat16"))


def is_mixed_precision(model) -> bool:
    """Whether any layer computes in a float dtype other than float32."""
    return bool(reduced_float_dtypes(model))


def float32_copy(model):
    """A float32 clone of `model` carrying the same weights.

    Args:
        model: a Functional or Sequential Keras model.

    Returns:
        A new model whose layers all use the "float32" dtype policy.
    """

    def rebuild_in_float32(layer):
        config = layer.get_config()
        # Operations such as GetItem (t[:, 0]) take no dtype argument.
        if isinstance(layer, keras.layers.Layer):
            config["dtype"] = "float32"
        return layer.__class__.from_config(config)

    copy = keras.models.clone_model(model, clone_function=rebuild_in_float32)
    copy.set_weights(model.get_weights())
    return copy
