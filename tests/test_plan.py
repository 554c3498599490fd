"""Plan resolution: auto choices, overrides, refusals and bad arguments."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasfast
from kerasfast.errors import DataError, PlanError
from kerasfast.hardware import GPU, Hardware
from kerasfast.plan import (DataFacts, ModelFacts, RunFacts, compute_dtype, keras_policy, resolve_plan,
                            resolve_precision)
from kerasfast.training.facts import model_facts
from kerasfast.training.inputs import prepare_data
from tests.helpers import small_convnet

CPU_BF16 = Hardware(cpu_cores=2, cpu_flags=("avx2", "avx512f", "avx512_bf16"))
CPU_PLAIN = Hardware(cpu_cores=8, cpu_flags=("avx2", "fma"))
FIT = dict(epochs=1, batch_size=64, run_dir=False, verbose=0, loss="sparse_categorical_crossentropy")


@pytest.mark.parametrize(
    "hardware, expected",
    [
        (CPU_BF16, "onednn_bfloat16"),
        (Hardware(cpu_flags=("amx_bf16",)), "onednn_bfloat16"),
        (CPU_PLAIN, "float32"),
        (Hardware(gpus=(GPU("A100", (8, 0)),)), "mixed_bfloat16"),
        (Hardware(gpus=(GPU("H200", (9, 0)), GPU("H200", (9, 0)))), "mixed_bfloat16"),
        (Hardware(gpus=(GPU("V100", (7, 0)),)), "mixed_float16"),
        (Hardware(gpus=(GPU("T4", (7, 5)),)), "mixed_float16"),
        (Hardware(gpus=(GPU("P100", (6, 0)),)), "float32"),
        (Hardware(tpu_cores=8), "mixed_bfloat16"),
    ],
)
def test_auto_precision_follows_the_hardware(hardware, expected):
    policy, reason = resolve_precision(hardware)
    assert policy == expected
    assert reason


def test_a_bf16_cpu_keeps_steps_too_small_to_gain_in_float32():
    assert resolve_precision(CPU_BF16, train_step_flops=2e7)[0] == "float32"
    assert "MFLOP" in resolve_precision(CPU_BF16, train_step_flops=2e7)[1]
    assert resolve_precision(CPU_BF16, train_step_flops=4e9)[0] == "onednn_bfloat16"
    # The plan computes the step's FLOPs from the model facts and the per-replica batch.
    tiny = resolve_plan(CPU_BF16, model=ModelFacts(forward_flops_per_sample=1_000), batch_size=32)
    large = resolve_plan(CPU_BF16, model=ModelFacts(forward_flops_per_sample=10_000_000), batch_size=32)
    assert (tiny.precision, large.precision) == ("float32", "onednn_bfloat16")


def test_depthwise_and_recurrent_models_keep_float32_on_a_bf16_cpu():
    big = dict(forward_flops_per_sample=10_000_000)
    mobile = resolve_plan(CPU_BF16, model=ModelFacts(**big, depthwise_conv_flops=100_000), batch_size=64)
    assert mobile.precision == "float32" and "depthwise" in mobile.reasons["precision"]
    recurrent = resolve_plan(CPU_BF16, model=ModelFacts(**big, recurrent_layers=("lstm",)), batch_size=64)
    assert (recurrent.precision, recurrent.jit_compile) == ("float32", True)
    assert "recurrent" in recurrent.reasons["jit_compile"]
    # On a GPU neither rule applies; without recurrent layers XLA stays off on a CPU.
    gpu = resolve_plan(Hardware(gpus=(GPU("A100", (8, 0)),)), model=ModelFacts(**big, depthwise_conv_flops=1),
                       batch_size=64)
    assert gpu.precision == "mixed_bfloat16"
    assert resolve_plan(CPU_BF16, model=ModelFacts(**big), batch_size=64).jit_compile is False


def test_conv_batch_norm_keeps_float32_on_a_bf16_cpu_until_the_step_is_large():
    # 1e7 FLOPs a sample: 0.96 GFLOP a train step at batch 32, 7.7 at 256.
    convnet = dict(forward_flops_per_sample=10_000_000, conv_flops=9_000_000)
    small = resolve_plan(CPU_BF16, model=ModelFacts(**convnet, batch_norm_layers=("bn",)), batch_size=32)
    assert small.precision == "float32" and "batch normalization" in small.reasons["precision"]
    large = resolve_plan(CPU_BF16, model=ModelFacts(**convnet, batch_norm_layers=("bn",)), batch_size=256)
    assert large.precision == "onednn_bfloat16"
    assert resolve_plan(CPU_BF16, model=ModelFacts(**convnet), batch_size=32).precision == "onednn_bfloat16"
    # An MLP with batch norm gains from bfloat16 (measured 1.36x at 3.3 GFLOP).
    mlp = ModelFacts(forward_flops_per_sample=10_000_000, batch_norm_layers=("bn",))
    assert resolve_plan(CPU_BF16, model=mlp, batch_size=32).precision == "onednn_bfloat16"
    # Only the CPU's oneDNN rewrite pays the casts: GPUs keep their rule.
    gpu = resolve_plan(Hardware(gpus=(GPU("A100", (8, 0)),)), model=ModelFacts(**convnet, batch_norm_layers=("bn",)),
                       batch_size=32)
    assert gpu.precision == "mixed_bfloat16"


def test_a_layer_normalised_stack_gets_xla_and_float32_on_a_cpu_unless_dropout_or_convolutions():
    big = dict(forward_flops_per_sample=10_000_000, layer_norm_layers=("norm1", "norm2"))
    stack = resolve_plan(CPU_BF16, model=ModelFacts(**big), batch_size=32)
    assert (stack.precision, stack.jit_compile) == ("float32", True)
    assert "layer norms (norm1, norm2" in stack.reasons["jit_compile"] and "XLA" in stack.reasons["precision"]
    for other in ({"random_layers": ("dropout",)}, {"conv_flops": 1_000}):
        plan = resolve_plan(CPU_BF16, model=ModelFacts(**big, **other), batch_size=32)
        assert (plan.precision, plan.jit_compile) == ("onednn_bfloat16", False), other
    # Your jit_compile=False keeps the precision rules of a step without XLA.
    off = resolve_plan(CPU_BF16, model=ModelFacts(**big), batch_size=32, jit_compile=False)
    assert (off.precision, off.jit_compile) == ("onednn_bfloat16", False)
    gpu = resolve_plan(Hardware(gpus=(GPU("A100", (8, 0)),)), model=ModelFacts(**big), batch_size=32)
    assert (gpu.precision, gpu.jit_compile) == ("mixed_bfloat16", True)


def test_the_model_facts_see_layer_norms_dropout_and_convolutions():
    rng = np.random.default_rng(0)
    tokens, labels = rng.integers(0, 50, (64, 16)), rng.integers(0, 2, 64)

    def encoder(dropout):
        inputs = keras.Input((16,), dtype="int32")
        x = keras.layers.Embedding(50, 16)(inputs)
        x = keras.layers.LayerNormalization()(x + keras.layers.MultiHeadAttention(2, 8, dropout=dropout)(x, x))
        return keras.Model(inputs, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x)))

    def planned(model, x):
        # The facts phase on its own, then the rules: what fit plans before its one check (XLA compiles these).
        found = model_facts(model, prepare_data(x, labels, batch_size=64), None)
        return resolve_plan(kerasfast.detect_hardware(), model=found, batch_size=64)

    plans = [planned(encoder(dropout), tokens) for dropout in (0.0, 0.1)]
    if kerasfast.detect_hardware().accelerator == "cpu":
        assert [plan.jit_compile for plan in plans] == [True, False]
        assert "layer norms" in plans[0].reasons["jit_compile"]
    images = rng.random((64, 8, 8, 3), dtype=np.float32)
    conv = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(8, 3), keras.layers.LayerNormalization(),
                             keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
    assert planned(conv, images).jit_compile is False


@pytest.mark.skipif(not kerasfast.detect_hardware().cpu_has_bf16,
                    reason="needs a CPU with AVX512_BF16 or AMX (the rule picks between float32 and bfloat16 there)")
def test_the_model_facts_see_batch_norm_layers():
    rng = np.random.default_rng(0)
    images, labels = rng.random((64, 8, 8, 3), dtype=np.float32), rng.integers(0, 2, 64)

    def convnet(batch_norm):
        layers = [keras.Input((8, 8, 3)), keras.layers.Conv2D(64, 3, padding="same")]
        layers += [keras.layers.BatchNormalization(name="bn")] if batch_norm else []
        return keras.Sequential(layers + [keras.layers.ReLU(), keras.layers.Conv2D(64, 3, padding="same"),
                                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])

    # ~0.9 GFLOP a train step: bfloat16 without batch norm, float32 with it.
    plans = [kerasfast.fit(convnet(batch_norm), images, labels, tune="off", **FIT).plan for batch_norm in (False, True)]
    assert [plan.precision for plan in plans] == ["onednn_bfloat16", "float32"]
    assert "batch normalization" in plans[1].reasons["precision"]


def test_the_model_facts_see_depthwise_and_recurrent_layers():
    # The facts phase on its own, then the rules for a bfloat16 CPU and for this machine (no training).
    rng = np.random.default_rng(0)
    images, labels = rng.random((64, 32, 32, 32), dtype=np.float32), rng.integers(0, 2, 64)
    # Enough math per step (~1 GFLOP) that only the depthwise rule keeps float32 on a bfloat16 CPU.
    mobile = keras.Sequential([keras.Input((32, 32, 32)), keras.layers.Conv2D(64, 1), keras.layers.DepthwiseConv2D(3),
                               keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
    found = model_facts(mobile, prepare_data(images, labels, batch_size=64), None)
    assert found.depthwise_conv_flops > 0
    precision = resolve_plan(CPU_BF16, model=found, batch_size=64).reasons["precision"]
    assert "depthwise" in precision
    series = rng.random((64, 8, 4), dtype=np.float32)
    recurrent = keras.Sequential([keras.Input((8, 4)), keras.layers.Bidirectional(keras.layers.GRU(8)),
                                  keras.layers.Dense(2)])
    found = model_facts(recurrent, prepare_data(series, labels, batch_size=64), None)
    assert found.recurrent_layers and found.depthwise_conv_flops == 0
    plan = resolve_plan(CPU_PLAIN, model=found, batch_size=64)
    assert plan.jit_compile is True and "gru" in plan.reasons["jit_compile"]


def test_xla_on_a_bf16_cpu_uses_the_keras_policy_whatever_the_step_size():
    # oneDNN's graph pass does not reach into XLA; the Keras policy must not
    # depend on whether the step's FLOPs are known yet.
    for flops in (None, 2e7, 4e9):
        assert resolve_precision(CPU_BF16, train_step_flops=flops, jit_compile=True)[0] == "mixed_bfloat16"


@pytest.mark.parametrize("hardware, options, message", [
    (Hardware(gpus=(GPU("A100", (8, 0)),)), {}, "for CPUs"),
    (CPU_BF16, {"jit_compile": True}, "does not apply inside XLA"),
])
def test_onednn_bfloat16_is_refused_where_it_cannot_work(hardware, options, message):
    with pytest.raises(PlanError, match=message):
        resolve_precision(hardware, "onednn_bfloat16", **options)


def test_onednn_bfloat16_builds_a_float32_model_that_computes_in_bfloat16():
    assert keras_policy("onednn_bfloat16") == "float32"
    assert keras_policy("mixed_bfloat16") == "mixed_bfloat16"
    assert compute_dtype("onednn_bfloat16") == "bfloat16"
    assert compute_dtype("float32") == "float32"
    assert "emulates" in resolve_precision(CPU_PLAIN, "onednn_bfloat16")[1]


def test_auto_never_picks_float16_on_a_cpu():
    for hardware in (CPU_BF16, CPU_PLAIN, Hardware()):
        assert resolve_precision(hardware)[0] != "mixed_float16"


def test_auto_xla_on_a_single_gpu_and_off_on_cpu():
    assert resolve_plan(Hardware(gpus=(GPU("A100", (8, 0)),))).jit_compile is True
    assert resolve_plan(CPU_BF16).jit_compile is False


def test_every_field_has_a_reason_and_round_trips_as_json():
    plan = resolve_plan(CPU_BF16, data=DataFacts(num_samples=1000), batch_size=50, run=RunFacts(epochs=3))
    data = json.loads(plan.to_json())["fields"]
    assert set(data) >= {"precision", "jit_compile", "steps_per_execution", "global_batch_size",
                         "per_replica_batch_size", "grad_accum_steps", "clipnorm", "remat", "lr_schedule"}
    assert all(field["reason"] for field in data.values())
    assert data["global_batch_size"] == {"value": 50, "reason": "requested", "source": "user"}
    assert data["total_steps"]["value"] == 3 * 20
    assert "precision" in str(plan)


def test_overrides_win():
    plan = resolve_plan(
        CPU_BF16, data=DataFacts(num_samples=640), run=RunFacts(epochs=2),
        precision="float32", jit_compile=True, steps_per_execution=3, batch_size=16, grad_accum_steps=4,
        clipnorm=1.0, remat=True, learning_rate=0.01, lr_schedule="one_cycle",
    )
    assert (plan.precision, plan.jit_compile, plan.steps_per_execution) == ("float32", True, 3)
    assert (plan.global_batch_size, plan.grad_accum_steps, plan.effective_batch_size) == (16, 4, 64)
    assert (plan.clipnorm, plan.remat, plan.learning_rate, plan.lr_schedule) == (1.0, "activations", 0.01, "one_cycle")
    assert plan.total_steps == 2 * 40 // 4
    assert {"precision", "jit_compile", "grad_accum_steps", "clipnorm", "remat"} <= set(plan.overridden)


def test_steps_per_execution_auto_amortises_overhead():
    cheap = resolve_plan(CPU_BF16, data=DataFacts(num_samples=100_000),
                         model=ModelFacts(forward_flops_per_sample=10_000), run=RunFacts(peak_flops=1e11))
    heavy = resolve_plan(CPU_BF16, data=DataFacts(num_samples=100_000),
                         model=ModelFacts(forward_flops_per_sample=10**10), run=RunFacts(peak_flops=1e11))
    assert cheap.steps_per_execution > 8
    assert heavy.steps_per_execution == 1
    # A ~40 ms step: its dispatch is ~1% by the estimate, yet without XLA
    # 8 steps per execution measured faster; under XLA the estimate decides.
    def medium(**options):
        return resolve_plan(CPU_BF16, data=DataFacts(num_samples=64 * 128), batch_size=128,
                            model=ModelFacts(forward_flops_per_sample=10**7), run=RunFacts(peak_flops=1e11), **options)
    assert medium(jit_compile=False).steps_per_execution == 8
    assert "without XLA" in medium(jit_compile=False).reasons["steps_per_execution"]
    assert medium(jit_compile=True).steps_per_execution == 1
    short = resolve_plan(CPU_BF16, data=DataFacts(num_samples=64), batch_size=32,
                         model=ModelFacts(forward_flops_per_sample=10), run=RunFacts(peak_flops=1e11))
    assert short.steps_per_execution == 2  # never more than an epoch
    with_hooks = resolve_plan(CPU_BF16, run=RunFacts(user_batch_callbacks=("MyLogger",)))
    assert with_hooks.steps_per_execution == 1 and "MyLogger" in with_hooks.reasons["steps_per_execution"]


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(precision="fp16"), "precision='fp16' is not known"),
        (dict(grad_accum_steps=-2), "grad_accum_steps=-2"),
        (dict(grad_accum_steps=0), "grad_accum_steps=0"),
        (dict(grad_accum_steps=2.5), "grad_accum_steps=2.5"),
        (dict(steps_per_execution=0), "steps_per_execution=0"),
        (dict(batch_size=0), "batch_size=0"),
        (dict(clipnorm=-1.0), "clipnorm=-1.0"),
        (dict(remat="full"), "keras issue 21207"),
        (dict(remat="sometimes"), "remat='sometimes' is not known"),
        (dict(jit_compile="yes"), "jit_compile='yes'"),
        (dict(lr_schedule="step"), "lr_schedule='step' is not known"),
        (dict(learning_rate=0), "learning_rate=0"),
        (dict(lr_schedule="warmup_cosine"), "needs the run's length"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(options, message):
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace("[", r"\[")):
        resolve_plan(CPU_BF16, **options)


def test_jit_is_refused_for_layers_without_xla_support():
    with pytest.raises(PlanError, match=r"jit_compile=True cannot work here: layer\(s\) lookup do not support XLA"):
        resolve_plan(CPU_BF16, model=ModelFacts(layers_without_jit=("lookup",)), jit_compile=True)
    auto = resolve_plan(CPU_BF16, model=ModelFacts(layers_without_jit=("lookup",)))
    assert auto.jit_compile is False and "lookup" in auto.reasons["jit_compile"]


class NoXlaLayer(keras.layers.Layer):
    """A real layer that declares it cannot be compiled with XLA (like string lookups)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_jit = False

    def call(self, inputs):
        return inputs


class StepRecorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_batch_begin(self, batch, logs=None):
        self.steps += 1


def _no_xla_model():
    return keras.Sequential([keras.Input((8, 8, 1)), NoXlaLayer(name="no_xla"), keras.layers.Flatten(),
                             keras.layers.Dense(10, activation="softmax")])


def test_fit_refuses_jit_before_any_training_step(digits):
    (x, y), _ = digits
    model = _no_xla_model()
    recorder = StepRecorder()
    with pytest.raises(PlanError, match="no_xla do not support XLA"):
        kerasfast.fit(model, (x, y), jit_compile=True, callbacks=[recorder], **FIT)
    assert recorder.steps == 0
    assert not model.compiled


@pytest.mark.parametrize(
    "options, error, message",
    [
        (dict(precision="fp8"), PlanError, "precision='fp8'"),
        (dict(grad_accum_steps=-1), PlanError, "grad_accum_steps=-1"),
        (dict(remat="list_of_layers"), PlanError, "keras issue 21207"),
        (dict(epochs=0), PlanError, "epochs=0"),
    ],
)
def test_fit_rejects_bad_arguments_before_training(digits, options, error, message):
    (x, y), _ = digits
    model = small_convnet()
    recorder = StepRecorder()
    fit_options = {**FIT, **options}
    with pytest.raises(error, match=message):
        kerasfast.fit(model, (x, y), callbacks=[recorder], **fit_options)
    assert recorder.steps == 0


