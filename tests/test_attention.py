"""Causal attention in query blocks (kerasfast/training/attention.py): the same
values and gradients as Keras's op, taken only where it computes as Keras
does, in place only while kerasfast traces an XLA-compiled train step, and
named by the plan."""

import os
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasfast
from kerasfast import _compat
from kerasfast.recipes import load_recipe
from kerasfast.training import attention

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _qkv(length, *, batch=2, heads=2, depth=8, dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.normal(size=(batch, length, heads, depth)).astype(dtype)) for _ in range(3)]


def _keras_causal(q, k, v, scale=None):
    return keras.ops.dot_product_attention(q, k, v, scale=scale, is_causal=True)


@pytest.mark.parametrize("length, block", [(128, None), (200, 64), (96, 32), (256, 64)])
def test_blocks_give_keras_values_and_gradients(length, block):
    """Blocks that divide the length and one that does not (200 = 3 x 64 + 8), under XLA."""
    q, k, v = _qkv(length)

    def values_and_gradients(fn):
        @tf.function(jit_compile=True)
        def run(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                out = fn(q, k, v)
                loss = tf.reduce_sum(out * tf.sin(out))
            return out, tape.gradient(loss, [q, k, v])
        return run(q, k, v)

    expected, expected_grads = values_and_gradients(lambda q, k, v: _keras_causal(q, k, v, scale=0.3))
    got, grads = values_and_gradients(lambda q, k, v: attention.causal_attention(q, k, v, scale=0.3, block=block))
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
    for name, g, e in zip("qkv", grads, expected_grads, strict=True):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"gradient of {name}")


def test_blocks_keep_the_inputs_dtype_with_float32_scores():
    q, k, v = _qkv(128, dtype="float16")
    got = attention.causal_attention(q, k, v)
    assert got.dtype == tf.float16
    np.testing.assert_allclose(got.numpy().astype("float32"), _keras_causal(q, k, v).numpy().astype("float32"),
                               rtol=5e-3, atol=5e-3)  # float16 steps near 2 are 0.002


def test_a_later_position_never_changes_an_earlier_output():
    q, k, v = _qkv(128)
    changed = [tf.concat([t[:, :70], t[:, 70:] + 1.0], axis=1) for t in (q, k, v)]
    before, after = attention.causal_attention(q, k, v), attention.causal_attention(*changed)
    np.testing.assert_allclose(after.numpy()[:, :70], before.numpy()[:, :70], rtol=1e-6, atol=1e-6)
    assert not np.allclose(after.numpy()[:, 70:], before.numpy()[:, 70:])


def test_only_calls_computed_as_keras_does_take_blocks():
    q, k, v = _qkv(128)
    assert attention.takes_blocks(q, k, v, is_causal=True)
    assert not attention.takes_blocks(q, k, v, is_causal=False)
    assert not attention.takes_blocks(q, k, v, is_causal=True, mask=tf.ones((2, 1, 128, 128), tf.bool))
    assert not attention.takes_blocks(q, k, v, is_causal=True, bias=tf.zeros((2, 2, 128, 128)))
    assert not attention.takes_blocks(q, k, v, is_causal=True, flash_attention=True)
    short = _qkv(64)
    assert not attention.takes_blocks(*short, is_causal=True)  # one block: nothing to skip
    cross = _qkv(256)
    assert not attention.takes_blocks(q, cross[1], cross[2], is_causal=True)  # keys longer than queries
    grouped_k, grouped_v = (t[:, :, :1] for t in (k, v))
    assert not attention.takes_blocks(q, grouped_k, grouped_v, is_causal=True)  # grouped-query heads
    assert not attention.takes_blocks(tf.cast(q, tf.float16), k, v, is_causal=True)  # Keras promotes mixed dtypes
    narrow_v = v[..., :4]  # values of a width of their own: computed as Keras does
    assert attention.takes_blocks(q, k, narrow_v, is_causal=True)
    np.testing.assert_allclose(attention.causal_attention(q, k, narrow_v).numpy(),
                               _keras_causal(q, k, narrow_v).numpy(), rtol=1e-5, atol=1e-5)
    unknown = tf.TensorSpec((None, None, 2, 8), tf.float32)
    taken = []

    @tf.function(input_signature=[unknown] * 3)
    def traced(q, k, v):
        taken.append(attention.takes_blocks(q, k, v, is_causal=True))
        return q

    traced(q, k, v)
    assert taken == [False]  # a length unknown when traced


def _traced_op_types(fn, q, k, v):
    return {op.type for op in tf.function(fn).get_concrete_function(q, k, v).graph.get_operations()}


