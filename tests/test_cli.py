"""The kerasfast command line, run as a user runs it: in a subprocess."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from kerasfast.plan import PRECISIONS

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def run_cli(*args, cwd=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "kerasfast.cli", *args], capture_output=True, text=True,
                          env=ENV, cwd=cwd, timeout=timeout)


def test_info_shows_hardware_and_default_plan():
    done = run_cli("info")
    assert done.returncode == 0, done.stderr
    assert "Hardware" in done.stdout and "usable cores" in done.stdout
    assert "precision" in done.stdout and "jit_compile" in done.stdout


def test_info_json_is_machine_readable():
    done = run_cli("info", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["hardware"]["cpu_cores"] >= 1
    assert report["plan"]["fields"]["precision"]["value"] in PRECISIONS
    from kerasfast.hardware import detect_hardware

    hardware = detect_hardware()
    assert tuple(report["hardware"]["cpu_flags"]) == hardware.cpu_flags
    # The kernels TensorFlow runs, as in this process (the same TF_ENABLE_ONEDNN_OPTS), and why.
    from kerasfast import _compat

    onednn = report["plan"]["fields"]["onednn"]
    assert onednn["value"] == _compat.onednn_enabled() and "not known" not in onednn["reason"], onednn


def test_quickstart_trains_and_writes_a_run_folder(tmp_path):
    out = tmp_path / "quick"
    done = run_cli("quickstart", "--out", str(out))  # the defaults a new user gets (~45 s on 2 cores)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kerasfast plan" in done.stdout
    assert "test accuracy" in done.stdout and "samples/s" in done.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dense_test_accuracy"] >= 0.98
    assert 0 < metrics["dense_test_loss"] < 0.2 and 0 < metrics["test_loss"] < 0.2  # getting-started.md names both
    # After pruning to 80% sparsity, within one point of the dense model (seed 0).
    assert metrics["test_accuracy"] >= metrics["dense_test_accuracy"] - 0.01
    assert metrics["samples_per_second"] > 0
    for stage in ("train", "prune"):
        for name in ("plan.json", "history.json", "result.json", "model.keras"):
            assert (out / stage / name).is_file(), f"{stage}/{name}"
    plan = json.loads((out / "train" / "plan.json").read_text())
    # quickstart sizes the thread pools before TensorFlow starts
    assert "kept" not in plan["fields"]["intra_op_threads"]["reason"]
    pruning = json.loads((out / "prune" / "pruning.json").read_text())
    assert all(abs(row["sparsity"] - 0.8) < 0.01 for row in pruning if "sparsity" in row)
    exported = {row["format"]: row for row in metrics["export"]}
    assert set(exported) == {"keras", "tflite_float32", "tflite_int8"}
    # The pruned int8 file, evaluated in LiteRT, within one point of the dense Keras model.
    assert exported["tflite_int8"]["accuracy"] >= metrics["dense_test_accuracy"] - 0.01
    prune_plan = json.loads((out / "prune" / "plan.json").read_text())
    assert "pruning fine-tune" in prune_plan["fields"]["learning_rate"]["reason"]
    assert (out / "export" / "model_int8.tflite").is_file()
    assert "tflite_int8" in done.stdout  # the report table is printed


def test_quickstart_summary_of_a_run_without_a_timed_epoch():
    from kerasfast.cli import quickstart_summary

    metrics = {"test_accuracy": 0.97, "sparsity": 0.8, "dense_test_accuracy": 0.98, "precision": "float32"}
    assert "n/a samples/s" in quickstart_summary({**metrics, "samples_per_second": None}, "q")
    assert "1,234 samples/s" in quickstart_summary({**metrics, "samples_per_second": 1234.4}, "q")


def test_unknown_precision_is_a_usage_error(tmp_path):
    done = run_cli("quickstart", "--out", str(tmp_path / "q"), "--precision", "fp8")
    assert done.returncode == 2
    assert "fp8" in done.stderr


@pytest.mark.parametrize("option", ["--epochs", "--batch-size"])
def test_quickstart_refuses_a_count_below_one_naming_the_option(tmp_path, option):
    from click.testing import CliRunner

    from kerasfast.cli import main

    done = CliRunner().invoke(main, ["quickstart", "--out", str(tmp_path / "q"), option, "0"])
    assert done.exit_code == 2 and f"Invalid value for '{option}': 0 is not in the range x>=1" in done.output
    assert not (tmp_path / "q").exists()


def test_quickstart_refuses_an_out_that_is_a_file_naming_the_option(tmp_path):
    from click.testing import CliRunner

    from kerasfast.cli import main

    (tmp_path / "afile").write_text("mine")
    done = CliRunner().invoke(main, ["quickstart", "--out", str(tmp_path / "afile"), "--epochs", "1"])
    assert done.exit_code == 2 and "Invalid value for '--out'" in done.output and "is a file" in done.output
    assert (tmp_path / "afile").read_text() == "mine"


def test_every_command_is_registered():
    done = run_cli("--help")
    assert done.returncode == 0, done.stderr
    for command in ("info", "quickstart", "launch", "convert", "export", "recipe"):
        assert f"  {command}" in done.stdout, command


def test_export_is_callable_like_fit(tmp_path):
    import keras
    import numpy as np

    import kerasfast

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    x = np.random.default_rng(0).random((32, 4), dtype=np.float32)
    result = kerasfast.export(model, tmp_path / "out", formats=("keras", "tflite_float32"), representative_data=x)
    assert [row.format for row in result.rows] == ["keras", "tflite_float32"]
    assert all(row.verified for row in result.rows)


def test_recipe_runs_only_the_shipped_recipes_never_a_path(tmp_path):
    import click

    from kerasfast import recipes

    marker = tmp_path / "ran"
    (tmp_path / "x.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
                                   "def main(argv):\n    pass\n")
    shipped = sorted(p.stem for p in (ROOT / "recipes").glob("*.py") if not p.name.startswith("_"))
    # `recipe ../../x` used to import recipes/../../x.py: any Python file
    escaping = os.path.relpath(tmp_path / "x", ROOT / "recipes")
    for name in (escaping, str(tmp_path / "x")):
        done = run_cli("recipe", name)
        assert done.returncode == 1, done.stderr
        assert f"no recipe {name!r}: the recipes are {', '.join(shipped)}." in done.stderr
    for name in ("../recipes/tabular", "tabular.py", "./tabular", "", "recipes"):
        with pytest.raises(click.ClickException, match="the recipes are"):
            recipes.load_recipe(name)
    assert not marker.exists()
    assert recipes.available_recipes() == shipped


def _as_unprivileged(command: list) -> list:
    """`command` without the power to write into read-only folders: root's capabilities dropped
    (setpriv, util-linux) when the tests run as root, as is."""
    if os.geteuid() != 0:
        return command
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", *command]


def test_quickstart_and_report_name_a_folder_they_cannot_write(tmp_path):
    (tmp_path / "afile").write_text("mine")
    done = run_cli("quickstart", "--out", str(tmp_path / "afile" / "run"), "--epochs", "1")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "Invalid value for --out" in done.stderr and "cannot be made" in done.stderr
    run = tmp_path / "run"
    run.mkdir()
    (run / "history.json").write_text(json.dumps({"loss": [1.0, 0.5]}))
    run.chmod(0o555)
    try:
        done = subprocess.run(_as_unprivileged([sys.executable, "-m", "kerasfast.cli", "report", str(run)]),
                              capture_output=True, text=True, env=ENV, timeout=300)
    finally:
        run.chmod(0o755)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "Invalid value for RUN_DIR" in done.stderr and "is not writable" in done.stderr
    assert sorted(path.name for path in run.iterdir()) == ["history.json"]