def test_data_that_does_not_match_the_model_is_a_clear_error(digits):
    (x, y), _ = digits
    with pytest.raises(DataError, match=r"inputs of shape \('batch', 64\).*expects \('batch', 8, 8, 1\)"):
        kerasfast.fit(small_convnet(), (x.reshape(len(x), 64), y), **FIT)
    with pytest.raises(DataError, match="disagree on the number of samples"):
        kerasfast.fit(small_convnet(), (x, y[:-5]), **FIT)
    unbatched = tf.data.Dataset.from_tensor_slices((x, y))
    with pytest.raises(DataError, match=r"single samples of shape \(8, 8, 1\).*dataset.batch\(32\)"):
        kerasfast.fit(small_convnet(), unbatched, **{k: v for k, v in FIT.items() if k != "batch_size"})
    with pytest.raises(DataError, match="needs input"):
        kerasfast.fit(small_convnet(), {"x": x}, y, **FIT)
    with pytest.raises(DataError, match="not supported"):
        kerasfast.fit(small_convnet(), object(), **FIT)


def test_unbuilt_model_with_wrong_data_is_a_clear_error(digits):
    (x, y), _ = digits
    model = keras.Sequential([keras.layers.Conv2D(4, 3), keras.layers.Flatten(), keras.layers.Dense(10)])
    with pytest.raises(DataError, match="could not be run on a batch of the data"):
        kerasfast.fit(model, (x.reshape(len(x), 64), y), **FIT)


