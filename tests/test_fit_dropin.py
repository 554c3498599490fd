"""kerasfast.fit as a drop-in for model.fit: the same weights for every Keras
fit argument, the model given back as Keras would leave it, reproducible
runs, and errors that keep their kind."""

import warnings

import keras
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

import kerasfast
from kerasfast.training.batch_callbacks import learning_rate_callbacks
from tests.helpers import CountsTrainingTraces

# Same batches in the same order, same float32 math through another step
# function: the weights agree to float32 rounding accumulated over the updates.
PARITY_ATOL = 2e-5


def _model(seed=4):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="tanh"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.2), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _data(n=200):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = np.argmax(x[:, :3] + 0.3 * x[:, 3:], axis=1)
    return x, y


def _assert_same_weights(a, b):
    for left, right in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(left, right, atol=PARITY_ATOL)


X, Y = _data()
W = np.linspace(0.2, 2.0, len(X)).astype("float32")
ARGUMENTS = {
    "x_y": dict(x=X, y=Y, batch_size=16, epochs=2),
    "odd_last_batch": dict(x=X, y=Y, batch_size=23, epochs=2),
    "validation_split": dict(x=X, y=Y, batch_size=16, epochs=2, validation_split=0.25),
    "class_weight": dict(x=X, y=Y, batch_size=16, epochs=2, class_weight={0: 1.0, 1: 3.0, 2: 0.5}),
    "sample_weight": dict(x=X, y=Y, batch_size=16, epochs=2, sample_weight=W),
    "initial_epoch": dict(x=X, y=Y, batch_size=16, epochs=3, initial_epoch=1),
    # 3 x 4 steps stay within one pass of 13 batches: past it, Keras's arrays run
    # out mid-epoch (a warning, a short epoch) where kerasfast's stream repeats.
    "steps_per_epoch": dict(x=X, y=Y, batch_size=16, epochs=3, steps_per_epoch=4),
    "validation_freq": dict(x=X, y=Y, batch_size=16, epochs=3, validation_data=(X[:50], Y[:50]), validation_freq=2,
                            validation_batch_size=25, validation_steps=1),
    "pandas": dict(x=pd.DataFrame(X), y=pd.Series(Y), batch_size=16, epochs=2),
    "dataset": dict(x=tf.data.Dataset.from_tensor_slices((X, Y)).batch(16), epochs=2),
}


@pytest.mark.parametrize("name", sorted(ARGUMENTS))
def test_each_keras_fit_argument_gives_the_weights_keras_gives(name):
    arguments = ARGUMENTS[name]
    keras_model, ours = _model(), _model()
    history = keras_model.fit(**arguments, shuffle=False, verbose=0)
    result = kerasfast.fit(ours, **arguments, shuffle=False, precision="float32", run_dir=False, verbose=0)
    _assert_same_weights(keras_model, ours)
    assert int(ours.optimizer.iterations) == int(keras_model.optimizer.iterations)
    assert sorted(result.history.history) == sorted(history.history)
    for key, values in history.history.items():
        np.testing.assert_allclose(result.history.history[key], values, atol=1e-4, err_msg=key)
    assert result.history.epoch == history.epoch


def test_class_weight_multiplies_into_sample_weight():
    """Keras 3.15 refuses the two together; kerasfast multiplies them (as tf.keras did):
    the same weights as Keras trained with their product as sample_weight."""
    class_weight = {0: 1.0, 1: 3.0, 2: 0.5}
    product = W * np.array([class_weight[int(c)] for c in Y], "float32")
    keras_model, ours = _model(), _model()
    keras_model.fit(X, Y, sample_weight=product, batch_size=16, epochs=2, shuffle=False, verbose=0)
    kerasfast.fit(ours, X, Y, sample_weight=W, class_weight=class_weight, batch_size=16, epochs=2, shuffle=False,
                  precision="float32", run_dir=False, verbose=0)
    _assert_same_weights(keras_model, ours)


class _BatchCount(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.train_batches = self.test_batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.train_batches += 1

    def on_test_batch_end(self, batch, logs=None):
        self.test_batches += 1


def test_validation_split_takes_a_string_tensor_as_keras_does():
    # NumPy holds a string tensor's values as objects, which Keras's split refuses ("Invalid dtype: object").
    words = np.array(["good movie", "bad film", "great plot", "awful acting"] * 10)
    labels = np.array([1, 0, 1, 0] * 10, dtype="int32")
    vectorize = keras.layers.TextVectorization(max_tokens=20, output_sequence_length=2)
    vectorize.adapt(words)
    inputs = keras.Input((1,), dtype="string")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(20, 4)(vectorize(inputs)))
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(pooled))
    model.compile("adam", "binary_crossentropy")
    counted = _BatchCount()
    result = kerasfast.fit(model, tf.constant(words[:, None]), labels, epochs=1, batch_size=8, validation_split=0.2,
                           callbacks=[counted], run_dir=False, verbose=0)
    assert counted.train_batches == 4 and counted.test_batches == 1  # 32 rows to train, the last 8 to validate
    assert np.isfinite(result.history.history["val_loss"]).all()


@pytest.mark.parametrize("kind", ["numpy", "numpy objects", "pandas"])
def test_string_arrays_train_and_validate_with_split_or_validation_data(kind):
    # kerasfast trains on NumPy and pandas strings; validating on them failed with Keras's "Invalid dtype: str160"
    # (validation_data) or a DataError (validation_split): Keras's own array handling takes only tf.string.
    import pandas as pd

    words = np.array(["red", "green", "blue", "cyan"])[np.random.default_rng(0).integers(0, 4, 80)]
    labels = (words == "red").astype("float32")
    column = {"numpy": words[:, None], "numpy objects": words[:, None].astype(object),
              "pandas": pd.DataFrame({"colour": words})}[kind]

    def model():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((1,), dtype="string")
        looked_up = keras.layers.StringLookup(vocabulary=["red", "green", "blue", "cyan"], output_mode="one_hot")
        built = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(looked_up(inputs)))
        built.compile(keras.optimizers.SGD(0.1), "binary_crossentropy")
        return built

    for validation in ({"validation_split": 0.25}, {"validation_data": (column, labels)}):
        counted = _BatchCount()
        result = kerasfast.fit(model(), column, labels, epochs=1, batch_size=20, shuffle=False, callbacks=[counted],
                               run_dir=False, verbose=0, **validation)
        assert np.isfinite(result.history.history["val_loss"]).all(), validation
        assert counted.test_batches == (1 if "validation_split" in validation else 4), validation


def test_a_history_among_the_callbacks_is_the_models_history_as_in_keras():
    own = keras.callbacks.History()
    model = _model()
    result = kerasfast.fit(model, X, Y, batch_size=20, epochs=2, callbacks=[own], run_dir=False, verbose=0)
    assert model.history is own and own.model is model
    assert dict(own.history) == dict(result.history.history) and len(own.history["loss"]) == 2


def test_validation_split_is_refused_for_a_dataset_as_keras_refuses_it():
    with pytest.raises(kerasfast.DataError, match="validation_split= only works for arrays"):
        kerasfast.fit(_model(), ARGUMENTS["dataset"]["x"], validation_split=0.2, run_dir=False, verbose=0)


def test_after_kerasfast_the_model_is_plain_keras_again():
    model = _model()
    optimizer = model.optimizer
    kerasfast.fit(model, X, Y, batch_size=20, epochs=3, run_dir=False, verbose=0)
    assert model.optimizer is optimizer and int(optimizer.iterations) == 30
    assert "make_train_function" not in model.__dict__ and model.train_function is None
    # A second kerasfast.fit continues the same optimizer.
    kerasfast.fit(model, X, Y, batch_size=20, epochs=1, run_dir=False, verbose=0)
    assert int(optimizer.iterations) == 40
    # Recompiled with a zero learning rate, Keras's own fit must not move the
    # weights, and must report the true loss.
    model.compile(keras.optimizers.SGD(learning_rate=0.0), "sparse_categorical_crossentropy")
    before = [w.copy() for w in model.get_weights()]
    history = model.fit(X, Y, batch_size=200, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    true_loss = model.evaluate(X, Y, batch_size=200, verbose=0, return_dict=True)["loss"]
    assert abs(history.history["loss"][0] - float(true_loss)) < 1e-4 * float(true_loss)
    assert history.history["loss"][0] > 0.05


def test_a_learning_rate_lowered_by_a_callback_carries_over():
    model = _model()
    lower = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: model.optimizer.learning_rate.assign(0.05))
    kerasfast.fit(model, X, Y, batch_size=20, epochs=1, callbacks=[lower], run_dir=False, verbose=0)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.05)


