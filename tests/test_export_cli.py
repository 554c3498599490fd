"""`kerasfast export` command on a real saved model."""

import json
import os
import shutil
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
    assert "Error: --representative samples have shape (3,) but the model input is (8, 8, 1)" in result.output
    assert "Traceback" not in result.output
    assert not (folder / "bad").exists()
    empty = CliRunner().invoke(export_command, [str(folder / "model.keras"), str(folder / "bad"), "--formats", ","])
    assert empty.exit_code == 1 and "Error: --formats names no format; pass one or more of" in empty.output


def _pickled_npz(path):
    np.savez(path, x=np.array([{"a": 1}] * 4, dtype=object), y=np.zeros(4))


def _damaged_npz(path):
    np.savez(path, x=np.zeros((4, 8, 8, 1), "float32"), y=np.zeros(4))
    data = bytearray(path.read_bytes())
    data[60] ^= 0xFF  # inside the first member's bytes: its CRC no longer matches
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("option", ["--representative", "--eval"])
@pytest.mark.parametrize("make", [_pickled_npz, _damaged_npz], ids=["pickled objects", "damaged member"])
def test_cli_names_an_archive_whose_arrays_numpy_cannot_read(saved_model_and_data, option, make):
    folder = saved_model_and_data
    make(folder / "arrays.npz")
    formats = ["--formats", "tflite_int8"] if option == "--representative" else []
    result = CliRunner().invoke(export_command, [str(folder / "model.keras"), str(folder / "bad"), option,
                                                 str(folder / "arrays.npz"), *formats])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert f"Error: {option} {folder / 'arrays.npz'} is not an array file NumPy can read" in result.output
    assert not (folder / "bad").exists()


