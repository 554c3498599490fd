"""`kerasfast report` on run folders whose files are not what a finished fit wrote, and re-runs into a
folder that already holds an earlier run's plots."""

import json
import shutil
import warnings

import pytest
from click.testing import CliRunner

import kerasfast
from kerasfast.cli import main
from tests.helpers import small_convnet

FIT = dict(batch_size=32, loss="sparse_categorical_crossentropy", metrics=["accuracy"], verbose=0, seed=0,
           steps_per_execution=8, tune="off")


@pytest.fixture(scope="module")
def finished(digits, tmp_path_factory):
    """The folder of one pruned fit (its report has a throughput timeline and a sparsity plot)."""
    (x, y), _ = digits
    folder = tmp_path_factory.mktemp("finished") / "run"
    kerasfast.fit(small_convnet(), x, y, epochs=2, prune=0.5, run_dir=folder, **FIT)
    return folder


def copy_of(finished, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(finished, folder)
    return folder


@pytest.mark.parametrize("history", ["[1, 2]", '{"loss": "abc"}', '{"loss": [0.5, "x"]}'],
                         ids=["list", "string values", "string in a curve"])
def test_a_history_of_the_wrong_shape_is_named_without_a_traceback(finished, tmp_path, history):
    folder = copy_of(finished, tmp_path)
    (folder / "history.json").write_text(history)

    done = CliRunner().invoke(main, ["report", str(folder)])

    assert done.exit_code == 1 and not isinstance(done.exception, (TypeError, AttributeError, ValueError))
    assert "history.json should hold a JSON object of per-epoch numbers per metric" in done.output
    assert str(folder) in done.output and "Traceback" not in done.output


def test_an_empty_history_draws_without_matplotlib_warnings(finished, tmp_path):
    folder = copy_of(finished, tmp_path)
    (folder / "history.json").write_text("{}")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kerasfast.write_report(folder)

    assert not [w for w in caught if "No artists" in str(w.message)], [str(w.message) for w in caught]


def test_a_rerun_without_a_timeline_or_pruning_drops_the_earlier_runs_plots(finished, tmp_path):
    folder = copy_of(finished, tmp_path)
    assert (folder / "throughput.png").is_file() and (folder / "sparsity.png").is_file()
    timeline = json.loads((folder / "timeline.json").read_text())
    # What a run too short for a timeline leaves: its first, compiling execution only.
    (folder / "timeline.json").write_text(json.dumps({key: value[:1] if isinstance(value, list) else value
                                                      for key, value in timeline.items()}))
    (folder / "pruning.json").unlink()

    kerasfast.write_report(folder)

    assert not (folder / "throughput.png").exists() and not (folder / "sparsity.png").exists()
    assert (folder / "curves.png").is_file()
    assert "No throughput timeline" in (folder / "report.html").read_text(encoding="utf-8")


def test_a_recipe_run_again_without_pruning_reports_only_what_it_wrote(finished, digits, tmp_path):
    # As `kerasfast recipe NAME --prune 0.5`, then the same command without --prune into the same folder.
    from kerasfast import recipes

    out = tmp_path / "recipe"
    shutil.copytree(finished, out / "prune")  # the earlier run's pruning phase
    (x, y), _ = digits
    trained = kerasfast.fit(small_convnet(), x[:256], y[:256], epochs=1, run_dir=out / "train", **FIT)
    metrics = recipes.finish(out, trained, {"test_accuracy": 0.5})

    assert metrics["left_from_earlier_runs"] == ["prune"]
    assert json.loads((out / "metrics.json").read_text())["left_from_earlier_runs"] == ["prune"]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "Run: train/" in page and "Run: prune/" not in page
    assert "Not from this run, so not shown: prune/ (left in the folder by an earlier run)." in page
    # Run again with --prune, the pruning phase is this run's own again.
    (out / "prune" / "plan.json").touch()
    assert "left_from_earlier_runs" not in recipes.finish(out, trained, {"test_accuracy": 0.5})
    assert "Run: prune/" in (out / "report.html").read_text(encoding="utf-8")
