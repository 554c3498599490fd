"""Accuracy and loss of an artifact's outputs, computed the same way for all."""

from __future__ import annotations

import keras
import numpy as np

from kerasfast import _compat


def classification_accuracy(outputs: np.ndarray, labels: np.ndarray, from_logits: bool = False) -> float | None:
    """The accuracy the labels call for, or None where they are not classes (regression targets).

    - class ids (whole numbers, one per output row) for class scores (last dim > 1): top-1 accuracy;
    - one-hot rows of the outputs' shape: top-1 accuracy;
    - 0/1 labels for one output per sample (binary) or of the outputs' shape with any number of 1s
      (multi-label): the share of outputs on their label's side of 0.5 (of 0 for logits, `from_logits`).

    Example:

    >>> classification_accuracy(np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([0, 0]))
    0.5
    >>> classification_accuracy(np.array([[0.3], [0.8]]), np.array([0, 1]))
    1.0
    >>> classification_accuracy(np.array([[0.3, 1.7]]), np.array([[0.25, 2.0]])) is None  # regression
    True
    """
    outputs, labels = np.asarray(outputs), np.asarray(labels)
    if outputs.ndim < 1 or not labels.size or not np.issubdtype(labels.dtype, np.number):
        return None
    threshold = 0.0 if from_logits else 0.5
    binary = bool(np.isin(labels, (0, 1)).all())
    width = outputs.shape[-1] if outputs.ndim >= 2 else 1
    if width > 1 and labels.shape == outputs.shape:
        if binary and (labels.sum(axis=-1) == 1).all():  # one-hot
            return float(np.mean(np.argmax(outputs, axis=-1) == np.argmax(labels, axis=-1)))
        return float(np.mean((outputs > threshold) == labels.astype(bool))) if binary else None
    if width == 1:
        if binary and labels.size == outputs.size:
            return float(np.mean((outputs.reshape(-1) > threshold) == labels.reshape(-1).astype(bool)))
        return None
    if labels.size == outputs.size // width and (labels == np.round(labels)).all():
        return float(np.mean(np.argmax(outputs, axis=-1).reshape(-1) == labels.reshape(-1)))
    return None


def loss_from_logits(loss_fn) -> bool:
    """Whether a compiled loss takes logits (`from_logits=True`), which sets where a binary output's class flips."""
    get_config = getattr(loss_fn, "get_config", None)
    try:
        return bool(get_config().get("from_logits", False)) if callable(get_config) else False
    except (TypeError, NotImplementedError):
        return False


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
