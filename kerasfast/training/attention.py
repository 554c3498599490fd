"""Causal self-attention that skips the masked half, in kerasfast's XLA-compiled train steps.

Under TensorFlow, `keras.ops.dot_product_attention(is_causal=True)` (what
`MultiHeadAttention(use_causal_mask=True)` and the GPT recipe's blocks
call) scores every query against every key and then masks half of the
scores away: TensorFlow has no fused attention kernel, so the masked half
costs its full matmuls, softmax and gradients. `causal_attention` computes
the same result in query blocks, each scored against the keys up to its
own end only: for 128 tokens in blocks of 64 the attention's matmuls do 75%
of their work, for 512 tokens 56%.

`substituting_attention()` puts it in place of Keras's TensorFlow op while
kerasfast traces an XLA-compiled train step (the plan's `attention`,
`kerasfast.plan.resolve_attention`), and only for the calls it
computes as Keras would: self-attention with no mask or bias and a length
of at least `MIN_BLOCKS` blocks, known when traced. Every other call, and
everything outside those steps (evaluation, the user's `predict`, a saved
or exported model), runs Keras's own op.
"""

from __future__ import annotations

from kerasfast import _compat
from kerasfast.training.substitution import Substitution

# Queries per block: at least this many. Smaller blocks skip more of the masked half, in more and smaller
# matmuls, but XLA's CPU compiler takes seconds over a softmax 32 wide. Measured at 128 tokens
# (benchmarks/attention.py): blocks of 32 made one attention 1.48x Keras's op against 1.20x for blocks of 64,
# but compiled in 4.0 s against 0.6 s (1.35 s with their first scores padded to 64 wide, then 1.32x), and the
# GPT recipe's train step was 1.10x with either size.
MIN_QUERY_BLOCK = 64
# At most this many blocks: each is a few ops more to trace and compile (512 tokens in blocks of 64: one
# attention 1.78x, its first call 2.2 s against 0.6 s).
MAX_BLOCKS = 8
# Two blocks already skip a quarter of the attention's matmuls.
MIN_BLOCKS = 2

