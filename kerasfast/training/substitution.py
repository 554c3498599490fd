"""Keras's TensorFlow functions replaced while kerasfast traces its train steps.

Where kerasfast computes one of Keras's TensorFlow ops faster in its steps
(`kerasfast.training.attention`, `kerasfast.training.dropout`), the backend
module's function is swapped, while a step is traced, for one that takes the
calls it computes as Keras would and hands every other to Keras's own. The
ops traced inside stay in the step's graph; nothing outside the block
(evaluation, the user's `predict`, a saved or exported model) changes.
Nested and concurrent traces share one swap, put back when the last leaves.
"""

from __future__ import annotations

import contextlib
import functools
import threading


class Substitution:
    """`module().name` replaced by `replacement(keras_function)` inside `active()` blocks.

    Args:
        module: Returns the module whose attribute is replaced (imported only when a block opens).
        name: The attribute, a function Keras looks up on every call.
        replacement: Given Keras's own function, returns the one to put in its place.

    Example:

    >>> import math, types
    >>> holder = types.SimpleNamespace(sqrt=math.sqrt)
    >>> halving = Substitution(lambda: holder, "sqrt", lambda keras_sqrt: lambda x: keras_sqrt(x) / 2)
    >>> with halving.active():
    ...     holder.sqrt(16.0)
    2.0
    >>> holder.sqrt(16.0)
    4.0
    """

    def __init__(self, module, name: str, replacement):
        self._module, self._name, self._replacement = module, name, replacement
        self._lock = threading.Lock()
        self._active = 0  # blocks entered and not yet left
        self._original = None  # Keras's own function, put back when the last block is left

    @contextlib.contextmanager
    def active(self):
        """Inside the block, the replacement is in place."""
        module = self._module()
        with self._lock:
            if self._active == 0:
                self._original = getattr(module, self._name)
                setattr(module, self._name, self._replacement(self._original))
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    setattr(module, self._name, self._original)
                    self._original = None

    def around(self, function):
        """`function`, whose calls run inside `active()`: a tf.function of it traces the replacement."""

        @functools.wraps(function)
        def traced(*args, **kwargs):
            with self.active():
                return function(*args, **kwargs)

        return traced
