"""Dropout masks from a counter hash, in kerasfast's train steps on a CPU.

Keras's TensorFlow dropout (every `Dropout` layer, `MultiHeadAttention`'s
dropout of its attention probabilities, the recurrent layers' dropout) draws
a float per value with `tf.random.stateless_uniform`, then compares, scales
and selects in separate passes over memory. On a CPU that costs more than
the layer's arithmetic: dropout of the attention probabilities of the text
recipe's encoder (64 x 4 heads x 128 x 128 values) took 17.5 ms against
2.6 ms for one multiply over the same values, and under XLA TensorFlow's
random-number kernel is slower still. `hashed_dropout` keeps each value
whose hash of (Keras's seed for the call, the value's position) clears the
rate, in one XLA-compiled loop over the values (4.5 ms there).

It is Keras's dropout with another random stream: the same rate (to
2^-32), the same scaling by 1 / (1 - rate), the same seed drawn from the
layer's `SeedGenerator` for each call (so runs stay reproducible and
backups resume exactly), a new mask for each call and step (replicas of a
`MirroredStrategy` draw the same seed, and mask, as with Keras's dropout).
The masks differ from Keras's: a model trained with them matches
`model.fit`'s in distribution, not bit for bit (`dropout="keras"` keeps
Keras's stream).

`substituting_dropout()` puts it in place of Keras's TensorFlow dropout
while kerasfast traces a train step whose plan says so (the plan's
`dropout`, `kerasfast.plan.resolve_dropout`); evaluation, `predict` and
saved or exported models have no dropout to replace.
"""

from __future__ import annotations

from kerasfast import _compat
from kerasfast.training.substitution import Substitution

# The positions one hash covers: a mask of more values (a noise shape of 2^31 or more) is Keras's to draw.
MAX_VALUES = 2**31 - 1
_TWO_TO_32 = 4294967296.0
_GOLDEN = 0x9E3779B9


def _mix(h):
    """MurmurHash3's 32-bit finaliser: every input bit moves every output bit (one round; `keep_mask` runs two,
    a single one left masks 4,096 and 16,384 positions apart correlated)."""
    import tensorflow as tf

    for shift, multiplier in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(shift, tf.uint32)))
        h = h * tf.constant(multiplier, tf.uint32)
    return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(16, tf.uint32)))


def keep_mask(noise_shape, seed, rate: float):
    """Which values of a tensor of `noise_shape` a dropout of `rate` keeps, for `seed` (two int32).

    Example:

    >>> import tensorflow as tf
    >>> kept = keep_mask([1000, 100], tf.constant([3, 7]), 0.25)
    >>> round(float(tf.reduce_mean(tf.cast(kept, tf.float32))), 2)
    0.75
    """
    import tensorflow as tf

    words = tf.bitcast(tf.cast(seed, tf.int32), tf.uint32)
    first_key = _mix(words[0] * tf.constant(_GOLDEN, tf.uint32) + _mix(words[1]))
    second_key = _mix(first_key + tf.constant(_GOLDEN, tf.uint32))
    positions = tf.bitcast(tf.range(tf.reduce_prod(noise_shape), dtype=tf.int32), tf.uint32)
    hashed = _mix(_mix(positions * tf.constant(_GOLDEN, tf.uint32) + first_key) + second_key)
    threshold = tf.constant(min(int(rate * _TWO_TO_32), 2**32 - 1), tf.uint32)
    return tf.reshape(hashed >= threshold, noise_shape)


_functions = {}  # (rate, noise shape as Keras gives it, dtype, rank) -> its XLA-compiled function


