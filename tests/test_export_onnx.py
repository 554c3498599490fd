"""ONNX export ("onnx", "onnx_int8"): real models trained briefly on digits,
run back in ONNX Runtime; and Keras's own LiteRT export against kerasfast's.

Tolerances stated here (outputs are softmax probabilities, at most 1):
- "onnx": within 1e-5 of Keras, same accuracy as Keras on the test split;
- "onnx_int8": within 0.05 of Keras, accuracy within 2 points of Keras.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

from kerasfast.errors import ExportError
from kerasfast.export import export_model
from kerasfast.export.cli import export_command
from kerasfast.export.litert import LiteRTModel
from kerasfast.export.onnx_export import OnnxModel

pytest.importorskip("onnxruntime")
pytest.importorskip("tf2onnx")


def _dense():
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")], name="dense_mlp")


def _conv():
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                             keras.layers.BatchNormalization(), keras.layers.MaxPooling2D(), keras.layers.Flatten(),
                             keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10, activation="softmax")],
                            name="small_convnet")


@pytest.fixture(scope="module")
def trained(digits):
    (x, y), _ = digits
    models = {}
    for build in (_dense, _conv):
        keras.utils.set_random_seed(0)
        model = build()
        model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
        model.fit(x, y, epochs=12, batch_size=64, verbose=0)
        models[model.name] = model
    return models


@pytest.mark.parametrize("name", ["dense_mlp", "small_convnet"])
def test_onnx_and_onnx_int8_rows_verified_with_accuracy(trained, digits, name, tmp_path):
    (x, _), (x_test, y_test) = digits
    model = trained[name]
    keras_accuracy = float(np.mean(np.argmax(model.predict(x_test, verbose=0), -1) == y_test))
    assert keras_accuracy > 0.85  # trained for real

    result = export_model(model, tmp_path / "out", formats=["keras", "onnx", "onnx_int8"],
                          representative_data=x[:200], eval_data=(x_test, y_test))

    rows = {r.format: r for r in result.rows}
    assert list(rows) == ["keras", "onnx", "onnx_int8"]
    onnx, int8 = rows["onnx"], rows["onnx_int8"]
    assert onnx.verified and int8.verified
    assert onnx.max_abs_diff <= 1e-5
    assert onnx.accuracy == pytest.approx(keras_accuracy, abs=1e-9) == rows["keras"].accuracy
    assert int8.max_abs_diff <= 0.05
    assert abs(int8.accuracy - keras_accuracy) <= 0.02
    assert onnx.loss is not None and int8.loss is not None
    assert onnx.latency_ms > 0 and int8.latency_ms > 0
    assert "static int8" in int8.notes and "200 representative samples" in int8.notes
    assert int8.size_bytes < onnx.size_bytes
    # The files are real ONNX: they run in a fresh ONNX Runtime session.
    for row in (onnx, int8):
        outputs = OnnxModel(result.path(row.format)).predict(x_test[:50])
        assert outputs.shape == (50, 10)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [a["format"] for a in report["artifacts"]] == ["keras", "onnx", "onnx_int8"]
    assert "onnxruntime" in report["latency"]
    assert "ms/sample" in (tmp_path / "out" / "report.md").read_text()


def test_onnx_int8_without_representative_data_is_dynamic(trained, digits, tmp_path):
    _, (x_test, y_test) = digits
    result = export_model(trained["dense_mlp"], tmp_path, formats=["onnx_int8"], eval_data=(x_test, y_test))
    (row,) = result.rows
    assert row.verified and "dynamic int8" in row.notes and row.accuracy > 0.8


def test_mixed_precision_model_exports_from_a_float32_copy(tmp_path):
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = _dense()
    keras.config.set_dtype_policy("float32")
    result = export_model(model, tmp_path, formats=["onnx"])
    assert result.rows[0].verified and "float32 copy" in result.rows[0].notes


def test_op_onnx_cannot_express_is_named(tmp_path):
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(4)(inputs)
    odd = keras.layers.Lambda(lambda t: tf.math.erfinv(tf.clip_by_value(t, -0.5, 0.5)), name="erfinv_layer")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(2)(odd))
    with pytest.raises(ExportError, match=r"ONNX cannot express the TensorFlow op\(s\) \['Erfinv'\] "
                                          r"\(in layer\(s\) \['erfinv_layer'\]\)"):
        export_model(model, tmp_path / "out", formats=["onnx"])
    assert not (tmp_path / "out").exists()  # nothing left behind


def test_cli_accepts_onnx_formats(trained, digits, tmp_path):
    (x, _), (x_test, y_test) = digits
    trained["small_convnet"].save(tmp_path / "model.keras")
    np.save(tmp_path / "rep.npy", x[:100])
    np.savez(tmp_path / "eval.npz", x=x_test, y=y_test)
    done = CliRunner().invoke(export_command, [str(tmp_path / "model.keras"), str(tmp_path / "out"), "--formats",
                                               "onnx,onnx_int8", "--representative", str(tmp_path / "rep.npy"),
                                               "--eval", str(tmp_path / "eval.npz")])
    assert done.exit_code == 0, done.output
    assert "| onnx | model.onnx |" in done.output and "| onnx_int8 | model_int8.onnx |" in done.output
    assert (tmp_path / "out" / "model_int8.onnx").exists()


def _ops(content):
    from ai_edge_litert.interpreter import Interpreter

    return sorted({op["op_name"] for op in Interpreter(model_content=content)._get_ops_details()})


@pytest.mark.parametrize("name", ["dense_mlp", "small_convnet"])
def test_keras_litert_export_matches_kerasfast_converter(trained, digits, name, tmp_path):
    """Keras's model.export(format="litert") and kerasfast's tflite_float32 give the same graph."""
    _, (x_test, _) = digits
    model = trained[name]
    model.export(str(tmp_path / "keras.tflite"), format="litert", verbose=False)
    ours = export_model(model, tmp_path / "out", formats=["tflite_float32"])
    keras_content = (tmp_path / "keras.tflite").read_bytes()
    our_content = ours.path("tflite_float32").read_bytes()
    assert _ops(keras_content) == _ops(our_content)
    assert abs(len(keras_content) - len(our_content)) < 0.01 * len(our_content)
    reference = model.predict(x_test[:100], verbose=0)
    keras_out, our_out = LiteRTModel(keras_content).predict(x_test[:100]), LiteRTModel(our_content).predict(x_test[:100])
    assert np.max(np.abs(keras_out - reference)) < 1e-5 and np.max(np.abs(our_out - reference)) < 1e-5


def test_keras_litert_export_silently_needs_flex_where_kerasfast_names_the_op(tmp_path):
    """Keras's path always allows TensorFlow (Flex) ops: a model with one converts to a file the
    LiteRT interpreter (ai_edge_litert, as on phones) cannot load. kerasfast refuses it, naming the op."""
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(4)(inputs)
    odd = keras.layers.Lambda(lambda t: tf.math.cumprod(t, axis=-1), name="cumprod_layer")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(2)(odd))
    model.export(str(tmp_path / "keras.tflite"), format="litert", verbose=False)  # "succeeds"
    with pytest.raises(ExportError, match="Flex"):
        LiteRTModel((tmp_path / "keras.tflite").read_bytes()).predict(np.ones((2, 4), np.float32))
    with pytest.raises(ExportError, match=r"Cumprod.*cumprod_layer"):
        export_model(model, tmp_path / "out", formats=["tflite_float32"])


def test_recipe_models_round_trip_tabular_with_normalization_and_gpt_with_exact_gelu(tmp_path):
    """The tabular recipe's MLP (Normalization constants, which Keras's own
    ONNX export leaves as unfed inputs) and a small GPT from the GPT recipe
    (exact GELU's Erfc; integer token inputs; static int8 strays on attention,
    so dynamic int8 is used and said): float and int8 run in ONNX Runtime."""
    from kerasfast.recipes import load_recipe

    tabular, gpt = load_recipe("tabular"), load_recipe("gpt")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 12)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("int32")
    keras.utils.set_random_seed(0)
    mlp = tabular.build_mlp(x, y, 2)
    mlp.compile("adam", "sparse_categorical_crossentropy")
    mlp.fit(x, y, epochs=3, verbose=0)
    result = export_model(mlp, tmp_path / "tabular", formats=["onnx", "onnx_int8"], representative_data=x[:200],
                          eval_data=(x[:500], y[:500]))
    rows = {r.format: r for r in result.rows}
    keras_accuracy = float(np.mean(np.argmax(mlp.predict(x[:500], verbose=0), -1) == y[:500]))
    assert rows["onnx"].max_abs_diff <= 1e-5 and rows["onnx"].accuracy == pytest.approx(keras_accuracy)
    assert abs(rows["onnx_int8"].accuracy - keras_accuracy) <= 0.02 and "static int8" in rows["onnx_int8"].notes

    (tokens, targets), (val_tokens, val_targets) = gpt.corpus_arrays(gpt.corpus_files(), 32, max_bytes=32 * 32 * 64)
    keras.utils.set_random_seed(0)
    model = gpt.build_gpt(seq_len=32, layers=1, d_model=32, heads=2)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(tokens.astype("int32"), targets.astype("int32"), epochs=1, batch_size=32, verbose=0)
    result = export_model(model, tmp_path / "gpt", formats=["onnx", "onnx_int8"],
                          representative_data=tokens[:64].astype("int32"),
                          eval_data=(val_tokens[:128].astype("int32"), val_targets[:128].astype("int32")))
    rows = {r.format: r for r in result.rows}
    assert rows["onnx"].verified and rows["onnx"].max_abs_diff <= 1e-4
    int8 = rows["onnx_int8"]
    assert int8.verified and abs(int8.accuracy - rows["onnx"].accuracy) <= 0.01
    assert int8.notes.startswith("onnxruntime dynamic int8") or "static int8" in int8.notes
    logits = OnnxModel(result.path("onnx")).predict(val_tokens[:4].astype("int32"))
    assert logits.shape == (4, 32, gpt.VOCAB_SIZE)
