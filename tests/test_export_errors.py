"""Bad export input: a clear error and nothing written; failures are atomic."""

import json
import shutil
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasfast.errors import DataError, ExportError
from kerasfast.export import export_model


def small_model(name="small"):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(hidden), name=name)


class NumpyMean(keras.layers.Layer):
    """Works eagerly but pulls a value out of a tensor with NumPy: untraceable."""

    def call(self, x):
        return x - np.float32(np.asarray(x).mean())

    def compute_output_shape(self, input_shape):
        return input_shape


class Unregistered(keras.layers.Layer):
    def call(self, x):
        return x * 2.0


def model_with(layer):
    inputs = keras.Input((6,))
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(layer(inputs)))


@pytest.fixture(scope="module")
def previous_export_template(tmp_path_factory):
    """A real earlier kerasfast export: model.keras, the reports, the manifest."""
    out_dir = tmp_path_factory.mktemp("previous") / "exported"
    export_model(small_model("previous"), out_dir, formats=["keras"])
    return out_dir


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


_BEFORE = {}


@pytest.fixture
def previous_export(previous_export_template, tmp_path):
    out_dir = tmp_path / "exported"
    shutil.copytree(previous_export_template, out_dir)
    _BEFORE[out_dir] = snapshot(out_dir)
    return out_dir