def test_set_random_seed_makes_runs_repeat_exactly():
    def run():
        keras.utils.set_random_seed(11)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dropout(0.3), keras.layers.Dense(3, activation="softmax")])
        model.compile("adam", "sparse_categorical_crossentropy")
        kerasfast.fit(model, X, Y, batch_size=16, epochs=2, run_dir=False, verbose=0)  # shuffled, seed=None
        return model.get_weights()

    first, second = run(), run()
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_error_from_the_users_own_model_code_keeps_its_type():
    class Broken(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            raise KeyError("my model's own bug")

    model = Broken()
    model.compile("sgd", "mse")
    with pytest.raises(KeyError, match="my model's own bug"):
        kerasfast.fit(model, X, np.zeros((len(X), 3), "float32"), run_dir=False, verbose=0)


def test_a_run_dir_that_cannot_be_a_folder_is_refused_before_training(tmp_path):
    (tmp_path / "afile").write_text("not a folder")
    model = _model()
    with pytest.raises(kerasfast.PlanError, match=r"run_dir=.* cannot be a folder: .*afile is a file"):
        kerasfast.fit(model, X, Y, run_dir=tmp_path / "afile" / "run", verbose=0)
    with pytest.raises(kerasfast.PlanError, match=r"run_dir=3 is not valid"):
        kerasfast.fit(model, X, Y, run_dir=3, verbose=0)
    assert not model.optimizer or int(model.optimizer.iterations.numpy()) == 0


def test_unknown_option_names_the_closest_one():
    with pytest.raises(kerasfast.PlanError, match="did you mean 'precision'"):
        kerasfast.fit(_model(), X, Y, precison="float32", run_dir=False, verbose=0)


def test_user_compile_settings_are_honoured_and_given_back():
    model = _model()
    model.compile(keras.optimizers.SGD(0.2), "sparse_categorical_crossentropy", steps_per_execution=5,
                  jit_compile=True)
    result = kerasfast.fit(model, X, Y, batch_size=20, epochs=1, precision="float32", run_dir=False, verbose=0)
    assert result.plan.steps_per_execution == 5 and "your compile" in result.plan.reasons["steps_per_execution"]
    assert result.plan.jit_compile is True and "your compile" in result.plan.reasons["jit_compile"]
    assert model.steps_per_execution == 5 and model.jit_compile is True


def test_a_custom_train_step_cannot_take_gradient_accumulation():
    class Own(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            return super().train_step(data)

    model = Own()
    model.compile("sgd", "mse")
    with pytest.raises(kerasfast.PlanError, match="grad_accum_steps= needs kerasfast's own train step"):
        kerasfast.fit(model, X, np.zeros((len(X), 3), "float32"), grad_accum_steps=2, run_dir=False, verbose=0)
    # Without it, the model's own step runs.
    result = kerasfast.fit(model, X, np.zeros((len(X), 3), "float32"), run_dir=False, verbose=0)
    assert result.plan.train_step == "yours" and "Own.train_step" in result.plan.reasons["train_step"]


def test_data_of_unknown_length_shorter_than_one_execution_keeps_its_logs_and_updates():
    """An epoch of 13 batches of unknown length inside one execution of 16 steps: the
    History holds its loss (not {}), and the optimizer counts the 13 updates made,
    as Keras's own multi-step loop does (Keras's one-step function counts one more
    when the data ends: docs/fit.md)."""
    unknown = tf.data.Dataset.from_tensor_slices((X, Y)).filter(lambda x, y: True).batch(16)
    keras_model, ours = _model(), _model()
    keras_model.compile(keras.optimizers.Adam(0.05), "sparse_categorical_crossentropy", metrics=["accuracy"],
                        steps_per_execution=4)
    ours.compile(keras.optimizers.Adam(0.05), "sparse_categorical_crossentropy", metrics=["accuracy"])
    history = keras_model.fit(unknown, epochs=2, verbose=0)
    result = kerasfast.fit(ours, unknown, epochs=2, steps_per_execution=16, precision="float32", run_dir=False,
                           verbose=0)
    assert int(ours.optimizer.iterations) == int(keras_model.optimizer.iterations) == 26
    assert sorted(result.history.history) == sorted(history.history)
    for key, values in history.history.items():
        np.testing.assert_allclose(result.history.history[key], values, atol=1e-4, err_msg=key)
    _assert_same_weights(keras_model, ours)
    # A generator (one pass) shorter than the automatic execution.
    generator = ((X[i:i + 16], Y[i:i + 16]) for i in range(0, len(X), 16))
    result = kerasfast.fit(_model(), generator, epochs=1, precision="float32", run_dir=False, verbose=0)
    assert len(result.history.history["loss"]) == 1


def _sparse_model():
    keras.utils.set_random_seed(4)
    inputs = keras.Input((6,), sparse=True)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(inputs))
    model.compile(keras.optimizers.SGD(0.2), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_sparse_and_ragged_inputs_train_as_keras_trains_them():
    """tf.SparseTensor and SciPy sparse x (Keras takes both as arrays), a dataset of
    sparse batches, and a tf.RaggedTensor x for a model that reads it."""
    import scipy.sparse

    dense = np.where(np.abs(X) > 0.8, X, 0.0).astype("float32")
    cases = {"tf.SparseTensor": dict(x=tf.sparse.from_dense(dense), y=Y, batch_size=16),
             "scipy": dict(x=scipy.sparse.csr_matrix(dense), y=Y, batch_size=16, validation_split=0.25),
             "dataset": dict(x=tf.data.Dataset.from_tensor_slices((tf.sparse.from_dense(dense), Y)).batch(16))}
    for name, arguments in cases.items():
        keras_model, ours = _sparse_model(), _sparse_model()
        history = keras_model.fit(**arguments, epochs=2, shuffle=False, verbose=0)
        result = kerasfast.fit(ours, **arguments, epochs=2, shuffle=False, precision="float32", run_dir=False,
                               verbose=0)
        _assert_same_weights(keras_model, ours)
        for key, values in history.history.items():
            np.testing.assert_allclose(result.history.history[key], values, atol=1e-4, err_msg=f"{name} {key}")

    tokens = tf.ragged.constant([[1, 2, 3, 4][: i % 4 + 1] for i in range(len(Y))])

    def ragged_model():
        keras.utils.set_random_seed(4)
        model = keras.Sequential([keras.layers.Embedding(5, 4), keras.layers.GlobalAveragePooling1D(),
                                  keras.layers.Dense(3, activation="softmax")])
        model.compile(keras.optimizers.SGD(0.2), "sparse_categorical_crossentropy")
        return model

    keras_model, ours = ragged_model(), ragged_model()
    keras_model.fit(tokens, Y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    kerasfast.fit(ours, tokens, Y, batch_size=16, epochs=2, shuffle=False, precision="float32", run_dir=False,
                  verbose=0)
    _assert_same_weights(keras_model, ours)


def test_a_callback_that_stops_training_leaves_stop_training_set_as_keras_does(tmp_path):
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)
    keras_model, ours = _model(), _model()
    history = keras_model.fit(X, Y, batch_size=20, epochs=5, shuffle=False, callbacks=[stop], verbose=0)
    result = kerasfast.fit(ours, X, Y, batch_size=20, epochs=5, shuffle=False, callbacks=[stop],
                           precision="float32", run_dir=False, verbose=0)
    assert keras_model.stop_training is True and ours.stop_training is True
    assert result.history.epoch == history.epoch == [0, 1]

    # A run resumed inside an epoch trains in two Keras fits (the rest of that epoch, then the
    # others): a callback stopping the first must not be undone by the second.
    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if self.model.optimizer.iterations.numpy() == 13:  # epoch 1 (10 steps each), step 3
                raise RuntimeError("crash")

    class StopAfterEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = epoch == 1

    common = dict(batch_size=20, epochs=4, backup_dir=tmp_path, backup_every=2, run_dir=False, verbose=0)
    with pytest.raises(RuntimeError, match="crash"):
        kerasfast.fit(_model(), X, Y, callbacks=[Crash()], **common)
    model = _model()
    result = kerasfast.fit(model, X, Y, callbacks=[StopAfterEpoch()], **common)
    assert result.history.epoch == [0, 1] and int(model.optimizer.iterations) == 20


@pytest.mark.parametrize("hook, steps_per_execution", [("on_train_begin", None), ("on_epoch_begin", None),
                                                        ("on_epoch_begin", 4)])
def test_a_stop_asked_for_before_a_batch_ends_the_run_after_one_execution_as_model_fit_does(hook,
                                                                                            steps_per_execution):
    class StopBeforeABatch(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            if hook == "on_train_begin":
                self.model.stop_training = True

        def on_epoch_begin(self, epoch, logs=None):
            if hook == "on_epoch_begin" and epoch == 1:
                self.model.stop_training = True

    updates = {}
    for fit in ("keras", "kerasfast"):
        model = _model()
        if steps_per_execution:  # the user's count: model.fit runs the whole execution before it stops
            model.compile(model.optimizer, model.loss, steps_per_execution=steps_per_execution)
        options = dict(batch_size=20, epochs=3, shuffle=False, callbacks=[StopBeforeABatch()], verbose=0)
        model.fit(X, Y, **options) if fit == "keras" else kerasfast.fit(model, X, Y, tune="off", run_dir=False,
                                                                       **options)
        updates[fit] = int(model.optimizer.iterations)
    # Without per-batch hooks kerasfast runs a whole epoch per execution; the stop is seen before it.
    assert updates["kerasfast"] == updates["keras"] == {"on_train_begin": 1, "on_epoch_begin": 11}[hook] + (
        steps_per_execution - 1 if steps_per_execution else 0)


def test_a_layer_kept_float32_in_a_mixed_precision_model_stays_float32():
    """A model built under mixed_bfloat16 with a hidden layer pinned to float32 trains
    under precision='mixed_bfloat16' exactly as Keras trains it: the pinned layer is not
    switched to bfloat16."""
    def build():
        keras.utils.set_random_seed(4)
        keras.config.set_dtype_policy("mixed_bfloat16")
        try:
            inputs = keras.Input((6,))
            hidden = keras.layers.Dense(12, activation="tanh")(inputs)
            hidden = keras.layers.Dense(12, activation="tanh", dtype="float32", name="pinned")(hidden)
            outputs = keras.layers.Dense(3, activation="softmax", dtype="float32")(hidden)
            model = keras.Model(inputs, outputs)
        finally:
            keras.config.set_dtype_policy("float32")
        model.compile(keras.optimizers.SGD(0.2), "sparse_categorical_crossentropy")
        return model

    keras_model, ours = build(), build()
    keras_model.fit(X, Y, batch_size=20, epochs=2, shuffle=False, verbose=0)
    kerasfast.fit(ours, X, Y, batch_size=20, epochs=2, shuffle=False, precision="mixed_bfloat16", jit_compile=False,
                  run_dir=False, verbose=0)
    _assert_same_weights(keras_model, ours)
    assert ours.get_layer("pinned").compute_dtype == "float32" and ours.layers[1].compute_dtype == "bfloat16"


def test_model_history_is_the_returned_history_as_in_keras():
    model = _model()
    result = kerasfast.fit(model, X, Y, batch_size=20, epochs=2, run_dir=False, verbose=0)
    assert isinstance(model.history, keras.callbacks.History)  # as Keras leaves it, holding the returned metrics
    assert model.history.history is result.history and len(model.history.history["loss"]) == 2
    assert model.history.epoch == result.history.epoch == [0, 1]


def test_arguments_keras_takes_loosely_work_and_string_labels_are_refused_clearly():
    # A single callback (not in a list) and NumPy integer counts, as Keras takes them.
    seen = []
    callback = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(epoch))
    keras_model, ours = _model(), _model()
    keras_model.fit(X, Y, batch_size=np.int64(20), epochs=np.int64(2), shuffle=False, verbose=0)
    result = kerasfast.fit(ours, X, Y, batch_size=np.int64(20), epochs=np.int64(2), shuffle=False,
                           callbacks=callback, precision="float32", run_dir=False, verbose=0)
    _assert_same_weights(keras_model, ours)
    assert seen == [0, 1] and result.plan.global_batch_size == 20
    with pytest.raises(kerasfast.DataError, match="x is None"):
        kerasfast.fit(_model(), None, Y, run_dir=False, verbose=0)
    with pytest.raises(kerasfast.DataError, match="y holds strings"):
        kerasfast.fit(_model(), X, np.array(["a", "b", "c"])[Y], run_dir=False, verbose=0)


@pytest.mark.parametrize("steps", [4, 12])
def test_a_longer_execution_compiles_the_train_step_once(steps):
    """An execution of several steps compiles one copy of the step, in its loop,
    as one of a single step does: a second copy doubled MobileNetV3-Small's
    compilation. 12 is a whole epoch of 12 batches in one execution."""
    traces = {}
    for count in (1, steps):
        keras.utils.set_random_seed(4)
        model = keras.Sequential([keras.Input((6,)), CountsTrainingTraces()])
        model.compile(keras.optimizers.SGD(0.2), "sparse_categorical_crossentropy", metrics=["accuracy"])
        CountsTrainingTraces.traces = 0
        kerasfast.fit(model, X[:192], Y[:192], batch_size=16, epochs=2, steps_per_execution=count, precision="float32",
                      jit_compile=False, tune="off", run_dir=False, verbose=0)
        traces[count] = CountsTrainingTraces.traces
    assert traces[1] >= 1
    assert traces[steps] == traces[1], traces


class SoftmaxModel(keras.Model):
    """Dense(3, softmax) as a subclassed model, for the two below."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3, activation="softmax")

    def call(self, x):
        return self.dense(x)


class LogsItsOwnValues(SoftmaxModel):
    """A train_step that returns a raw value, not a metric: the number of updates."""

    def train_step(self, data):
        logs = super().train_step(data)
        return {**logs, "updates": keras.ops.cast(self.optimizer.iterations, "float32")}


class ComputesItsOwnMetrics(SoftmaxModel):
    """A model whose compute_metrics adds a value of its own to Keras's."""

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        logs = super().compute_metrics(x, y, y_pred, sample_weight)
        return {**logs, "updates": keras.ops.cast(self.optimizer.iterations, "float32")}


@pytest.mark.parametrize("model_class", [LogsItsOwnValues, ComputesItsOwnMetrics])
def test_logs_a_step_returns_itself_come_from_the_last_step_of_each_execution(model_class):
    """Keras's History keeps the last step's own logs for each epoch; with 4 steps
    per execution (one compiled block in a loop) they are still the last step's."""
    histories = []
    for keras_fit in (True, False):
        keras.utils.set_random_seed(4)
        model = model_class()
        if keras_fit:
            model.compile(keras.optimizers.SGD(0.2), "sparse_categorical_crossentropy", metrics=["accuracy"],
                          steps_per_execution=4)
            histories.append(model.fit(X[:192], Y[:192], batch_size=16, epochs=2, shuffle=False, verbose=0).history)
        else:
            model.compile(keras.optimizers.SGD(0.2), "sparse_categorical_crossentropy", metrics=["accuracy"])
            result = kerasfast.fit(model, X[:192], Y[:192], batch_size=16, epochs=2, shuffle=False,
                                   steps_per_execution=4, precision="float32", run_dir=False, verbose=0)
            assert result.plan.steps_per_execution == 4
            histories.append(result.history.history)
    keras_history, ours = histories
    assert keras_history["updates"] == [12.0, 24.0]  # the steps of each epoch, 12 batches of 16
    assert sorted(ours) == sorted(keras_history)
    for key, values in keras_history.items():
        np.testing.assert_allclose(ours[key], values, atol=1e-4, err_msg=key)


def test_named_inputs_of_different_lengths_are_named_in_the_error():
    """Keras refuses inputs whose sample counts disagree; so does kerasfast, naming each array,
    also when the disagreement is between two inputs of x (not only between x and y)."""
    keras.utils.set_random_seed(4)
    a, b = keras.Input((6,), name="a"), keras.Input((2,), name="b")
    model = keras.Model({"a": a, "b": b},
                        keras.layers.Dense(3, activation="softmax")(keras.layers.Concatenate()([a, b])))
    model.compile("sgd", "sparse_categorical_crossentropy")
    x = {"a": X, "b": X[:150, :2]}
    with pytest.raises(ValueError):
        model.fit(x, Y[:150], verbose=0)
    with pytest.raises(kerasfast.DataError, match=r"x\['a'\] has 200 rows, x\['b'\] has 150 rows, y has 150 rows"):
        kerasfast.fit(model, x, Y[:150], run_dir=False, verbose=0)


def _looping_batches(x, y, batch_size, limit=None):
    yielded = 0
    while limit is None or yielded < limit:
        for start in range(0, len(x), batch_size):
            if limit is not None and yielded == limit:
                return
            yielded += 1
            yield x[start:start + batch_size], y[start:start + batch_size]


def test_a_looping_validation_generator_with_validation_steps_validates_as_keras_does_without_a_warning():
    arguments = dict(x=X, y=Y, batch_size=16, epochs=3, shuffle=False, verbose=0, validation_steps=2)
    keras_model, ours = _model(), _model()
    history = keras_model.fit(**arguments, validation_data=_looping_batches(X[:50], Y[:50], 25))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = kerasfast.fit(ours, **arguments, validation_data=_looping_batches(X[:50], Y[:50], 25),
                               precision="float32", run_dir=False)
    assert not [w for w in seen if "ran out of data" in str(w.message)]  # unknown-length data made Keras warn after each one
    assert len(result.history.history["val_loss"]) == 3
    np.testing.assert_allclose(result.history.history["val_loss"], history.history["val_loss"], atol=1e-4)


def test_validation_data_shorter_than_validation_steps_is_named():
    with pytest.raises(kerasfast.DataError, match=r"validation_steps=3, but validation_data yielded only 2 "):
        kerasfast.fit(_model(), X, Y, batch_size=16, epochs=1, validation_steps=3, run_dir=False, verbose=0,
                      validation_data=_looping_batches(X[:50], Y[:50], 25, limit=2))


@pytest.mark.parametrize("make_callback, calls_per_step", [
    (lambda seen: keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(batch)), 1),
    (lambda seen: keras.callbacks.LambdaCallback(on_batch_end=lambda batch, logs: seen.append(batch)), 1),
    (lambda seen: keras.callbacks.TensorBoard(seen.dir, update_freq=1), 0),
])
def test_keras_callbacks_acting_on_every_batch_see_every_batch(make_callback, calls_per_step, tmp_path):
    seen = type("Seen", (list,), {})()
    seen.dir = str(tmp_path)
    callback = make_callback(seen)
    result = kerasfast.fit(_model(), X, Y, batch_size=16, epochs=2, callbacks=[callback], run_dir=False, verbose=0)
    assert result.plan.steps_per_execution == 1
    assert type(callback).__name__ in result.plan.reasons["steps_per_execution"]
    assert len(seen) == calls_per_step * 2 * 13  # 2 epochs of 13 batches, as in Keras
    if isinstance(callback, keras.callbacks.TensorBoard):
        assert callback._global_train_batch == 2 * 13


def test_keras_callbacks_acting_per_epoch_keep_longer_executions(tmp_path):
    callbacks = [keras.callbacks.TensorBoard(str(tmp_path)), keras.callbacks.EarlyStopping(monitor="loss"),
                 keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None)]
    result = kerasfast.fit(_model(), X, Y, batch_size=16, epochs=1, callbacks=callbacks, run_dir=False, verbose=0)
    assert result.plan.steps_per_execution > 1


