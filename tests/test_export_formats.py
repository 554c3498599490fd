"""export_model on a pruned digits convnet: every format written, verified and reported."""

import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter
from sklearn.datasets import load_digits

from kerasfast.compress import prune
from kerasfast.errors import DataError, ExportError
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
    # What the diff column is measured against, and how far that copy is from the bf16 model, measured.
    copy_diff = float(re.search(r"which differs from the model by up to ([\d.e+-]+)\)",
                                result.row("tflite_float32").notes).group(1))
    assert 1e-4 < copy_diff < 0.5
    # The float TFLite file scores like the bf16 Keras model it came from.
    assert abs(result.row("tflite_float32").accuracy - model.evaluate(*test, verbose=0)[1]) <= 0.02


def string_input_model():
    keras.utils.set_random_seed(0)
    words = keras.Input((1,), dtype="string")
    ids = keras.layers.StringLookup(vocabulary=["cat", "dog"])(words)
    return keras.Model(words, keras.layers.Dense(2)(keras.layers.Embedding(5, 4)(ids)[:, 0]))


def test_string_input_model_exports_and_its_tflite_file_takes_text(tmp_path):
    model = string_input_model()
    words = np.array([["cat"], ["dog"], ["cow"]] * 10, dtype=object)
    result = export_model(model, tmp_path / "text", formats=["keras", "saved_model", "tflite_float32"],
                          representative_data=words, eval_data=(words, np.zeros(30, "int32")), measure_latency=False)
    assert all(row.verified for row in result.rows)
    expected = model.predict(tf.constant(words[:3].astype(str)), verbose=0)
    loaded = tf.saved_model.load(str(result.path("saved_model")))
    np.testing.assert_allclose(loaded.serve(tf.constant(words[:3].astype(str))).numpy(), expected, atol=1e-5)
    interpreter = Interpreter(model_path=str(result.path("tflite_float32")))
    interpreter.resize_tensor_input(interpreter.get_input_details()[0]["index"], [3, 1])
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], words[:3].astype(bytes))
    interpreter.invoke()
    np.testing.assert_allclose(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]), expected,
                               atol=1e-5)
    # Without data it is checked on empty strings (out of vocabulary), said so in the report.
    no_data = export_model(model, tmp_path / "nodata", formats=["keras"], measure_latency=False)
    assert json.loads((no_data.out_dir / "report.json").read_text())["comparison_inputs"] == "empty strings"


def test_string_input_model_refuses_int8_calibration_naming_the_formats_that_work(tmp_path):
    words = np.array([["cat"], ["dog"], ["cow"]] * 10, dtype=object)
    with pytest.raises(ExportError, match=r"The model input is a string tensor, which \['tflite_int8'\] cannot take; "
                       r"export it with formats=\['keras', 'saved_model', "):
        export_model(string_input_model(), tmp_path / "out", formats=["keras", "tflite_int8"],
                     representative_data=words)
    with pytest.raises(DataError, match="eval_data x has dtype float32 but the model input is a string tensor"):
        export_model(string_input_model(), tmp_path / "out", formats=["keras"],
                     eval_data=(np.zeros((3, 1), "float32"), np.zeros(3)))
    assert not (tmp_path / "out").exists()


def test_float16_model_note_names_the_float16_layers(tmp_path):
    inputs = keras.Input((8,), dtype="float16")
    model = keras.Model(inputs, keras.layers.Dense(2, dtype="float16")(inputs))
    x = np.random.default_rng(0).normal(size=(20, 8)).astype("float16")
    result = export_model(model, tmp_path / "f16", formats=["tflite_float32"], representative_data=x,
                          measure_latency=False)
    assert result.rows[0].notes.startswith("converted from a float32 copy of the model (layers computing in float16) "
                                           "(the diff column is against the copy, which differs from the model by up "
                                           "to ")


@pytest.mark.parametrize("wrap", [lambda t: {"probs": t}, lambda t: [t]], ids=["dict", "list"])
def test_single_output_declared_as_a_dict_or_list_exports(tmp_path, wrap):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 4)).astype("float32"), rng.integers(0, 2, 40)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, wrap(keras.layers.Dense(2, activation="softmax")(inputs)))
    model.compile("adam", wrap("sparse_categorical_crossentropy"))
    result = export_model(model, tmp_path / "out", formats=["keras", "saved_model", "tflite_float32"],
                          representative_data=x, eval_data=(x, y), measure_latency=False)
    expected = keras.ops.convert_to_numpy(keras.losses.sparse_categorical_crossentropy(
        y, np.asarray(tf.nest.flatten(model.predict(x, verbose=0))[0]))).mean()
    for row in result.rows:
        assert row.verified and row.loss == pytest.approx(expected, rel=1e-4), row


def test_labels_of_shape_batch_for_an_output_of_one_unit_are_taken_as_fit_and_evaluate_take_them(tmp_path):
    # The loss named by a string was called as a bare function: "target and output must have the same rank".
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")  # shape (64,), against outputs (64, 1)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile("adam", "binary_crossentropy")
    model.fit(x, y, epochs=1, verbose=0)
    expected = model.evaluate(x, y, verbose=0, batch_size=len(x))
    result = export_model(model, tmp_path / "out", formats=["keras", "saved_model"], eval_data=(x, y),
                          measure_latency=False)
    for row in result.rows:
        assert row.verified and row.loss == pytest.approx(expected, rel=1e-4), row


def test_string_model_takes_non_ascii_text_encoded_as_utf8(tmp_path):
    # One string per sample (shape ()), words outside ASCII in the vocabulary and in the data.
    keras.utils.set_random_seed(0)
    words = keras.Input((), dtype="string")
    ids = keras.layers.StringLookup(vocabulary=["cat", "héllo", "日本"])(words)
    model = keras.Model(words, keras.layers.Dense(3)(keras.layers.Embedding(5, 4)(ids)))
    text = np.array(["cat", "héllo", "日本", "x", "emoji 🎉"] * 8, dtype=object)
    result = export_model(model, tmp_path / "utf8", formats=["tflite_float32"], eval_data=(text, np.zeros(40, "int32")))
    assert result.row("tflite_float32").verified and result.row("tflite_float32").latency_ms > 0
    # A fresh interpreter at the file's own input shape ([1]) finds "héllo" in the table, as TensorFlow does.
    interpreter = Interpreter(model_path=str(result.path("tflite_float32")))
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], np.array(["héllo".encode()], dtype=object))
    interpreter.invoke()
    np.testing.assert_allclose(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]),
                               model(tf.constant(["héllo"])).numpy(), atol=1e-5)
    assert not np.allclose(model(tf.constant(["héllo"])).numpy(), model(tf.constant(["x"])).numpy())