def assert_untouched(out_dir):
    assert sorted(snapshot(out_dir)) == ["kerasfast-export.json", "model.keras", "report.json", "report.md"]
    assert snapshot(out_dir) == _BEFORE[out_dir]
    leftovers = [p.name for folder in (out_dir, out_dir.parent) for p in folder.iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers


def test_unknown_format_is_refused(previous_export):
    with pytest.raises(ExportError, match=r"Unknown export format\(s\) \['coreml'\]. Known formats: keras, "):
        export_model(small_model(), previous_export, formats=["keras", "coreml"])
    assert_untouched(previous_export)


def test_tflite_int8_without_representative_data_is_refused(previous_export):
    with pytest.raises(ExportError, match=r"\['tflite_int8'\] calibrates activation ranges and needs representative_data"):
        export_model(small_model(), previous_export, formats=["tflite_int8"])
    assert_untouched(previous_export)


@pytest.mark.parametrize(
    "data, message",
    [
        (np.zeros((10, 7), "float32"), r"representative_data samples have shape \(7,\) but the model input is \(6,\)"),
        (np.zeros((10, 2, 3), "float32"), r"samples have shape \(2, 3\)"),
        (np.zeros((10, 6), "int64"), r"representative_data has dtype int64 but the model input is float32"),
        (np.array([["a"] * 6] * 4), r"has dtype <U1 but the model input is float32"),
        (np.zeros((0, 6), "float32"), r"representative_data holds no samples"),
        (tf.data.Dataset.from_tensor_slices(np.zeros((0, 6), "float32")).batch(4), "empty dataset"),
        (np.full((4, 6), np.nan, "float32"), "NaN or infinite"),
    ],
)
def test_bad_representative_data_is_refused(previous_export, data, message):
    with pytest.raises(DataError, match=message):
        export_model(small_model(), previous_export, formats=["tflite_int8"], representative_data=data)
    assert_untouched(previous_export)


def test_bad_eval_data_is_refused(previous_export):
    with pytest.raises(DataError, match="eval_data has 5 inputs but 4 labels"):
        export_model(small_model(), previous_export, formats=["keras"],
                     eval_data=(np.zeros((5, 6), "float32"), np.zeros(4)))
    assert_untouched(previous_export)


@pytest.mark.parametrize("loss, labels, message", [
    ("sparse_categorical_crossentropy", np.eye(3)[[0, 1, 2, 0]], r"labels \(shape \(4, 3\), dtype float64\)"),
    ("sparse_categorical_crossentropy", np.array([0, 1, 2, 3]), r"Received a label value of 3"),
    ("categorical_crossentropy", np.array([0, 1, 2, 0]), r"loss categorical_crossentropy"),
    ("sparse_categorical_crossentropy", np.array(["a", "b", "c", "a"]),
     r"labels have dtype <U1 \(e.g. 'a'\).*integer class ids or one-hot rows"),
], ids=["one-hot for a sparse loss", "a class id beyond the outputs", "class ids for a categorical loss",
        "strings"])
def test_eval_labels_the_loss_cannot_take_are_refused(previous_export, loss, labels, message):
    model = small_model()
    model.compile("sgd", keras.losses.get(loss) if loss == "categorical_crossentropy" else loss)
    with pytest.raises(DataError, match=message) as refused:
        export_model(model, previous_export, formats=["keras"], eval_data=(np.zeros((4, 6), "float32"), labels))
    assert "eval_data's labels" in str(refused.value) and "{{function_node" not in str(refused.value)
    assert_untouched(previous_export)


def test_layer_no_graph_format_supports_is_named(previous_export):
    model = model_with(NumpyMean(name="numpy_mean"))
    with pytest.raises(ExportError, match=r"layer 'numpy_mean' \(NumpyMean\) cannot be traced.*"
                       r"none of the formats \['saved_model', 'tflite_float32'\]"):
        export_model(model, previous_export, formats=["saved_model", "tflite_float32"])
    assert_untouched(previous_export)


def test_unregistered_custom_layer_is_refused_for_keras_format(previous_export):
    model = model_with(Unregistered(name="doubler"))
    with pytest.raises(ExportError, match=r"'keras' format cannot save layers \[\"'doubler' \(Unregistered: not "
                       r"registered\)\"\].*register_keras_serializable"):
        export_model(model, previous_export, formats=["keras", "tflite_float32"])
    assert_untouched(previous_export)


def test_keras_int8_on_a_model_without_dense_layers_is_refused(previous_export):
    inputs = keras.Input((8, 8, 1))
    model = keras.Model(inputs, keras.layers.Conv2D(2, 3, name="only_conv")(inputs))
    with pytest.raises(ExportError, match=r"has none \(layers with weights: \['only_conv'\]\)"):
        export_model(model, previous_export, formats=["saved_model_int8"])
    assert_untouched(previous_export)


def test_unwritable_out_dir_is_refused(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(ExportError, match=rf"out_dir {blocker}/exported cannot be created: {blocker} is a file"):
        export_model(small_model(), blocker / "exported", formats=["keras"])
    with pytest.raises(ExportError, match="exists and is a file"):
        export_model(small_model(), blocker, formats=["keras"])
    assert blocker.read_text() == "not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_unbuilt_or_multi_input_model_is_refused(previous_export):
    with pytest.raises(ExportError, match="not built"):
        export_model(keras.Sequential([keras.layers.Dense(2)]), previous_export, formats=["keras"])
    a, b = keras.Input((2,)), keras.Input((3,))
    two_inputs = keras.Model([a, b], keras.layers.Concatenate()([a, b]))
    with pytest.raises(ExportError, match="2 inputs and 1 outputs"):
        export_model(two_inputs, previous_export, formats=["keras"])
    assert_untouched(previous_export)


def test_op_without_tflite_builtin_fails_naming_the_op_and_keeps_previous_export(previous_export, capfd):
    inputs = keras.Input((6,))
    outputs = keras.layers.Lambda(lambda t: keras.ops.erfinv(keras.ops.tanh(t) * 0.5), name="erfinv_layer")(inputs)
    model = keras.Model(inputs, outputs)
    capfd.readouterr()
    # keras and saved_model succeed in the staging folder first; the TFLite
    # failure must throw all of it away.
    with pytest.raises(ExportError, match=r"not TFLite builtins: \['Erfinv'\] \(in layer\(s\) \['erfinv_layer'\]\)"):
        export_model(model, previous_export, formats=["saved_model", "tflite_float32"])
    assert_untouched(previous_export)
    # The converter's MLIR diagnostics (the same ops, as "'tf.Erfinv' op is neither a custom op nor a flex op")
    # stay in the error's cause: the ExportError is the one account of it.
    assert "neither a custom op nor a flex op" not in capfd.readouterr().err


def test_a_saved_model_moved_by_random_augmentation_layers_is_refused_naming_them(tmp_path):
    # Keras's SavedModel serving function keeps RandomRotation's transform: its outputs moved by up to 0.17.
    rng = np.random.default_rng(0)
    x = (rng.random((64, 16, 16, 3)) * 255).astype("float32")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    hidden = keras.layers.Conv2D(8, 3, activation="relu")(keras.layers.Rescaling(1 / 255)(
        keras.layers.RandomRotation(0.2, name="augment")(inputs)))
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(hidden)))
    with pytest.raises(ExportError, match=r"saved_model: outputs differ .* random augmentation layer\(s\) "
                                          r"\['augment'\].*export the model without them"):
        export_model(model, tmp_path / "out", formats=["saved_model"], representative_data=x,
                     measure_latency=False)
    assert not (tmp_path / "out").exists()


