"""Memory and optimisation options of fit, each checked against real training."""

import itertools
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import kerasfast
from kerasfast import costs
from kerasfast.training.schedules import OneCycle, warmup_cosine
from tests.helpers import TrainingProbe, small_convnet

QUIET = dict(run_dir=False, verbose=0, seed=0)


def _dense_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(10)])


def _flat_digits(digits, n=256):
    (x, y), _ = digits
    return x[:n].reshape(n, 64), y[:n]


def test_gradient_accumulation_equals_one_large_batch(digits):
    """4 accumulated steps of 16 samples give the same update as one step of 64 (SGD, float32)."""
    x, y = _flat_digits(digits)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    common = dict(loss=loss, precision="float32", shuffle=False, epochs=1, **QUIET)
    large = _dense_model()
    small = _dense_model()
    np.testing.assert_array_equal(large.get_weights()[0], small.get_weights()[0])
    # One optimizer per model, as Keras requires (an optimizer is built for one set of variables).
    kerasfast.fit(large, (x, y), batch_size=64, optimizer=keras.optimizers.SGD(0.5), **common)
    result_small = kerasfast.fit(small, (x, y), batch_size=16, grad_accum_steps=4,
                                 optimizer=keras.optimizers.SGD(0.5), **common)
    assert result_small.plan.effective_batch_size == 64
    assert result_small.plan.reasons["effective_batch_size"].startswith("16 x 4")
    assert result_small.plan.learning_rate == pytest.approx(0.5)
    for a, b in zip(large.get_weights(), small.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5)
    # Without accumulation the small-batch run takes 4x the updates and lands elsewhere.
    plain = _dense_model()
    kerasfast.fit(plain, (x, y), batch_size=16, optimizer=keras.optimizers.SGD(0.5), **common)
    assert not np.allclose(plain.get_weights()[0], large.get_weights()[0], atol=1e-3)


class _WithUnusedWeight(keras.layers.Layer):
    """A layer with a weight its output never uses (an unused pooler or head): it gets no gradient."""

    def build(self, shape):
        self.kernel = self.add_weight(shape=(shape[-1], 16), name="kernel")
        self.unused = self.add_weight(shape=(3,), initializer="ones", name="unused")

    def call(self, x):
        return keras.ops.tanh(x @ self.kernel)


