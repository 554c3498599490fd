"""One test per Keras/TensorFlow internal in `kerasfast/_compat.py`: each
fails when upstream renames, moves or changes what kerasfast relies on."""

import json
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasfast import _compat


def _functional():
    inputs = keras.Input((4,), name="features")
    hidden = keras.Sequential([keras.layers.Dense(3, name="inner")], name="block")(inputs)
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden))


class _OwnStep(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        return super().train_step(data)


def test_the_installed_keras_and_tensorflow_are_the_checked_versions():
    _compat.check_versions()
    assert _compat.version_supported("3.15.1", ("3.15",)) and _compat.version_supported("3.15", ("3.15",))
    assert not _compat.version_supported("3.16.0", ("3.15",)) and not _compat.version_supported("3.150.0", ("3.15",))


def test_build_state_creates_model_metric_and_optimizer_variables():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    assert not model.optimizer.built
    _compat.build_state(model, (np.zeros((2, 4), "float32"), np.zeros((2, 2), "float32")))
    assert model.optimizer.built and len(model.optimizer.variables) > 1
    assert {v.path for v in model.metrics_variables} >= {"loss/total", "loss/count", "mean_absolute_error/total"}


def test_the_creation_strategy_can_be_read_detached_and_put_back():
    strategy = tf.distribute.MirroredStrategy(["CPU:0"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
    assert _compat.creation_strategy(model) is strategy
    assert _compat.optimizer_strategy(optimizer) is strategy
    assert _compat.optimizer_strategy(keras.optimizers.SGD(0.1)) is tf.distribute.get_strategy()  # the default
    _compat.detach_from_creation_strategy(model)
    assert _compat.creation_strategy(model) is None
    _compat.attach_strategy(model, strategy)
    assert _compat.creation_strategy(model) is strategy
    assert not _compat.is_multi_worker(strategy)


def test_the_loss_tracker_is_the_mean_behind_the_logged_loss():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    assert _compat.loss_tracker(model) is None
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 4), "float32"), np.zeros((8, 1), "float32")
    logs = model.fit(x, y, batch_size=8, epochs=1, verbose=0).history
    tracker = _compat.loss_tracker(model)
    assert isinstance(tracker, keras.metrics.Mean)
    assert float(tracker.result()) == pytest.approx(logs["loss"][0])
    assert float(_compat.unscale_loss_for_distribution(tf.constant(2.5))) == 2.5  # one replica: unchanged


def test_training_argument_and_overridden_steps_are_seen():
    assert _compat.call_has_training_arg(keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.5)]))
    own = _OwnStep()
    assert not _compat.call_has_training_arg(own)
    assert _compat.overridden_step(own, "train_step") == "_OwnStep.train_step"
    assert _compat.overridden_step(own, "test_step") is None
    assert _compat.overridden_step(_functional(), "train_step") is None


def test_compile_config_keeps_the_users_own_objects():
    def my_loss(y_true, y_pred):  # not registered: the public get_compile_config would lose it
        return keras.ops.mean(keras.ops.abs(y_true - y_pred))

    model = _functional()
    assert _compat.compile_config(model) == {}
    optimizer = keras.optimizers.Adam(3e-4)
    model.compile(optimizer=optimizer, loss=my_loss, metrics=["mae"])
    config = _compat.compile_config(model)
    assert config["loss"] is my_loss and config["optimizer"] is optimizer and config["metrics"] == ["mae"]


def test_compile_sets_only_the_attributes_kerasfast_puts_back():
    model = _functional()
    before = set(model.__dict__)
    model.compile(optimizer="adam", loss="mse")
    assert set(model.__dict__) - before <= set(_compat.COMPILE_STATE)
    for name in _compat.CHECKPOINT_DEPENDENCY_STATE:
        assert name in model.__dict__