def test_success_replaces_previous_contents(previous_export):
    # A folder holding only an earlier kerasfast export is replaced without overwrite=True.
    result = export_model(small_model(), previous_export, formats=["keras"])
    assert sorted(p.name for p in previous_export.iterdir()) == [
        "kerasfast-export.json", "model.keras", "report.json", "report.md",
    ]
    assert (previous_export / "model.keras").read_bytes() != _BEFORE[previous_export]["model.keras"]
    assert json.loads((previous_export / "report.json").read_text())["model_name"] == "small"
    assert result.out_dir == previous_export
    assert [p.name for folder in (previous_export, previous_export.parent)
            for p in folder.iterdir() if p.name.startswith(".")] == []


def flex_model():
    inputs = keras.Input((4,))
    square = keras.layers.Reshape((2, 2))(inputs)
    inverse = keras.layers.Lambda(lambda t: tf.linalg.inv(t + 3.0 * tf.eye(2)), name="inverse")(square)
    return keras.Model(inputs, keras.layers.Flatten()(inverse))


def test_model_needing_flex_ops_is_refused_naming_them(previous_export):
    with pytest.raises(ExportError, match=r"not TFLite builtins: \['MatrixInverse'\] \(in layer\(s\) \['inverse'\]\).*"
                       "allow_flex_ops=True"):
        export_model(flex_model(), previous_export, formats=["tflite_float32"])
    assert_untouched(previous_export)


def test_tflite_file_failing_at_batch_one_in_a_fresh_interpreter_is_refused(previous_export):
    # The converter writes this graph so that it runs at batch 32 (and at batch 1 after a resize from another
    # batch) but a fresh interpreter at the file's own input shape [1, 1] fails in RESHAPE.
    words = keras.Input((1,), dtype="string")
    ids = keras.layers.StringLookup(vocabulary=["cat", "dog", "bird"])(words)
    flat = keras.layers.Flatten(name="flatten")(keras.layers.Embedding(6, 4)(ids))
    model = keras.Model(words, keras.layers.Dense(3)(flat))
    text = np.array([["cat"], ["dog"], ["x"], ["bird"]] * 10, dtype=object)
    with pytest.raises(ExportError, match=r"tflite_float32: the \.tflite file fails in a fresh LiteRT interpreter "
                       r"at batch 1 \(its input shape \[1, 1\]\) in the RESHAPE op of layer\(s\) \['flatten'\].*"
                       r"keras\.Input\(shape=\(\), dtype=\"string\"\).*'saved_model'"):
        export_model(model, previous_export, formats=["keras", "tflite_float32"],
                     eval_data=(text, np.zeros(40, "int32")), measure_latency=False)
    assert_untouched(previous_export)


def test_flex_ops_when_allowed_are_kept_but_reported_unverified(tmp_path):
    result = export_model(flex_model(), tmp_path / "flex", formats=["tflite_float32"], allow_flex_ops=True)
    (row,) = result.rows
    assert not row.verified and "Flex delegate" in row.notes
    assert result.path("tflite_float32").stat().st_size == row.size_bytes > 0


def test_callable_module_shows_export_models_signature():
    # `kerasfast.export(...)` is a module one calls: help and IDEs must see its real arguments.
    import inspect

    import kerasfast

    assert inspect.signature(kerasfast.export) == inspect.signature(export_model)
    assert "representative_data" in inspect.signature(kerasfast.export).parameters


def token_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,), dtype="int32")
    embedded = keras.layers.Embedding(20, 4, name="tokens")(inputs)
    outputs = keras.layers.Dense(2, name="out")(keras.layers.GlobalAveragePooling1D()(embedded))
    return keras.Model(inputs, outputs)


