"""Any Keras 3 model trains through kerasfast.fit and stays usable afterwards."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasfast
from tests.helpers import TrainingProbe, small_convnet

FIT = dict(epochs=3, batch_size=64, run_dir=False, verbose=0, seed=0)


def functional_model():
    inputs = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="probabilities")(x)
    return keras.Model(inputs, outputs, name="functional_digits")


@keras.saving.register_keras_serializable(package="kerasfast_tests")
class SubclassedModel(keras.Model):
    def __init__(self, units=32, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.flatten = keras.layers.Flatten()
        self.hidden = keras.layers.Dense(units, activation="relu")
        self.classifier = keras.layers.Dense(10, activation="softmax")

    def call(self, inputs):
        return self.classifier(self.hidden(self.flatten(inputs)))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


class UnclonableModel(keras.Model):
    """Takes a layer object in __init__, so it cannot be rebuilt from a config."""

    def __init__(self, head):
        super().__init__()
        self.flatten = keras.layers.Flatten()
        self.head = head

    def call(self, inputs):
        return self.head(self.flatten(inputs))


class BatchCounter(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs_seen = 0
        self.batches_seen = 0

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_seen += 1

    def on_train_batch_end(self, batch, logs=None):
        self.batches_seen += 1


def _accuracy(model, digits):
    _, (x_test, y_test) = digits
    predictions = np.argmax(keras.ops.convert_to_numpy(model.predict(x_test, verbose=0)), axis=-1)
    return float(np.mean(predictions == y_test))


@pytest.mark.parametrize("build", [small_convnet, functional_model, SubclassedModel], ids=["sequential", "functional", "subclassed"])
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "uncompiled"])
def test_model_kinds_train_in_place_for_the_user(digits, build, compiled):
    (x, y), _ = digits
    model = build()
    if compiled:
        model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
        options = {}
    else:
        options = dict(loss="sparse_categorical_crossentropy", metrics=["accuracy"], learning_rate=3e-3)
    counter = BatchCounter()
    before = [w.copy() for w in model.get_weights()] if model.built else None
    result = kerasfast.fit(model, (x, y), callbacks=[counter], **FIT, **options)
    assert result.model is model
    assert counter.epochs_seen == 3 and counter.batches_seen >= 3
    if before is not None:
        assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
    # The user's object holds the trained weights: it predicts well on its own.
    assert _accuracy(model, digits) > 0.7
    _, (x_test, y_test) = digits
    evaluated = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
    assert evaluated["accuracy"] > 0.7
    for a, b in zip(model.get_weights(), result.train_model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert keras.config.dtype_policy().name == "float32"
    assert result.history.history["loss"][-1] < result.history.history["loss"][0]


def test_builder_callable_trains_under_the_plan_precision(digits):
    (x, y), _ = digits
    probe = TrainingProbe()
    result = kerasfast.fit(functional_model, (x, y), loss="sparse_categorical_crossentropy",
                           precision="mixed_bfloat16", learning_rate=3e-3, callbacks=[probe], **FIT)
    model = result.model
    assert model is result.train_model
    assert probe.seen["compute_dtypes"][1] == "bfloat16"  # while training
    assert model.layers[1].compute_dtype == "float32"  # a plain float32 model afterwards
    assert "built by your function" in result.model_preparation
    assert _accuracy(model, digits) > 0.5
    assert keras.config.dtype_policy().name == "float32"


def test_model_already_under_the_plan_policy_trains_in_place(digits):
    (x, y), _ = digits
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = small_convnet()
    keras.config.set_dtype_policy("float32")
    result = kerasfast.fit(model, (x, y), loss="sparse_categorical_crossentropy", precision="mixed_bfloat16", **FIT)
    assert result.train_model is model
    assert "in place" in result.model_preparation


def test_float32_plan_trains_a_mixed_model_in_float32_and_gives_it_back_mixed(digits):
    (x, y), _ = digits
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = small_convnet()
    keras.config.set_dtype_policy("float32")
    probe = TrainingProbe()
    result = kerasfast.fit(model, (x, y), loss="sparse_categorical_crossentropy", precision="float32",
                           callbacks=[probe], **FIT)
    assert result.train_model is model
    assert set(probe.seen["compute_dtypes"]) == {"float32"}
    assert model.layers[0].compute_dtype == "bfloat16"


def test_unclonable_subclassed_model_trains_in_place_under_any_precision(digits):
    (x, y), _ = digits
    # No rebuild is needed any more: the layers' policies switch in place.
    model = UnclonableModel(keras.layers.Dense(10, activation="softmax"))
    result = kerasfast.fit(model, (x, y), loss="sparse_categorical_crossentropy", precision="mixed_bfloat16", **FIT)
    assert result.train_model is model and model.head.compute_dtype == "float32"
    assert result.history.history["loss"][-1] < result.history.history["loss"][0]
    # And through a builder.
    result = kerasfast.fit(lambda: UnclonableModel(keras.layers.Dense(10, activation="softmax")), (x, y),
                           loss="sparse_categorical_crossentropy", precision="mixed_bfloat16", **FIT)
    assert result.plan.precision == "mixed_bfloat16"


def test_tf_data_dataset_input(digits):
    import tensorflow as tf

    (x, y), (x_test, y_test) = digits
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2000, seed=0).batch(50)
    validation = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(50)
    result = kerasfast.fit(small_convnet(), dataset, validation_data=validation,
                           loss="sparse_categorical_crossentropy", metrics=["accuracy"], learning_rate=3e-3,
                           epochs=3, run_dir=False, verbose=0)
    assert result.plan.global_batch_size == 50
    assert result.plan.reasons["global_batch_size"] == "50: set by the dataset"
    assert "val_accuracy" in result.history.history
    assert result.history.history["val_accuracy"][-1] > 0.5


def test_run_folder_holds_plan_history_and_model(digits, tmp_path):
    import json

    (x, y), _ = digits
    result = kerasfast.fit(small_convnet(), (x, y), loss="sparse_categorical_crossentropy",
                           epochs=2, batch_size=64, run_dir=tmp_path / "run", verbose=0)
    folder = tmp_path / "run"
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["fields"]["precision"]["value"] == result.plan.precision
    assert plan["fields"]["global_batch_size"]["source"] == "user"
    assert plan["hardware"]["cpu_cores"] >= 1
    history = json.loads((folder / "history.json").read_text())
    assert len(history["loss"]) == 2
    summary = json.loads((folder / "result.json").read_text())
    assert summary["throughput"]["samples_per_second"] > 0
    reloaded = keras.saving.load_model(folder / "model.keras")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(reloaded(x[:8])), keras.ops.convert_to_numpy(result.train_model(x[:8])), atol=1e-6
    )
    assert not list(folder.glob(".*tmp*"))


def test_throughput_is_measured_after_the_first_execution(digits):
    (x, y), _ = digits
    result = kerasfast.fit(small_convnet(), (x, y), loss="sparse_categorical_crossentropy",
                           epochs=3, batch_size=64, steps_per_execution=1, run_dir=False, verbose=0)
    throughput = result.throughput
    steps_per_epoch = int(np.ceil(len(x) / 64))
    assert throughput.measured_steps == 3 * steps_per_epoch - 1  # all but the first, compiling step
    assert throughput.samples_per_second > 0 and throughput.steps_per_second > 0
    assert throughput.first_execution_s > 0
    # Samples are counted exactly: the last batch of each epoch is partial.
    expected_samples = 3 * len(x) - 64
    assert throughput.samples_per_second * throughput.measured_seconds == pytest.approx(expected_samples)


def test_a_model_rebuilt_for_a_strategy_goes_on_from_its_optimizers_state(digits):
    """A model created outside the strategy's scope trains as a rebuilt copy;
    a second fit goes on from the optimizer state the first left in the
    user's model (step count and moments), as model.fit does."""
    (x, y), _ = digits
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    options = dict(epochs=1, batch_size=64, tune="off", run_dir=False, verbose=0)

    def trained_twice(**strategy_option):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
        model.compile(keras.optimizers.Adam(1e-2),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        for _ in range(2):
            result = kerasfast.fit(model, (x, y), **options, **strategy_option)
        return model, result

    model, result = trained_twice(strategy=strategy)
    assert result.model_preparation.startswith("rebuilt in the strategy's scope")
    steps = -(-len(x) // 64)
    assert int(model.optimizer.iterations) == 2 * steps
    alone, _ = trained_twice(strategy="none")
    for a, b in zip(model.get_weights(), alone.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


class _ReadsValues(keras.layers.Layer):
    """Reads its input's values, which only an eager tensor has (why a model is compiled run_eagerly)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.means = []

    def call(self, x):
        if isinstance(x, tf.Tensor):  # not the KerasTensor of Sequential's own build
            self.means.append(float(x.numpy().mean()))
        return x

    def compute_output_shape(self, shape):
        return shape


def test_an_eager_model_whose_layer_reads_values_trains_as_in_keras():
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    y = x[:, :1]
    histories, means = [], []
    for train in ("keras", "kerasfast"):
        keras.utils.set_random_seed(0)
        reads = _ReadsValues()
        model = keras.Sequential([keras.Input((8,)), reads, keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse", run_eagerly=True)
        if train == "keras":
            history = model.fit(x, y, epochs=1, batch_size=32, shuffle=False, verbose=0)
        else:
            history = kerasfast.fit(model, x, y, epochs=1, batch_size=32, shuffle=False, run_dir=False, verbose=0,
                                    tune="off")
        histories.append(history.history["loss"])
        means.append(reads.means)
    assert means[1] == pytest.approx(means[0]) and len(means[1]) == 2
    np.testing.assert_allclose(histories[1], histories[0], rtol=1e-5)


_CREATED_UNDER_MIRRORED = textwrap.dedent(
    """
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import kerasfast
    from kerasfast.errors import ModelError

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 8)).astype("float32"), rng.integers(0, 2, 64)
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        subclassed = Subclassed()
    before = model.get_weights()[0].copy()
    options = dict(epochs=1, batch_size=16, strategy="none", loss="sparse_categorical_crossentropy", run_dir=False,
                   verbose=0, tune="off")
    result = kerasfast.fit(model, x, y, **options)
    assert np.isfinite(result.history["loss"][0]) and not np.allclose(model.get_weights()[0], before)
    try:
        kerasfast.fit(subclassed, x, y, **options)
    except ModelError as error:
        print("refused:", error)
    """
)


_COMPILED_UNDER_THE_USERS_MIRRORED = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import kerasfast

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(256, 8)).astype("float32"), rng.integers(0, 2, 256)
    users = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def compiled():
        keras.utils.set_random_seed(3)
        with users.scope():
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                                      keras.layers.Dense(2)])
            model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    losses = {"keras": compiled().fit(x, y, epochs=2, batch_size=32, shuffle=False, verbose=0).history["loss"]}
    for name, strategy in (("mirrored", "mirrored"), ("another", tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))):
        model = compiled()
        result = kerasfast.fit(model, x, y, epochs=2, batch_size=32, shuffle=False, strategy=strategy,
                               steps_per_execution=1, tune="off", run_dir=False, verbose=0)
        losses[name] = result.history.history["loss"]
        losses[name + "_updates"] = int(model.optimizer.iterations.numpy())

    class Subclassed(keras.Model):  # no build() of its own: model.build() leaves its layers unbuilt
        def __init__(self):
            super().__init__()
            self.hidden, self.out = keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(2)

        def call(self, x):
            return self.out(self.hidden(x))

    def built_by_shape():
        keras.utils.set_random_seed(3)
        with users.scope():
            model = Subclassed()
            model.build((None, 8))
            model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    losses["keras_built_by_shape"] = built_by_shape().fit(x, y, epochs=2, batch_size=32, shuffle=False,
                                                          verbose=0).history["loss"]
    result = kerasfast.fit(built_by_shape(), x, y, epochs=2, batch_size=32, shuffle=False, steps_per_execution=1,
                           tune="off", run_dir=False, verbose=0)
    losses["built_by_shape"] = result.history.history["loss"]
    json.dump(losses, open(sys.argv[1], "w"))
    """
)