def _compiled(rate: float, noise_shape, dtype, rank):
    """The XLA-compiled dropout for one rate and noise shape, of inputs of one dtype and rank: XLA fuses the
    hash, the compare, the scaling and the select (and their gradient) into single loops, which TensorFlow's
    kernels run as one pass each. One function for each, traced once (TensorFlow counts their traces together
    as one function's retracing, which `kerasfast._quiet` keeps off the console)."""
    import tensorflow as tf

    key = (rate, noise_shape, dtype, rank)
    if key not in _functions:
        def apply_hashed_mask(inputs, seed):
            shape = tf.shape(inputs)
            noise = shape if noise_shape is None else tf.stack(
                [shape[axis] if size is None else size for axis, size in enumerate(noise_shape)])
            kept = tf.broadcast_to(keep_mask(noise, seed, rate), shape)
            scale = tf.cast(1.0 / (1.0 - rate), inputs.dtype)
            return tf.where(kept, inputs * scale, tf.zeros_like(inputs))

        # Shapes that vary from call to call (sequences of other lengths) share one trace; XLA compiles each.
        _functions[key] = tf.function(apply_hashed_mask, jit_compile=True, autograph=False, reduce_retracing=True)
    return _functions[key]


def hashed_dropout(inputs, rate, noise_shape=None, seed=None):
    """Keras's TensorFlow `dropout(inputs, rate, noise_shape, seed)`, its mask from `keep_mask`.

    Args:
        inputs: The tensor to drop values of.
        rate: The fraction dropped, a Python number in [0, 1].
        noise_shape: As for `keras.layers.Dropout` (None entries: the
            inputs' size; 1: one draw shared along that axis).
        seed: A `keras.random.SeedGenerator` or an int, as Keras takes it.

    Returns:
        `inputs` with the dropped values 0 and the others scaled by 1 / (1 - rate).

    Example:

    >>> import numpy as np, keras
    >>> out = hashed_dropout(np.ones((4, 1000), "float32"), 0.5, seed=keras.random.SeedGenerator(1))
    >>> sorted(set(np.unique(out).tolist()))
    [0.0, 2.0]
    """
    import tensorflow as tf

    if rate == 1.0:
        return tf.zeros_like(inputs)
    if rate == 0.0:
        return inputs
    seed = _compat.keras_random_seed(seed)  # drawn as Keras draws it: the generator advances alike
    noise = tuple(noise_shape) if noise_shape is not None else None
    inputs = tf.convert_to_tensor(inputs)
    return _compiled(float(rate), noise, inputs.dtype, inputs.shape.rank)(inputs, seed)


def _hashed_or_keras(keras_dropout):
    """Keras's TensorFlow `dropout`, taking `hashed_dropout` for the masks one hash covers."""

    def dropout(inputs, rate, noise_shape=None, seed=None):
        # Shapes known when traced but for the batch: XLA compiles the hashed mask once per shape, so a sequence
        # length that varies (padded batches, buckets) would compile it again at each new length; a batch
        # varies at most at an epoch's end.
        shape = getattr(inputs, "shape", None)
        known = shape is not None and shape.rank is not None and all(size is not None for size in shape[1:])
        # A noise shape of numbers (a spatial dropout's of an unknown batch holds a tensor: Keras's to draw).
        plain = noise_shape is None or all(size is None or isinstance(size, int) for size in noise_shape)
        if known and plain and isinstance(rate, (int, float)):
            values = 1
            for axis, length in enumerate(shape):
                given = noise_shape[axis] if noise_shape is not None and axis < len(noise_shape) else None
                values *= (given if given is not None else length) or 1  # an unknown batch counts 1
            if values <= MAX_VALUES:
                return hashed_dropout(inputs, rate, noise_shape, seed)
        return keras_dropout(inputs, rate, noise_shape=noise_shape, seed=seed)

    return dropout


_SUBSTITUTION = Substitution(_compat.tensorflow_random_module, "dropout", _hashed_or_keras)


def substituting_dropout():
    """Inside the block, Keras's TensorFlow `dropout` takes `hashed_dropout` (for inputs whose shape is known
    when traced but for the batch, masks of fewer than 2^31 values, and a rate given as a number).

    Example:

    >>> import numpy as np, keras
    >>> with substituting_dropout():
    ...     out = keras.layers.Dropout(0.5, seed=1)(np.ones((4, 1000), "float32"), training=True)
    >>> sorted(set(np.unique(out).tolist()))
    [0.0, 2.0]
    """
    return _SUBSTITUTION.active()


def with_hashed_dropout(function):
    """`function`, whose calls run inside `substituting_dropout()`: a tf.function of it traces the hashed masks."""
    return _SUBSTITUTION.around(function)
