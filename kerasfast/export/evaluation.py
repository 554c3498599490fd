"""Accuracy and loss of an artifact's outputs, computed the same way for all."""

from __future__ import annotations

import keras
import numpy as np

from kerasfast import _compat


def classification_accuracy(outputs: np.ndarray, labels: np.ndarray) -> float | None:
    """Top-1 accuracy for class-score outputs (last dim > 1), else None.

    Labels may be integer class ids or one-hot rows.
    """
    if outputs.ndim < 2 or outputs.shape[-1] < 2:
        return None
    predicted = np.argmax(outputs, axis=-1)
    labels = np.asarray(labels)
    if labels.ndim == outputs.ndim and labels.shape[-1] == outputs.shape[-1]:
        labels = np.argmax(labels, axis=-1)
    labels = labels.reshape(predicted.shape)
    return float(np.mean(predicted == labels))


def model_loss_fn(model):
    """The loss the model was compiled with, as a callable, or None."""
    loss = getattr(model, "loss", None)
    # A single output declared as {"name": ...} or [...] has its loss given the same way.
    if isinstance(loss, dict) and len(loss) == 1:
        (loss,) = loss.values()
    elif isinstance(loss, (list, tuple)) and len(loss) == 1:
        (loss,) = loss
    if loss is None or isinstance(loss, (list, tuple, dict)):
        return None
    try:
        found = keras.losses.get(loss)
    except (ValueError, TypeError):
        return None
    # A loss named by a string or given as a function is wrapped as compile wraps it, so that labels of shape
    # (batch,) meet outputs of shape (batch, 1) as in fit and evaluate.
    return found if isinstance(found, keras.losses.Loss) or not callable(found) else _compat.loss_as_compiled(found)


def loss_value(loss_fn, outputs: np.ndarray, labels: np.ndarray) -> float | None:
    if loss_fn is None:
        return None
    return float(np.mean(keras.ops.convert_to_numpy(loss_fn(labels, outputs))))