def test_gradient_accumulation_leaves_a_weight_without_gradient_alone_as_keras_does(digits):
    x, y = _flat_digits(digits, 128)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def model():
        keras.utils.set_random_seed(3)
        return keras.Sequential([keras.Input((64,)), _WithUnusedWeight(), keras.layers.Dense(10)])

    expected = model()
    expected.compile(optimizer=keras.optimizers.AdamW(0.01, gradient_accumulation_steps=2), loss=loss)
    expected.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    trained = model()
    kerasfast.fit(trained, (x, y), batch_size=16, grad_accum_steps=2, optimizer=keras.optimizers.AdamW(0.01),
                  loss=loss, precision="float32", jit_compile=False, shuffle=False, epochs=1, **QUIET)
    np.testing.assert_array_equal(trained.layers[0].unused.numpy(), np.ones(3, "float32"))  # no weight decay either
    for a, b in zip(expected.get_weights(), trained.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


_UNUSED_WEIGHT_UNDER_MIRRORED = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import kerasfast

    class WithUnusedWeight(keras.layers.Layer):
        def build(self, shape):
            self.kernel = self.add_weight(shape=(shape[-1], 4), name="kernel")
            self.unused = self.add_weight(shape=(3,), initializer="ones", name="unused")

        def call(self, x):
            return x @ self.kernel

    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    results = {}
    for strategy in ("none", "mirrored"):
        for accumulate in (1, 2):
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((8,)), WithUnusedWeight(), keras.layers.Dense(1)])
            kerasfast.fit(model, x, x[:, :1], loss="mse", optimizer=keras.optimizers.SGD(0.1), strategy=strategy,
                          clipnorm=0.5, grad_accum_steps=accumulate, batch_size=16, shuffle=False, epochs=1,
                          precision="float32", jit_compile=False, tune="off", run_dir=False, verbose=0)
            results[f"{strategy}/{accumulate}"] = [w.tolist() for w in model.get_weights()]
    json.dump(results, open(sys.argv[1], "w"))
    """
)


def test_a_weight_without_gradient_under_mirrored_with_clipping_and_accumulation(tmp_path):
    # The summed-then-clipped gradient of several replicas (fit's clipnorm=) all-reduced a None (was
    # "None values not supported"); both replicas together train as one does.
    out = tmp_path / "weights.json"
    done = subprocess.run([sys.executable, "-c", _UNUSED_WEIGHT_UNDER_MIRRORED, str(out)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    for accumulate in (1, 2):
        one, two = results[f"none/{accumulate}"], results[f"mirrored/{accumulate}"]
        assert two[1] == [1.0, 1.0, 1.0]
        for a, b in zip(one, two, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6, err_msg=f"grad_accum_steps={accumulate}")


def test_gradient_accumulation_with_mixed_float16(digits):
    x, y = _flat_digits(digits)
    result = kerasfast.fit(_dense_model(), (x, y), batch_size=16, grad_accum_steps=4, precision="mixed_float16",
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), epochs=3, **QUIET)
    optimizer = result.train_model.optimizer
    # Loss scaling wraps the optimizer for the run only: the model keeps the one it was compiled with.
    assert isinstance(optimizer, keras.optimizers.AdamW)
    # 256 samples / 16 = 16 steps per epoch, 3 epochs, one update per 4 steps.
    assert int(optimizer.iterations) == 3 * 16 // 4
    assert result.history.history["loss"][-1] < result.history.history["loss"][0]


def test_clipnorm_bounds_each_update(digits):
    x, y = _flat_digits(digits, 64)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def one_step(clipnorm):
        model = _dense_model()
        before = [w.copy() for w in model.get_weights()]
        kerasfast.fit(model, (x, y), batch_size=64, epochs=1, loss=loss, optimizer=keras.optimizers.SGD(1.0),
                      precision="float32", clipnorm=clipnorm, **QUIET)
        delta = [a - b for a, b in zip(model.get_weights(), before, strict=True)]
        return float(np.sqrt(sum(np.sum(d**2) for d in delta)))

    unclipped = one_step(None)
    clipped = one_step(0.01)
    assert unclipped > 0.05
    assert clipped == pytest.approx(0.01, rel=1e-3)  # SGD lr=1: the update is the clipped gradient


def test_remat_recomputes_activations_and_trains_the_same(digits):
    x, y = _flat_digits(digits)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    common = dict(batch_size=32, epochs=2, loss=loss, precision="float32", shuffle=False, **QUIET)
    probe = TrainingProbe()
    plain = kerasfast.fit(_dense_model(), (x, y), optimizer=keras.optimizers.SGD(0.1), **common)
    remat = kerasfast.fit(_dense_model(), (x, y), remat=True, optimizer=keras.optimizers.SGD(0.1),
                          callbacks=[probe], **common)
    assert remat.plan.remat == "activations"
    assert probe.seen["remat"][0] == "activations"  # while training
    assert getattr(remat.model.layers[0], "_remat_mode", None) is None  # given back as it was
    assert getattr(plain.train_model.layers[0], "_remat_mode", None) is None
    np.testing.assert_allclose(remat.history.history["loss"], plain.history.history["loss"], rtol=1e-5)


def test_xla_on_a_single_cpu_device_trains(digits):
    (x, y), _ = digits
    result = kerasfast.fit(small_convnet(), (x, y), jit_compile=True, batch_size=64, epochs=2,
                           loss="sparse_categorical_crossentropy", precision="float32", **QUIET)
    assert result.plan.jit_compile is True and result.plan.reasons["jit_compile"] == "requested"
    # The model keeps its own compile settings afterwards.
    assert result.model.jit_compile is False
    assert result.history.history["loss"][-1] < result.history.history["loss"][0]


def test_steps_per_execution_is_passed_to_keras(digits):
    (x, y), _ = digits
    probe = TrainingProbe()
    result = kerasfast.fit(small_convnet(), (x, y), batch_size=64, steps_per_execution=7, epochs=1,
                           loss="sparse_categorical_crossentropy", callbacks=[probe], **QUIET)
    assert result.plan.steps_per_execution == 7 and probe.seen["steps_per_execution"] == 7
    assert result.model.steps_per_execution == 1  # the model's own compile setting, given back
    # The epoch is exactly one pass (23 steps), not rounded up to a multiple of 7.
    assert result.plan.steps_per_epoch == int(np.ceil(len(x) / 64))


def test_default_optimizer_is_adamw_with_warmup_cosine(digits):
    (x, y), _ = digits
    rates = []
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: rates.append(
        float(model.optimizer.learning_rate)))
    model = small_convnet()
    result = kerasfast.fit(model, (x, y), batch_size=64, epochs=2, loss="sparse_categorical_crossentropy",
                           callbacks=[record], **QUIET)
    plan = result.plan
    assert plan.optimizer == "AdamW" and plan.lr_schedule == "warmup_cosine"
    optimizer = result.train_model.optimizer
    assert isinstance(optimizer, keras.optimizers.AdamW)
    steps = int(np.ceil(len(x) / 64)) * 2
    assert plan.total_steps == steps and plan.warmup_steps == max(1, int(steps * 0.05))
    # At the end of the run the cosine has decayed the learning rate to ~0; the
    # optimizer then keeps the peak as a constant, for a later fit.
    assert len(rates) == 2 and rates[-1] < 0.01 * plan.learning_rate
    assert float(optimizer.learning_rate) == pytest.approx(plan.learning_rate)


def test_user_optimizer_with_a_requested_schedule(digits):
    (x, y), _ = digits
    result = kerasfast.fit(small_convnet(), (x, y), batch_size=64, epochs=1, optimizer=keras.optimizers.SGD(0.05),
                           lr_schedule="one_cycle", loss="sparse_categorical_crossentropy", **QUIET)
    assert result.plan.optimizer == "SGD" and result.plan.learning_rate == pytest.approx(0.05)
    assert isinstance(result.train_model.optimizer.inner_optimizer
                      if isinstance(result.train_model.optimizer, keras.optimizers.LossScaleOptimizer)
                      else result.train_model.optimizer, keras.optimizers.SGD)


def test_warmup_cosine_schedule_values():
    schedule = warmup_cosine(1e-3, total_steps=100, warmup_steps=10)
    assert float(schedule(0)) == pytest.approx(0.0)
    assert float(schedule(5)) == pytest.approx(5e-4)
    assert float(schedule(10)) == pytest.approx(1e-3)
    assert float(schedule(55)) == pytest.approx(5e-4, rel=1e-3)
    assert float(schedule(100)) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="warmup_steps"):
        warmup_cosine(1e-3, total_steps=10, warmup_steps=10)


def test_one_cycle_schedule_values_and_serialisation():
    schedule = OneCycle(0.1, total_steps=100, pct_start=0.3)
    values = [float(schedule(step)) for step in range(101)]
    assert values[0] == pytest.approx(0.1 / 25)
    assert max(values) == pytest.approx(0.1) and int(np.argmax(values)) == 30
    assert values[-1] == pytest.approx(0.1 / 25 / 1e4, rel=1e-3)  # PyTorch's and optax's convention
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(values[:31]))  # rising
    assert all(a >= b - 1e-9 for a, b in itertools.pairwise(values[30:]))  # falling
    restored = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert float(restored(42)) == pytest.approx(float(schedule(42)))


def test_forward_flops_are_counted():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    # 2*4*3 + 3 bias adds + 2*3*2 + 2 bias adds
    assert costs.forward_flops_per_sample(model, (4,)) == 24 + 3 + 12 + 2
    assert costs.forward_flops_per_sample(model, (None,)) is None


def test_einsum_matmuls_count_as_their_matmul_forms():
    # TensorFlow's profiler counts no FLOPs for Einsum, the op of Keras's
    # dot_product_attention (so of every MultiHeadAttention) under TensorFlow.
    # Attention: scores (2*T*S*H per head) and the weighted sum, as with two batch matmuls.
    def attention(fused):
        q = keras.Input((5, 2, 8))

        def call(t):
            if fused:
                return keras.ops.dot_product_attention(t, t, t)
            heads = keras.ops.transpose(t, (0, 2, 1, 3))
            scores = keras.ops.matmul(heads, keras.ops.transpose(heads, (0, 1, 3, 2)))
            return keras.ops.matmul(keras.ops.softmax(scores), heads)

        return keras.Model(q, keras.layers.Lambda(call)(q))

    matmuls = 2 * (2 * 2 * 5 * 5 * 8)
    assert costs.forward_flops(attention(True), (5, 2, 8)).by_op_type["Einsum"] == matmuls
    assert costs.forward_flops(attention(False), (5, 2, 8)).by_op_type["BatchMatMulV2"] == matmuls
    inputs = keras.Input((5, 16))
    mha = keras.Model(inputs, keras.layers.MultiHeadAttention(2, 8)(inputs, inputs))
    assert costs.forward_flops(mha, (5, 16)).by_op_type["Einsum"] == matmuls


def test_threads_are_set_from_the_plan_when_tensorflow_has_not_started(tmp_path):
    script = textwrap.dedent(
        """
        import json, numpy as np, keras, kerasfast, tensorflow as tf
        x = np.random.rand(64, 4).astype("float32"); y = np.random.rand(64, 1).astype("float32")
        model = lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        result = kerasfast.fit(model, (x, y), loss="mse", intra_op_threads=1, run_dir=False, verbose=0)
        late = None
        try:
            kerasfast.fit(model, (x, y), loss="mse", intra_op_threads=2, run_dir=False, verbose=0)
        except kerasfast.PlanError as error:
            late = str(error)
        print(json.dumps({
            "plan": [result.plan.intra_op_threads, result.plan.inter_op_threads],
            "tf": [tf.config.threading.get_intra_op_parallelism_threads(),
                   tf.config.threading.get_inter_op_parallelism_threads()],
            "late": late,
        }))
        """
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                            check=True).stdout
    report = json.loads(output.strip().splitlines()[-1])
    cores = kerasfast.detect_hardware().cpu_cores
    assert report["plan"] == [1, min(2, cores)]
    assert report["tf"] == report["plan"]
    assert "configure_threads" in report["late"]


def test_configure_threads_after_start_raises():
    import tensorflow as tf

    tf.constant(1.0)  # TensorFlow is running in the test process
    with pytest.raises(RuntimeError, match="top of the script"):
        kerasfast.configure_threads()


@pytest.mark.parametrize("optimizer, option, message", [
    (lambda: keras.optimizers.SGD(0.5, clipvalue=1e-3), {"clipnorm": 10.0},
     r"clipnorm=10\.0 clips the gradient's global norm, but the optimizer 'sgd(_\d+)?' clips it already \(clipvalue=0\.001\)"),
    (lambda: keras.optimizers.Adam(gradient_accumulation_steps=2), {"grad_accum_steps": 2},
     r"grad_accum_steps=2 accumulates gradients, and the optimizer 'adam(_\d+)?' does too \(gradient_accumulation_steps=2\): "
     r"together they would update every 4 steps"),
])
def test_fits_clipping_or_accumulation_beside_the_optimizers_own_is_refused_before_training(digits, optimizer, option,
                                                                                          message):
    # Was: fit's clipnorm silently replaced the optimizer's clipvalue for the run; the two accumulations multiplied.
    x, y = _flat_digits(digits, 64)
    model = _dense_model()
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(kerasfast.PlanError, match=message):
        kerasfast.fit(model, (x, y), batch_size=16, optimizer=optimizer(), loss="sparse_categorical_crossentropy",
                      precision="float32", **option, **QUIET)
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
