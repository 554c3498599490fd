"""Export, TFLite conversion, `kerasfast convert`, a recipe and `kerasfast launch` print none of TensorFlow's
log lines (C++ or Python), unless KERASFAST_VERBOSE_TF=1; real errors still show."""

import os
import re
import subprocess
import sys

import keras
import numpy as np

# A TensorFlow log line: glog/absl format ("I0000 00:00:17.5 123 file.cc:52] ..."),
# the Python logger's ("WARNING:tensorflow:..."), or TFLite's printf notices.
TF_LOG_LINE = re.compile(
    r"^(\[worker \d\] )?([IWEF]\d{4} [\d:.]+\s+\d+ [\w.+-]+:\d+\]|WARNING:tensorflow:|WARNING:absl:|"
    r"INFO: Created TensorFlow Lite|fully_quantize: |WARNING: All log messages before absl)"
)


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "KERASFAST_VERBOSE_TF")}
    return {**env, **extra}


def _kerasfast(*args, cwd, env=None):
    done = subprocess.run([sys.executable, "-m", "kerasfast.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env or _env(), timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return done


def _tf_lines(text):
    return [line for line in text.splitlines() if TF_LOG_LINE.match(line)]


def test_export_and_tflite_conversion_print_no_tensorflow_log_lines(tmp_path):
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.save(tmp_path / "model.keras")
    np.save(tmp_path / "x.npy", x)
    args = ["export", "model.keras", "out", "--formats", "tflite_float32,tflite_int8", "--representative", "x.npy"]
    done = _kerasfast(*args, cwd=tmp_path)
    assert "tflite_int8" in done.stdout
    assert _tf_lines(done.stderr) == [], done.stderr
    assert done.stderr.strip() == "", done.stderr


def test_verbose_tf_shows_the_converter_lines(tmp_path):
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.save(tmp_path / "model.keras")
    np.save(tmp_path / "x.npy", x)
    done = _kerasfast("export", "model.keras", "out", "--formats", "tflite_int8", "--representative", "x.npy",
                      cwd=tmp_path, env=_env(KERASFAST_VERBOSE_TF="1"))
    assert "fully_quantize: " in done.stderr, done.stderr[-3000:]


# keras before kerasfast, as keras.io examples do: TensorFlow starts before
# kerasfast can silence it, so the launcher drops its start-up lines.
WORKER = """
import keras
import numpy as np

import kerasfast

kerasfast.distribute.setup("multi_worker")
x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
kerasfast.fit(model, (x, y), epochs=1, batch_size=16, loss="sparse_categorical_crossentropy", run_dir=False,
              verbose=0, tune="off")
print("trained")
"""


def test_convert_prints_no_tensorflow_log_lines(tmp_path):
    (tmp_path / "table.csv").write_text("a,b,label\n" + "".join(f"{i},{i * 0.5},{i % 2}\n" for i in range(40)))
    done = _kerasfast("convert", "table.csv", "records", "--shards", "2", cwd=tmp_path)
    assert (tmp_path / "records" / "schema.json").is_file()
    assert _tf_lines(done.stdout + done.stderr) == [], done.stderr


def test_a_recipe_smoke_run_prints_no_tensorflow_log_lines(tmp_path):
    done = _kerasfast("recipe", "tabular", "--smoke", "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert "test accuracy" in done.stdout
    assert _tf_lines(done.stdout + done.stderr) == [], done.stderr[-3000:]


def test_a_two_worker_launch_prints_no_tensorflow_log_lines(tmp_path):
    (tmp_path / "train.py").write_text(WORKER)
    done = _kerasfast("launch", "-n", "2", "--", sys.executable, "train.py", cwd=tmp_path)
    output = done.stdout + done.stderr
    assert "[worker 0] trained" in output and "[worker 1] trained" in output, output[-3000:]
    assert _tf_lines(output) == [], output[-3000:]


# Writes TensorFlow-style chatter and a real error line to file descriptor 2
# inside filtered_stderr; raises if asked.
CAPTURE = """
import os, sys
from kerasfast._quiet import filtered_stderr
try:
    with filtered_stderr():
        os.write(2, b"I0000 00:00:1796145201.747797   21032 reader.cc:83] Reading SavedModel\\n")
        os.write(2, b"fully_quantize: 0, inference_type: 6\\n")
        os.write(2, b"error: the real problem\\n")
        if sys.argv[1] == "fail":
            raise RuntimeError("conversion failed")
except RuntimeError:
    pass
"""


def test_captured_lines_are_all_shown_when_the_call_fails():
    def stderr_of(mode):
        done = subprocess.run([sys.executable, "-c", CAPTURE, mode], capture_output=True, text=True, timeout=120,
                              env=_env())
        assert done.returncode == 0, done.stderr
        return done.stderr

    assert stderr_of("ok") == "error: the real problem\n"
    failed = stderr_of("fail")
    assert "Reading SavedModel" in failed and "fully_quantize" in failed and "the real problem" in failed


def test_tensorflow_imported_after_kerasfast_is_quiet_even_after_a_look_up():
    """kerasfast no longer imports TensorFlow itself: whoever imports it first
    (here the script, after only asking whether it is installed) gets the quiet import."""
    code = ("import importlib.util, sys, kerasfast\n"
            "assert 'tensorflow' not in sys.modules\n"
            "assert importlib.util.find_spec('tensorflow') is not None\n"
            "import tensorflow as tf\n"
            "print(float(tf.constant(1.0) + 1))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "2.0"
    assert _tf_lines(done.stderr) == [] and "oneDNN" not in done.stderr, done.stderr


def test_with_keras_imported_first_only_the_import_lines_print(tmp_path):
    """TensorFlow's lines at import come before kerasfast exists; the device probe's (cuInit) are filtered."""
    script = ("import sys\nimport keras\nimport kerasfast\nprint('imported', file=sys.stderr, flush=True)\n"
              "kerasfast.detect_hardware()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    after_import = done.stderr.split("imported\n", 1)[1]
    assert _tf_lines(after_import) == [], after_import