@pytest.mark.parametrize("argument, bad_id", [("eval_data", 1017), ("eval_data", -3), ("representative_data", 20)])
def test_token_ids_outside_the_embedding_vocabulary_are_refused(previous_export, argument, bad_id):
    ids = np.ones((4, 5), "int32")
    ids[2, 3] = bad_id
    data = {"eval_data": (ids, np.zeros(4, "int32"))} if argument == "eval_data" else {argument: ids}
    with pytest.raises(DataError, match=rf"{argument}( x)? holds token id {bad_id} \(sample 2\) outside the "
                       r"vocabulary of Embedding layer 'tokens' \(input_dim=20: ids 0 to 19\)"):
        export_model(token_model(), previous_export, formats=["tflite_float32"], **data)
    assert_untouched(previous_export)


@pytest.mark.parametrize("arguments", [
    {"num_comparison_samples": 0}, {"num_calibration_samples": 0}, {"num_calibration_samples": 2.5},
    {"num_comparison_samples": True},
], ids=str)
def test_sample_counts_that_are_not_positive_integers_are_refused(previous_export, arguments):
    (argument, value), = arguments.items()
    with pytest.raises(ExportError, match=rf"{argument} must be a positive integer .*got {value!r}"):
        export_model(small_model(), previous_export, formats=["tflite_int8"],
                     representative_data=np.zeros((8, 6), "float32"), **arguments)
    assert_untouched(previous_export)


@pytest.mark.parametrize("as_path", [str, lambda p: p], ids=["str", "Path"])
def test_a_path_given_as_the_model_is_refused_suggesting_load_model(previous_export, as_path):
    saved = as_path(previous_export / "model.keras")
    with pytest.raises(ExportError, match=r"model must be a keras.Model object, not the path '.*model.keras'; "
                       r"load it first: model = keras.models.load_model\("):
        export_model(saved, previous_export, formats=["keras"])
    assert_untouched(previous_export)


def test_out_dir_none_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ExportError, match=r"out_dir must be the path of a folder .*got None"):
        export_model(small_model(), None, formats=["keras"])
    assert list(tmp_path.iterdir()) == []


def test_varying_sample_shapes_across_batches_are_refused(previous_export):
    inputs = keras.Input((None, 4))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(inputs)))
    batches = tf.data.Dataset.from_generator(
        lambda: iter([np.zeros((2, 5, 4), "float32"), np.zeros((2, 7, 4), "float32")]),
        output_signature=tf.TensorSpec((None, None, 4), tf.float32))
    with pytest.raises(DataError, match=r"representative_data's batches hold samples of different shapes "
                       r"\[\(5, 4\), \(7, 4\)\].*padded_batch"):
        export_model(model, previous_export, formats=["tflite_int8"], representative_data=batches)
    assert_untouched(previous_export)


def test_variable_length_input_exports_to_tflite_int8(tmp_path):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, 4))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(inputs)))
    x = np.random.default_rng(0).normal(size=(20, 5, 4)).astype("float32")
    result = export_model(model, tmp_path / "out", formats=["tflite_float32", "tflite_int8"], representative_data=x)
    assert all(row.verified and row.latency_ms > 0 for row in result.rows)


def fitted_small_model():
    model = small_model()
    model.compile("sgd", "sparse_categorical_crossentropy")
    return model


def test_unbatched_datasets_are_read_sample_by_sample(tmp_path):
    x = np.random.default_rng(0).normal(size=(10, 6)).astype("float32")
    y = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    batched = export_model(fitted_small_model(), tmp_path / "batched", formats=["keras"], eval_data=(x, y),
                           representative_data=x)
    unbatched = export_model(fitted_small_model(), tmp_path / "unbatched", formats=["keras"],
                             eval_data=tf.data.Dataset.from_tensor_slices((x, y)),
                             representative_data=tf.data.Dataset.from_tensor_slices(x))
    report = json.loads((unbatched.out_dir / "report.json").read_text())
    assert (report["eval_samples"], report["calibration_samples"]) == (10, 10)
    assert unbatched.rows[0].accuracy == batched.rows[0].accuracy is not None
    assert unbatched.rows[0].loss == pytest.approx(batched.rows[0].loss)


@pytest.mark.parametrize("make", [
    lambda x: x.tolist(), lambda x: list(x), lambda x: [x, np.zeros(len(x))], lambda x: (x, np.zeros(len(x))),
], ids=["list of lists", "list of sample arrays", "[x, y] list", "(x, y) tuple"])
def test_representative_data_as_python_lists_is_read_as_samples(tmp_path, make):
    x = np.random.default_rng(0).normal(size=(10, 6)).astype("float32")
    result = export_model(small_model(), tmp_path / "out", formats=["keras"], representative_data=make(x))
    assert json.loads((result.out_dir / "report.json").read_text())["calibration_samples"] == 10


