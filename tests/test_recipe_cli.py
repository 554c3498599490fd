"""The recipes from the command line: flag checks, --resume, Ctrl-C, and loading the models they save."""

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import time
import zipfile

import pytest
from click.testing import CliRunner

from kerasfast import recipes
from kerasfast.cli import main
from kerasfast.errors import PlanError

ROOT = pathlib.Path(__file__).resolve().parents[1]
RANGE_TYPES = (recipes.positive_int, recipes.non_negative_int, recipes.positive_float, recipes.non_negative_float)


def run_recipe(name, *flags):
    return recipes.load_recipe(name).main([str(flag) for flag in flags])


def _interruptible():
    # A job started in the background by a non-interactive shell (as a CI
    # runner may start the suite) inherits SIGINT ignored, and Python keeps an
    # ignored SIGINT ignored: give the command Ctrl-C's default, as a terminal does.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kerasfast_process(*args, **options):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen([sys.executable, "-m", "kerasfast.cli", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_interruptible,
                            **options)


@pytest.mark.parametrize("name, flags, message", [
    ("gpt", ["--heads", "0"], "argument --heads: 0 is below 1"),
    ("gpt", ["--seq-len", "-4"], "argument --seq-len: -4 is below 1"),
    ("gpt", ["--corpus-mb", "-1"], "argument --corpus-mb: -1 is not a finite number of at least 0"),
    ("gpt", ["--learning-rate", "nan"], "argument --learning-rate: nan is not a finite number above 0"),
    ("image_classification", ["--image-size", "-5"], "argument --image-size: -5 is below 1"),
    ("text_classification", ["--per-class", "0"], "argument --per-class: 0 is below 1"),
], ids=["heads", "seq-len", "corpus-mb", "learning-rate", "image-size", "per-class"])
def test_numeric_flags_out_of_range_are_refused_before_any_data_is_written(tmp_path, capsys, name, flags,
                                                                           message):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as refused:
        run_recipe(name, "--smoke", *flags, "--out", out)
    assert refused.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("flags, message", [
    (["--data-service", "notaurl"], "--data-service 'notaurl' is not valid: use 'grpc://HOST:PORT'"),
    (["--jit", "on", "--precision", "onednn_bfloat16"],
     "--precision 'onednn_bfloat16' with --jit on: oneDNN's bfloat16 graph pass does not apply inside XLA"),
], ids=["data-service", "jit-precision"])
def test_flags_fit_would_refuse_are_refused_before_any_data_is_written_in_the_flags_words(tmp_path, flags,
                                                                                          message):
    out = tmp_path / "run"
    with pytest.raises(PlanError) as refused:
        run_recipe("tabular", "--smoke", *flags, "--out", out)
    assert message in str(refused.value)
    assert not out.exists()


@pytest.mark.parametrize("name", recipes.RECIPES)
def test_every_numeric_flag_of_every_recipe_has_a_range(name):
    parser = recipes.static_parser(recipes.recipe_path(name))
    # --ray-workers is checked by recipes.start, also before any data is written.
    unchecked = [action.option_strings[0] for action in parser._actions
                 if isinstance(action, argparse._StoreAction) and action.type in (int, float)
                 and action.option_strings[0] != "--ray-workers"]
    assert not unchecked, f"{name}: {unchecked} take any number; give them one of {RANGE_TYPES}"


def test_resume_is_a_flag_of_the_recipes_and_the_quickstart():
    parser = recipes.static_parser(recipes.recipe_path("tabular"))
    assert recipes.fit_options(parser.parse_args(["--resume", "fresh"]))["resume"] == "fresh"
    assert recipes.fit_options(parser.parse_args([]))["resume"] == "auto"
    shown = CliRunner().invoke(main, ["quickstart", "--help"])
    assert shown.exit_code == 0 and "--resume [auto|fresh|force]" in shown.output


def wait_for(path: pathlib.Path, process, timeout_s: float = 240):
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.5)