def test_layer_walk_producing_layer_and_functional_class():
    model = _functional()
    names = [layer.name for layer in _compat.flatten_layers(model)]
    assert {"inner", "block", "head"} <= set(names) and model.name not in names
    assert [layer.name for layer in _compat.flatten_layers(model, include_self=True)][0] == model.name
    assert "inner" not in [layer.name for layer in _compat.flatten_layers(model, recursive=False)]
    assert _compat.producing_layer_name(model.outputs[0]) == "head"
    assert _compat.producing_layer_name(tf.constant(1.0)) is None
    assert _compat.is_plain_functional(model)
    assert not _compat.is_plain_functional(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    assert not _compat.is_plain_functional(_OwnStep())


def test_remat_mode_is_read_and_set_per_layer():
    with keras.RematScope(mode="full"):
        layer = keras.layers.Dense(2)
    assert _compat.get_remat(layer) == _compat.remat_mode("full")
    plain = keras.layers.Dense(2)
    assert _compat.get_remat(plain) is None
    _compat.set_remat(plain, _compat.remat_mode("activations"))
    assert _compat.get_remat(plain).mode == "activations"


def test_keras_data_helpers():
    x, y = np.arange(10.0).reshape(10, 1), np.arange(10)
    (train_x, train_y), (val_x, val_y) = _compat.train_validation_split((x, y), validation_split=0.2)
    np.testing.assert_array_equal(val_y, [8, 9])  # the last samples, as Keras's fit takes them
    assert len(train_x) == 8
    assert _compat.can_convert_arrays((x, y)) and not _compat.can_convert_arrays(iter([x]))

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return np.full((2, 1), index, "float32"), np.zeros((2,), "float32")

    adapter = _compat.data_adapter(Batches())
    np.testing.assert_array_equal(_compat.first_batch(adapter)[0], np.zeros((2, 1)))

    def generator():
        while True:
            yield np.ones((3, 1), "float32"), np.zeros((3,), "float32")

    adapter = _compat.data_adapter(generator())
    assert _compat.first_batch(adapter)[0].shape == (3, 1)
    converted = _compat.tensors([np.ones(2), [np.zeros(1)]])
    assert isinstance(converted, tuple) and isinstance(converted[1], tuple) and tf.is_tensor(converted[0])


def test_kerases_tf2onnx_patch_is_where_kerasfast_looks():
    import importlib.util

    assert importlib.util.find_spec("keras.src.export.tf2onnx_lib") is not None
    assert callable(__import__("keras.src.export.tf2onnx_lib", fromlist=["patch_tf2onnx"]).patch_tf2onnx)


def test_runtime_start_and_op_determinism_are_read_in_a_fresh_process():
    script = textwrap.dedent("""
        import json
        import tensorflow as tf
        from kerasfast import _compat
        seen = [_compat.runtime_started(), _compat.op_determinism_enabled()]
        tf.config.experimental.enable_op_determinism()
        tf.constant(1.0) + 1.0
        seen += [_compat.runtime_started(), _compat.op_determinism_enabled()]
        print(json.dumps(seen))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [False, False, True, True]


def test_the_profiler_counts_float_operations():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    graph = tf.function(lambda x: model(x)).get_concrete_function(tf.TensorSpec((1, 4), tf.float32)).graph
    profile = _compat.profile_float_operations(graph)
    assert int(profile.total_float_ops) == 18  # 2*4*2 multiply-adds, 2 bias adds
    assert any(child.float_ops for child in profile.children)


def test_freezing_folds_variables_into_constants():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    function = tf.function(lambda x: model(x)).get_concrete_function(tf.TensorSpec((None, 4), tf.float32))
    frozen = _compat.freeze(function)
    op_types = {op.type for op in frozen.graph.get_operations()}
    assert not op_types & {"VarHandleOp", "ReadVariableOp"}
    x = np.ones((3, 4), "float32")
    np.testing.assert_allclose(frozen(tf.constant(x))[0] if isinstance(frozen(tf.constant(x)), list)
                               else frozen(tf.constant(x)), model(x), rtol=1e-6)


def test_the_optimizers_learning_rate_store_can_be_swapped_and_put_back():
    optimizer = keras.optimizers.Adam(1e-3)
    store = _compat.learning_rate_store(optimizer)
    assert float(keras.ops.convert_to_numpy(store)) == pytest.approx(1e-3)
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-2, decay_steps=10, decay_rate=0.5)
    _compat.set_learning_rate_store(optimizer, schedule)
    assert float(optimizer.learning_rate) == pytest.approx(1e-2)  # read through the schedule at step 0
    _compat.set_learning_rate_store(optimizer, store)
    assert float(optimizer.learning_rate) == pytest.approx(1e-3)


def test_added_losses_weight_variables_and_variable_strategy():
    class Regularised(keras.layers.Layer):
        def call(self, x):
            self.add_loss(keras.ops.sum(x))
            return x

    model = keras.Sequential([keras.Input((4,)), Regularised(), keras.layers.Dense(2, name="dense")])
    model(np.ones((1, 4), "float32"))
    assert _compat.layers_add_losses(model)
    assert not _compat.layers_add_losses(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    dense = model.get_layer("dense")
    dense.enable_lora(2)
    assert _compat.weight_variable(dense, "kernel") is not None
    assert tuple(_compat.weight_variable(dense, "kernel").shape) == (4, 2)
    assert not isinstance(dense.kernel, keras.Variable)  # the public property is the computed kernel + A @ B
    strategy = tf.distribute.MirroredStrategy(["CPU:0"])
    with strategy.scope():
        variable = keras.Variable(np.zeros(2, "float32"))
    assert _compat.variable_strategy(variable) is strategy


def test_dataset_graph_and_data_service_private_api():
    import inspect

    from tensorflow.python.data.experimental.ops import data_service_ops

    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(_compat.serialized_dataset_graph(tf.data.Dataset.range(3).map(lambda v: v + 1)))
    assert any(node.op == "MapDataset" for node in graph.node)
    parameters = inspect.signature(data_service_ops._distribute).parameters
    assert {"processing_mode", "service", "task_refresh_interval_hint_ms"} <= set(parameters)


def test_a_data_service_server_can_be_stopped():
    service = tf.data.experimental.service
    server = service.DispatchServer(service.DispatcherConfig(port=0))
    _compat.stop_server(server)
    _compat.stop_server(server)  # stopping twice is harmless, as at a second Ctrl-C
