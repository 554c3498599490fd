"""TensorFlow's thread pools.

TensorFlow sizes its op thread pools once, when its runtime starts; after
that they cannot change. `configure_threads()` is therefore meant for the top
of a script; `kerasfast.fit` applies the plan's thread counts itself only
when the runtime has not started yet, and says so in the plan otherwise.
"""

from __future__ import annotations


def runtime_started() -> bool:
    """Whether TensorFlow's runtime (and so its thread pools) already exists."""
    from kerasfast import _compat

    return _compat.runtime_started()


def current_threads() -> tuple[int, int]:
    """TensorFlow's (intra_op, inter_op) settings; 0 means TensorFlow's default."""
    import tensorflow as tf

    return (
        tf.config.threading.get_intra_op_parallelism_threads(),
        tf.config.threading.get_inter_op_parallelism_threads(),
    )


def configure_threads(intra_op_threads: int | None = None, inter_op_threads: int | None = None) -> tuple[int, int]:
    """Sets TensorFlow's thread pools; call before creating any model or tensor.

    Args:
        intra_op_threads: Threads one op may use; None = one per usable core.
        inter_op_threads: Ops that may run at once; None = 2.

    Returns:
        The `(intra_op, inter_op)` thread counts now in force.

    Raises:
        RuntimeError: When TensorFlow's runtime has already started.

    Example:

    Not run as a doctest: it must come before TensorFlow starts, and the
    counts depend on the machine (here, 2 cores).

    >>> import kerasfast
    >>> kerasfast.configure_threads()  # first thing in the script  # doctest: +SKIP
    (2, 2)
    """
    import tensorflow as tf

    from kerasfast.hardware import detect_hardware

    if runtime_started():
        raise RuntimeError(
            "TensorFlow's runtime has already started, so its thread pools can no longer change: call "
            "kerasfast.configure_threads() at the top of the script, before any model or tensor is created."
        )
    cores = detect_hardware().cpu_cores
    intra = cores if intra_op_threads is None else intra_op_threads
    inter = min(2, cores) if inter_op_threads is None else inter_op_threads
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    return intra, inter