def test_tuning_keeps_one_step_per_execution_for_a_per_batch_callback(tmp_path, monkeypatch):
    monkeypatch.setenv("KERASFAST_CACHE_DIR", str(tmp_path))
    untouched = kerasfast.fit(_model(), X, Y, batch_size=16, epochs=1, tune_budget_s=5, run_dir=False, verbose=0)
    assert untouched.plan.tuning and untouched.plan.steps_per_execution > 1  # tuned and cached, no callback
    seen = []
    callback = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(batch))
    result = kerasfast.fit(_model(), X, Y, batch_size=16, epochs=1, tune_budget_s=5, callbacks=[callback],
                           run_dir=False, verbose=0)
    assert result.plan.steps_per_execution == 1 and len(seen) == 13


def test_a_model_created_in_a_strategy_scope_trains_under_that_strategy_as_in_keras():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        keras_model, ours = _model(), _model()
    keras_model.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    result = kerasfast.fit(ours, X, Y, batch_size=16, epochs=2, shuffle=False, precision="float32", run_dir=False,
                           verbose=0)
    assert result.plan.strategy == "MirroredStrategy"
    assert ours.distribute_strategy is strategy
    _assert_same_weights(keras_model, ours)


class _HalvingSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule of the user's own without get_config(), as keras.io's often are."""

    def __call__(self, step):
        return 0.2 * 0.5 ** (keras.ops.cast(step, "float32") / 10.0)


def test_a_schedule_without_get_config_survives_the_rebuild_for_a_strategy():
    model = _model()
    schedule = _HalvingSchedule()
    model.compile(keras.optimizers.SGD(schedule), "sparse_categorical_crossentropy")
    before = [w.copy() for w in model.get_weights()]
    result = kerasfast.fit(model, X, Y, batch_size=16, epochs=1, strategy=tf.distribute.MirroredStrategy(["/cpu:0"]),
                           run_dir=False, verbose=0)
    assert "rebuilt" in result.model_preparation
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
    assert model.optimizer._learning_rate is schedule and int(model.optimizer.iterations) == 13


def test_a_model_rebuilt_for_a_strategy_keeps_the_users_compile_settings():
    model = _model()  # SGD(0.2), accuracy
    result = kerasfast.fit(model, X, Y, batch_size=16, epochs=1, strategy=tf.distribute.MirroredStrategy(["/cpu:0"]),
                           run_dir=False, verbose=0)
    assert "rebuilt" in result.model_preparation
    assert "accuracy" in result.history.history
    assert "your optimizer" in result.plan.reasons["learning_rate"]
    assert isinstance(model.optimizer, keras.optimizers.SGD) and int(model.optimizer.iterations) == 13
    assert float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)) == pytest.approx(0.2)


def test_a_model_keras_cannot_save_keeps_its_run_and_its_weights(tmp_path):
    model = _model()
    model.compile(keras.optimizers.SGD(_HalvingSchedule()), "sparse_categorical_crossentropy")
    with pytest.warns(kerasfast.RunFolderWarning,
                      match=r"model.keras \(Keras cannot save the model: NotImplementedError: .*_HalvingSchedule"):
        result = kerasfast.fit(model, X, Y, batch_size=16, epochs=1, run_dir=tmp_path, verbose=0)
    files = sorted(path.name for path in tmp_path.iterdir())
    assert "model.keras" not in files and "history.json" in files
    assert not [name for name in files if name.startswith(".tmp")]  # nothing half-written left
    restored = _model()
    restored.load_weights(tmp_path / "model.weights.h5")
    _assert_same_weights(restored, result.model)


def test_labels_out_of_the_outputs_range_are_named():
    labels = Y.copy()
    labels[[7, 40]] = 3  # the model has 3 classes: 0..2
    with pytest.raises(kerasfast.DataError, match=r"y holds label 3 at sample 7 \(2 sample\(s\) in all.*0\.\.2"):
        kerasfast.fit(_model(), X, labels, batch_size=16, epochs=1, run_dir=False, verbose=0)
    batches = tf.data.Dataset.from_tensor_slices((X, labels)).batch(16)
    with pytest.raises(kerasfast.DataError, match=r"the data holds label 3, .* 3 classes"):
        kerasfast.fit(_model(), batches, epochs=1, run_dir=False, verbose=0)


class GuideCustomStep(keras.Model):
    """keras.io guide "Customizing what happens in fit()" (TensorFlow), with
    sample weights: its logs nest the compiled metrics' dict under
    "compile_metrics", as `{m.name: m.result() for m in self.metrics}` gives."""

    def train_step(self, data):
        if len(data) == 3:
            x, y, sample_weight = data
        else:
            sample_weight = None
            x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred, sample_weight=sample_weight)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply(gradients, trainable_vars)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred, sample_weight=sample_weight)
        return {m.name: m.result() for m in self.metrics}


@pytest.mark.parametrize("weighted", [False, True])
def test_a_custom_step_returning_nested_logs_trains_as_keras_does(weighted):
    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input(shape=(6,))
        model = GuideCustomStep(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
        return model

    target = X[:, :1] * 0.5
    arguments = dict(x=X, y=target, batch_size=16, epochs=2, shuffle=False, verbose=0,
                     sample_weight=W if weighted else None)
    keras_model, ours = build(), build()
    history = keras_model.fit(**arguments)
    result = kerasfast.fit(ours, **arguments, precision="float32", run_dir=False)
    assert result.plan.steps_per_execution > 1  # the looped execution carries the nested logs
    _assert_same_weights(keras_model, ours)
    assert sorted(result.history.history) == sorted(history.history) == ["loss", "mae"]


def test_the_result_reads_like_the_history_model_fit_returns():
    """`history = model.fit(...)` swapped for `history = kerasfast.fit(...)`:
    the lines that read it keep working."""
    keras_model, ours = _model(), _model()
    expected = keras_model.fit(X, Y, batch_size=16, epochs=2, validation_split=0.2, shuffle=False, verbose=0)
    history = kerasfast.fit(ours, X, Y, batch_size=16, epochs=2, validation_split=0.2, shuffle=False,
                            precision="float32", run_dir=False, verbose=0)
    assert sorted(history.history.keys()) == sorted(expected.history.keys())
    np.testing.assert_allclose(history.history["val_loss"], expected.history["val_loss"], atol=1e-4)
    assert "loss" in history.history and len(history.history) == len(expected.history)
    assert history.epoch == expected.epoch == [0, 1]
    assert history.params["epochs"] == expected.params["epochs"] == 2
    frame = pd.DataFrame(history.history)
    assert sorted(frame.columns) == sorted(expected.history) and len(frame) == 2
    assert ours.history.history is history.history  # model.history holds the same metrics


def test_kerass_fit_arguments_can_be_passed_by_position_as_to_model_fit():
    keras_model, ours = _model(), _model()
    # x, y, batch_size, epochs, verbose, callbacks, validation_split, validation_data, shuffle
    keras_model.fit(X, Y, 16, 2, 0, None, 0.25, None, False)
    result = kerasfast.fit(ours, X, Y, 16, 2, 0, None, 0.25, None, False, precision="float32", run_dir=False)
    _assert_same_weights(keras_model, ours)
    assert result.plan.global_batch_size == 16 and result.history.epoch == [0, 1] and "val_loss" in result.history


def test_the_tuple_form_with_validation_split_splits_as_keras_does():
    keras_model, ours = _model(), _model()
    history = keras_model.fit(X, Y, batch_size=16, epochs=2, validation_split=0.25, shuffle=False, verbose=0)
    result = kerasfast.fit(ours, (X, Y), batch_size=16, epochs=2, validation_split=0.25, shuffle=False,
                           precision="float32", run_dir=False, verbose=0)
    _assert_same_weights(keras_model, ours)
    np.testing.assert_allclose(result.history.history["val_loss"], history.history["val_loss"], atol=1e-4)


def _dict_input_model(named: bool):
    keras.utils.set_random_seed(3)
    first, second = (keras.Input((3,), name="first"), keras.Input((3,), name="second")) if named else \
        (keras.Input((3,)), keras.Input((3,)))
    joined = keras.layers.Concatenate()([first, second])
    output = keras.layers.Dense(3, activation="softmax")(keras.layers.Dense(8, activation="tanh")(joined))
    model = keras.Model({"a": first, "b": second} if not named else [first, second], output)
    model.compile(keras.optimizers.SGD(0.2), "sparse_categorical_crossentropy")
    return model


@pytest.mark.parametrize("named", [False, True], ids=["dict_of_unnamed_inputs", "named_inputs"])
def test_dict_inputs_match_by_the_users_names_through_a_rebuild(named):
    keras_model, ours = _dict_input_model(named), _dict_input_model(named)
    keys = ("a", "b") if not named else ("first", "second")
    data = {keys[0]: X[:, :3], keys[1]: X[:, 3:]}
    keras_model.fit(data, Y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    result = kerasfast.fit(ours, data, Y, batch_size=16, epochs=2, shuffle=False, precision="float32",
                           strategy=tf.distribute.MirroredStrategy(["/cpu:0"]), run_dir=False, verbose=0)
    assert "rebuilt" in result.model_preparation
    assert result.train_model is not ours
    _assert_same_weights(keras_model, ours)


def test_a_rebuilt_copy_keeps_the_names_of_its_inputs():
    from kerasfast.training.inputs import input_names
    from kerasfast.training.models import clone_under

    for model in (_dict_input_model(named=False), _dict_input_model(named=True)):
        copy = clone_under(model, "float32")
        assert list(input_names(copy)) == list(input_names(model))


@pytest.mark.parametrize("example", ["vae", "dcgan"])
def test_a_model_with_its_own_train_step_that_is_never_built_returns_its_run(example, tmp_path):
    """keras.io's VAE and DCGAN never call the model itself, so Keras can save neither it nor its
    weights: the run still returns, its folder holds the rest, and a warning says what is missing."""
    from tests import kerasio_models

    model = getattr(kerasio_models, f"build_{example}")()
    data = {**getattr(kerasio_models, f"data_{example}")(), "epochs": 1}
    with pytest.warns(kerasfast.RunFolderWarning, match=rf"model.keras \(model '{model.name}' was never built"):
        result = kerasfast.fit(model, **data, steps_per_epoch=2, run_dir=tmp_path, verbose=0)
    assert len(result.history.history["loss" if example == "vae" else "d_loss"]) == 1
    files = {path.name for path in tmp_path.iterdir()}
    assert {"history.json", "result.json", "plan.json"} <= files and "model.keras" not in files
    assert "backup" not in files  # a re-run could not write it either: nothing is kept to resume


class _CountsBatchHooks(keras.callbacks.Callback):
    """Counts each batch hook Keras calls, training and validation."""

    def __init__(self):
        super().__init__()
        self.calls = {}

    def _count(self, hook):
        self.calls[hook] = self.calls.get(hook, 0) + 1

    def on_test_batch_begin(self, batch, logs=None):
        self._count("on_test_batch_begin")

    def on_test_batch_end(self, batch, logs=None):
        self._count("on_test_batch_end")


def _fit_both(make_callbacks, tmp_path, x=X, ours=None, **arguments):
    """The same run through model.fit and kerasfast.fit (automatic plan, with `ours` added), each with
    fresh callbacks: `{"keras" | "kerasfast": (model, callbacks, folder, plan or None)}`."""
    runs = {}
    for name in ("keras", "kerasfast"):
        folder = tmp_path / name
        folder.mkdir()
        callbacks = make_callbacks(folder)
        model = _model()
        if name == "keras":
            model.fit(x, Y, batch_size=16, callbacks=callbacks, shuffle=False, verbose=0, **arguments)
            plan = None
        else:
            plan = kerasfast.fit(model, x, Y, batch_size=16, callbacks=callbacks, shuffle=False, run_dir=False,
                                 verbose=0, **arguments, **(ours or {})).plan
        runs[name] = (model, callbacks, folder, plan)
    return runs


def test_a_checkpoint_saved_every_n_batches_writes_the_files_keras_writes(tmp_path):
    runs = _fit_both(lambda folder: [keras.callbacks.ModelCheckpoint(str(folder / "{epoch}-{batch}.weights.h5"),
                                                                     save_weights_only=True, save_freq=5)],
                     tmp_path, epochs=2)
    written = {name: sorted(path.name for path in run[2].iterdir()) for name, run in runs.items()}
    assert len(written["keras"]) == 5 and written["kerasfast"] == written["keras"]  # 26 batches, every 5th
    plan = runs["kerasfast"][3]
    assert plan.steps_per_execution == 1 and "ModelCheckpoint(save_freq=5)" in plan.reasons["steps_per_execution"]


def test_validation_batch_hooks_run_as_often_as_in_keras(tmp_path):
    runs = _fit_both(lambda folder: [_CountsBatchHooks()], tmp_path, epochs=2, validation_split=0.25)
    keras_calls, our_calls = (run[1][0].calls for run in (runs["keras"], runs["kerasfast"]))
    assert keras_calls == {"on_test_batch_begin": 8, "on_test_batch_end": 8}  # 2 epochs x 4 batches
    assert our_calls == keras_calls
    assert "_CountsBatchHooks(on_test_batch_begin, on_test_batch_end)" in \
        runs["kerasfast"][3].reasons["steps_per_execution"]


def test_terminate_on_nan_stops_at_the_batch_keras_stops_at(tmp_path):
    x = X.copy()
    x[40] = np.inf  # in the third batch of 16
    runs = _fit_both(lambda folder: [keras.callbacks.TerminateOnNaN()], tmp_path, x=x, epochs=2,
                     ours={"on_nan": "ignore"})
    (keras_model, *_), (ours, *_, plan) = runs["keras"], runs["kerasfast"]
    assert int(keras_model.optimizer.iterations) == 3
    assert int(ours.optimizer.iterations) == 3
    for left, right in zip(keras_model.get_weights(), ours.get_weights(), strict=True):
        np.testing.assert_allclose(left, right, atol=PARITY_ATOL)  # the same values, NaN where Keras has NaN
    assert "TerminateOnNaN" in plan.reasons["steps_per_execution"]


@pytest.mark.parametrize("compiled_with, fit_options", [
    ("schedule", {}),
    ("schedule", {"learning_rate": 0.05, "clipnorm": 1.0}),
    ("constant", {"learning_rate": 0.05, "clipnorm": 1.0}),
    (None, {}),
], ids=["own_schedule", "schedule_replaced_for_the_run", "constant_replaced_for_the_run", "kerasfasts_optimizer"])
def test_a_checkpoint_saved_mid_run_loads_with_its_optimizer_state_and_the_users_settings(tmp_path, compiled_with,
                                                                                          fit_options):
    """A `.keras` checkpoint written during a run holds the optimizer the
    user made (rate, clipping), not the run's stand-ins, with the variables
    Keras rebuilds from that config: plain Keras loads it with every moment
    (one variable too many made Keras skip loading them all)."""
    import json
    import zipfile

    x, y = _data()
    model = _model()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.02, decay_steps=5, decay_rate=0.9)
    if compiled_with is None:  # never compiled: kerasfast's own AdamW and schedule
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="tanh"),
                                  keras.layers.Dense(3, activation="softmax")])
        fit_options = {**fit_options, "loss": "sparse_categorical_crossentropy"}
    else:
        model.compile(keras.optimizers.Adam(schedule if compiled_with == "schedule" else 0.02),
                      "sparse_categorical_crossentropy")
    users_config = model.optimizer.get_config() if model.compiled else None
    saved = tmp_path / "checkpoint.keras"
    kerasfast.fit(model, x, y, epochs=2, batch_size=32, callbacks=[keras.callbacks.ModelCheckpoint(str(saved))],
                  run_dir=False, verbose=0, tune="off", **fit_options)

    with zipfile.ZipFile(saved) as archive:
        optimizer_config = json.loads(archive.read("config.json"))["compile_config"]["optimizer"]["config"]
    if compiled_with is None:
        assert isinstance(model.optimizer, keras.optimizers.AdamW)
        assert isinstance(optimizer_config["learning_rate"], dict)  # saved during the run: the plan's schedule
        assert float(model.optimizer.learning_rate) == pytest.approx(1e-3)  # after it: the peak, a constant
    if users_config is not None:
        expected = json.loads(json.dumps(keras.saving.serialize_keras_object(users_config)))
        if compiled_with == "constant":  # the variable holding it is saved as the run uses it
            expected["learning_rate"] = pytest.approx(fit_options["learning_rate"])
        assert optimizer_config == expected
        assert "kerasfast" not in json.dumps(optimizer_config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Keras warns, and loads no optimizer state, on a count mismatch
        loaded = keras.models.load_model(saved)
    # The rate is the user's again after the run (kerasfast's AdamW: its peak, a constant); the state matches.
    mine, theirs = ([v for v in optimizer.variables if not v.path.endswith("learning_rate")]
                    for optimizer in (model.optimizer, loaded.optimizer))
    assert len(theirs) == len(mine) and int(loaded.optimizer.iterations) == int(model.optimizer.iterations) == 14
    for left, right in zip(mine, theirs, strict=True):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(right), keras.ops.convert_to_numpy(left))
    # A SavedModel export saves the optimizer too, and TensorFlow refuses a tracked list an item was
    # deleted from.
    model.export(str(tmp_path / "saved_model"), verbose=False)


def test_a_model_compiled_without_an_optimizer_trains_with_kerasfasts_own():
    """`compile(optimizer=None)` reads as no optimizer: kerasfast's AdamW, as
    for an uncompiled model (Keras's fit fails on `None.apply_gradients`)."""
    x, y = _data()
    model = _model()
    model.compile(optimizer=None, loss="sparse_categorical_crossentropy")
    before = model.get_weights()[0].copy()
    result = kerasfast.fit(model, x, y, epochs=1, batch_size=32, run_dir=False, verbose=0, tune="off")
    assert isinstance(model.optimizer, keras.optimizers.AdamW) and int(model.optimizer.iterations) == 7
    assert result.plan.optimizer == "AdamW" and result.plan.reasons["optimizer"].startswith("kerasfast default: AdamW")
    assert not np.allclose(model.get_weights()[0], before)


class _ReshufflingBatches(keras.utils.PyDataset):
    """Keras's idiom: a PyDataset that draws new batches in `on_epoch_end`."""

    def __init__(self):
        super().__init__()
        self.order, self.rng = np.arange(len(X)), np.random.default_rng(0)
        self.begins, self.ends, self.first_rows = 0, 0, []  # first_rows: row 0 of each pass
        self.inside_a_pass = False

    def __len__(self):
        return len(X) // 40

    def __getitem__(self, index):
        rows = self.order[index * 40:(index + 1) * 40]
        if index == 0 and self.inside_a_pass:  # not a look at the batch structure
            self.first_rows.append(int(rows[0]))
        return X[rows], Y[rows]

    def on_epoch_begin(self):
        self.begins += 1
        self.inside_a_pass = True

    def on_epoch_end(self):
        self.ends += 1
        self.inside_a_pass = False
        self.rng.shuffle(self.order)


def test_a_pydataset_draws_new_batches_each_epoch_as_in_keras():
    # Each epoch reads the order the previous on_epoch_end drew; model.fit also calls on_epoch_end once
    # before its first epoch, so even the first epoch reads a drawn order.
    keras_batches, batches = _ReshufflingBatches(), _ReshufflingBatches()
    _model().fit(keras_batches, epochs=3, verbose=0)
    kerasfast.fit(_model(), batches, epochs=3, run_dir=False, verbose=0)
    assert len(set(keras_batches.first_rows)) == 3 and batches.first_rows[:3] == keras_batches.first_rows
    assert batches.ends >= 3 and batches.begins >= 3


class _Curriculum(keras.utils.PyDataset):
    """Batches scaled by a level that a callback raises each epoch; records the level of each batch read."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.level, self.read = 0, []

    def __len__(self):
        return len(X) // 40

    def __getitem__(self, index):
        self.read.append(self.level)
        return X[index * 40:(index + 1) * 40] * (1 + self.level), Y[index * 40:(index + 1) * 40]


class _RaiseLevel(keras.callbacks.Callback):
    def __init__(self, batches):
        super().__init__()
        self.batches, self.levels_read = batches, []

    def on_epoch_begin(self, epoch, logs=None):
        self.batches.level, self.start = epoch, len(self.batches.read)

    def on_epoch_end(self, epoch, logs=None):
        self.levels_read.append(self.batches.read[self.start:])


@pytest.mark.parametrize("workers", [1, 2])
def test_a_pydataset_a_callback_changes_between_epochs_is_read_after_the_change_as_in_keras(workers):
    batches = _Curriculum(workers=workers)
    curriculum = _RaiseLevel(batches)
    kerasfast.fit(_model(), batches, epochs=3, shuffle=False, callbacks=[curriculum], run_dir=False, verbose=0,
                  tune="off")
    steps = len(batches)
    # model.fit reads each epoch's batches after the callback's on_epoch_begin, none ahead of it.
    assert curriculum.levels_read == [[0] * steps, [1] * steps, [2] * steps]


def _uncompiled(seed=4):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="tanh"),
                             keras.layers.Dense(3, activation="softmax")])


def test_a_callback_that_sets_the_learning_rate_gets_a_constant_rate_to_set():
    halve = keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate / 2)
    result = kerasfast.fit(_uncompiled(), X, Y, loss="sparse_categorical_crossentropy", batch_size=20, epochs=3,
                           callbacks=[halve], run_dir=False, verbose=0)
    assert result.plan.lr_schedule == "constant"
    assert "LearningRateScheduler sets the learning rate" in result.plan.reasons["lr_schedule"]
    rate = result.plan.learning_rate
    np.testing.assert_allclose(result.history.history["learning_rate"], [rate / 2, rate / 4, rate / 8], rtol=1e-6)


@pytest.mark.parametrize("compiled", [False, True], ids=["kerasfast's optimizer", "the user's, at fit's rate"])
def test_the_rate_a_callback_set_stays_after_the_run_as_in_keras(compiled):
    model = _uncompiled()
    if compiled:
        model.compile(keras.optimizers.Adam(0.5), "sparse_categorical_crossentropy")
    steps = keras.callbacks.LearningRateScheduler(lambda epoch, rate: 1e-3 * (epoch + 1))
    kerasfast.fit(model, X, Y, loss=None if compiled else "sparse_categorical_crossentropy", learning_rate=1e-3,
                  batch_size=20, epochs=3, callbacks=[steps], run_dir=False, verbose=0)
    assert float(model.optimizer.learning_rate) == pytest.approx(3e-3)  # as model.fit leaves it


def test_a_rate_fit_was_given_for_one_run_gives_back_the_users_own():
    model = _uncompiled()
    model.compile(keras.optimizers.Adam(0.5), "sparse_categorical_crossentropy")
    kerasfast.fit(model, X, Y, learning_rate=1e-3, batch_size=20, epochs=1, run_dir=False, verbose=0)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.5)


class _WarmUp(keras.callbacks.Callback):
    """A warm-up as keras.io examples write one: the rate set in the callback's own code."""

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_epoch_begin(self, epoch, logs=None):
        self.model.optimizer.learning_rate = 1e-3 * (epoch + 1)

    def on_epoch_end(self, epoch, logs=None):
        self.rates.append(float(self.model.optimizer.learning_rate))


def test_a_callback_of_the_users_that_sets_the_rate_gets_a_constant_rate_to_set():
    warm_up = _WarmUp()  # Keras's TypeError ("not settable") under a planned schedule
    result = kerasfast.fit(_uncompiled(), X, Y, loss="sparse_categorical_crossentropy", batch_size=20, epochs=3,
                           callbacks=[warm_up], run_dir=False, verbose=0)
    assert result.plan.lr_schedule == "constant"
    assert "_WarmUp sets the learning rate" in result.plan.reasons["lr_schedule"]
    np.testing.assert_allclose(warm_up.rates, [1e-3, 2e-3, 3e-3], rtol=1e-6)


def _set_rate(optimizer, rate):
    optimizer.learning_rate = rate


class _HalvingThroughAHelper(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        _set_rate(self.model.optimizer, float(self.model.optimizer.learning_rate) / 2)


@pytest.mark.parametrize("callback", [
    _HalvingThroughAHelper(),
    keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: _set_rate(MODEL_OF_LAMBDA[0].optimizer, 1e-4)),
], ids=["a module-level helper", "a LambdaCallback"])
def test_a_callback_setting_the_rate_through_other_code_gets_a_constant_rate(callback):
    model = _uncompiled()
    MODEL_OF_LAMBDA[:] = [model]
    result = kerasfast.fit(model, X, Y, loss="sparse_categorical_crossentropy", batch_size=20, epochs=2,
                           callbacks=[callback], run_dir=False, verbose=0)
    assert result.plan.lr_schedule == "constant", result.plan.reasons["lr_schedule"]


MODEL_OF_LAMBDA = []


def test_a_callback_whose_code_cannot_be_read_setting_the_rate_is_named_with_the_fix(tmp_path):
    namespace = {"keras": keras}
    # No source file, so its code cannot be read; a method's object need not be called `self`.
    exec("class Unreadable(keras.callbacks.Callback):\n"
         "    def on_epoch_end(s, epoch, logs=None):\n"
         "        s.model.optimizer.learning_rate = 1e-4\n", namespace)
    options = dict(loss="sparse_categorical_crossentropy", batch_size=20, epochs=2, run_dir=tmp_path, verbose=0)
    model = _uncompiled()
    with pytest.raises(kerasfast.PlanError, match=r"^Unreadable set optimizer.learning_rate, but the run's learning "
                                                  r"rate is the planned schedule lr_schedule='warmup_cosine'.*"
                                                  r"lr_schedule='constant'"):
        kerasfast.fit(model, X, Y, callbacks=[namespace["Unreadable"]()], **options)
    # The fix the message names works at once: the backup of the steps trained with the schedule is gone.
    assert not (tmp_path / "backup").exists()
    result = kerasfast.fit(model, X, Y, callbacks=[namespace["Unreadable"]()], lr_schedule="constant", **options)
    assert len(result.history.history["loss"]) == 2
    assert float(model.optimizer.learning_rate) == pytest.approx(1e-4)


class _RateLogger(keras.callbacks.Callback):
    """Reads the rate and keeps it in attributes of its own, named as an optimizer's are."""

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_epoch_end(self, epoch, logs=None):
        self.lr = float(self.model.optimizer.learning_rate)
        self.learning_rate: float = self.lr
        self.rates.append(self.lr)


class _SetsThroughSetattr(keras.callbacks.Callback):
    def on_epoch_end(this, epoch, logs=None):
        setattr(this.model.optimizer, "learning_rate", 1e-4)  # noqa: B010 - the form under test


class _SetsThroughItsVariable(keras.callbacks.Callback):
    def on_train_begin(this, logs=None):
        this.lr = this.model.optimizer.learning_rate

    def on_epoch_end(this, epoch, logs=None):
        this.lr.assign(this.lr * 0.5)


class _Outer:
    class _LoggerWithANote(keras.callbacks.Callback):  # indented, with a string's lines at column 0
        def on_epoch_end(self, epoch, logs=None):
            self.note = """
the rate, read"""
            self.lr = float(self.model.optimizer.learning_rate)


_RATES_SET = []
_SETTER_ON_A_CONTINUED_LINE = keras.callbacks.LambdaCallback(
    on_epoch_end=lambda epoch, logs: setattr(_RATES_SET[0], "learning_rate", 0.1))


def test_a_callback_keeping_the_rate_in_its_own_attributes_does_not_set_it():
    assert learning_rate_callbacks([_RateLogger(), _Outer._LoggerWithANote()]) == ()
    assert learning_rate_callbacks([_SetsThroughSetattr(), _SetsThroughItsVariable(), _SETTER_ON_A_CONTINUED_LINE]) == (
        "_SetsThroughSetattr", "_SetsThroughItsVariable", "LambdaCallback")
    # Beside a schedule (which Keras cannot set), as model.fit trains it; with kerasfast's own optimizer, the
    # planned schedule stays.
    model = _uncompiled()
    decay = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=10, decay_rate=0.5)
    model.compile(keras.optimizers.Adam(decay), "sparse_categorical_crossentropy")
    logger = _RateLogger()
    kerasfast.fit(model, X, Y, batch_size=20, epochs=2, callbacks=[logger], run_dir=False, verbose=0, tune="off")
    np.testing.assert_allclose(logger.rates, [0.005, 0.0025], rtol=1e-5)
    result = kerasfast.fit(_uncompiled(), X, Y, loss="sparse_categorical_crossentropy", batch_size=20, epochs=2,
                           callbacks=[_RateLogger()], run_dir=False, verbose=0, tune="off")
    assert result.plan.lr_schedule == "warmup_cosine"