def test_missing_loss_is_a_clear_error(digits):
    (x, y), _ = digits
    with pytest.raises(PlanError, match="no loss"):
        kerasfast.fit(small_convnet(), (x, y), epochs=1, run_dir=False, verbose=0)


def test_batch_size_conflicting_with_a_batched_dataset(digits):
    import tensorflow as tf

    (x, y), _ = digits
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    # As in Keras, batch_size= is ignored for data that comes batched; the plan says so.
    result = kerasfast.fit(small_convnet(), dataset, **FIT)  # FIT has batch_size=64
    assert result.plan.global_batch_size == 32
    assert "batch_size=64 ignored" in result.plan.reasons["global_batch_size"]
    assert "global_batch_size" not in result.plan.overridden


def test_plan_is_printed_unless_silent(digits, capsys):
    (x, y), _ = digits
    kerasfast.fit(small_convnet(), (x[:256], y[:256]), epochs=2, batch_size=64, run_dir=False, verbose=2,
                  loss="sparse_categorical_crossentropy")
    printed = capsys.readouterr().out
    assert "kerasfast plan" in printed and "precision" in printed and "samples/s" in printed
    kerasfast.fit(small_convnet(), (x[:256], y[:256]), **FIT)
    assert "kerasfast plan" not in capsys.readouterr().out