def _tflite_representative(x):
    def representative_dataset():  # TFLiteConverter's form: a function yielding a list of one batch each
        for index in range(len(x)):
            yield [x[index:index + 1]]

    return representative_dataset


@pytest.mark.parametrize("make", [
    _tflite_representative, lambda x: (sample for sample in x), lambda x: iter([{"inputs": x[:4]}, {"inputs": x[4:]}]),
    lambda x: (x[start:start + 5].tolist() for start in (0, 5)), lambda x: ((x[i], i % 3) for i in range(len(x))),
], ids=["TFLite's representative_dataset function", "a generator of samples", "an iterator of dict batches",
        "a generator of batches as lists of rows", "a generator of (sample, label) pairs"])
def test_representative_data_from_a_generator_or_tflites_function_is_read_as_samples(tmp_path, make):
    x = np.random.default_rng(0).normal(size=(10, 6)).astype("float32")
    result = export_model(small_model(), tmp_path / "out", formats=["keras"], representative_data=make(x))
    assert json.loads((result.out_dir / "report.json").read_text())["calibration_samples"] == 10


def test_representative_data_from_a_function_that_returns_no_samples_is_refused(previous_export):
    with pytest.raises(DataError, match="representative_data is a function that returned int, not samples"):
        export_model(small_model(), previous_export, formats=["tflite_int8"], representative_data=lambda: 3)
    with pytest.raises(DataError, match=r"representative_data is a function of 1 argument\(s\) \(n, ...\); pass one "
                                        r"that takes none"):
        export_model(small_model(), previous_export, formats=["tflite_int8"], representative_data=lambda n: n)

    def failing():  # the generator's own error is its own
        yield np.zeros((1, 6), "float32")
        raise TypeError("the user's own bug")

    with pytest.raises(TypeError, match="the user's own bug"):
        export_model(small_model(), previous_export, formats=["tflite_int8"], representative_data=failing)
    assert_untouched(previous_export)


def test_eval_data_keyed_by_the_models_input_name_is_its_input(tmp_path):
    keras.utils.set_random_seed(0)
    age = keras.Input((3,), name="age")
    model = keras.Model({"age": age}, keras.layers.Dense(2)(age))
    x = np.random.default_rng(0).normal(size=(10, 3)).astype("float32")
    labels = np.argmax(model.predict(x, verbose=0), axis=1)
    result = export_model(model, tmp_path / "out", formats=["keras"], eval_data=({"age": x}, labels))
    assert result.rows[0].accuracy == 1.0


@pytest.mark.parametrize("eval_data, message", [
    (({"a": np.zeros((4, 6), "float32"), "b": np.zeros((4, 6), "float32")}, np.zeros(4)),
     r"eval_data x is a dict of 2 inputs \(a, b\); export takes models of one input"),
    (tf.data.Dataset.from_tensor_slices((np.zeros((4, 6), "float32"), np.zeros(4), np.ones(4))).batch(2),
     r"eval_data dataset yields 3 parts, \(x, y, sample_weight\): export's evaluation does not weight samples"),
], ids=["a dict of two inputs", "a dataset with sample weights"])
def test_eval_data_export_cannot_take_as_given_is_refused(previous_export, eval_data, message):
    with pytest.raises(DataError, match=message):
        export_model(small_model(), previous_export, formats=["keras"], eval_data=eval_data)
    assert_untouched(previous_export)


def trained_two_class_model():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 16)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=5, verbose=0)
    return model, x, y


def test_int8_calibrated_on_too_narrow_inputs_fails_verification_on_eval_data(previous_export):
    # Checked on its own calibration samples this file looked exact; on the
    # real inputs of eval_data its clipped ranges are far off.
    model, x, y = trained_two_class_model()
    with pytest.raises(ExportError, match=r"tflite_int8: no int8 variant is within the verification tolerance"):
        export_model(model, previous_export, formats=["tflite_int8"], representative_data=x[:100] * 0.02,
                     eval_data=(x[100:], y[100:]))
    assert_untouched(previous_export)


