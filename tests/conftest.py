"""Shared fixtures: real data (scikit-learn digits) and small real models."""

import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Tuned plans are cached per test session (worker processes inherit it), never
# read from or written to the user's own cache.
os.environ["KERASFAST_CACHE_DIR"] = tempfile.mkdtemp(prefix="kerasfast-test-cache-")

# kerasfast before Keras, as the docs advise: TensorFlow then loads with oneDNN's CPU kernels on every
# x86-64 CPU (kerasfast/onednn.py), the kernels of the worker processes the tests start, so a result
# computed here and one computed in a worker come from the same kernels.
import kerasfast  # noqa: E402, F401
import keras  # noqa: E402
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
