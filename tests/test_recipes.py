"""The image, tabular and text recipes run end to end with --smoke, and `kerasfast recipe` runs them.

Each run trains for real on the bundled data (or on small data sets written
here) and is checked for what a user would look at: the metrics beat the
trivial baseline, the run folder holds the plan, history, metrics and valid
PNG plots, and an exported int8 TFLite file was evaluated in LiteRT.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from kerasfast import datasets, recipes
from kerasfast.plan import PRECISIONS

ROOT = pathlib.Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_recipe(name, *flags):
    """Runs recipes/NAME.py's main in this process, as `kerasfast recipe` does."""
    return recipes.load_recipe(name).main([str(flag) for flag in flags])


def assert_run_folder(out: pathlib.Path, stages=("train",)):
    """The files every recipe run leaves: plan, history, metrics, two valid PNG plots and the report."""
    import matplotlib.image

    for stage in stages:
        plan = json.loads((out / stage / "plan.json").read_text())
        assert plan["fields"]["precision"]["value"] in PRECISIONS
        assert json.loads((out / stage / "history.json").read_text())["loss"]
    for plot in ("curves.png", "throughput.png"):
        path = out / plot
        assert path.read_bytes()[:8] == PNG_SIGNATURE, plot
        assert matplotlib.image.imread(path).shape[0] > 100, plot  # decodes to a real image
    report = (out / "report.html").read_text()  # one page for the stages, plots embedded
    assert report.count("data:image/png;base64,") >= 2 * len(stages)
    return json.loads((out / "metrics.json").read_text())


