"""`kerasfast export` command on a real saved model."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from click.testing import CliRunner

from kerasfast.export.cli import export_command


@pytest.fixture(scope="module")
def saved_model_and_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    hidden = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    hidden = keras.layers.Flatten()(hidden)
    model = keras.Model(inputs, keras.layers.Dense(10)(hidden))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.random((64, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 10, 64)
    model.save(folder / "model.keras")
    np.save(folder / "calibration.npy", x)
    np.savez(folder / "eval.npz", x=x[:32], y=y[:32])
    return folder


def test_cli_exports_requested_formats_and_prints_the_report(saved_model_and_data):
    folder = saved_model_and_data
    out_dir = folder / "out"
    result = CliRunner().invoke(
        export_command,
        [str(folder / "model.keras"), str(out_dir), "--formats", "keras,tflite_int8",
         "--representative", str(folder / "calibration.npy"), "--eval", str(folder / "eval.npz")],
    )
    assert result.exit_code == 0, result.output
    assert "| tflite_int8 | model_int8.tflite |" in result.output
    report = json.loads((out_dir / "report.json").read_text())
    assert [a["format"] for a in report["artifacts"]] == ["keras", "tflite_int8"]
    assert all(a["verified"] for a in report["artifacts"])
    assert report["eval_samples"] == 32


def test_cli_reports_bad_input_as_a_clear_error(saved_model_and_data):
    folder = saved_model_and_data
    np.save(folder / "wrong.npy", np.zeros((5, 3), "float32"))
    result = CliRunner().invoke(
        export_command,
        [str(folder / "model.keras"), str(folder / "bad"), "--formats", "tflite_int8",
         "--representative", str(folder / "wrong.npy")],
    )
    assert result.exit_code == 1
    assert "Error: representative_data samples have shape (3,) but the model input is (8, 8, 1)" in result.output
    assert "Traceback" not in result.output
    assert not (folder / "bad").exists()


def test_cli_runs_as_a_module(saved_model_and_data):
    folder = saved_model_and_data
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    completed = subprocess.run(
        [sys.executable, "-m", "kerasfast.export.cli", str(folder / "model.keras"), str(folder / "module_out"),
         "--formats", "onnx"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert completed.returncode == 1
    assert "Unknown export format(s) ['onnx']" in completed.stderr