def test_kerasfasts_own_optimizer_keeps_a_settable_rate_after_a_run_that_raised():
    class _Interrupted(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt

    model = _uncompiled()
    with pytest.raises(KeyboardInterrupt):
        kerasfast.fit(model, X, Y, loss="sparse_categorical_crossentropy", batch_size=20, epochs=3,
                      learning_rate=0.01, callbacks=[_Interrupted()], run_dir=False, verbose=0, tune="off")
    # As after a run that finished: the peak rate as a constant, which a later model.fit trains at and its
    # callbacks can set (the schedule would have gone on decaying to 0, and refused them).
    assert float(model.optimizer.learning_rate) == pytest.approx(0.01)
    model.fit(X, Y, batch_size=20, epochs=2, verbose=0,
              callbacks=[keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate / 2)])
    assert float(model.optimizer.learning_rate) == pytest.approx(0.0025)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_training_metrics_leave_out_masked_steps_as_model_fit_does(jit_compile):
    rng = np.random.default_rng(0)
    tokens = np.zeros((128, 10), "int32")
    for row, length in enumerate(rng.integers(3, 11, len(tokens))):
        tokens[row, :length] = rng.integers(1, 20, length)
    labels = np.where(tokens == 0, 2, tokens % 3)  # the padding's label is one the model rarely predicts

    def tagger():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((10,), dtype="int32")
        hidden = keras.layers.Embedding(20, 8, mask_zero=True)(inputs)
        hidden = keras.layers.GRU(8, return_sequences=True)(hidden)
        model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))
        model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"],
                      weighted_metrics=["accuracy"])
        return model

    options = dict(batch_size=32, epochs=2, shuffle=False, verbose=0)
    expected = tagger().fit(tokens, labels, **options).history
    got = kerasfast.fit(tagger(), tokens, labels, jit_compile=jit_compile, steps_per_execution=1, run_dir=False,
                        tune="off", **options).history.history
    for name in ("accuracy", "weighted_accuracy", "loss"):
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, err_msg=name)