@pytest.mark.parametrize("option, name", [("--representative", "notnpy.npy"), ("--eval", "notnpz.npz")])
def test_cli_names_an_array_file_numpy_cannot_read(saved_model_and_data, option, name):
    folder = saved_model_and_data
    (folder / name).write_bytes(b"plain text, not an array file\n")
    result = CliRunner().invoke(export_command, [str(folder / "model.keras"), str(folder / "bad"), option,
                                                 str(folder / name)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"Error: {option} {folder / name} is not an array file NumPy can read" in result.output
    assert not (folder / "bad").exists()


def test_cli_runs_as_a_module(saved_model_and_data):
    folder = saved_model_and_data
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    completed = subprocess.run(
        [sys.executable, "-m", "kerasfast.export.cli", str(folder / "model.keras"), str(folder / "module_out"),
         "--formats", "coreml"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert completed.returncode == 1
    assert "Unknown export format(s) ['coreml']" in completed.stderr


@pytest.fixture
def user_folder(saved_model_and_data, tmp_path):
    """A user's working folder (mode 0755): their model, notes and a sub-folder."""
    folder = tmp_path / "work"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(saved_model_and_data / "model.keras", folder / "model.keras")
    (folder / "notes.txt").write_text("my notes")
    (folder / "sub" / "data.csv").write_text("a,b\n1,2\n")
    folder.chmod(0o755)
    return folder


def user_files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_cli_refuses_to_export_into_a_folder_with_user_files(user_folder):
    before = user_files(user_folder)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    completed = subprocess.run(
        [sys.executable, "-m", "kerasfast.cli", "export", "model.keras", ".", "--formats", "tflite_float32"],
        cwd=user_folder, capture_output=True, text=True, env=env, timeout=180,
    )
    assert completed.returncode == 1, completed.stderr[-2000:]
    assert (f"Error: out_dir {user_folder} holds 3 entries kerasfast did not write: model.keras, notes.txt, sub/."
            in completed.stderr)
    assert "(command line: --overwrite)" in completed.stderr
    assert "Traceback" not in completed.stderr
    assert user_files(user_folder) == before
    assert sorted(p.name for p in user_folder.iterdir()) == ["model.keras", "notes.txt", "sub"]


def test_cli_overwrite_exports_beside_user_files_and_never_replaces_them(user_folder, monkeypatch):
    before = user_files(user_folder)
    monkeypatch.chdir(user_folder)
    result = CliRunner().invoke(export_command, ["model.keras", ".", "--formats", "tflite_float32", "--overwrite"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in user_folder.iterdir()) == [
        "kerasfast-export.json", "model.keras", "model_float32.tflite", "notes.txt", "report.json", "report.md", "sub",
    ]
    assert {k: v for k, v in user_files(user_folder).items() if k in before} == before
    assert os.stat(user_folder).st_mode & 0o777 == 0o755
    # The keras format would replace the input model.keras itself: refused even with --overwrite.
    result = CliRunner().invoke(export_command, ["model.keras", ".", "--formats", "keras", "--overwrite"])
    assert result.exit_code == 1
    assert "holds model.keras, which kerasfast did not write, at a name this export would replace" in result.output
    assert user_files(user_folder)["model.keras"] == before["model.keras"]


def test_cli_loads_a_model_with_a_lambda_only_when_told_the_file_is_trusted(tmp_path):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Lambda(lambda t: t * 2.0)(inputs)))
    model.save(tmp_path / "model.keras")
    arguments = [str(tmp_path / "model.keras"), str(tmp_path / "out"), "--formats", "tflite_float32"]
    refused = CliRunner().invoke(export_command, arguments)
    assert refused.exit_code == 1 and "pass --unsafe-deserialization" in refused.output, refused.output
    assert not (tmp_path / "out").exists()
    exported = CliRunner().invoke(export_command, [*arguments, "--unsafe-deserialization"])
    assert exported.exit_code == 0, exported.output
    assert (tmp_path / "out" / "model_float32.tflite").stat().st_size > 0
    # The keras artifact is reloaded as the user allowed, not in safe mode.
    everything = CliRunner().invoke(export_command, [str(tmp_path / "model.keras"), str(tmp_path / "all"),
                                                     "--unsafe-deserialization"])
    assert everything.exit_code == 0, everything.output
    assert (tmp_path / "all" / "model.keras").stat().st_size > 0


def test_a_report_of_an_export_folder_does_not_block_the_next_export_into_it(saved_model_and_data):
    import kerasfast

    folder = saved_model_and_data
    out_dir = folder / "reported"
    arguments = [str(folder / "model.keras"), str(out_dir), "--formats", "keras"]
    assert CliRunner().invoke(export_command, arguments).exit_code == 0
    kerasfast.write_report(out_dir)
    assert (out_dir / "report.html").exists() and (out_dir / "export.png").exists()
    again = CliRunner().invoke(export_command, arguments)  # no --overwrite: the report is kerasfast's too
    assert again.exit_code == 0, again.output
    assert not (out_dir / "report.html").exists()  # the old export's report went with it


def test_a_file_that_is_not_a_keras_archive_is_named_as_such(saved_model_and_data):
    folder = saved_model_and_data
    (folder / "fake.keras").write_text("hello\n")
    result = CliRunner().invoke(export_command, [str(folder / "fake.keras"), str(folder / "bad")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "is not a .keras file (a zip archive Keras writes)" in result.output and "not found" not in result.output
    assert not (folder / "bad").exists()


def test_int8_io_without_tflite_int8_is_refused(saved_model_and_data):
    folder = saved_model_and_data
    result = CliRunner().invoke(export_command, [str(folder / "model.keras"), str(folder / "bad"), "--formats",
                                                 "keras", "--int8-io"])
    assert result.exit_code == 1 and "do not include tflite_int8" in result.output
    # The message names this command's options, not export_model's arguments.
    assert "add it (it needs --representative), or leave --int8-io off" in result.output
    assert "int8_input_output" not in result.output and "representative_data" not in result.output
    assert not (folder / "bad").exists()


def test_int8_without_representative_data_names_the_option(saved_model_and_data):
    folder = saved_model_and_data
    result = CliRunner().invoke(export_command, [str(folder / "model.keras"), str(folder / "no_calibration"),
                                                 "--formats", "keras,tflite_int8"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "calibrates activation ranges and needs --representative DATA.npy" in result.output
    assert not (folder / "no_calibration").exists()