def test_without_eval_data_int8_is_verified_on_held_out_representative_samples(tmp_path):
    model, x, _ = trained_two_class_model()
    result = export_model(model, tmp_path / "out", formats=["tflite_float32", "tflite_int8"],
                          representative_data=x[:40], num_calibration_samples=300)
    report = json.loads((result.out_dir / "report.json").read_text())
    assert (report["calibration_samples"], report["comparison_samples"]) == (30, 10)
    assert report["comparison_inputs"] == "representative_data samples held out from calibration"
    # Beyond num_calibration_samples, the next samples are the held-out ones.
    result = export_model(model, tmp_path / "more", formats=["tflite_int8"], representative_data=x,
                          num_calibration_samples=200, num_comparison_samples=50)
    report = json.loads((result.out_dir / "report.json").read_text())
    assert (report["calibration_samples"], report["comparison_samples"]) == (200, 50)
    assert "held out from calibration" in (result.out_dir / "report.md").read_text()


@pytest.mark.parametrize("data, message", [
    (np.zeros((50, 6), "float32"), r"representative_data's 50 samples are all identical \(all zeros\)"),
    (np.ones((20, 6), "float32"), r"representative_data's 20 samples are all identical \(one input repeated\)"),
    (np.ones((1, 6), "float32"), r"representative_data holds 1 sample, which cannot calibrate \['tflite_int8'\]"),
], ids=["zeros", "constant", "one sample"])
def test_degenerate_calibration_data_is_refused(previous_export, data, message):
    with pytest.raises(DataError, match=message):
        export_model(small_model(), previous_export, formats=["tflite_int8"], representative_data=data,
                     eval_data=(np.random.default_rng(0).normal(size=(8, 6)).astype("float32"), np.zeros(8)))
    assert_untouched(previous_export)


@keras.saving.register_keras_serializable(package="kerasfast_tests")
class ForgetfulScale(keras.layers.Layer):
    """Registered, but its get_config() leaves out `factor`: saves, never loads back."""

    def __init__(self, factor, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor

    def get_config(self):
        return super().get_config()  # without `factor`


def lambda_model():
    inputs = keras.Input((6,))
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(keras.layers.Lambda(lambda t: t * 2.0,
                                                                                       name="doubling")(inputs)))


def test_keras_file_that_would_not_load_back_is_refused_naming_the_layer(previous_export):
    with pytest.raises(ExportError, match=r"layer 'doubling' \(Lambda\) holds a Python lambda.*"
                       r"pass unsafe_deserialization=True"):
        export_model(lambda_model(), previous_export, formats=["saved_model", "keras"])
    with pytest.raises(ExportError, match=r"layer 'forgetful' \(ForgetfulScale\) cannot be rebuilt from its config "
                       r"\(ForgetfulScale.__init__\(\) missing 1 required positional argument: 'factor'\)\. "
                       r"Make its get_config\(\) return every argument"):
        export_model(model_with(ForgetfulScale(3.0, name="forgetful")), previous_export,
                     formats=["keras", "tflite_float32"])
    assert_untouched(previous_export)


def test_unsafe_deserialization_exports_and_reloads_a_lambda_model(tmp_path):
    model = lambda_model()
    result = export_model(model, tmp_path / "out", formats=["keras"], unsafe_deserialization=True)
    assert result.rows[0].verified
    x = np.random.default_rng(0).normal(size=(4, 6)).astype("float32")
    restored = keras.saving.load_model(result.path("keras"), safe_mode=False)
    np.testing.assert_allclose(restored.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)


def test_untraceable_layer_error_quotes_the_real_reason_not_in_user_code(previous_export):
    with pytest.raises(ExportError, match=r"layer 'numpy_mean' \(NumpyMean\) cannot be traced.*can export it: "
                       r"Cannot convert a symbolic tf.Tensor .* to a numpy array") as refused:
        export_model(model_with(NumpyMean(name="numpy_mean")), previous_export, formats=["saved_model"])
    assert "in user code" not in str(refused.value)
    assert_untouched(previous_export)