@pytest.mark.parametrize("run_dir", ["given", "default"])
def test_a_call_that_fails_before_its_first_update_leaves_no_run_folder(tmp_path, monkeypatch, run_dir):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "run" if run_dir == "given" else None
    model = _model()
    with pytest.raises(RuntimeError, match="not today"):
        kerasfast.fit(model, X, Y, batch_size=20, epochs=2, run_dir=folder, verbose=0, callbacks=[_FailsAtStart()])
    assert int(model.optimizer.iterations) == 0
    assert list(tmp_path.rglob("*")) == []
    # Labels outside the output's classes are refused before the folder is made.
    with pytest.raises(kerasfast.DataError, match=r"^y holds label [5-7] at sample 0 \(\d+ sample\(s\) in all hold labels "
                                                  r"out of range\), but the model's output has 3 classes"):
        kerasfast.fit(model, X, Y + 5, batch_size=20, epochs=2, run_dir=folder, verbose=0)
    assert list(tmp_path.rglob("*")) == []
    # Once an update was made, the folder is the run's record (and its backup).
    with pytest.raises(RuntimeError, match="simulated crash"):
        kerasfast.fit(model, X, Y, batch_size=20, epochs=2, run_dir=folder, verbose=0, backup_every=2,
                      steps_per_execution=1, callbacks=[_CrashesAtBatch()])
    assert any(path.name == "plan.json" for path in tmp_path.rglob("*"))