def test_linear_learning_rate_scaling_is_opt_in_and_reported():
    plain = resolve_plan(CPU_BF16, data=DataFacts(num_samples=640), batch_size=64, learning_rate=0.01, num_replicas=2)
    assert plain.learning_rate == pytest.approx(0.01) and plain.per_replica_batch_size == 32
    scaled = resolve_plan(CPU_BF16, data=DataFacts(num_samples=640), batch_size=64, learning_rate=0.01,
                          num_replicas=2, scale_lr=True)
    assert scaled.learning_rate == pytest.approx(0.02)
    assert "linear scaling" in scaled.reasons["learning_rate"] and "learning_rate" in scaled.overridden
    with pytest.raises(PlanError, match=r"global batch size 33 does not divide over 2 replicas: use a multiple of "
                                        r"2 \(e\.g\. batch_size=34\)"):
        resolve_plan(CPU_BF16, batch_size=33, num_replicas=2)


def test_a_batched_dataset_whose_first_batch_does_not_divide_over_the_replicas_is_named_as_such():
    # A dataset of 1 sample batched by 32 has a first batch of 1: the message says where the 1 came from.
    with pytest.raises(PlanError, match=r"the dataset's first batch holds 1 sample\(s\), which makes 1 its global "
                                        r"batch size .* does not divide over 2 replicas: batch it by a multiple of 2 "
                                        r"\(e\.g\. dataset\.unbatch\(\)\.batch\(2\)\)\. A dataset holding fewer"):
        resolve_plan(CPU_BF16, data=DataFacts(batch_size=1, steps_per_epoch=1), batch_size=32, num_replicas=2)