def test_a_name_tensorflow_refuses_as_a_scope_is_named_as_such(previous_export):
    inputs = keras.Input((6,))
    spaced_layer = keras.Model(inputs, keras.layers.Dense(3, name="out layer")(inputs))
    with pytest.raises(ExportError, match=r"The name 'out layer' \(of layer 'out layer' \(Dense\)\) is not a valid "
                       r"TensorFlow scope name.*letters, digits and _ \. / > -.*e\.g\. 'out_layer'") as refused:
        export_model(spaced_layer, previous_export, formats=["saved_model"])
    assert "call()" not in str(refused.value)
    spaced_model = keras.Model(inputs, keras.layers.Dense(3)(inputs), name="my model")
    with pytest.raises(ExportError, match=r"The name 'my model' \(of the model or one of its layers\) is not a valid "
                       r"TensorFlow scope name"):
        export_model(spaced_model, previous_export, formats=["tflite_float32"])
    assert_untouched(previous_export)
    # The failed traces leave no name scope behind: a model built afterwards exports.
    export_model(small_model(), previous_export.parent / "after", formats=["saved_model"])


def test_accuracy_follows_what_the_labels_are():
    from kerasfast.export.evaluation import classification_accuracy

    scores = np.array([[0.9, 0.1, 0.0], [0.1, 0.2, 0.7]], "float32")
    assert classification_accuracy(scores, np.array([0, 1])) == 0.5  # class ids
    assert classification_accuracy(scores, np.eye(3)[[0, 2]]) == 1.0  # one-hot rows
    # Regression targets of the outputs' shape have no accuracy (argmax against argmax gave a number).
    assert classification_accuracy(scores, np.array([[0.3, 1.5, 2.0], [0.1, 0.2, 0.3]])) is None
    # Multi-label 0/1 rows: per-output, at 0.5 (or 0 for logits), not argmax.
    assert classification_accuracy(scores, np.array([[1, 0, 0], [0, 0, 1]])) == 1.0
    assert classification_accuracy(scores, np.array([[1, 1, 0], [0, 0, 1]])) == pytest.approx(5 / 6)
    # One sigmoid output with 0/1 labels: binary accuracy (it was none).
    assert classification_accuracy(np.array([[0.2], [0.7], [0.6]]), np.array([0, 1, 0])) == pytest.approx(2 / 3)
    assert classification_accuracy(np.array([[-1.0], [2.0]]), np.array([0, 1]), from_logits=True) == 1.0
    assert classification_accuracy(np.array([[0.2], [0.7]]), np.array([0.5, 3.0])) is None


def test_class_ids_outside_an_uncompiled_models_outputs_are_refused(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])  # no loss to judge the labels by
    x = np.zeros((16, 4), "float32")
    with pytest.raises(DataError, match=r"eval_data's labels hold class id 1\d at sample 0 \(16 sample\(s\) in all\), "
                                        r"but the model has 3 outputs \(class ids 0\.\.2\)"):
        export_model(model, tmp_path / "out", formats=["tflite_float32"], eval_data=(x, np.arange(16) % 3 + 10))
    assert not (tmp_path / "out").exists()


def test_a_dynamic_int8_file_with_no_weight_quantised_says_so(tmp_path):
    # TFLite leaves weights under 1,024 values in float32: this file was the float32 one, with no note.
    small = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    large = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(3)])
    notes = {name: export_model(model, tmp_path / name, formats=["tflite_dynamic_int8"]).rows[0].notes
             for name, model in (("small", small), ("large", large))}
    assert "no weight was quantised" in notes["small"]
    assert "no weight was quantised" not in notes["large"]


def test_a_sequence_model_of_open_length_with_an_unpadded_convolution_exports(tmp_path):
    # LiteRT sized the open length at 1 when loading the file, too short for a 3-wide convolution: "XNNPack
    # delegate failed to reshape", naming no format; the file is run at the samples' own length.
    model = keras.Sequential([keras.Input((None, 4)), keras.layers.Conv1D(8, 3), keras.layers.GlobalAveragePooling1D(),
                              keras.layers.Dense(3)])
    x = np.random.default_rng(0).random((16, 12, 4)).astype("float32")
    result = export_model(model, tmp_path / "out", formats=["tflite_float32"], eval_data=(x, np.arange(16) % 3))
    assert result.rows[0].verified and result.rows[0].max_abs_diff < 1e-4


def test_the_keras_files_check_does_not_warn_of_an_optimizer_that_never_trained(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile("adam", "mse")  # compiled, never fit: its optimizer has no slots yet
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert export_model(model, tmp_path / "out", formats=["keras"]).rows[0].verified
