"""Full-integer int8 TFLite of transformer blocks passes verification in LiteRT.

A small model (Embedding + MultiHeadAttention + LayerNormalization + Dense)
is trained briefly on generated sequences; the int8 file must verify, and
when full int8 is off, the report must name the layers kept in float.
"""

import json

import keras
import numpy as np
import pytest

import kerasfast
from kerasfast.export import int8_selection
from kerasfast.export.litert import LiteRTModel

VOCAB, LENGTH, WIDTH = 32, 16, 32


def transformer_block(mask_value=None):
    tokens = keras.Input((LENGTH,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, WIDTH, name="embedding")(tokens)
    attended = keras.layers.MultiHeadAttention(2, WIDTH // 2, name="attention")(x, x, use_causal_mask=True)
    x = keras.layers.LayerNormalization(name="norm1")(x + attended)
    hidden = keras.layers.Dense(64, activation="gelu", name="mlp_in")(x)
    x = keras.layers.LayerNormalization(name="norm2")(x + keras.layers.Dense(WIDTH, name="mlp_out")(hidden))
    return keras.Model(tokens, keras.layers.Dense(VOCAB, name="logits")(x))


@pytest.fixture(scope="module")
def trained_block():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    # Next token = token + step (mod VOCAB), the step drawn per sequence: attention must look back.
    start, step = rng.integers(0, VOCAB, (1536, 1)), rng.integers(1, 4, (1536, 1))
    sequences = ((start + step * np.arange(LENGTH + 1)) % VOCAB).astype("int32")
    x, y = sequences[:, :-1], sequences[:, 1:]
    model = transformer_block()
    model.compile(optimizer=keras.optimizers.Adam(3e-3), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[:1280], y[:1280], epochs=4, batch_size=64, verbose=0)
    return model, (x[:1280], y[:1280]), (x[1280:], y[1280:])


def test_full_int8_transformer_block_verifies_in_litert(trained_block, tmp_path):
    model, (x, y), (x_test, y_test) = trained_block
    exported = kerasfast.export(model, tmp_path / "export", formats=("tflite_float32", "tflite_int8"),
                                representative_data=x[:200], eval_data=(x_test, y_test))
    int8 = exported.row("tflite_int8")
    assert int8.verified
    quantization = int8.quantization
    assert quantization["mode"] in ("int8", "int8+float", "16x8")
    if quantization["mode"] != "int8":
        # The report names what stayed float and why.
        assert quantization["kept_in_float"] and all(row["why"] for row in quantization["kept_in_float"])
        assert all(row["layer"] in int8.notes for row in quantization["kept_in_float"])
    # Within the stated tolerance of the float file, in LiteRT.
    float32 = exported.row("tflite_float32")
    assert abs(int8.accuracy - float32.accuracy) <= 0.02, (int8.accuracy, float32.accuracy)
    report = json.loads((tmp_path / "export" / "report.json").read_text())
    row = next(r for r in (report["artifacts"] if isinstance(report, dict) and "artifacts" in report else report)
               if r["format"] == "tflite_int8")
    assert row["quantization"]["mode"] == quantization["mode"]
    # The file really runs int8 kernels: its weights are int8 tensors.
    details = LiteRTModel((tmp_path / "export" / "model_int8.tflite").read_bytes())._interpreter.get_tensor_details()
    assert any(d["dtype"] == np.int8 for d in details)


def test_attention_kept_in_float_when_full_int8_breaks(trained_block, tmp_path):
    """A -1e9 attention mask (as the GPT recipe's) ruins int8 scores; the attention layer goes float."""
    model, (x, _), _ = trained_block
    directory = str(tmp_path / "saved")
    model.export(directory, format="tf_saved_model", verbose=False)
    comparison = x[:32]
    reference = model.predict(comparison, verbose=0)
    names = [layer.name for layer in model._flatten_layers(include_self=False)]
    # A tolerance that full int8 misses, as the GPT's does.
    full = LiteRTModel(int8_selection.convert_saved_model(directory, "int8", representative_inputs=x[:200]))
    full_error = float(np.max(np.abs(full.predict(comparison) - reference)))
    choice = int8_selection.convert_int8_verified(directory, x[:200], comparison, reference, 0.5 * full_error,
                                                  known_layer_names=names, norm_layers=["norm1", "norm2"])
    assert choice.mode in ("int8+float", "16x8")
    assert choice.max_abs_diff <= 0.5 * full_error < choice.full_int8_max_abs_diff
    if choice.mode == "int8+float":
        assert choice.kept and all(row["layer"] in names for row in choice.kept)
        assert "kept in float" in choice.note() and choice.kept[0]["layer"] in choice.note()
    ops = int8_selection.per_op_errors(directory, x[:200], comparison[:4], names)
    layers = int8_selection.layer_errors(ops, ["norm1", "norm2"])
    kinds = {layer["layer"]: layer["why"] for layer in layers}
    assert kinds["attention"].startswith("attention")
    assert kinds["norm1"].startswith("layer normalisation")
    assert kinds["logits"].startswith("the logits layer")
