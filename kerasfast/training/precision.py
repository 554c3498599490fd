"""Running a train step in the plan's precision.

A Keras mixed policy ("mixed_bfloat16", "mixed_float16") is applied when
the model is built (`kerasfast.training.models`). "onednn_bfloat16" is
applied when the step's graph is optimised instead: the model stays
float32, and TensorFlow's oneDNN auto-mixed-precision pass (a Grappler
rewrite) turns the graph's matmuls and convolutions into bfloat16 while
softmax, normalisation, reductions and the optimizer update stay in
float32. On CPUs it measures as fast as a mixed policy (within run-to-run
noise, benchmarks/precision_ablation.py), and the model is trained as built:
nothing is rebuilt or copied, and it predicts and exports in float32.
"""

from __future__ import annotations

import contextlib

from kerasfast.plan import ONEDNN_BFLOAT16

GRAPPLER_OPTION = "auto_mixed_precision_onednn_bfloat16"


@contextlib.contextmanager
def graph_precision(precision: str):
    """Optimises the functions first run inside it for `precision`.

    TensorFlow applies Grappler options when a `tf.function` first runs, so
    the train and test steps must first run inside this block; the previous
    option is restored on leaving it, so later functions (predict, export)
    run in float32.

    Args:
        precision: A plan precision; only "onednn_bfloat16" changes anything.

    Example:

    >>> import tensorflow as tf
    >>> with graph_precision("onednn_bfloat16"):
    ...     tf.config.optimizer.get_experimental_options()["auto_mixed_precision_onednn_bfloat16"]
    True
    """
    if precision != ONEDNN_BFLOAT16:
        yield
        return
    import tensorflow as tf

    previous = tf.config.optimizer.get_experimental_options().get(GRAPPLER_OPTION, False)
    tf.config.optimizer.set_experimental_options({GRAPPLER_OPTION: True})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({GRAPPLER_OPTION: previous})
