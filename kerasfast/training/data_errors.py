"""Errors met while training that name the data behind them.

TensorFlow reports a damaged TFRecord, a label the model has no class for,
or validation data shorter than `validation_steps` as a graph error deep in
a step. `errors_naming_the_data` turns each into a `DataError` that names
the file, record, sample or count and says how to fix it; every other
error passes unchanged.
"""

from __future__ import annotations

import contextlib
import os
import re

import numpy as np
import tensorflow as tf

from kerasfast.errors import DataError


@contextlib.contextmanager
def errors_naming_the_data(x, y, validation_data, validation_steps):
    """The three translations below, for one `fit` call's data.

    Example:

    >>> with errors_naming_the_data(x=None, y=None, validation_data=None, validation_steps=None):
    ...     pass
    """
    with damage_named(x, validation_data), validation_steps_checked(validation_steps), labels_checked(y):
        yield


@contextlib.contextmanager
def damage_named(*sources):
    """Turns a TensorFlow read error from TFRecord `sources` (paths, or
    datasets from `kerasfast.data.tfrecord_dataset`) into a `DataError`
    naming the damaged file, record and byte offset; other errors (a model's
    own InvalidArgumentError) pass unchanged."""
    paths = [source for source in sources
             if isinstance(source, (str, os.PathLike)) or getattr(source, "kerasfast_info", None) is not None]
    try:
        yield
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
        if not paths:
            raise
        from kerasfast.data import damage_error, locate_damage

        for path in paths:
            try:
                found = locate_damage(path)
            except DataError:
                found = None
            if found is not None:
                raise damage_error(path, error) from error
        if isinstance(error, tf.errors.DataLossError):
            raise damage_error(paths[0], error) from error  # TensorFlow's words, with the files checked
        raise


@contextlib.contextmanager
def validation_steps_checked(steps: int | None):
    """Turns `kerasfast.training.inputs.first_batches`'s count check failing into a `DataError`
    naming `validation_steps` and the batches the data held."""
    try:
        yield
    except tf.errors.FailedPreconditionError as error:
        found = re.search(rf"expected to contain {steps} elements but contained only (\d+)", str(error))
        if steps is None or found is None:
            raise
        raise DataError(
            f"validation_steps={steps}, but validation_data yielded only {found.group(1)} batch(es). Pass "
            f"validation_steps={found.group(1)} or fewer, or validation data that lasts (a generator that loops, "
            "a dataset with .repeat()).") from error


_LABEL_OUT_OF_RANGE = r"Received a label value of (-?\d+) which is outside the valid range of \[0, (\d+)\)"


@contextlib.contextmanager
def labels_checked(y):
    """Turns TensorFlow's "label value outside the valid range" (a sparse
    categorical loss on a label the output has no unit for) into a
    `DataError` with the label, the sample when `y` is an array, and the fix."""
    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        found = re.search(_LABEL_OUT_OF_RANGE, str(error))
        if found is None:
            raise
        label, classes = int(found.group(1)), int(found.group(2))
        where = labels_outside(y, classes) or f"the data holds label {label}"
        raise labels_out_of_range(where, classes) from error


def labels_outside(y, classes: int, what: str = "y", ignore_class=None) -> str | None:
    """Where the array `y` holds sparse labels outside `0..classes - 1` ("y holds label 7 at sample 3 (...)"),
    or None when it holds none (or is not an array of numbers)."""
    if not isinstance(y, np.ndarray) or not np.issubdtype(y.dtype, np.number) or not y.ndim:
        return None
    rows = y.reshape(len(y), -1)
    outside = (rows < 0) | (rows >= classes)
    if ignore_class is not None:
        outside &= rows != ignore_class
    bad = np.flatnonzero(outside.any(axis=1))
    if not len(bad):
        return None
    label = rows[bad[0]][outside[bad[0]]][0]
    label = int(label) if float(label).is_integer() else label
    return f"{what} holds label {label} at sample {bad[0]} ({len(bad)} sample(s) in all hold labels out of range)"


def labels_out_of_range(where: str, classes: int) -> DataError:
    return DataError(
        f"{where}, but the model's output has {classes} classes, so labels must lie in 0..{classes - 1}. "
        "Shift labels that start at 1 (y - 1), or give the output layer as many units as there are "
        "classes.")
