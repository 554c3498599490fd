"""Small data sets that ship with the machine, for the quickstart, tests and benchmarks.

They come from scikit-learn's bundled files (no download), so every example
runs offline. Install with `pip install kerasfast[datasets]`.
"""

from __future__ import annotations

import numpy as np

from kerasfast.errors import DataError


def _sklearn():
    try:
        import sklearn.datasets
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise DataError(
            "the built-in data sets need scikit-learn: pip install 'kerasfast[datasets]'"
        ) from error
    return sklearn.datasets


def digits(test_fraction: float = 0.2, seed: int = 0):
    """scikit-learn's 1,797 handwritten digits as 8x8x1 float32 images in [0, 1].

    Args:
        test_fraction: Share of samples held out for testing.
        seed: Seed of the shuffle before the split.

    Returns:
        `((x_train, y_train), (x_test, y_test))`, labels int32 in 0..9.

    Example:

    >>> (x, y), (x_test, y_test) = digits()
    >>> x.shape[1:]
    (8, 8, 1)
    """
    bunch = _sklearn().load_digits()
    images = (bunch.images / 16.0).astype("float32")[..., None]
    labels = bunch.target.astype("int32")
    order = np.random.default_rng(seed).permutation(len(labels))
    images, labels = images[order], labels[order]
    split = int(len(labels) * (1 - test_fraction))
    return (images[:split], labels[:split]), (images[split:], labels[split:])
