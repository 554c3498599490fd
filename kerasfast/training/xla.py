"""Whether XLA can compile a model, found out before training.

XLA refuses some TensorFlow ops (string ops, `tf.numpy_function`, ...). Met
at the first train step, that is a long graph error; lowering the model's
forward pass to XLA's HLO once on a sample batch finds it first, with the op
and layer.
"""

from __future__ import annotations

import re

from kerasfast import _compat

_UNSUPPORTED = re.compile(r"No registered '(\w+)' OpKernel for XLA\w* devices compatible with node \{\{node ([^}]+)\}\}")


def xla_problem(model, sample_inputs) -> str | None:
    """Lowers `model`'s forward pass on `sample_inputs` to XLA's HLO.

    Args:
        model: A built Keras model.
        sample_inputs: One batch of the model's inputs.

    Returns:
        None when XLA compiles it, else what stops it, e.g. "XLA cannot
        compile op AsString (in layer odd)".
    """
    import tensorflow as tf

    @tf.autograph.experimental.do_not_convert
    def forward(inputs):
        return model(inputs, training=False)

    try:
        # Lowering to HLO meets every op XLA has no kernel for; compiling
        # the HLO to machine code as well (calling the function) took twice
        # as long (0.97 s against 0.51 s on the GPT recipe's model).
        tf.function(forward, jit_compile=True).experimental_get_compiler_ir(sample_inputs)(stage="hlo")
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError, ValueError) as error:
        found = _UNSUPPORTED.findall(str(error))
        if not found:
            raise
        ops = sorted({op for op, _ in found})
        layers = sorted({_layer_of(node, model) for _, node in found} - {None})
        where = f" (in layer {', '.join(layers)})" if layers else ""
        return f"XLA cannot compile op {', '.join(ops)}{where}"
    return None


def _layer_of(node: str, model) -> str | None:
    """The layer name in a node path such as `sequential_1/odd_1/AsString`."""
    names = {layer.name for layer in _compat.flatten_layers(model)}
    parts = node.split("/")[:-1]
    for part in reversed(parts):
        if part in names:
            return part
        stripped = re.sub(r"_\d+$", "", part)
        if stripped in names:
            return stripped
    return parts[-1] if parts else None
