"""Dense layers traced in the form TensorFlow's oneDNN fuses, inside kerasfast's steps only."""

import threading

import keras
import numpy as np
import tensorflow as tf

import kerasfast
from kerasfast.plan import FUSED_DENSE_REASON
from kerasfast.training.fused_kernels import fused_dense

KERAS_DENSE_CALL = keras.layers.Dense.call


def _block():
    """A transformer MLP block: Dense layers on (batch, tokens, features) inputs."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 8))
    hidden = keras.layers.Dense(16, activation="gelu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(8)(hidden) + inputs)


def _consumers(model, x, producer_type):
    graph = tf.function(lambda x: model(x)).get_concrete_function(tf.TensorSpec(x.shape, x.dtype)).graph
    return {consumer.type for op in graph.get_operations() if op.type == producer_type
            for out in op.outputs for consumer in out.consumers()}


def test_inside_the_block_dense_on_3d_inputs_is_matmul_then_bias_add_with_the_same_values_and_gradients():
    model, x = _block(), np.random.default_rng(0).normal(size=(4, 6, 8)).astype("float32")
    assert _consumers(model, x, "MatMul") == {"Reshape"}  # Keras's own: tensordot (reshapes), then BiasAdd
    with fused_dense():
        assert _consumers(model, x, "MatMul") == {"BiasAdd"}  # the pair the oneDNN remapper fuses
        with tf.GradientTape() as tape:
            fused = model(x)
        fused_grads = tape.gradient(fused, model.trainable_weights)
    with tf.GradientTape() as tape:
        plain = model(x)
    plain_grads = tape.gradient(plain, model.trainable_weights)
    np.testing.assert_allclose(fused, plain, atol=1e-5)
    for a, b in zip(fused_grads, plain_grads, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)
    assert keras.layers.Dense.call is KERAS_DENSE_CALL  # Keras's own call is back


def test_another_thread_and_2d_inputs_and_subclasses_keep_keras_own_call():
    model, x = _block(), np.zeros((2, 6, 8), "float32")
    seen = {}

    class OwnCall(keras.layers.Dense):
        def call(self, inputs):
            return super().call(inputs) * 2.0

    with fused_dense():
        worker = threading.Thread(target=lambda: seen.update(consumers=_consumers(model, x, "MatMul")))
        worker.start()
        worker.join()
        flat = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Reshape((2, 2))])
        two_d = _consumers(flat, np.zeros((2, 8), "float32"), "MatMul")  # 2-D: Keras's own, fused already
        subclass = keras.Sequential([keras.Input((6, 8)), OwnCall(4)])
        sub = _consumers(subclass, x, "MatMul")
    assert seen["consumers"] == {"Reshape"}  # a callback's predict on another thread traces plain Keras
    assert two_d == {"BiasAdd"} and sub == {"Reshape"}


@keras.saving.register_keras_serializable(package="test_fused_kernels")
class GraphSpy(keras.layers.Layer):
    """Passes its input through, keeping the graphs it was traced in."""

    graphs = []

    def call(self, x):
        if not tf.executing_eagerly():
            GraphSpy.graphs.append(x.graph)
        return x


def test_fit_without_xla_trains_the_fused_form_and_says_so_leaving_keras_and_the_saved_model_alone(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(256, 6, 8)).astype("float32")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 8))
    model = keras.Model(inputs, GraphSpy()(keras.layers.Dense(8, activation="gelu")(inputs)))
    GraphSpy.graphs.clear()
    result = kerasfast.fit(model, (x, np.tanh(x)), epochs=2, batch_size=32, loss="mse", optimizer="adam",
                           jit_compile=False, tune="off", run_dir=False, verbose=0)
    assert result.history.history["loss"][-1] < result.history.history["loss"][0]
    step_graphs = [graph for graph in GraphSpy.graphs if any(op.type == "AssignVariableOp"
                                                             for op in graph.get_operations())] or GraphSpy.graphs
    matmul_consumers = {consumer.type for graph in step_graphs for op in graph.get_operations()
                        if op.type == "MatMul" and "dense" in op.name and "gradient" not in op.name
                        for consumer in op.outputs[0].consumers()}
    assert matmul_consumers == {"BiasAdd"}, matmul_consumers  # the train step's forward pass
    assert FUSED_DENSE_REASON in result.plan.reason("jit_compile") and FUSED_DENSE_REASON in str(result.plan)
    assert keras.layers.Dense.call is KERAS_DENSE_CALL
    path = tmp_path / "model.keras"
    model.save(path)
    np.testing.assert_allclose(keras.models.load_model(path).predict(x[:8], verbose=0),
                               model.predict(x[:8], verbose=0), atol=1e-6)
    with_xla = kerasfast.fit(_block(), (x, np.tanh(x)), epochs=1, batch_size=32, loss="mse", optimizer="adam",
                             jit_compile=True, tune="off", run_dir=False, verbose=0)
    assert FUSED_DENSE_REASON not in with_xla.plan.reason("jit_compile")  # XLA fuses on its own


def test_the_fused_form_trains_to_the_weights_of_keras_own():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(128, 6, 8)).astype("float32")
    weights = []
    for fused in (True, False):
        model = _block()
        model.compile(keras.optimizers.SGD(0.05), "mse")
        with fused_dense(fused):  # Keras's train function is traced on its first call: inside the block
            model.fit(x, np.tanh(x), batch_size=32, epochs=2, verbose=0, shuffle=False)
        weights.append([w.numpy() for w in model.weights])
    for fused, plain in zip(*weights, strict=True):
        np.testing.assert_allclose(fused, plain, atol=1e-5)