def test_image_classification_trains_prunes_and_exports_int8(tmp_path):
    metrics = run_recipe("image_classification", "--smoke", "--prune", 0.5, "--export", "--out", tmp_path)

    written = assert_run_folder(tmp_path, stages=("train", "prune"))
    assert written["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    # 10 classes: chance is 0.1; a few epochs of the small ResNet reach ~0.9.
    assert metrics["dense_test_accuracy"] > 0.5
    assert metrics["test_accuracy"] > 0.5 and metrics["sparsity"] == 0.5
    assert (tmp_path / "data" / "train" / "schema.json").exists()  # trained from TFRecords
    pruning = json.loads((tmp_path / "prune" / "pruning.json").read_text())
    pruned = [row for row in pruning if row.get("target_sparsity")]
    assert len(pruned) >= 5 and all(row["sparsity"] == pytest.approx(0.5, abs=0.01) for row in pruned)
    int8 = next(row for row in metrics["export"] if row["format"] == "tflite_int8")
    assert (tmp_path / "export" / "model_int8.tflite").stat().st_size > 0
    assert int8["verified"] and int8["latency_ms"] > 0
    # Accuracy measured from LiteRT's outputs, close to the Keras model's.
    assert metrics["tflite_int8_accuracy"] == int8["accuracy"] > 0.5
    assert abs(int8["accuracy"] - metrics["test_accuracy"]) < 0.1
    assert "tflite_int8" in (tmp_path / "export" / "report.md").read_text()


def test_image_classification_reads_an_image_folder(tmp_path):
    from PIL import Image

    (x, y), _ = datasets.digits()
    folder = tmp_path / "images"
    for index in range(240):
        label = int(y[index]) % 3  # 3 classes: digit mod 3
        (folder / f"class{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray((x[index, :, :, 0] * 255).astype("uint8")).save(folder / f"class{label}" / f"{index}.png")

    metrics = run_recipe("image_classification", "--smoke", "--data", folder, "--image-size", 16,
                         "--out", tmp_path / "run")

    assert metrics["classes"] == ["class0", "class1", "class2"]
    assert metrics["test_samples"] == 48  # the 2 of 10 shards held out
    assert (tmp_path / "run" / "data" / "images" / "schema.json").exists()
    assert_run_folder(tmp_path / "run")


def test_tabular_regression_beats_predicting_the_mean(tmp_path):
    metrics = run_recipe("tabular", "--smoke", "--task", "regression", "--out", tmp_path)

    assert_run_folder(tmp_path)
    assert metrics["task"] == "regression" and metrics["train_rows"] == 353  # diabetes, 80%
    assert metrics["test_mse"] < 0.9 * metrics["train_mean_mse"]
    assert metrics["test_r2"] > 0.1


def test_tabular_reads_a_csv_with_text_columns(tmp_path):
    rng = np.random.default_rng(0)
    rows = 400
    size = rng.uniform(20, 200, rows)
    city = rng.choice(["north", "south"], rows)
    price = 3 * size + np.where(city == "north", 150, 0) + rng.normal(0, 10, rows)
    csv = tmp_path / "houses.csv"
    csv.write_text("size,city,price\n" + "\n".join(f"{s:.1f},{c},{p:.1f}" for s, c, p in zip(size, city, price, strict=True)))

    metrics = run_recipe("tabular", "--smoke", "--data", csv, "--label", "price", "--out", tmp_path / "run")

    assert metrics["task"] == "regression"  # inferred from a float label with many values
    assert metrics["features"] == 3  # size + city one-hot (north, south)
    assert metrics["test_r2"] > 0.5


def test_text_classification_learns_which_stdlib_package_code_is_from(tmp_path):
    metrics = run_recipe("text_classification", "--smoke", "--out", tmp_path)

    assert_run_folder(tmp_path)
    assert {"asyncio", "email", "json"} <= set(metrics["classes"])
    chance = 1 / len(metrics["classes"])
    assert metrics["majority_class_accuracy"] == pytest.approx(chance, abs=0.02)  # balanced classes
    assert metrics["test_accuracy"] > 1.5 * chance


def test_text_classification_exports_full_integer_int8_that_verifies(tmp_path):
    """The text encoder (attention, layer normalisation, softmax) as full-integer int8 TFLite: verified
    in LiteRT against the float model (the exporter's stated tolerance) and within 5 points of float32."""
    metrics = run_recipe("text_classification", "--smoke", "--prune", "0.5", "--export", "--out", tmp_path)

    rows = {row["format"]: row for row in metrics["export"]}
    int8, float32 = rows["tflite_int8"], rows["tflite_float32"]
    assert int8["verified"] and float32["verified"]
    assert abs(int8["accuracy"] - float32["accuracy"]) <= 0.05
    assert (tmp_path / "export" / "model_int8.tflite").stat().st_size > 0


def test_text_classification_reads_a_csv(tmp_path):
    import pandas as pd

    rng = np.random.default_rng(0)
    words = {"sport": ["goal", "match", "team", "score"], "tech": ["code", "chip", "data", "cloud"]}
    labels = rng.choice(sorted(words), 300)
    texts = [" ".join(rng.choice(words[label], 6)) for label in labels]
    path = tmp_path / "news.parquet"
    pd.DataFrame({"headline": texts, "topic": labels}).to_parquet(path)

    metrics = run_recipe("text_classification", "--smoke", "--data", path, "--text-column", "headline",
                         "--label", "topic", "--out", tmp_path / "run")

    assert metrics["classes"] == ["sport", "tech"] and metrics["test_samples"] == 60
    assert metrics["test_accuracy"] > 0.8


def test_recipe_command_runs_a_recipe(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(recipes.recipe_command, ["tabular", "--smoke", "--out", str(out)])

    assert result.exit_code == 0, result.output
    assert "tabular classification: test accuracy" in result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "classification"
    assert metrics["test_accuracy"] > metrics["majority_class_accuracy"]


def test_recipe_command_passes_help_to_the_recipe_and_names_the_recipes():
    shown = CliRunner().invoke(recipes.recipe_command, ["tabular", "--help"])
    assert shown.exit_code == 0 and "--task" in shown.output and "--prune" in shown.output

    unknown = CliRunner().invoke(recipes.recipe_command, ["resnet"])
    assert unknown.exit_code != 0
    assert "no recipe 'resnet'" in unknown.output and "image_classification" in unknown.output


def test_recipes_refuse_bad_flags_with_a_clear_message(tmp_path):
    import kerasfast

    with pytest.raises(kerasfast.PlanError, match="--image-size >= 32"):
        run_recipe("image_classification", "--smoke", "--model", "mobilenetv3", "--image-size", 16,
                   "--out", tmp_path)
    with pytest.raises(kerasfast.DataError, match="--label 'price' is not a column"):
        csv = tmp_path / "t.csv"
        csv.write_text("a,b\n1,2\n")
        run_recipe("tabular", "--data", csv, "--label", "price", "--out", tmp_path)


@pytest.mark.parametrize("flags, message", [
    (["--prune", "1.5"], "argument --prune: 1.5 is outside [0, 1)"),
    (["--epochs", "0"], "argument --epochs: 0 is below 1"),
    (["--batch-size", "many"], "argument --batch-size: 'many' is not a whole number"),
], ids=["prune", "epochs", "batch size"])
def test_recipe_flags_are_refused_before_anything_is_written(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as refused:
        run_recipe("tabular", "--smoke", *flags, "--out", out)
    assert refused.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_tabular_recipe_runs_as_a_two_worker_job(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-m", "kerasfast.cli", "launch", "-n", "2", "--", sys.executable, "recipes/tabular.py",
         "--smoke", "--strategy", "multi_worker", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = assert_run_folder(out)
    assert metrics["strategy"] == "multi_worker" and metrics["num_replicas"] == 2
    assert metrics["test_accuracy"] > metrics["majority_class_accuracy"]
    # Only the chief printed the summary (and wrote the run folder).
    assert (done.stdout + done.stderr).count("tabular classification: test accuracy") == 1
