"""The run report: `report.html` and its PNGs from real training, `kerasfast report`,
and TensorBoard logs from `fit(..., tensorboard=True)`."""

import base64
import json
import re
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

import kerasfast
from kerasfast.cli import main
from kerasfast.errors import PlanError, ReportError
from tests.helpers import small_convnet

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EMBEDDED = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
FIT = dict(batch_size=32, loss="sparse_categorical_crossentropy", metrics=["accuracy"], verbose=0, seed=0,
           steps_per_execution=8, tune="off")


def assert_png(data: bytes):
    import matplotlib.image

    assert data[:8] == PNG_SIGNATURE
    import io

    assert matplotlib.image.imread(io.BytesIO(data), format="png").shape[0] > 100  # decodes to a real image


@pytest.fixture(scope="module")
def run(digits, tmp_path_factory):
    """One fit with validation data and pruning: (result, run folder)."""
    import keras

    keras.utils.set_random_seed(0)
    (x, y), (x_test, y_test) = digits
    folder = tmp_path_factory.mktemp("report") / "run"
    result = kerasfast.fit(small_convnet(), x, y, epochs=3, validation_data=(x_test, y_test), prune=0.5,
                           run_dir=folder, **FIT)
    return result, folder


def test_fit_writes_a_self_contained_report(run):
    result, folder = run
    assert result.report == folder / "report.html"
    html = result.report.read_text(encoding="utf-8")
    images = EMBEDDED.findall(html)
    # Curves, throughput timeline and sparsity, each embedded and a valid PNG.
    assert len(images) >= 3
    for data in images:
        assert_png(base64.b64decode(data))
    assert "<img" in html and 'src="http' not in html and "<script" not in html  # nothing fetched from elsewhere
    # The plan table: every field with its value and reason.
    plan = json.loads((folder / "plan.json").read_text())
    for name in plan["fields"]:
        assert f"<td>{name}</td>" in html
    assert "requested" in html and "AdamW" in html
    assert plan["fields"]["prune"]["reason"].split(",")[0] in html
    # Sparsity per layer, as achieved.
    for row in result.pruning:
        if row.get("pruned", True):
            assert f"<td>{row['layer']}</td>" in html


def test_the_pngs_behind_the_report_are_written_next_to_it(run):
    _, folder = run
    for name in ("curves.png", "throughput.png", "sparsity.png"):
        assert_png((folder / name).read_bytes())
    html = (folder / "report.html").read_text(encoding="utf-8")
    for name in ("curves.png", "throughput.png", "sparsity.png"):
        assert base64.b64encode((folder / name).read_bytes()).decode() in html


def test_validation_curves_and_a_timeline_of_steps(run):
    result, folder = run
    history = json.loads((folder / "history.json").read_text())
    assert {"val_loss", "val_accuracy"} <= set(history)
    assert "no validation data" not in (folder / "report.html").read_text(encoding="utf-8")
    timeline = json.loads((folder / "timeline.json").read_text())
    assert timeline == json.loads(json.dumps(result.timeline))
    # One point per execution after the first: 45 steps per epoch in executions of 8 steps.
    assert len(timeline["step"]) >= 10 and timeline["step"] == sorted(timeline["step"])
    assert timeline["step"][-1] == 3 * 45 and timeline["seconds"][0] == 0.0
    assert timeline["samples"][-1] == pytest.approx(result.throughput.measured_seconds
                                                    * result.throughput.samples_per_second)
    waits = timeline["input_wait_seconds"]
    assert all(w is not None for w in waits) and waits == sorted(waits)
    from kerasfast.reporting.plots import timeline_rates

    rates = timeline_rates(timeline)
    assert len(rates["samples_per_second"]) == len(timeline["step"]) - 1
    assert np.all((rates["input_wait_fraction"] >= 0) & (rates["input_wait_fraction"] <= 1))


def test_no_validation_says_so(digits, tmp_path):
    (x, y), _ = digits
    result = kerasfast.fit(small_convnet(), x[:256], y[:256], epochs=1, run_dir=tmp_path / "run", **FIT)
    html = result.report.read_text(encoding="utf-8")
    assert "no validation data" in html
    assert "val_" not in json.dumps(json.loads((tmp_path / "run" / "history.json").read_text()))


def test_report_command_regenerates_it(run):
    _, folder = run
    for name in ("report.html", "curves.png", "throughput.png"):
        (folder / name).unlink()
    done = CliRunner().invoke(main, ["report", str(folder)])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == str(folder / "report.html")
    html = (folder / "report.html").read_text(encoding="utf-8")
    assert len(EMBEDDED.findall(html)) >= 3
    assert_png((folder / "throughput.png").read_bytes())