def test_a_subclassed_models_own_loss_code_keeps_float32_where_auto_would_mix():
    # A mixed policy hands a subclassed model's outputs to the user's loss
    # code in bfloat16/float16 (`y - y_pred` then fails); Keras's compiled
    # losses cast, and Sequential/functional outputs stay float32.
    x, y = np.random.default_rng(0).normal(size=(64, 4)).astype("float32"), np.zeros((64, 1), "float32")

    class Net(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense = keras.layers.Dense(1)

        def call(self, inputs):
            return self.dense(inputs)

    class OwnLoss(Net):
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            return keras.ops.mean(keras.ops.abs(y - y_pred))

    def facts(model):
        model.compile(optimizer="sgd", loss=None if isinstance(model, OwnLoss) else "mse")
        return model_facts(model, prepare_data(x, y, batch_size=32), None)

    assert facts(OwnLoss()).loss_from_raw_outputs == "OwnLoss.compute_loss"
    assert facts(Net()).loss_from_raw_outputs is None
    functional = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    assert facts(functional).loss_from_raw_outputs is None

    gpu = Hardware(gpus=(GPU("A100", (8, 0)),))
    big = dict(forward_flops_per_sample=10_000_000)
    own = resolve_plan(gpu, model=ModelFacts(**big, loss_from_raw_outputs="OwnLoss.compute_loss"), batch_size=64)
    assert own.precision == "float32"
    assert "OwnLoss.compute_loss" in own.reasons["precision"] and "precision='mixed_bfloat16'" in own.reasons["precision"]
    assert resolve_plan(gpu, model=ModelFacts(**big), batch_size=64).precision == "mixed_bfloat16"
    asked = resolve_plan(gpu, model=ModelFacts(**big, loss_from_raw_outputs="OwnLoss.compute_loss"), batch_size=64,
                         precision="mixed_bfloat16")
    assert asked.precision == "mixed_bfloat16"  # your choice stands


SCALE_PROBLEM = ("ScaleF32 layer 'scale' mixes float32 into bfloat16 (model.py, line 7: Input 'y' of 'Mul' Op has "
                 "type float32 that does not match type bfloat16 of argument 'x')")


def test_a_layer_mixing_float32_into_the_compute_dtype_keeps_auto_in_float32_and_refuses_a_mixed_request():
    from kerasfast.plan import Overrides, candidate_plans, mixed_policy_in_reach

    a100, v100 = Hardware(gpus=(GPU("A100", (8, 0)),)), Hardware(gpus=(GPU("V100", (7, 0)),))
    found = ModelFacts(forward_flops_per_sample=10_000_000, mixed_precision_problem=SCALE_PROBLEM)
    kept = resolve_plan(a100, model=found, batch_size=64)
    assert kept.precision == "float32"
    reason = kept.reasons["precision"]
    assert SCALE_PROBLEM in reason and "self.compute_dtype" in reason and "precision='mixed_bfloat16'" in reason
    # Tuning does not time the mixed policies it would fail under.
    assert {plan.precision for plan in candidate_plans(kept, a100, found, RunFacts(), mode="full")} == {"float32"}
    with pytest.raises(PlanError, match=r"precision='mixed_float16' cannot train this model: under it ScaleF32 "
                                        r"layer 'scale' mixes float32"):
        resolve_plan(v100, model=found, batch_size=64, precision="mixed_float16")
    # The policy the model's forward pass is traced under before planning: the one a plan may pick.
    assert mixed_policy_in_reach(a100, Overrides(), ModelFacts()) == "mixed_bfloat16"
    assert mixed_policy_in_reach(v100, Overrides(), ModelFacts()) == "mixed_float16"
    assert mixed_policy_in_reach(CPU_PLAIN, Overrides(), ModelFacts()) is None
    assert mixed_policy_in_reach(CPU_BF16, Overrides(), ModelFacts()) is None  # onednn_bfloat16 or float32
    assert mixed_policy_in_reach(CPU_BF16, Overrides(jit_compile=True), ModelFacts()) == "mixed_bfloat16"
    assert mixed_policy_in_reach(CPU_PLAIN, Overrides(precision="mixed_bfloat16"), ModelFacts()) == "mixed_bfloat16"
    assert mixed_policy_in_reach(a100, Overrides(), ModelFacts(custom_train_step="Gan.train_step")) is None


class ScaleF32(keras.layers.Layer):
    """The TF tutorials' `d_model` scaling: a float32 constant, whatever the input's dtype."""

    def call(self, x):
        return x * tf.math.sqrt(tf.cast(6, tf.float32))


class ScaleInItsDtype(keras.layers.Layer):
    """The same scaling in the layer's compute dtype: fine under a mixed policy."""

    def call(self, x):
        return x * keras.ops.sqrt(keras.ops.cast(6, self.compute_dtype))


def test_on_a_gpu_auto_keeps_float32_only_for_a_model_whose_own_layer_mixes_float32_in(monkeypatch):
    """On a GPU "auto" picks a mixed policy, under which ScaleF32 fails in
    TensorFlow's first step: its model trains in float32, the plan naming
    the layer. A custom layer keeping to its compute dtype, and a model of
    Keras layers, still train mixed; only models with layers of their own
    have their forward pass traced for it. (The GPU is the plan's: the
    steps run on this machine's CPU.)"""
    from kerasfast.training import facts, precision

    monkeypatch.setattr(facts, "detect_hardware", lambda: Hardware(cpu_cores=2, gpus=(GPU("A100", (8, 0)),)))
    traced, trace = [], getattr(precision, "mixed_dtype_problem", None)

    def counted(model, *args):
        traced.append(model.name)
        return trace(model, *args)

    monkeypatch.setattr(precision, "mixed_dtype_problem", counted, raising=False)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(128, 6)).astype("float32"), rng.integers(0, 3, size=128)

    def fit(*middle, name):
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), *middle,
                                  keras.layers.Dense(3)], name=name)
        return kerasfast.fit(model, x, y, epochs=1, batch_size=32, tune="off", run_dir=False, verbose=0,
                             loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer="adam")

    float32_constant = fit(ScaleF32(name="scale"), name="float32_constant")
    assert float32_constant.plan.precision == "float32"
    reason = float32_constant.plan.reasons["precision"]
    assert "ScaleF32 layer 'scale' mixes float32 into bfloat16" in reason and "precision='mixed_bfloat16'" in reason
    assert np.isfinite(float32_constant.history.history["loss"][0])
    assert fit(ScaleInItsDtype(), keras.layers.Lambda(lambda t: t / 2.0), name="own_dtype").plan.precision == \
        "mixed_bfloat16"
    assert fit(keras.layers.BatchNormalization(), name="keras_only").plan.precision == "mixed_bfloat16"
    assert traced == ["float32_constant", "own_dtype"]


