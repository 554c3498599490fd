"""A fresh `import kerasfast` / `kerasfast info` prints none of TensorFlow's
start-up chatter, unless KERASFAST_VERBOSE_TF=1; other stderr output stays."""

import os
import subprocess
import sys

from kerasfast._quiet import filter_chatter

# What TensorFlow 2.21 prints on a CPU-only machine without the silencing.
CHATTER = ("failed call to cuInit", "oneDNN custom operations", "cudart_stub", "absl::InitializeLog")

# Import kerasfast, then make TensorFlow probe devices (the cuInit line comes then).
PROBE = (
    "import kerasfast, os, sys, warnings\n"
    "import tensorflow as tf\n"
    "tf.config.list_physical_devices(); (tf.constant(1.0) + 1).numpy()\n"
    "warnings.warn('kerasfast-style warning')\n"
    "print('TF_CPP_MIN_LOG_LEVEL=' + os.environ.get('TF_CPP_MIN_LOG_LEVEL', ''), file=sys.stderr)\n"
)


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "KERASFAST_VERBOSE_TF")}
    env.update(extra)
    return env


def _run(code, env, cwd, *, printed: str | None = None):
    """The stderr of `code` run in a fresh process, which must succeed (and print `printed`, if given)."""
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert printed is None or printed in done.stdout, done.stdout[-3000:]
    return done.stderr


def test_import_is_quiet_and_warnings_stay(tmp_path):
    stderr = _run(PROBE, _env(), tmp_path)
    assert not [line for line in stderr.splitlines() if any(c in line for c in CHATTER)], stderr
    assert "UserWarning: kerasfast-style warning" in stderr
    assert "TF_CPP_MIN_LOG_LEVEL=" in stderr


def test_user_log_level_is_kept(tmp_path):
    stderr = _run(PROBE, _env(TF_CPP_MIN_LOG_LEVEL="1"), tmp_path)
    assert "TF_CPP_MIN_LOG_LEVEL=1" in stderr


def test_verbose_tf_brings_the_chatter_back(tmp_path):
    stderr = _run(PROBE, _env(KERASFAST_VERBOSE_TF="1"), tmp_path)
    # On the machine this was written on (TF 2.21, no GPU) the oneDNN and
    # cudart notices always appear; where TensorFlow prints none, there is
    # nothing to bring back.
    assert "TF_CPP_MIN_LOG_LEVEL=" in stderr
    plain = _run("import tensorflow as tf; tf.config.list_physical_devices()", _env(), tmp_path)
    expected = [c for c in CHATTER if c in plain]
    assert all(c in stderr for c in expected), (expected, stderr)


def test_cli_info_prints_no_tensorflow_log_lines(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kerasfast.cli", "info"], env=_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Hardware" in done.stdout
    assert done.stderr.strip() == "", done.stderr


def test_filter_keeps_everything_but_the_chatter():
    text = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1796145201.747797   21032 port.cc:153] oneDNN custom operations are on.\n"
        "W0000 00:00:1796145201.747797   21032 some.cc:1] a warning\n"
        "E0000 00:00:1796145204.948045   21032 cuda_platform.cc:52] failed call to cuInit: INTERNAL\n"
        "E0000 00:00:1796145204.948045   21032 cuda_dnn.cc:9] Loaded runtime CuDNN library: 8.1 but compiled with 9\n"
        "/x.py:1: UserWarning: keep me\n"
    )
    assert filter_chatter(text) == (
        "E0000 00:00:1796145204.948045   21032 cuda_dnn.cc:9] Loaded runtime CuDNN library: 8.1 but compiled with 9\n"
        "/x.py:1: UserWarning: keep me\n"
    )


# A model whose graph has ops of unknown shape (TextVectorization), counted by kerasfast's FLOP estimate.
FLOP_COUNT = (
    "import kerasfast, keras, tensorflow as tf\n"
    "from kerasfast.costs import forward_flops\n"
    "words = keras.layers.TextVectorization(max_tokens=20, output_sequence_length=4)\n"
    "words.adapt(tf.constant([['a dog'], ['cat b']]))\n"
    "text = keras.Input((1,), dtype='string')\n"
    "model = keras.Model(text, keras.layers.Dense(1)(keras.layers.Embedding(20, 4)(words(text))))\n"
    "print('counted', forward_flops(model, [(1,)], ['string']) is not None)\n"
)


def test_the_flop_count_of_a_model_with_unknown_shapes_prints_nothing(tmp_path):
    stderr = _run(FLOP_COUNT, _env(), tmp_path, printed="counted True")
    assert "no flops stats" not in stderr, stderr


SIX_FITS = (
    "import numpy as np, keras, kerasfast\n"
    "x = np.random.default_rng(0).normal(size=(64, 8)).astype('float32')\n"
    "for _ in range(6):\n"
    "    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])\n"
    "    kerasfast.fit(model, x, x[:, :1], loss='mse', epochs=1, batch_size=32, run_dir=False, verbose=0,\n"
    "                  tune='off')\n"
    "print('trained')\n"
)


def test_fit_called_again_and_again_is_not_warned_of_retracing(tmp_path):
    """Each call traces its own steps once; tf.function counts them all as one function's retraces."""
    stderr = _run(SIX_FITS, _env(), tmp_path, printed="trained")
    assert "triggered tf.function retracing" not in stderr, stderr[-3000:]