def test_a_folder_of_runs_and_an_export_gets_one_page(run, tmp_path):
    result, _ = run
    import shutil

    from kerasfast.export import export_model

    parent = tmp_path / "job"
    shutil.copytree(result.run_dir, parent / "train", ignore=shutil.ignore_patterns("*.png", "report.html"))
    (_, _), (x_test, y_test) = kerasfast.datasets.digits()
    export_model(result.model, parent / "export", formats=("keras",), eval_data=(x_test, y_test))
    done = CliRunner().invoke(main, ["report", str(parent)])
    assert done.exit_code == 0, done.output
    html = (parent / "report.html").read_text(encoding="utf-8")
    assert "Run: train/" in html and "Export: export/" in html and "size and accuracy" in html
    assert (parent / "train" / "report.html").is_file()  # each run keeps its own page too
    assert_png((parent / "export.png").read_bytes())
    # An export folder on its own.
    done = CliRunner().invoke(main, ["report", str(parent / "export")])
    assert done.exit_code == 0, done.output
    assert "<td>keras</td>" in (parent / "export" / "report.html").read_text(encoding="utf-8")


def test_missing_files_are_named(run, tmp_path):
    _, folder = run
    empty = tmp_path / "empty"
    empty.mkdir()
    done = CliRunner().invoke(main, ["report", str(empty)])
    assert done.exit_code != 0
    assert "plan.json is missing" in done.output and "run_dir=" in done.output
    assert not (empty / "report.html").exists()

    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "plan.json").write_bytes((folder / "plan.json").read_bytes())
    with pytest.raises(ReportError, match=r"history\.json is missing.*re-run the same fit"):
        kerasfast.write_report(unfinished)
    done = CliRunner().invoke(main, ["report", str(tmp_path / "nowhere")])
    assert done.exit_code != 0 and "no such folder" in done.output


def test_a_failing_report_never_loses_the_run(digits, tmp_path):
    (x, y), _ = digits
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "curves.png").mkdir()  # the plot cannot be written where a folder stands
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = kerasfast.fit(small_convnet(), x[:256], y[:256], epochs=1, run_dir=folder, **FIT)
    assert result.report is None and result.history.history["loss"]
    assert (folder / "result.json").is_file() and (folder / "model.keras").is_file()
    messages = [str(w.message) for w in caught if "report.html could not be written" in str(w.message)]
    assert messages and "curves.png" in messages[0] and "kerasfast report" in messages[0]


def test_tensorboard_writes_scalars_and_a_profile(digits, tmp_path):
    (x, y), (x_test, y_test) = digits
    folder = tmp_path / "run"
    result = kerasfast.fit(small_convnet(), x, y, epochs=2, validation_data=(x_test[:100], y_test[:100]),
                           run_dir=folder, tensorboard=True, **FIT)
    logs = folder / "tensorboard"
    assert list((logs / "train").glob("events.out.tfevents.*"))
    assert list((logs / "validation").glob("events.out.tfevents.*"))
    profiles = list((logs / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert profiles and profiles[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logs / "train"), size_guidance={"tensors": 0}).Reload()
    assert "epoch_loss" in events.Tags()["tensors"]
    assert len(events.Tensors("epoch_loss")) == 2
    assert "tensorboard --logdir" in result.report.read_text(encoding="utf-8")


def test_tensorboard_profiles_steady_state_executions():
    from kerasfast.training.tensorboard import profile_range

    assert profile_range(None) == (3, 5) and profile_range(100) == (3, 5)
    assert profile_range(4) == (3, 4) and profile_range(2) == (2, 2) and profile_range(1) == (1, 1)


def test_tensorboard_without_a_run_folder_is_refused(digits):
    (x, y), _ = digits
    with pytest.raises(PlanError, match=r"tensorboard=True.*run_dir=False"):
        kerasfast.fit(small_convnet(), x[:64], y[:64], run_dir=False, tensorboard=True, **FIT)
    with pytest.raises(PlanError, match="tensorboard='yes' is not valid"):
        kerasfast.fit(small_convnet(), x[:64], y[:64], run_dir=False, tensorboard="yes", **FIT)


def _browser():
    import shutil

    return next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)


@pytest.mark.skipif(_browser() is None, reason="needs a headless Chromium (Debian: apt-get install chromium; "
                    ".ci/run installs it)")
def test_the_report_renders_its_plots_in_a_browser(run, tmp_path):
    """Chromium draws the page: the embedded plots show up as pixels in matplotlib's colours."""
    import subprocess

    import matplotlib.image

    result, _ = run
    shot = tmp_path / "report.png"
    completed = subprocess.run(
        [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={shot}",
         "--window-size=1280,4000", result.report.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert shot.exists(), completed.stderr[-2000:]
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (4000, 1280)
    # matplotlib's first two line colours (C0 blue #1f77b4, C1 orange #ff7f0e) only come from the plots.
    for colour in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)):
        near = np.abs(pixels - np.array(colour) / 255).max(axis=-1) < 0.08
        assert near.sum() > 200, f"no plot pixels of colour {colour} in the screenshot"
    # The page is not blank: a good share of it differs from the white background.
    assert (pixels.mean(axis=-1) < 0.95).mean() > 0.02
