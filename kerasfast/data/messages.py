"""Making TensorFlow's error text fit into a kerasfast message."""

import re

_NODE_PREFIX = re.compile(r"\{\{function_node [^}]*\}\}\s*")
_OP_SUFFIX = re.compile(r"\s*\[Op:[^\]]*\](\s*name:.*)?$")


def tf_error_text(exc: BaseException) -> str:
    """The first line of a TensorFlow error, without graph-node and op decorations."""
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    line = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    line = _NODE_PREFIX.sub("", line)
    return _OP_SUFFIX.sub("", line).strip()
