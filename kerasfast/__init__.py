"""kerasfast: train any Keras 3 model the fast way from one call."""

import os as _os

# TensorFlow's C++ start-up chatter hides kerasfast's own plan output.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"

from kerasfast.errors import DataError, ExportError, KerasfastError, ModelError, PlanError  # noqa: E402