def test_substitution_holds_inside_the_block_only_and_is_undone_on_errors():
    q, k, v = _qkv(128)
    module = _compat.tensorflow_nn_module()
    keras_op = module.dot_product_attention

    assert "Einsum" in _traced_op_types(_keras_causal, q, k, v)  # Keras's own op
    blocked = _traced_op_types(attention.with_causal_blocks(_keras_causal), q, k, v)
    assert "Einsum" not in blocked and "BatchMatMulV2" in blocked
    masked = attention.with_causal_blocks(lambda q, k, v: keras.ops.dot_product_attention(
        q, k, v, mask=tf.ones((1, 1, 128, 128), tf.bool), is_causal=True))
    assert "Einsum" in _traced_op_types(masked, q, k, v)  # not taken: Keras's op
    assert module.dot_product_attention is keras_op

    with attention.substituting_attention():
        with attention.substituting_attention():  # nested: undone by the outer block only
            pass
        assert module.dot_product_attention is not keras_op
    assert module.dot_product_attention is keras_op

    with pytest.raises(RuntimeError, match="inside"):
        with attention.substituting_attention():
            raise RuntimeError("raised inside the block")
    assert module.dot_product_attention is keras_op


def test_the_plan_names_blocks_only_where_they_were_measured_to_pay():
    from kerasfast.hardware import GPU, Hardware
    from kerasfast.plan import ATTENTION_BLOCKS, ATTENTION_KERAS, RunFacts, resolve_attention

    cpu, gpu = Hardware(cpu_cores=2), Hardware(cpu_cores=2, gpus=(GPU(name="A100", compute_capability=(8, 0)),))
    value, reason = resolve_attention(True, cpu, RunFacts())
    assert value == ATTENTION_BLOCKS and "query blocks" in reason
    value, reason = resolve_attention(False, cpu, RunFacts())
    assert value == ATTENTION_KERAS and "without XLA" in reason
    value, reason = resolve_attention(True, gpu, RunFacts())
    assert value == ATTENTION_KERAS and "gpu" in reason
    value, reason = resolve_attention(True, cpu, RunFacts(flash_attention=False))
    assert value == ATTENTION_KERAS and "disable_flash_attention" in reason


def _fit_gpt(x, **options):
    gpt = load_recipe("gpt")

    def model():
        keras.utils.set_random_seed(0)
        return gpt.build_gpt(seq_len=128, layers=1, d_model=32, heads=2)

    result = kerasfast.fit(model, (x[:, :-1], x[:, 1:]), batch_size=16, epochs=1, shuffle=False,
                           optimizer=keras.optimizers.SGD(0.1), tune=False,
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), run_dir=False,
                           verbose=0, **options)
    return result


def test_fit_trains_the_gpt_recipe_with_blocks_as_it_trains_with_keras_op():
    """The same weights after training with the blocks (the plan names them) and with Keras's op (flash
    attention disabled: Keras's switch), both XLA-compiled: the blocks change the speed, not the training."""
    x = np.frombuffer(pathlib.Path(os.__file__).read_bytes()[:32 * 129], np.uint8).reshape(32, 129)
    x = x.astype("int32")
    blocked = _fit_gpt(x, jit_compile=True)
    assert blocked.plan.attention == "causal_blocks"
    assert "query blocks" in blocked.plan.reasons["attention"]
    keras.config.disable_flash_attention()
    try:
        plain = _fit_gpt(x, jit_compile=True)
    finally:
        from keras.src.backend.common import global_state

        global_state.set_global_attribute("flash_attention", None)
    assert plain.plan.attention == "keras"
    for a, b in zip(blocked.model.weights, plain.model.weights, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5, err_msg=a.path)
    assert _compat.tensorflow_nn_module().dot_product_attention.__module__ == "keras.src.backend.tensorflow.nn"


def test_tuning_candidates_follow_their_own_xla_choice():
    from kerasfast.hardware import Hardware
    from kerasfast.plan import ModelFacts, RunFacts, candidate_plans, resolve_plan

    cpu = Hardware(cpu_cores=2)
    plan = resolve_plan(cpu, batch_size=32, jit_compile=True)
    assert plan.attention == "causal_blocks"
    candidates = candidate_plans(plan, cpu, ModelFacts(), RunFacts(), user_set=())
    assert {(c.jit_compile, c.attention) for c in candidates} == {(True, "causal_blocks"), (False, "keras")}


@pytest.mark.slow
def test_benchmark_prints_each_candidate_against_keras_op(capsys):
    import sys

    sys.path.insert(0, str(ROOT))
    from benchmarks import attention as benchmark

    benchmark.main(["--rounds", "1", "--lengths", "128"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()[2:]]
    cases = [(row[0].lstrip("| "), row[1]) for row in rows]
    assert cases == [("one attention, 128 tokens, XLA", "Keras's op"), ("one attention, 128 tokens, XLA", "blocks of 32"),
                     ("one attention, 128 tokens, XLA", "blocks of 64 (kerasfast's)"),
                     ("one attention, 128 tokens, no XLA", "Keras's op"), ("one attention, 128 tokens, no XLA", "blocks of 64"),
                     ("GPT recipe train step, XLA", "Keras's op"), ("GPT recipe train step, XLA", "kerasfast (blocks of 64)")]
    for row in rows:
        assert float(row[2]) > 0 and row[4].endswith("x")