def test_a_model_compiled_under_the_users_mirrored_strategy_trains_under_kerasfasts(tmp_path):
    # The copy kerasfast trains under its strategy reads the user's optimizer, made under theirs
    # (was "Mixing different tf.distribute.Strategy objects"); a model whose layers model.build() left
    # unbuilt is built in the strategy's scope (was an AssertionError in the first step).
    out = tmp_path / "losses.json"
    done = subprocess.run([sys.executable, "-c", _COMPILED_UNDER_THE_USERS_MIRRORED, str(out)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    losses = json.loads(out.read_text())
    for name in ("mirrored", "another"):
        np.testing.assert_allclose(losses[name], losses["keras"], rtol=1e-6, err_msg=name)
        assert losses[name + "_updates"] == 16  # the user's own optimizer holds the trained state
    # A subclassed model given its input shape by model.build(), under the strategy it was made in.
    np.testing.assert_allclose(losses["built_by_shape"], losses["keras_built_by_shape"], rtol=1e-6)


def test_a_model_created_in_a_strategys_scope_trains_with_no_strategy_or_is_refused_naming_it():
    done = subprocess.run([sys.executable, "-c", _CREATED_UNDER_MIRRORED], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused: model 'subclassed' (Subclassed) was created in a MirroredStrategy's scope" in done.stdout
    assert "strategy='none'" in done.stdout
