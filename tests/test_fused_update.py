"""Adam's fused update (`kerasfast.training.optimizers.fused_update`): the same
values as Keras's own `update_step`, from far fewer graph ops, on one device
and under MirroredStrategy; other optimizers are left alone."""

import contextlib
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
from kerasfast.training.optimizers import fused_update, fuses_update


def _model():
    """Token ids -> class: an Embedding (sparse gradients), a Dense on 3-D input and a classifier."""
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((6,), dtype="int32"),
        keras.layers.Embedding(50, 8),
        keras.layers.Dense(16, activation="gelu"),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(3),
    ])


def _data():
    rng = np.random.default_rng(0)
    return rng.integers(0, 50, (64, 6)).astype("int32"), rng.integers(0, 3, 64)


def _train(optimizer, fused: bool, steps: int = 6):
    """Weights, moments and the traced step's graph after `steps` updates by `optimizer`."""
    model, (x, y) = _model(), _data()
    optimizer.build(model.trainable_variables)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        optimizer.apply(tape.gradient(value, model.trainable_variables), model.trainable_variables)

    with fused_update(optimizer) if fused else contextlib.nullcontext():
        traced = tf.function(step)
        graph = traced.get_concrete_function(tf.constant(x[:16]), tf.constant(y[:16])).graph
        for i in range(steps):
            traced(tf.constant(x[i * 8:(i + 1) * 8 + 8]), tf.constant(y[i * 8:(i + 1) * 8 + 8]))
    op_types = [op.type for op in graph.get_operations()]
    return [w.numpy() for w in model.weights], [v.numpy() for v in optimizer.variables], op_types


# name -> (optimizer, weights updated by the fused op): the embedding's sparse gradient keeps Keras's
# update, unless clipping made it dense first.
OPTIMIZERS = {
    "Adam": (lambda: keras.optimizers.Adam(0.01), 4),
    "AdamW with a schedule and clipping": (lambda: keras.optimizers.AdamW(
        keras.optimizers.schedules.ExponentialDecay(0.01, 3, 0.5), weight_decay=0.05, global_clipnorm=0.5), 5),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_fused_update_computes_what_keras_adam_does_with_one_op_per_weight(name):
    make, fused_weights_count = OPTIMIZERS[name]
    weights, state, keras_ops = _train(make(), fused=False)
    fused_weights, fused_state, fused_ops = _train(make(), fused=True)
    for ours, theirs in zip(fused_weights + fused_state, weights + state, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=1e-6)
    assert not np.allclose(weights[0], _model().weights[0].numpy())  # it trained
    assert fused_ops.count("ResourceApplyAdam") == fused_weights_count
    assert keras_ops.count("ResourceApplyAdam") == 0
    # Keras's update builds ~25 graph ops per weight (moments, bias correction, step); the fused one ~5.
    assert len(keras_ops) - len(fused_ops) >= 15 * fused_weights_count, (len(fused_ops), len(keras_ops))


def test_only_kerass_own_adam_family_is_fused_and_the_optimizer_is_itself_again_after():
    class MyAdam(keras.optimizers.Adam):
        pass

    assert fuses_update(keras.optimizers.Adam())
    assert fuses_update(keras.optimizers.LossScaleOptimizer(keras.optimizers.AdamW()))
    assert not fuses_update(keras.optimizers.Adam(amsgrad=True))
    assert not fuses_update(MyAdam())  # a subclass may change the update
    assert not fuses_update(keras.optimizers.SGD())
    adam, sgd = keras.optimizers.Adam(), keras.optimizers.SGD()
    with fused_update(adam), fused_update(sgd):
        assert "update_step" in vars(adam) and "update_step" not in vars(sgd)
        with fused_update(adam):  # an inner block leaves the outer one's update in place
            pass
        assert "update_step" in vars(adam)
    assert "update_step" not in vars(adam)


def test_kerasfast_fit_names_the_fused_update_in_its_plan_and_leaves_the_users_optimizer_plain():
    model, (x, y) = _model(), _data()
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    reference = _model()
    reference.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    result = kerasfast.fit(model, x, y, batch_size=16, epochs=2, shuffle=False, run_dir=False, verbose=0,
                           jit_compile=False, precision="float32", tune="off")
    assert "one TensorFlow op (ResourceApplyAdam)" in result.plan.reasons["optimizer"]
    assert "update_step" not in vars(model.optimizer)
    for ours, theirs in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


_MIRRORED = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    from kerasfast.training.optimizers import fused_update

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 8)).astype("float32"), rng.integers(0, 3, 64)
    results = {}
    for fused in (False, True):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(3)])
            optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.05)
            optimizer.build(model.trainable_variables)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

        def replica_step(x, y):
            with tf.GradientTape() as tape:
                value = loss(y, model(x, training=True)) / 16.0
            optimizer.apply(tape.gradient(value, model.trainable_variables), model.trainable_variables)

        with fused_update(optimizer) if fused else strategy.scope():
            step = tf.function(lambda x, y: strategy.run(replica_step, args=(x, y)))
            data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(16))
            for batch in data:
                step(*batch)
        replicas = [[np.asarray(v).tolist() for v in w.value.values] for w in model.weights]
        results[str(fused)] = replicas
    json.dump(results, open(sys.argv[1], "w"))
    """
)


def test_the_fused_update_under_mirrored_strategy_matches_keras_on_every_replica(tmp_path):
    out = tmp_path / "weights.json"
    done = subprocess.run([sys.executable, "-c", _MIRRORED, str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    for keras_replicas, fused_replicas in zip(results["False"], results["True"], strict=True):
        assert len(fused_replicas) == 2
        np.testing.assert_array_equal(fused_replicas[0], fused_replicas[1])  # replicas stay in sync
        np.testing.assert_allclose(fused_replicas[0], keras_replicas[0], rtol=2e-5, atol=1e-6)