def test_ctrl_c_exits_130_says_how_to_go_on_and_resume_fresh_starts_afresh(tmp_path):
    out = tmp_path / "run"
    process = kerasfast_process("recipe", "tabular", "--smoke", "--epochs", "1000", "--out", out)
    wait_for(out / "train" / "backup" / "state.npz", process)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)

    assert process.returncode == 130, stderr[-2000:]
    assert "Aborted!" not in stderr and "Traceback" not in stderr
    assert f"Interrupted: {out} holds a backup of the run" in stderr and "--resume fresh" in stderr

    # Other flags: refused while the backup is there, unless --resume fresh discards it.
    refused = CliRunner().invoke(recipes.recipe_command, ["tabular", "--smoke", "--epochs", "1", "--out", str(out)])
    assert refused.exit_code == 1 and "resume" in refused.output
    (out / "throughput.png").write_bytes(b"\x89PNG\r\n\x1a\n an earlier run's plot")
    fresh = CliRunner().invoke(recipes.recipe_command,
                               ["tabular", "--smoke", "--epochs", "1", "--resume", "fresh", "--out", str(out)])
    assert fresh.exit_code == 0, fresh.output
    # One epoch times nothing after the first execution: no throughput plot, and no earlier one either.
    assert not (out / "throughput.png").exists()


@pytest.mark.slow
def test_ctrl_c_of_the_quickstart_exits_130(tmp_path):
    out = tmp_path / "qs"
    process = kerasfast_process("quickstart", "--epochs", "200", "--out", out)
    wait_for(out / "train" / "backup" / "state.npz", process)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)

    assert process.returncode == 130, stderr[-2000:]
    assert f"Interrupted: {out} holds a backup of the run" in stderr and "Aborted!" not in stderr


def test_ctrl_c_while_pruning_after_training_finished_says_the_command_starts_afresh(tmp_path, capsys):
    # The pruning phase resumes only beside a training phase that resumes (next_phase_options).
    out = tmp_path / "run"
    for phase in ("prune", "train"):
        (out / phase / "backup").mkdir(parents=True)
        (out / phase / "backup" / "state.npz").write_bytes(b"")
        assert recipes.interrupted(out).exit_code == 130
        said = capsys.readouterr().err
        if phase == "prune":
            assert (f"Interrupted in {out / 'prune'}, after training had finished: running the command again trains "
                    "and prunes afresh") in said and "resume from it" not in said
        else:
            assert f"Interrupted: {out} holds a backup of the run. Run the same command again to resume" in said


def tiny_text_encoder(path: pathlib.Path) -> pathlib.Path:
    model = recipes.load_recipe("text_classification").text_encoder(16, 2, embed_dim=8, num_heads=1, num_blocks=1,
                                                                     feed_forward_dim=8)
    model.save(path)
    return path


def test_export_loads_a_model_with_a_recipes_layers(tmp_path):
    """In a fresh process, as `kerasfast export` runs after the recipe that saved the model has exited."""
    model = tiny_text_encoder(tmp_path / "model.keras")
    process = kerasfast_process("export", model, tmp_path / "exported", "--formats", "keras")
    stdout, stderr = process.communicate(timeout=300)

    assert process.returncode == 0, stdout[-2000:] + stderr[-2000:]
    assert (tmp_path / "exported" / "model.keras").is_file()
    assert recipes.import_recipe_layers(model) == ["text_classification"]


def test_a_model_whose_class_cannot_be_found_names_it(tmp_path):
    saved = tiny_text_encoder(tmp_path / "saved.keras")
    moved = tmp_path / "moved.keras"
    # The same model as if its layer came from a module of the user's that is not imported.
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(moved, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            if item.filename == "config.json":
                data = (data.replace(b"kerasfast_recipe_text_classification", b"my_layers")
                        .replace(b"kerasfast_recipes>", b"my_package>"))
            target.writestr(item, data)

    done = CliRunner().invoke(main, ["export", str(moved), str(tmp_path / "out"), "--formats", "keras"])

    assert done.exit_code == 1 and "Traceback" not in done.output
    assert "custom class 'TokenAndPositionEmbedding'" in done.output
    assert "importing the module that defines the class" in done.output


def test_the_pruning_phase_resumes_only_when_the_training_phase_does(tmp_path):
    from kerasfast.recipes import next_phase_options

    options = {"resume": "auto", "seed": 0}
    # Training will run again from scratch: a pruning backup made from another run's model is not resumed.
    assert next_phase_options(options, tmp_path / "train") == {"resume": "fresh", "seed": 0}
    (tmp_path / "train" / "backup").mkdir(parents=True)
    (tmp_path / "train" / "backup" / "state.npz").write_bytes(b"")
    assert next_phase_options(options, tmp_path / "train") == options
