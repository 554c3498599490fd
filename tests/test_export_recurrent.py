"""export_model on recurrent models (LSTM, GRU, Bidirectional): builtin-only .tflite files taking batch 1.

Keras's recurrent layers loop over TensorLists that TFLite lowers to builtin
ops only with a fixed batch size; full-integer int8 is calibrated on the
layers unrolled (TFLite's calibrator crashes on the loop). Every file here is
run in the real LiteRT interpreter and compared with Keras's predictions.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter

from kerasfast.errors import ExportError
from kerasfast.export import LiteRTModel, export_model

TFLITE = ["tflite_float32", "tflite_dynamic_int8", "tflite_int8"]
# Largest |tflite - Keras| over the largest |Keras output|, as export_model allows.
TOLERANCE = {"tflite_float32": 1e-3, "tflite_float16": 2e-2, "tflite_dynamic_int8": 0.5, "tflite_int8": 0.5}


def token_data(count=160, length=12, vocabulary=50):
    """Sequences of token ids; class 1 when token 7 occurs."""
    rng = np.random.default_rng(0)
    x = rng.integers(1, vocabulary, size=(count, length)).astype("int32")
    y = (x == 7).any(axis=1).astype("int32")
    return x, y


def series_data(count=160, steps=10, features=3):
    """Noisy series; class 1 when the series trends upwards."""
    rng = np.random.default_rng(1)
    slope = rng.normal(size=(count, 1, 1))
    x = (slope * np.linspace(-1, 1, steps)[None, :, None] + 0.3 * rng.normal(size=(count, steps, features)))
    return x.astype("float32"), (slope[:, 0, 0] > 0).astype("int32")


def trained(layers, data):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(layers)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(*data, epochs=1, batch_size=32, verbose=0)
    return model


def lstm_classifier():
    return trained([keras.Input((12,), dtype="int32"), keras.layers.Embedding(50, 8, name="embedding"),
                    keras.layers.LSTM(16, name="lstm"), keras.layers.Dense(2, name="logits")], token_data())


def run_file(path, x):
    """The file's outputs on `x`, one sample per call, in a bare LiteRT interpreter."""
    interpreter = Interpreter(model_path=str(path))
    (inp,) = interpreter.get_input_details()
    interpreter.resize_tensor_input(inp["index"], [1, *x.shape[1:]])  # a variable sequence length (-1) takes x's
    interpreter.allocate_tensors()
    (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
    outputs = []
    for sample in x:
        interpreter.set_tensor(inp["index"], sample[None].astype(inp["dtype"]))
        interpreter.invoke()
        outputs.append(interpreter.get_tensor(out["index"]))
    ops = {op["op_name"] for op in interpreter._get_ops_details()}
    return np.concatenate(outputs), list(inp["shape_signature"]), ops


def assert_verified_and_close(model, result, x, formats):
    expected = model.predict(x, verbose=0)
    for name in formats:
        row = result.row(name)
        assert row.verified, row
        assert row.max_abs_diff <= TOLERANCE[name] * np.max(np.abs(expected)), row
        assert "input batch 1 (one sample per call)" in row.notes, row.notes
        outputs, shape, ops = run_file(result.path(name), x)
        assert shape == [1, *x.shape[1:]], (name, shape)
        assert not any(op.startswith("Flex") or op == "CUSTOM" for op in ops), (name, ops)
        np.testing.assert_allclose(outputs, expected, atol=TOLERANCE[name] * np.max(np.abs(expected)))


@pytest.fixture(scope="module")
def lstm_export(tmp_path_factory):
    model = lstm_classifier()
    x, y = token_data()
    out_dir = tmp_path_factory.mktemp("recurrent") / "lstm"
    before = model.predict(x[100:], verbose=0)
    result = export_model(model, out_dir, formats=["keras", "saved_model", *TFLITE],
                          representative_data=x[:100], eval_data=(x[100:], y[100:]), num_comparison_samples=24)
    return model, result, (x[100:], y[100:]), before


def test_embedding_lstm_exports_to_builtin_tflite_with_batch_one(lstm_export):
    model, result, (x, y), _ = lstm_export
    assert_verified_and_close(model, result, x[:20], TFLITE)
    ops = run_file(result.path("tflite_float32"), x[:1])[2]
    assert "WHILE" in ops, ops  # the loop kept, as builtin ops
    assert "WHILE" not in run_file(result.path("tflite_int8"), x[:1])[2]  # unrolled for calibration
    assert "unrolled" in result.row("tflite_int8").notes
    # Accuracy on eval_data is computed from each file's own outputs, run one sample at a time.
    keras_accuracy = model.evaluate(x, y, verbose=0)[1]
    assert result.row("tflite_float32").accuracy == pytest.approx(keras_accuracy, abs=1e-6)
    assert abs(result.row("tflite_int8").accuracy - keras_accuracy) <= 0.05
    # SavedModel and .keras keep any batch size, as before.
    assert result.row("saved_model").verified and result.row("keras").verified
    loaded = tf.saved_model.load(str(result.path("saved_model")))
    np.testing.assert_allclose(loaded.serve(tf.constant(x[:5])).numpy(), model.predict(x[:5], verbose=0),
                               atol=1e-4)


def test_report_says_the_files_take_one_sample_per_call(lstm_export):
    _, result, _, _ = lstm_export
    report = json.loads((result.out_dir / "report.json").read_text())
    assert report["tflite_input_batch"] == 1 and "lstm" in report["tflite_input_batch_reason"]
    markdown = (result.out_dir / "report.md").read_text()
    assert "The .tflite files take a fixed batch of 1 (input shape [1, ...], one sample per call)" in markdown
    assert "recurrent layer(s) lstm" in markdown


def test_the_users_model_is_left_as_it_was(lstm_export):
    model, _, (x, _), before = lstm_export
    layer = model.get_layer("lstm")
    assert layer.unroll is False and layer.use_cudnn == "auto"
    np.testing.assert_array_equal(model.predict(x, verbose=0), before)


def test_bidirectional_lstm_and_gru_series_model(tmp_path):
    x, y = series_data()
    model = trained([keras.Input((10, 3)),
                     keras.layers.Bidirectional(keras.layers.LSTM(8, return_sequences=True), name="bidirectional"),
                     keras.layers.GRU(8, name="gru"), keras.layers.Dense(2, name="logits")], (x, y))
    formats = [*TFLITE, "tflite_float16"]
    result = export_model(model, tmp_path / "series", formats=formats, representative_data=x[:100],
                          eval_data=(x[100:], y[100:]), num_comparison_samples=16, measure_latency=True)
    assert_verified_and_close(model, result, x[100:116], formats)
    assert "recurrent layer(s) bidirectional, gru" in result.row("tflite_float32").notes


def test_litert_model_runs_a_batch_one_file_on_any_number_of_samples(lstm_export):
    model, result, (x, _), _ = lstm_export
    runner = LiteRTModel(result.path("tflite_float32").read_bytes())
    assert runner.fixed_batch == 1
    np.testing.assert_allclose(runner.predict(x[:7], batch_size=4), model.predict(x[:7], verbose=0), atol=1e-5)


def test_variable_length_sequences_convert_but_full_int8_is_refused_naming_the_layer(tmp_path):
    x, y = token_data(count=96)
    model = trained([keras.Input((None,), dtype="int32"), keras.layers.Embedding(50, 8),
                     keras.layers.GRU(8, name="gru"), keras.layers.Dense(2)], (x, y))
    result = export_model(model, tmp_path / "float", formats=["tflite_float32"], eval_data=(x, y),
                          measure_latency=False)
    assert result.rows[0].verified
    outputs, shape, _ = run_file(result.path("tflite_float32"), x[:3])
    assert shape == [1, -1]
    np.testing.assert_allclose(outputs, model.predict(x[:3], verbose=0), atol=1e-4)
    with pytest.raises(ExportError, match=r"tflite_int8: recurrent layer\(s\) \['gru'\] run over a variable "
                                          r"number of time steps.*tflite_dynamic_int8"):
        export_model(model, tmp_path / "int8", formats=["tflite_float32", "tflite_int8"], representative_data=x)
    assert not (tmp_path / "int8").exists()


class Smooth(keras.layers.Layer):
    """Exponential smoothing over time with tf.scan: a TensorList loop that is no Keras RNN."""

    def call(self, x):
        steps = tf.transpose(x, [1, 0, 2])
        return tf.transpose(tf.scan(lambda state, step: 0.5 * state + step, steps), [1, 0, 2])


def test_a_tensor_list_loop_outside_keras_rnns_is_retried_with_batch_one(tmp_path):
    x, _ = series_data(count=32)
    model = keras.Sequential([keras.Input((10, 3)), Smooth(name="smooth"), keras.layers.Flatten(),
                              keras.layers.Dense(2)])
    result = export_model(model, tmp_path / "scan", formats=["tflite_float32", "tflite_dynamic_int8"],
                          representative_data=x, measure_latency=False)
    assert_verified_and_close(model, result, x[:8], ["tflite_float32", "tflite_dynamic_int8"])
    assert "smooth loop over TensorLists" in result.row("tflite_float32").notes
    # Full int8 would have TFLite's calibrator crash the process on the loop: refused, named.
    with pytest.raises(ExportError, match=r"tflite_int8: layer\(s\) \['smooth'\] run a while loop"):
        export_model(model, tmp_path / "int8", formats=["tflite_int8"], representative_data=x)


@pytest.mark.parametrize("recurrent", [keras.layers.LSTM, keras.layers.GRU])
def test_lstm_and_gru_models_export_to_onnx_matching_keras(tmp_path, recurrent):
    # TensorFlow's freezing lowers the layer's loop to TensorList ops tf2onnx cannot map; converted with the loop
    # kept (as Keras's own ONNX export does) they become an ONNX LSTM op or a Loop.
    onnx = pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("tf2onnx")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((10, 3)), recurrent(8), keras.layers.Dense(2)])
    x = np.random.default_rng(0).normal(size=(64, 10, 3)).astype("float32")
    result = export_model(model, tmp_path / "onnx", formats=["onnx", "onnx_int8"], representative_data=x,
                          measure_latency=False)
    assert all(row.verified for row in result.rows), result.table()
    assert "static int8" in result.row("onnx_int8").notes
    graph = onnx.load(str(result.path("onnx"))).graph
    assert [i.name for i in graph.input] == ["inputs:0"]
    assert not {node.op_type for node in graph.node} & {"TensorListReserve", "TensorListSetItem", "While"}
    # The file alone, in ONNX Runtime, at batch 1 and batch 7.
    session = onnxruntime.InferenceSession(str(result.path("onnx")), providers=["CPUExecutionProvider"])
    for batch in (x[:1], x[:7]):
        np.testing.assert_allclose(session.run(None, {"inputs:0": batch})[0], model.predict(batch, verbose=0),
                                   atol=1e-5)
