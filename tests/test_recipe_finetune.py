"""The fine-tuning recipe (recipes/finetune.py) end to end in its smoke size: a keras-hub BERT classifier on raw
strings, pruned and exported to an int8 TFLite file evaluated in LiteRT; the GPT-2 LM with LoRA; a task loaded
from a local preset folder; under two workers; and the one-line message when keras-hub is missing."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from kerasfast import recipes
from tests.test_recipes import assert_run_folder, run_recipe

pytest.importorskip("keras_hub", reason="keras-hub is in the [test] extra (pip install -e '.[test]')")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_classifier_fine_tunes_prunes_and_exports_int8_verified_in_litert(tmp_path):
    metrics = run_recipe("finetune", "--smoke", "--prune", 0.5, "--export", "--out", tmp_path)
    assert_run_folder(tmp_path, stages=("train", "prune"))
    assert metrics["dense_test_accuracy"] > metrics["majority_class_accuracy"] + 0.1
    assert metrics["test_accuracy"] > metrics["majority_class_accuracy"] and metrics["sparsity"] == 0.5
    plan = json.loads((tmp_path / "train" / "plan.json").read_text())
    assert "BertTextClassifierPreprocessor applied once" in (tmp_path / "train" / "result.json").read_text()
    assert plan["fields"]["optimizer"]["value"] == "AdamW"
    int8 = next(row for row in metrics["export"] if row["format"] == "tflite_int8")
    float32 = next(row for row in metrics["export"] if row["format"] == "tflite_float32")
    assert int8["verified"] and (tmp_path / "export" / "model_int8.tflite").stat().st_size < float32["size_bytes"]
    # Accuracy of the int8 file, measured in LiteRT on the tokenised test texts, within a point of the float one.
    assert abs(int8["accuracy"] - float32["accuracy"]) <= 0.01
    assert metrics["tflite_int8_accuracy"] == int8["accuracy"]


def test_the_causal_lm_fine_tunes_with_lora_and_writes_a_sample(tmp_path):
    metrics = run_recipe("finetune", "--smoke", "--task", "lm", "--epochs", 2, "--out", tmp_path)
    assert_run_folder(tmp_path)
    assert metrics["lora_rank"] == 4 and metrics["trainable_parameters"] < metrics["parameters"] / 3
    # Better than a uniform guess over the byte-pair vocabulary (LoRA factors on a random backbone learn little).
    assert 1 < metrics["validation_perplexity"] < 0.75 * metrics["vocabulary_size"]
    assert isinstance(metrics["sample"], str) and metrics["sample"]


def test_a_task_from_a_local_preset_folder_fine_tunes(tmp_path):
    from tests import hub_tasks

    preset = tmp_path / "preset"
    hub_tasks.bert_classifier(sequence_length=32).save_to_preset(str(preset))  # as a cluster holds weights
    metrics = run_recipe("finetune", "--smoke", "--epochs", 1, "--preset", preset, "--out", tmp_path / "run")
    assert metrics["preset"] == str(preset) and 0 <= metrics["test_accuracy"] <= 1


def test_a_missing_keras_hub_is_named_with_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "keras_hub", None)  # as if not installed
    with pytest.raises(SystemExit) as missing:
        recipes.import_optional("keras_hub", extra="hub")
    assert 'pip install -e ".[hub]"' in str(missing.value) and "keras_hub" in str(missing.value)


def test_lm_only_flags_are_refused_before_anything_is_written(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        run_recipe("finetune", "--smoke", "--task", "lm", "--export", "--out", tmp_path / "run")
    assert refused.value.code == 2 and "--task classifier" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_recipe_runs_as_a_two_worker_job(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "kerasfast.cli", "launch", "-n", "2", "--", sys.executable,
         str(ROOT / "recipes" / "finetune.py"), "--smoke", "--epochs", "1", "--strategy", "multi_worker",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_replicas"] == 2 and metrics["strategy"] == "multi_worker"
