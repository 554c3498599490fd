"""Shared fixtures: real data (scikit-learn digits) and small real models."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from kerasfast import datasets  # noqa: E402


@pytest.fixture(scope="session")
def digits():
    """((x_train, y_train), (x_test, y_test)) with 8x8x1 float32 images."""
    return datasets.digits()


@pytest.fixture(autouse=True)
def _float32_policy_and_seed():
    """Every test starts from Keras's defaults and a fixed seed, and must leave them so."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")
