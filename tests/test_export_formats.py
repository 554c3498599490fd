"""export_model on a pruned digits convnet: every format written, verified and reported."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter
from sklearn.datasets import load_digits

from kerasfast.compress import prune
from kerasfast.export import FORMATS, export_model

ALL_FORMATS = list(FORMATS)


@pytest.fixture(scope="module")
def digits_split():
    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    y = data.target.astype("int32")
    return (x[:600], y[:600]), (x[1500:1700], y[1500:1700])


def trained_convnet(train, epochs=8):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, activation="relu", name="conv1"),
            keras.layers.Conv2D(32, 3, activation="relu", name="conv2"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(64, activation="relu", name="dense"),
            keras.layers.Dense(10, name="logits"),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(*train, epochs=epochs, batch_size=32, verbose=0)
    return model


@pytest.fixture(scope="module")
def exported(digits_split, tmp_path_factory):
    train, test = digits_split
    model = trained_convnet(train)
    prune(model, train, target_sparsity=0.8, epochs=2, batch_size=32, min_size=200, verbose=0)
    out_dir = tmp_path_factory.mktemp("export") / "digits"
    result = export_model(
        model, out_dir, formats=ALL_FORMATS, representative_data=train[0][:200], eval_data=test
    )
    return model, result, test


def test_every_format_is_written_verified_and_reported(exported):
    model, result, test = exported
    assert [row.format for row in result.rows] == ALL_FORMATS
    names = {p.name for p in result.out_dir.iterdir()}
    assert names == {FORMATS[f].filename for f in ALL_FORMATS} | {"report.json", "report.md", "kerasfast-export.json"}
    for row in result.rows:
        assert row.verified, row
        assert row.size_bytes > 0 and 0 < row.gzip_bytes
        assert row.sparsity == pytest.approx(0.8, abs=0.01)  # conv1 (144 weights) below min_size stays dense
        assert row.accuracy is not None and row.accuracy > 0.8, row
        assert row.loss is not None and np.isfinite(row.loss)
        assert (row.latency_ms is not None) == (FORMATS[row.format].is_tflite or FORMATS[row.format].is_onnx)
    # Accuracy reported for the Keras file equals the model's own.
    keras_accuracy = model.evaluate(*test, verbose=0)[1]
    assert result.row("keras").accuracy == pytest.approx(keras_accuracy, abs=1e-6)
    # Float TFLite matches Keras closely; int8 stays within a point or two.
    assert result.row("tflite_float32").max_abs_diff < 1e-3
    assert abs(result.row("tflite_int8").accuracy - keras_accuracy) <= 0.03


def test_quantised_files_are_smaller_and_pruning_shows_under_gzip(exported):
    _, result, _ = exported
    float32 = result.row("tflite_float32")
    assert result.row("tflite_int8").size_bytes < float32.size_bytes / 2.5
    assert result.row("tflite_dynamic_int8").size_bytes < float32.size_bytes / 2.5
    assert result.row("tflite_float16").size_bytes < float32.size_bytes * 0.7
    # 80% zeros compress: the gzipped float file is much smaller than raw.
    assert float32.gzip_bytes < float32.size_bytes * 0.6


def test_report_files_hold_the_rows(exported):
    _, result, _ = exported
    report = json.loads((result.out_dir / "report.json").read_text())
    assert [a["format"] for a in report["artifacts"]] == ALL_FORMATS
    assert report["eval_samples"] == 200 and report["calibration_samples"] == 200
    assert report["artifacts"][0]["size_bytes"] == result.rows[0].size_bytes
    markdown = (result.out_dir / "report.md").read_text()
    assert "| tflite_int8 | model_int8.tflite |" in markdown
    assert "left in float by Keras int8: conv1, conv2" in markdown


def test_artifacts_run_independently_of_kerasfast(exported):
    model, result, test = exported
    x = test[0][:8]
    expected = model.predict(x, verbose=0)
    loaded = tf.saved_model.load(str(result.path("saved_model")))
    np.testing.assert_allclose(loaded.serve(tf.constant(x)).numpy(), expected, atol=1e-4)
    interpreter = Interpreter(model_path=str(result.path("tflite_int8")))
    interpreter.allocate_tensors()
    (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
    # Builtin int8 ops only: no Flex / custom ops in the file.
    ops = {op["op_name"] for op in interpreter._get_ops_details()}
    assert not any(op.startswith("Flex") or op == "CUSTOM" for op in ops), ops
    interpreter.set_tensor(inp["index"], x[:1])
    interpreter.invoke()
    assert np.argmax(interpreter.get_tensor(out["index"])) == np.argmax(expected[0])


def test_int8_input_output_option(digits_split, tmp_path):
    train, test = digits_split
    model = trained_convnet(train, epochs=3)
    result = export_model(
        model, tmp_path / "int8io", formats=["tflite_int8"], representative_data=train,
        eval_data=test, int8_input_output=True,
    )
    interpreter = Interpreter(model_path=str(result.path("tflite_int8")))
    assert interpreter.get_input_details()[0]["dtype"] == np.int8
    assert interpreter.get_output_details()[0]["dtype"] == np.int8
    assert result.rows[0].verified and result.rows[0].notes == "int8 input/output"
    assert abs(result.rows[0].accuracy - model.evaluate(*test, verbose=0)[1]) <= 0.03


def test_default_formats_and_dataset_inputs(digits_split, tmp_path):
    train, test = digits_split
    model = trained_convnet(train, epochs=1)
    dataset = tf.data.Dataset.from_tensor_slices(train).batch(50)
    result = export_model(model, tmp_path / "defaults", representative_data=dataset, eval_data=dataset.take(2),
                          measure_latency=False)
    assert [r.format for r in result.rows] == [
        "keras", "saved_model", "tflite_float32", "tflite_dynamic_int8", "tflite_float16", "tflite_int8",
    ]
    without_data = export_model(model, tmp_path / "nodata", formats=None)
    assert "tflite_int8" not in [r.format for r in without_data.rows]
    assert all(r.accuracy is None and r.verified for r in without_data.rows)


def test_mixed_bfloat16_model_exports_builtin_tflite_from_a_float32_copy(digits_split, tmp_path):
    train, test = digits_split
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = trained_convnet(train, epochs=2)
    finally:
        keras.config.set_dtype_policy("float32")
    assert model.get_layer("dense").compute_dtype == "bfloat16"
    result = export_model(model, tmp_path / "bf16", formats=["saved_model", "tflite_float32", "tflite_int8"],
                          representative_data=train, eval_data=test, measure_latency=False)
    assert all(row.verified for row in result.rows)
    assert "float32 copy of the mixed_bfloat16 model" in result.row("tflite_int8").notes
    # The float TFLite file scores like the bf16 Keras model it came from.
    assert abs(result.row("tflite_float32").accuracy - model.evaluate(*test, verbose=0)[1]) <= 0.02