def test_a_model_training_through_its_own_optimizers_keeps_its_run_folder_when_it_fails_later(tmp_path):
    # keras.io's DCGAN updates through d_optimizer and g_optimizer; its model.optimizer never counts a step.
    from tests import kerasio_models

    gan, data = kerasio_models.build_dcgan(), kerasio_models.data_dcgan()
    with pytest.raises(RuntimeError, match="simulated crash"):
        kerasfast.fit(gan, data["x"], epochs=2, run_dir=tmp_path / "run", verbose=0, steps_per_execution=1,
                      callbacks=[_CrashesAtBatch()])
    assert int(gan.d_optimizer.iterations) > 0
    assert (tmp_path / "run" / "plan.json").is_file()


class _FailsAtStart(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        raise RuntimeError("not today")


class _CrashesAtBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 3:
            raise RuntimeError("simulated crash")


@pytest.mark.parametrize("compiled", [False, True], ids=["kerasfast's optimizer", "a constant rate of the user's"])
def test_a_planned_schedule_next_to_a_callback_that_sets_the_rate_is_refused_before_training(compiled):
    model = _model() if compiled else _uncompiled()
    before = [w.copy() for w in model.get_weights()]
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0)
    with pytest.raises(kerasfast.PlanError, match=r"ReduceLROnPlateau sets the learning rate .* "
                                                  r"lr_schedule='warmup_cosine' sets it every step"):
        kerasfast.fit(model, X, Y, loss="sparse_categorical_crossentropy", lr_schedule="warmup_cosine",
                      learning_rate=0.01, epochs=2, callbacks=[plateau], run_dir=False, verbose=0)
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_schedule_of_the_users_that_a_callback_would_set_is_refused_before_training():
    model = _uncompiled()
    decay = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.9)
    model.compile(keras.optimizers.SGD(decay), "sparse_categorical_crossentropy")
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0)
    with pytest.raises(kerasfast.PlanError, match="your optimizer's learning rate is a schedule, which Keras cannot "
                                                  "set"):
        kerasfast.fit(model, X, Y, epochs=2, callbacks=[plateau], run_dir=False, verbose=0)


