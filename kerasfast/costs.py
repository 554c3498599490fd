"""How much work a training step is, and how fast this machine does it.

Two measurements feed the plan (steps per execution) and the recipes (model
FLOPs utilisation): the FLOPs of a model's forward pass, counted by
TensorFlow's profiler on the traced graph, and the practical peak FLOP/s of a
dense matmul in a given dtype, timed on this machine.
"""

from __future__ import annotations

import dataclasses
import time

# A training step costs about three forward passes: the forward pass itself
# and the two matmuls per layer of the backward pass (input and weight grads).
TRAIN_STEP_FLOPS_PER_FORWARD = 3


@dataclasses.dataclass(frozen=True)
class ForwardFlops:
    """The FLOPs of one sample's forward pass.

    Attributes:
        total: All floating-point operations.
        by_op_type: FLOPs per graph op type (e.g. "MatMul", "Conv2D",
            "DepthwiseConv2dNative").
    """

    total: int
    by_op_type: dict = dataclasses.field(default_factory=dict)


def _input_specs(input_shapes, input_dtypes, batch):
    """`tf.TensorSpec`s with a leading `batch` dimension for one input shape,
    or a dict / list of them.

    Raises:
        ValueError: For a shape with an unknown dimension.
    """
    import tensorflow as tf

    def spec(shape, dtype):
        if shape is None or any(dim is None for dim in shape):
            raise ValueError("unknown dimension")
        return tf.TensorSpec((batch, *shape), dtype or tf.float32)

    if isinstance(input_shapes, dict):
        dtypes = input_dtypes or {}
        return {k: spec(s, dtypes.get(k)) for k, s in input_shapes.items()}
    if isinstance(input_shapes, list):
        dtypes = input_dtypes or [None] * len(input_shapes)
        return [spec(s, d) for s, d in zip(input_shapes, dtypes, strict=True)]
    return spec(input_shapes, input_dtypes)


def forward_flops(model, input_shapes, input_dtypes=None) -> ForwardFlops | None:
    """Counts the floating-point operations of one forward pass for one sample.

    The count is TensorFlow's profiler's, with `Einsum` (the op of Keras's
    `dot_product_attention`, which the profiler leaves out) counted as the
    matmuls it is.

    Args:
        model: A built Keras model.
        input_shapes: The model's input shape(s) without the batch dimension,
            e.g. `(8, 8, 1)`, or a list/dict of such shapes for several inputs.
        input_dtypes: Matching dtype(s); float32 when None.

    Returns:
        A `ForwardFlops`, or None when the graph cannot be traced or counted
        (e.g. an input of unknown length): callers must treat it as unknown.

    Example:

    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> forward_flops(model, (4,))  # 2*4*2 for the matmul, 2 bias adds
    ForwardFlops(total=18, by_op_type={'MatMul': 16, 'BiasAdd': 2})
    """
    import tensorflow as tf

    from kerasfast import _compat

    try:
        specs = _input_specs(input_shapes, input_dtypes, batch=1)
        graph = tf.function(lambda x: model(x, training=False), autograph=False).get_concrete_function(specs).graph
        profile = _compat.profile_float_operations(graph)
    except Exception:  # noqa: BLE001 - any tracing failure means "unknown", never a crash
        return None
    op_types = {op.name: op.type for op in graph.get_operations()}
    by_op_type, pending = {}, list(profile.children)
    while pending:
        node = pending.pop(0)
        if node.float_ops:
            op_type = op_types.get(node.name, "other")
            by_op_type[op_type] = by_op_type.get(op_type, 0) + int(node.float_ops)
        pending.extend(node.children)
    return ForwardFlops(int(profile.total_float_ops), by_op_type)


def forward_flops_per_sample(model, input_shapes, input_dtypes=None) -> int | None:
    """`forward_flops(...).total`, or None when it cannot be counted.

    Example:

    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> forward_flops_per_sample(model, (4,))
    18
    """
    counted = forward_flops(model, input_shapes, input_dtypes)
    return counted.total if counted is not None else None


def activation_bytes_per_sample(model, input_shapes, input_dtypes=None) -> int | None:
    """Bytes of every tensor one sample's forward pass produces.

    A train step keeps most of them for the backward pass, so this is what
    grows with the batch; the weights and optimizer state do not.

    Args:
        model: A built Keras model.
        input_shapes: As for `forward_flops` (without the batch dimension).
        input_dtypes: Matching dtype(s); float32 when None.

    Returns:
        The bytes of the forward graph's per-sample tensors (those whose
        first dimension is the batch), or None when it cannot be traced.

    Example:

    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> activation_bytes_per_sample(model, (4,)) > 0
    True
    """
    import tensorflow as tf

    try:
        specs = _input_specs(input_shapes, input_dtypes, batch=None)
        graph = tf.function(lambda x: model(x, training=True), autograph=False).get_concrete_function(specs).graph
    except Exception:  # noqa: BLE001 - any tracing failure means "unknown"
        return None
    total = 0
    for op in graph.get_operations():
        for tensor in op.outputs:
            shape = tensor.shape
            if shape.rank and shape[0] is None and shape[1:].is_fully_defined() and tensor.dtype.size:
                total += shape[1:].num_elements() * tensor.dtype.size
    return total


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
    matmul = tf.function(lambda a: tf.matmul(a, a), autograph=False)
    matmul(matrix).numpy()
    start = time.perf_counter()
    for _ in range(repeats):
        result = matmul(matrix)
    result.numpy()
    elapsed = time.perf_counter() - start
    return repeats * 2 * size**3 / elapsed


class PeakFlops:
    """`measure_peak_flops`, measured once per dtype and only when asked:
    the plan asks for the peak in the precision it picks.

    Args:
        shared: `f(value) -> value` making a measurement the same on every
            worker (the chief's), or None on one process.

    Example:

    >>> peak = PeakFlops()
    >>> peak("float32") == peak("float32") > 1e9  # the second call measures nothing
    True
    """

    def __init__(self, shared=None):
        self._shared = shared
        self._measured = {}

    def measured(self, dtype: str) -> float | None:
        """The peak in `dtype` if it was measured already, else None (nothing is measured)."""
        return self._measured.get(dtype)

    def __call__(self, dtype: str) -> float:
        if dtype not in self._measured:
            value = measure_peak_flops(dtype)
            self._measured[dtype] = self._shared(value) if self._shared is not None else value
        return self._measured[dtype]