def query_block(length: int) -> int:
    """Queries per block for a sequence of `length`: `MIN_QUERY_BLOCK`, or more to keep to `MAX_BLOCKS`."""
    return max(MIN_QUERY_BLOCK, -(-length // MAX_BLOCKS))


def causal_attention(query, key, value, scale=None, block: int | None = None):
    """Causal scaled dot-product attention computed in query blocks.

    Equal to `keras.ops.dot_product_attention(query, key, value, scale=scale,
    is_causal=True)` under TensorFlow (scores and softmax in float32, the
    probabilities in the inputs' dtype), without computing the scores that
    the causal mask removes.

    Args:
        query, key, value: Tensors of shape (batch, length, heads, head_dim),
            one length, known when traced.
        scale: The scores' scale; None: 1 / sqrt(head_dim).
        block: Queries per block (None: `query_block(length)`).

    Returns:
        The attended values, shape (batch, length, heads, head_dim).

    Example:

    >>> import numpy as np, keras
    >>> q = np.random.default_rng(0).normal(size=(2, 128, 2, 8)).astype("float32")
    >>> expected = keras.ops.dot_product_attention(q, q, q, is_causal=True)
    >>> bool(np.allclose(causal_attention(q, q, q), expected, atol=1e-5))
    True
    """
    import tensorflow as tf

    query, key, value = (tf.convert_to_tensor(t) for t in (query, key, value))
    dtype = query.dtype
    key, value = tf.cast(key, dtype), tf.cast(value, dtype)
    logits_dtype = tf.float64 if dtype == tf.float64 else tf.float32
    if scale is None:
        scale = 1.0 / tf.sqrt(tf.cast(tf.shape(key)[-1], "float32"))
    scale = tf.cast(scale, logits_dtype)
    length = query.shape[1]
    block = block or query_block(length)
    # Keras masks with -0.7 times the dtype's largest value: the same here (a masked score's weight is 0 in both).
    masked = tf.constant(-0.7 * logits_dtype.max, logits_dtype)
    # Heads first, once: each block's matmuls then slice along the length without a transpose of their own.
    query, key, value = (tf.transpose(t, (0, 2, 1, 3)) for t in (query, key, value))
    blocks = []
    for start in range(0, length, block):
        stop = min(start + block, length)
        logits = tf.matmul(query[:, :, start:stop], key[:, :, :stop], transpose_b=True)
        logits = tf.cast(logits, logits_dtype) * scale
        # Query start + i sees keys 0 .. start + i: the keys before the block, and the block's lower triangle.
        sees = tf.linalg.band_part(tf.ones((stop - start, stop), tf.bool), -1, start)
        probs = tf.nn.softmax(tf.where(sees, logits, masked), axis=-1)
        blocks.append(tf.matmul(tf.cast(probs, dtype), value[:, :, :stop]))
    return tf.transpose(tf.concat(blocks, axis=2), (0, 2, 1, 3))


def takes_blocks(query, key, value, bias=None, mask=None, is_causal=False, flash_attention=None,
                 attn_logits_soft_cap=None) -> bool:
    """Whether `causal_attention` computes this `dot_product_attention` call exactly as Keras would."""
    if not is_causal or bias is not None or mask is not None or flash_attention or attn_logits_soft_cap is not None:
        return False
    shapes = [getattr(t, "shape", None) for t in (query, key, value)]
    if any(shape is None or len(shape) != 4 for shape in shapes):
        return False
    (_, length, heads, depth), key_shape, value_shape = shapes
    if length is None or heads is None or depth is None or not query.dtype == key.dtype == value.dtype:
        return False  # Keras would promote mixed dtypes to a common one
    # Self-attention's shapes only: grouped-query heads and cross-attention lengths go to Keras's op.
    return (tuple(key_shape[1:]) == (length, heads, depth) and tuple(value_shape[1:3]) == (length, heads)
            and length >= MIN_BLOCKS * MIN_QUERY_BLOCK)


def _blocks_or_keras(keras_op):
    """Keras's TensorFlow `dot_product_attention`, taking `causal_attention` for the calls `takes_blocks` accepts."""

    def dot_product_attention(query, key, value, bias=None, mask=None, scale=None, is_causal=False,
                              flash_attention=None, attn_logits_soft_cap=None):
        if takes_blocks(query, key, value, bias, mask, is_causal, flash_attention, attn_logits_soft_cap):
            return causal_attention(query, key, value, scale)
        return keras_op(query, key, value, bias=bias, mask=mask, scale=scale, is_causal=is_causal,
                        flash_attention=flash_attention, attn_logits_soft_cap=attn_logits_soft_cap)

    return dot_product_attention


_SUBSTITUTION = Substitution(_compat.tensorflow_nn_module, "dot_product_attention", _blocks_or_keras)


def substituting_attention():
    """Inside the block, Keras's TensorFlow `dot_product_attention` takes
    `causal_attention` for the calls `takes_blocks` accepts.

    Meant for the time a tf.function is traced: the ops traced inside stay
    in its graph, and nothing outside the block changes
    (`kerasfast.training.substitution`).

    Example:

    >>> import numpy as np, keras
    >>> q = np.random.default_rng(0).normal(size=(1, 128, 1, 4)).astype("float32")
    >>> with substituting_attention():
    ...     blocked = keras.ops.dot_product_attention(q, q, q, is_causal=True)
    >>> bool(np.allclose(blocked, keras.ops.dot_product_attention(q, q, q, is_causal=True), atol=1e-5))
    True
    """
    return _SUBSTITUTION.active()


def with_causal_blocks(function):
    """`function`, whose calls run inside `substituting_attention()`: a tf.function of it traces the blocks."""
    return _SUBSTITUTION.around(function)