def test_a_model_trained_with_kerasfasts_optimizer_trains_again_in_either_fit(tmp_path):
    model = _uncompiled()
    first = kerasfast.fit(model, X, Y, loss="sparse_categorical_crossentropy", batch_size=20, epochs=2,
                          run_dir=False, verbose=0)
    assert first.plan.lr_schedule == "warmup_cosine"  # ends at 0
    # The run's schedule has ended; the optimizer keeps its peak rate, settable as after Keras's compile.
    assert float(model.optimizer.learning_rate) == pytest.approx(first.plan.learning_rate)
    model.optimizer.learning_rate = first.plan.learning_rate / 2
    before = [w.copy() for w in model.get_weights()]
    second = kerasfast.fit(model, X, Y, batch_size=20, epochs=2, run_dir=False, verbose=0)
    assert second.plan.lr_schedule == "warmup_cosine" and "kerasfast default" in second.plan.reasons["optimizer"]
    assert int(model.optimizer.iterations) == 40  # the same optimizer, its state kept
    assert max(float(np.abs(a - b).max()) for a, b in zip(before, model.get_weights(), strict=True)) > 1e-4
    before = [w.copy() for w in model.get_weights()]
    model.fit(X, Y, batch_size=20, epochs=1, verbose=0)
    assert max(float(np.abs(a - b).max()) for a, b in zip(before, model.get_weights(), strict=True)) > 1e-4
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_dataset_that_never_ends_needs_steps_per_epoch():
    endless = tf.data.Dataset.from_tensor_slices((X, Y)).batch(20).repeat()
    with pytest.raises(kerasfast.PlanError, match=r"x repeats forever .* pass steps_per_epoch="):
        kerasfast.fit(_model(), endless, epochs=1, run_dir=False, verbose=0)
    # A callback acting only at epoch ends cannot end an epoch that never ends (it hung).
    with pytest.raises(kerasfast.PlanError, match=r"x repeats forever .*\(no callback acts on every batch"):
        kerasfast.fit(_model(), endless, epochs=1, run_dir=False, verbose=0,
                      callbacks=[keras.callbacks.EarlyStopping(monitor="loss")])
    result = kerasfast.fit(_model(), endless, epochs=2, steps_per_epoch=5, run_dir=False, verbose=0)
    assert len(result.history.history["loss"]) == 2
    stopped = kerasfast.fit(_model(), endless, epochs=1, run_dir=False, verbose=0, callbacks=[_StopAfterBatches(6)])
    assert len(stopped.history.history["loss"]) == 1


class _StopAfterBatches(keras.callbacks.Callback):
    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def on_train_batch_end(self, batch, logs=None):
        self.model.stop_training = batch + 1 >= self.batches


class TwoInputsOwnLoss(keras.Model):
    """A subclassed model taking (a, b) that computes its own loss (add_loss): fit gets no y."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, inputs):
        a, b = inputs
        out = self.dense(a)
        self.add_loss(keras.ops.mean(keras.ops.square(out - b)))
        return out


class DistanceLoss(keras.layers.Layer):
    def call(self, inputs):
        out, target = inputs
        self.add_loss(keras.ops.mean(keras.ops.square(out - target)))
        return out


def _two_inputs_own_loss_functional():
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    return keras.Model([a, b], DistanceLoss()([keras.layers.Dense(2)(a), b]))


@pytest.mark.parametrize("make", [TwoInputsOwnLoss, _two_inputs_own_loss_functional],
                         ids=["subclassed", "functional"])
def test_a_tuple_of_the_models_inputs_without_y_is_read_as_its_inputs_as_keras_does(make):
    """model.fit((xa, xb)) feeds both arrays to a two-input model; so does kerasfast.fit (docs/fit.md)."""
    rng = np.random.default_rng(0)
    xa, xb = rng.normal(size=(64, 3)).astype("float32"), rng.normal(size=(64, 2)).astype("float32")
    models = []
    for _ in range(2):
        keras.utils.set_random_seed(1)
        models.append(make())
        models[-1].compile(keras.optimizers.SGD(0.1))
    keras_model, ours = models
    history = keras_model.fit((xa, xb), batch_size=16, epochs=2, shuffle=False, verbose=0)
    result = kerasfast.fit(ours, (xa, xb), batch_size=16, epochs=2, shuffle=False, precision="float32",
                           tune="off", run_dir=False, verbose=0)
    _assert_same_weights(keras_model, ours)
    np.testing.assert_allclose(result.history.history["loss"], history.history["loss"], atol=1e-4)


class OneInput(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3, activation="softmax")

    def call(self, inputs):
        return self.dense(inputs)


def _two_inputs_with_loss():
    a, b = keras.Input((3,)), keras.Input((3,))
    model = keras.Model([a, b], keras.layers.Dense(3, activation="softmax")(keras.layers.Concatenate()([a, b])))
    return model


@pytest.mark.parametrize("make, x", [
    (lambda: keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")]), X),
    (OneInput, X),  # no declared inputs, but a loss that needs y
    (_two_inputs_with_loss, (X[:, :3], X[:, 3:])),  # x itself a tuple of the two inputs
], ids=["sequential", "subclassed_with_loss", "two_inputs_with_loss"])
def test_a_tuple_without_y_is_still_x_y_where_the_model_needs_a_y(make, x):
    """kerasfast's fit(model, (x, y)) form keeps its reading wherever a y is meant."""
    models = []
    for _ in range(2):
        keras.utils.set_random_seed(1)
        models.append(make())
        models[-1].compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    keras_model, ours = models
    keras_model.fit(x, Y, batch_size=20, epochs=2, shuffle=False, verbose=0)
    kerasfast.fit(ours, (x, Y), batch_size=20, epochs=2, shuffle=False, precision="float32", tune="off",
                  run_dir=False, verbose=0)
    _assert_same_weights(keras_model, ours)


@pytest.mark.parametrize("name", ["y", "sample_weight"])
def test_targets_or_weights_keras_cannot_read_beside_arrays_are_named(name):
    given = {"y": Y, "sample_weight": None, name: [float(value) for value in Y]}  # a Python list of numbers
    with pytest.raises(kerasfast.DataError, match=rf"^data: {name} of type list cannot be read beside the arrays of x "
                                                  rf"\(model.fit refuses it too\); pass it as an array, e.g. "
                                                  rf"np.asarray\({name}\)"):
        kerasfast.fit(_model(), X, epochs=1, tune="off", run_dir=False, verbose=0, **given)


@pytest.mark.parametrize("data", ["arrays", "dataset"])
def test_inputs_without_targets_for_a_compiled_loss_are_refused_naming_the_loss(data):
    # model.fit fails inside the loss with a bare "None values not supported".
    model = _model()
    before = [w.copy() for w in model.get_weights()]
    x = X if data == "arrays" else tf.data.Dataset.from_tensor_slices(X).batch(20)
    with pytest.raises(kerasfast.DataError, match=r"inputs only \(y=None.*loss='sparse_categorical_crossentropy'.*pass y="):
        kerasfast.fit(model, x, epochs=1, batch_size=20 if data == "arrays" else None, tune="off",
                      run_dir=False, verbose=0)
    for now, was in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(now, was)


@pytest.mark.parametrize("data", ["arrays", "array alone", "dataset"])
def test_validation_data_without_targets_is_refused_before_the_first_epoch_trains(data):
    # model.fit trains the whole first epoch, then fails in the evaluation with "None values not supported".
    model = _model()
    before = [w.copy() for w in model.get_weights()]
    validation = {"arrays": lambda: (X[:50],), "array alone": lambda: X[:50],
                  "dataset": lambda: tf.data.Dataset.from_tensor_slices(X[:50]).batch(25)}[data]()
    with pytest.raises(kerasfast.DataError, match=r"^validation_data holds inputs only .*pass validation_data=\(x, y\)"):
        kerasfast.fit(model, X, Y, epochs=1, batch_size=20, validation_data=validation, tune="off", run_dir=False,
                      verbose=0)
    for now, was in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(now, was)