def test_synchronized_batch_norm_under_a_strategy_keeps_xla_off():
    # Its all-reduce inside the forward pass is a merge_call XLA's compiled forward cannot hold.
    a100x2 = Hardware(gpus=(GPU("A100", (8, 0)), GPU("A100", (8, 0))))
    synced = ModelFacts(synchronized_batch_norm_layers=("bn",))
    assert resolve_plan(a100x2, model=ModelFacts(), num_replicas=2, strategy_name="mirrored").jit_compile is True
    plan = resolve_plan(a100x2, model=synced, num_replicas=2, strategy_name="mirrored")
    assert plan.jit_compile is False and "BatchNormalization(synchronized=True) layer(s) bn" in \
        plan.reasons["jit_compile"]
    with pytest.raises(PlanError, match=r"jit_compile=True cannot work here: BatchNormalization\(synchronized=True\)"):
        resolve_plan(a100x2, model=synced, num_replicas=2, strategy_name="mirrored", jit_compile=True)
    assert resolve_plan(a100x2, model=synced).jit_compile is True  # one device: no all-reduce


def test_a_compile_argument_given_to_fit_says_where_it_belongs():
    from kerasfast.plan import Overrides

    with pytest.raises(PlanError, match=r"'loss_weights' \(an argument of model.compile: compile the model with it"):
        Overrides.from_options({"loss_weights": [1.0, 0.5]})
    with pytest.raises(PlanError, match="did you mean 'precision'"):
        Overrides.from_options({"precison": "float32"})
