"""The GPT recipe (recipes/gpt.py): its corpus, a smoke training run end to end
(perplexity, sample, tokens/s, MFU, run folder, export) and the same run as a
2-worker job under `kerasfast launch`."""

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "gpt.py"


def load_recipe():
    spec = importlib.util.spec_from_file_location("recipe_gpt", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpt = load_recipe()


def test_corpus_is_next_byte_windows_with_held_out_validation(tmp_path):
    texts = {f"f{i}.txt": bytes(range(32, 127)) * (i + 3) for i in range(6)}
    for name, data in texts.items():
        (tmp_path / name).write_bytes(data)
    files = gpt.corpus_files(str(tmp_path / "*.txt"))
    assert sorted(pathlib.Path(f).name for f in files) == sorted(texts)
    assert gpt.corpus_files(str(tmp_path)) == files  # a folder: every file in it

    (x, y), (x_val, y_val) = gpt.corpus_arrays(files, 16, val_fraction=0.2)
    assert x.dtype == np.uint8 and x.shape[1] == 16 and x.shape == y.shape and x_val.shape[1:] == (16,)
    # Targets are the inputs shifted by one byte, across window boundaries too.
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
    np.testing.assert_array_equal(y[:-1, -1], x[1:, 0])
    total = sum(len(d) + 1 for d in texts.values())  # each file ends with a newline
    assert abs(len(x_val) * 16 - 0.2 * total) <= 2 * 16
    # Validation bytes are the held-out tail, never training bytes.
    stream = np.concatenate([x.ravel(), x_val.ravel()])
    assert len(stream) <= total

    (x_small, _), _ = gpt.corpus_arrays(files, 16, max_bytes=400)
    assert x_small.size <= 400

    stdlib = gpt.corpus_files()
    assert len(stdlib) > 100 and all(f.endswith(".py") and "site-packages" not in f for f in stdlib)


def test_attention_is_one_fused_op_equal_to_the_unfused_causal_attention():
    import keras

    layer = gpt.CausalSelfAttention(heads=4)
    x = np.random.default_rng(0).normal(size=(2, 7, 16)).astype("float32")
    fused = keras.ops.convert_to_numpy(layer(x))

    # The unfused reference in NumPy, from the layer's own weights.
    qkv = x @ keras.ops.convert_to_numpy(layer.qkv.kernel) + keras.ops.convert_to_numpy(layer.qkv.bias)
    q, k, v = (t.reshape(2, 7, 4, 4).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, axis=-1))
    scores = np.where(np.tril(np.ones((7, 7), bool)), q @ k.transpose(0, 1, 3, 2) / 2.0, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    attended = (weights / weights.sum(-1, keepdims=True)) @ v
    reference = attended.transpose(0, 2, 1, 3).reshape(2, 7, 16) @ keras.ops.convert_to_numpy(layer.out.kernel)
    reference += keras.ops.convert_to_numpy(layer.out.bias)
    np.testing.assert_allclose(fused, reference, rtol=1e-5, atol=1e-5)

    # Causal: a later position never changes an earlier one's output.
    changed = x.copy()
    changed[:, 4:] += 1.0
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(changed))[:, :4], fused[:, :4], rtol=1e-5, atol=1e-6)


def test_smoke_run_trains_reports_and_exports(tmp_path):
    out = tmp_path / "run"
    metrics = gpt.main(["--smoke", "--export", "--out", str(out)])

    # Learned something: uniform guessing over bytes is perplexity 256, a
    # unigram byte model of Python source is ~25.
    assert math.isfinite(metrics["val_perplexity"]) and metrics["val_perplexity"] < 25
    assert metrics["val_perplexity"] == pytest.approx(math.exp(metrics["val_loss"]))
    sample = metrics["sample"]
    assert isinstance(sample, str) and sample.startswith("def ") and len(sample.strip()) > len("def")
    assert metrics["tokens_per_s"] > 0
    assert 0 < metrics["mfu"] <= 1 and metrics["peak_flops_per_s"] > 1e9
    assert "measured here" in metrics["peak_flops_source"]
    # The profiler's count and the analytic 6*N*T + attention estimate agree
    # within what the analytic one leaves out (norms, softmax, GELU, adds).
    profiler, analytic = metrics["train_flops_per_sequence_profiler"], metrics["train_flops_per_sequence_analytic"]
    assert analytic <= profiler <= 1.1 * analytic

    written = json.loads((out / "metrics.json").read_text())
    assert written["val_perplexity"] == pytest.approx(metrics["val_perplexity"]) and written["mfu"] == metrics["mfu"]
    plan = {k: v["value"] for k, v in json.loads((out / "train" / "plan.json").read_text())["fields"].items()}
    assert plan["clipnorm"] == 1.0 and plan["lr_schedule"] == "warmup_cosine" and plan["optimizer"] == "AdamW"
    for name in ("curves.png", "throughput.png", "train/history.json", "train/model.keras"):
        assert (out / name).stat().st_size > 0, name
    for split in ("train", "val"):
        assert (out / "data" / split / "schema.json").exists()
        assert list((out / "data" / split).glob("data-*.tfrecord"))
    assert written["train_sequences"] > 10 * written["val_sequences"] > 0

    # Export: what converts for a transformer, each artifact verified.
    report = json.loads((out / "export" / "report.json").read_text())
    formats = {row["format"]: row for row in report["artifacts"]}
    assert {"keras", "saved_model", "tflite_float32", "tflite_dynamic_int8"} <= set(formats)
    assert all(row["verified"] and row["accuracy"] > 0.2 for row in formats.values())
    assert (out / "export" / "model_dynamic_int8.tflite").stat().st_size > 0
    # Full-integer int8 verifies too: the layers int8 breaks stay float, named in the report.
    int8 = formats["tflite_int8"]
    assert int8["verified"] and int8["quantization"]["mode"] in ("int8", "int8+float", "16x8")
    if int8["quantization"]["mode"] == "int8+float":
        kept = int8["quantization"]["kept_in_float"]
        assert kept and all(row["layer"] in int8["notes"] and row["why"] for row in kept)
    # Within a stated tolerance of the float file: 1 point of next-byte accuracy.
    assert abs(int8["accuracy"] - formats["tflite_float32"]["accuracy"]) <= 0.01


@pytest.mark.slow
def test_two_worker_run_under_kerasfast_launch(tmp_path):
    out, scratch = tmp_path / "run", tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT), "TMPDIR": str(scratch)}
    command = [sys.executable, "-m", "kerasfast.cli", "launch", "-n", "2", "--", sys.executable, str(RECIPE),
               "--smoke", "--strategy", "multi_worker", "--corpus-mb", "0.15", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["strategy"] == "multi_worker" and metrics["num_replicas"] == 2
    assert math.isfinite(metrics["val_perplexity"]) and 0 < metrics["mfu"] <= 1
    # Only the chief reports and writes: one run folder, and worker 1's
    # temporary corpus and run folder are gone.
    assert "[worker 0] run folder:" in log and "[worker 1] run folder:" not in log
    assert "[worker 1] corpus:" not in log
    assert sorted(p.name for p in out.iterdir()) == ["curves.png", "data", "metrics.json", "report.html",
                                                    "throughput.png", "train"]
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("kerasfast-")]