class _Batches(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1


_VALIDATION_WIDTH = r"validation_data has inputs of shape \('batch', 5\) but model '\w+' input '\w*' expects " \
                    r"\('batch', 6\)"


@pytest.mark.parametrize("validation_data, message", [
    (lambda: (X[:, :5], Y), _VALIDATION_WIDTH),
    (lambda: [X[:, :5], Y], _VALIDATION_WIDTH),
    (lambda: (X[:100], Y[:50]),
     r"validation_data: the arrays disagree on the number of samples \(x has 100 rows, y has 50 rows\)"),
    (lambda: (X, Y, np.ones(10)), r"validation_data: .*sample_weight has 10 rows"),
    (lambda: (X, np.array(["a"] * len(X))), r"validation_data: y holds strings"),
    (lambda: (X, Y + 2),
     r"validation_data's y holds label \d at sample \d+ \(\d+ sample\(s\) in all hold labels out of range\), but the "
     r"model's output has 3 classes"),
    (lambda: (X, keras.utils.to_categorical(Y, 3)),
     r"validation_data's y is one-hot \(shape \(\d+, 3\), one 1 per row\), but .* pass y\.argmax\(axis=1\), or compile "
     r"with loss='categorical_crossentropy'"),
    (lambda: (np.where(X > 1.5, np.nan, X), Y),
     r"validation_data\[0\] holds NaN at sample \d+.* that makes the validation loss and metrics NaN"),
    (lambda: tf.data.Dataset.from_tensor_slices((X[:, :5], Y)).batch(16), _VALIDATION_WIDTH),
    (lambda: tf.data.Dataset.from_tensor_slices((X, Y)),
     r"validation_data yields single samples of shape \(6,\), .* batch the data"),
], ids=["width", "width_list", "lengths", "sample_weight_length", "string_labels", "labels_out_of_range", "one_hot", "nan",
        "dataset_width", "dataset_unbatched"])
def test_validation_data_that_cannot_work_is_refused_before_any_step(validation_data, message):
    """The training data's checks and messages, naming validation_data, before training
    (Keras raises its own ValueError only after the first epoch has trained)."""
    batches = _Batches()
    with pytest.raises(kerasfast.DataError, match=message):
        kerasfast.fit(_model(), X, Y, batch_size=20, epochs=2, validation_data=validation_data(),
                      callbacks=[batches], tune="off", run_dir=False, verbose=0)
    assert batches.seen == 0


def test_validation_data_of_a_model_built_by_a_function_is_checked_against_the_built_model():
    batches = _Batches()
    with pytest.raises(kerasfast.DataError, match=_VALIDATION_WIDTH):
        kerasfast.fit(_model, X, Y, batch_size=20, epochs=2, validation_data=(X[:, :5], Y), callbacks=[batches],
                      tune="off", run_dir=False, verbose=0)
    assert batches.seen == 0


def test_validation_data_whose_dataset_shape_is_unknown_still_trains():
    """Dimensions a dataset's element_spec leaves unknown are not checked before it is read."""
    unknown = tf.data.Dataset.from_tensor_slices((X, Y)).batch(20).map(
        lambda x, y: (tf.reshape(x, [-1, tf.shape(x)[1]]), y))
    result = kerasfast.fit(_model(), X, Y, batch_size=20, epochs=1, validation_data=unknown, tune="off",
                           run_dir=False, verbose=0)
    assert len(result.history.history["val_loss"]) == 1


def _unknown_length():
    return tf.data.Dataset.from_tensor_slices((X[:100], Y[:100])).filter(lambda x, y: True).batch(20)


def test_a_progress_bar_counting_steps_that_ran_shows_the_batches_of_an_epoch_of_unknown_length(capsys):
    """Keras's own bar counts the last, shorter execution as a whole one (5 batches under 4 steps per
    execution show as 8/8); RealBatchesProgbar counts the steps that ran, as Keras shows with one step
    per execution."""
    from kerasfast.training.batch_callbacks import RealBatchesProgbar

    model = _model()
    model.compile(keras.optimizers.SGD(0.2), "sparse_categorical_crossentropy", steps_per_execution=4)
    model.fit(_unknown_length(), epochs=1, verbose=2)
    assert "8/8" in capsys.readouterr().out  # Keras's count
    model.fit(_unknown_length(), epochs=2, verbose=2,
              callbacks=[RealBatchesProgbar(lambda: int(model.optimizer.iterations))])
    out = capsys.readouterr().out
    assert out.count("5/5") == 2 and "8/8" not in out


def test_fit_shows_the_batches_of_an_epoch_of_unknown_length_as_keras_does(capsys):
    """5 batches of unknown length under longer executions: the bar and the throughput count
    5 steps an epoch, as model.fit shows them (not the execution's 64). Needs trainer.train to add
    `batch_callbacks.progress_bars` and pass `steps_done` to the ThroughputMeter."""
    result = kerasfast.fit(_model(), _unknown_length(), epochs=2, steps_per_execution=64, tune="off",
                           run_dir=False, verbose=2)
    out = capsys.readouterr().out
    assert out.count("5/5") == 2 and "64/64" not in out
    assert result.throughput.measured_steps == 5  # the second epoch's: the first execution is left out


@pytest.mark.parametrize("freq", [(1, 3), {3, 1}, range(1, 4, 2), np.array([1, 3]), [1, 3]],
                         ids=["tuple", "set", "range", "array", "list"])
def test_validation_freq_as_any_collection_of_epochs_validates_after_those_epochs(freq):
    # Keras takes only an int or a list: a tuple passed kerasfast's check, trained an epoch, then failed in Keras.
    result = kerasfast.fit(_model(), X, Y, batch_size=16, epochs=3, validation_data=(X[:50], Y[:50]),
                           validation_freq=freq, run_dir=False, verbose=0, tune="off")
    assert len(result.history.history["loss"]) == 3 and len(result.history.history["val_loss"]) == 2


def test_validation_freq_as_a_numpy_integer_and_bad_values():
    result = kerasfast.fit(_model(), X, Y, batch_size=16, epochs=2, validation_data=(X[:50], Y[:50]),
                           validation_freq=np.int64(2), run_dir=False, verbose=0, tune="off")
    assert len(result.history.history["val_loss"]) == 1
    for bad in ((0, 2), ("1",), 0, 1.5):
        with pytest.raises(kerasfast.PlanError, match="validation_freq=.* is not valid: use an integer >= 1, or a "
                                                      "list of the epochs"):
            kerasfast.fit(_model(), X, Y, epochs=2, validation_data=(X, Y), validation_freq=bad, run_dir=False,
                          verbose=0)


def test_pandas_nullable_columns_train_as_their_numpy_dtype_and_a_missing_value_is_named():
    # Their NumPy form is objects: the call failed with "Failed to convert a NumPy array to a Tensor".
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.integers(0, 5, (64, 4)), columns=list("abcd"))
    labels = (frame.sum(axis=1) > 8).astype(int)
    options = dict(batch_size=16, epochs=1, shuffle=False, run_dir=False, verbose=0, tune="off",
                   loss="sparse_categorical_crossentropy", precision="float32", jit_compile=False)

    def model():
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])

    plain = kerasfast.fit(model(), frame.astype("float32"), labels, **options)
    nullable = kerasfast.fit(model(), frame.astype({"a": "Int64", "b": "Float64"}), labels.astype("Int64"), **options)
    np.testing.assert_allclose(nullable.history.history["loss"], plain.history.history["loss"], rtol=1e-6)
    holed = frame.astype("Int64")
    holed.loc[[3, 9], "c"] = pd.NA  # NaN to the model: named by fit's check, or trained on as model.fit would
    with pytest.raises(kerasfast.DataError, match=r"x\['c'\] holds NaN at sample 3 \(2 sample\(s\) in all"):
        kerasfast.fit(model(), holed, labels, **options)
    ignored = kerasfast.fit(model(), holed, labels, on_nan="ignore", **options)
    assert len(ignored.history.history["loss"]) == 1


def test_validation_data_that_repeats_forever_needs_validation_steps():
    # Keras (and kerasfast) hung in the first validation, reading an endless dataset to its end.
    endless = tf.data.Dataset.from_tensor_slices((X[:32], Y[:32])).batch(16).repeat()
    model = _model()
    before = model.get_weights()[0].copy()
    with pytest.raises(kerasfast.PlanError, match="validation_data repeats forever .* pass validation_steps="):
        kerasfast.fit(model, X, Y, batch_size=16, epochs=1, validation_data=endless, run_dir=False, verbose=0)
    np.testing.assert_array_equal(model.get_weights()[0], before)  # refused before any step
    result = kerasfast.fit(_model(), X, Y, batch_size=16, epochs=1, validation_data=endless, validation_steps=2,
                           run_dir=False, verbose=0, tune="off")
    assert len(result.history.history["val_loss"]) == 1


def test_arrays_that_fit_a_multi_input_model_only_in_another_order_are_named_with_that_order():
    # The message asked for a reshape that could not work ("x.reshape(-1, 6)") for two swapped arrays.
    a, b = keras.Input((6,), name="a"), keras.Input((4,), name="b")
    model = keras.Model([a, b], keras.layers.Dense(1, activation="sigmoid")(keras.layers.Concatenate()([a, b])))
    model.compile("adam", "binary_crossentropy")
    xa, xb, y = np.zeros((64, 6), "float32"), np.zeros((64, 4), "float32"), np.zeros(64, "float32")
    with pytest.raises(kerasfast.DataError, match=r"^data's arrays fit model '\w+''s inputs only in another order: "
                                                  r"'a' \('batch', 6\) <- your array 1, 'b' \('batch', 4\) <- your "
                                                  r"array 0\. Pass them in the model's order \('a', 'b'\), or as a "
                                                  r"dict"):
        kerasfast.fit(model, [xb, xa], y, run_dir=False, verbose=0)
    result = kerasfast.fit(model, [xa, xb], y, epochs=1, run_dir=False, verbose=0)
    assert len(result.history.history["loss"]) == 1


def test_validation_labels_are_checked_against_the_loss_fit_was_given():
    one_hot = keras.utils.to_categorical(Y, 3)
    # A sparse loss compiled earlier, replaced by fit's loss=: one-hot labels are right for it.
    result = kerasfast.fit(_model(), X, one_hot, loss="categorical_crossentropy", validation_data=(X, one_hot),
                           batch_size=20, epochs=1, run_dir=False, verbose=0)
    assert "val_loss" in result.history.history
    # An uncompiled model given a sparse loss by fit: labels outside its classes are refused before any step.
    batches = _Batches()
    with pytest.raises(kerasfast.DataError, match=r"^validation_data's y holds label \d at sample"):
        kerasfast.fit(_uncompiled(), X, Y, loss="sparse_categorical_crossentropy", validation_data=(X, Y + 3),
                      batch_size=20, epochs=1, callbacks=[batches], run_dir=False, verbose=0)
    assert batches.seen == 0


@pytest.mark.parametrize("options, message", [
    ({"learning_rate": float("nan")}, r"learning_rate=nan is not valid: use a positive, finite number"),
    ({"learning_rate": float("inf")}, r"learning_rate=inf is not valid: use a positive, finite number"),
    ({"clipnorm": float("nan")}, r"clipnorm=nan is not valid"),
])
def test_a_nan_or_infinite_setting_is_refused_before_training(options, message):
    with pytest.raises(kerasfast.PlanError, match=message):
        kerasfast.fit(_model(), X, Y, epochs=1, run_dir=False, verbose=0, **options)


@pytest.mark.parametrize("x, message", [
    (np.zeros((len(Y), 0), "float32"), r"inputs of shape \('batch', 0\).*hold no values"),
    (np.array([["a"] * 6] * len(Y)), r"holds strings \(b'a', \.\.\.\), but model '\w+' takes float32 there"),
    (X.astype(object), r"x is a NumPy array of Python objects \(dtype object, float first\)"),
], ids=["zero-width", "strings", "objects"])
def test_inputs_the_model_cannot_take_are_named_before_training(x, message):
    """A feature of no values (TensorFlow's oneDNN kernels abort the process on it), strings for an input
    of numbers and NumPy object arrays each get a DataError instead of a graph error or a crash."""
    width = x.shape[1]
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(2, activation="softmax")])
    with pytest.raises(kerasfast.DataError, match=message):
        kerasfast.fit(model, x, Y, epochs=1, loss="sparse_categorical_crossentropy", run_dir=False, verbose=0)
