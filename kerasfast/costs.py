"""How much work a training step is, and how fast this machine does it.

Two measurements feed the plan (steps per execution) and the recipes (model
FLOPs utilisation): the FLOPs of a model's forward pass, counted by
TensorFlow's profiler on the traced graph, and the practical peak FLOP/s of a
dense matmul in a given dtype, timed on this machine.
"""

from __future__ import annotations

import time

# A training step costs about three forward passes: the forward pass itself
# and the two matmuls per layer of the backward pass (input and weight grads).
TRAIN_STEP_FLOPS_PER_FORWARD = 3


def forward_flops_per_sample(model, input_shapes, input_dtypes=None) -> int | None:
    """Counts the floating-point operations of one forward pass for one sample.

    Args:
        model: A built Keras model.
        input_shapes: The model's input shape(s) without the batch dimension,
            e.g. `(8, 8, 1)`, or a list/dict of such shapes for several inputs.
        input_dtypes: Matching dtype(s); float32 when None.

    Returns:
        The FLOP count, or None when the graph cannot be traced or counted
        (e.g. an input of unknown length): callers must treat it as unknown.

    Example:

    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> forward_flops_per_sample(model, (4,))  # 2*4*2 + bias adds
    18
    """
    import tensorflow as tf
    from tensorflow.python.profiler import model_analyzer, option_builder

    def spec(shape, dtype):
        if shape is None or any(dim is None for dim in shape):
            raise ValueError("unknown dimension")
        return tf.TensorSpec((1, *shape), dtype or tf.float32)

    try:
        if isinstance(input_shapes, dict):
            dtypes = input_dtypes or {}
            specs = {k: spec(s, dtypes.get(k)) for k, s in input_shapes.items()}
        elif isinstance(input_shapes, list):
            dtypes = input_dtypes or [None] * len(input_shapes)
            specs = [spec(s, d) for s, d in zip(input_shapes, dtypes)]
        else:
            specs = spec(input_shapes, input_dtypes)
        traced = tf.function(lambda x: model(x, training=False)).get_concrete_function(specs)
        options = option_builder.ProfileOptionBuilder.float_operation()
        options["output"] = "none"
        # The v1 profiler logs a deprecation warning per call; it is ours to ignore.
        verbosity = tf.get_logger().level
        tf.get_logger().setLevel("ERROR")
        try:
            return int(model_analyzer.profile(traced.graph, options=options).total_float_ops)
        finally:
            tf.get_logger().setLevel(verbosity)
    except Exception:  # noqa: BLE001 - any tracing failure means "unknown", never a crash
        return None


def measure_peak_flops(dtype: str = "float32", size: int = 1024, repeats: int = 10) -> float:
    """Times a square matmul and returns the FLOP/s it reached.

    This is the practical peak of dense math in `dtype` on the default
    device: the yardstick for model FLOPs utilisation and for estimating how
    long a step takes.

    Args:
        dtype: "float32", "bfloat16" or "float16".
        size: Side of the square matrices.
        repeats: Timed matmuls after one warm-up.

    Returns:
        FLOP/s as a float.

    Example:

    >>> measure_peak_flops("float32") > 1e9
    True
    """
    import tensorflow as tf

    matrix = tf.random.normal((size, size), dtype=dtype)
    matmul = tf.function(lambda a: tf.matmul(a, a))
    matmul(matrix).numpy()
    start = time.perf_counter()
    for _ in range(repeats):
        result = matmul(matrix)
    result.numpy()
    elapsed = time.perf_counter() - start
    return repeats * 2 * size**3 / elapsed
