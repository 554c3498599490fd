"""Settings for the docstring examples: `python -m pytest --doctest-modules kerasfast`.

The test suite (`python -m pytest`, tests/conftest.py) is untouched by this
file: its fixture acts on doctest items only.
"""

import pytest
from _pytest.doctest import DoctestItem



@pytest.fixture(autouse=True)
def _doctest_setting(request):
    """Every example sees `keras`, `np`, `tf` and `kerasfast` (as Keras's own
    docstrings assume), and nothing else: a model or data it needs, it builds.

    Examples write run folders (`runs/first`), so each runs in its own empty
    working folder (and tuning cache); each starts from Keras's float32 policy and a fixed seed,
    whatever the one before it did.
    """
    if not isinstance(request.node, DoctestItem):
        yield
        return
    import keras
    import numpy as np
    import tensorflow as tf

    import kerasfast

    request.getfixturevalue("doctest_namespace").update(keras=keras, np=np, tf=tf, kerasfast=kerasfast)
    monkeypatch, tmp_path = request.getfixturevalue("monkeypatch"), request.getfixturevalue("tmp_path")
    monkeypatch.chdir(tmp_path)
    # A tuned plan is cached on disk: never in the user's own cache.
    monkeypatch.setenv("KERASFAST_CACHE_DIR", str(tmp_path / "cache"))
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")
