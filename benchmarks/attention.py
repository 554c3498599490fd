"""Causal attention in query blocks against Keras's op: one attention, and the GPT recipe's whole train step.

Keras's TensorFlow `dot_product_attention(is_causal=True)` scores every
query against every key and masks half away; `kerasfast.training.attention`
scores each block of queries against the keys up to its end only. This
times a forward and backward pass of each, side by side in one process,
runs alternating (min and median ms of `--rounds`), with the first call's
time (tracing and compilation):

- one attention (4 heads of 32, 4,096 tokens a batch) at several lengths and
  block sizes, with XLA, and at 128 tokens without it (TensorFlow's graph);
- the GPT recipe's model (4 blocks, d_model 128, 128 tokens, batch 32),
  loss and gradients with XLA, as kerasfast's train step computes them.

    python benchmarks/attention.py [--rounds 6] [--lengths 128,256,512]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's kerasfast, not an installed one: a worktree measures its own code

import kerasfast  # noqa: E402,F401  (first: TensorFlow then loads with oneDNN's CPU kernels, as in a run)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from kerasfast.recipes import load_recipe  # noqa: E402
from kerasfast.training import attention  # noqa: E402

TOKENS = 4096
HEADS, DEPTH = 4, 32


def keras_op(q, k, v):
    return keras.ops.dot_product_attention(q, k, v, is_causal=True)


def blocks(block):
    return lambda q, k, v: attention.causal_attention(q, k, v, block=block)


def attention_step(fn, jit_compile):
    @tf.function(jit_compile=jit_compile)
    def step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            loss = tf.reduce_sum(tf.square(fn(q, k, v)))
        return tape.gradient(loss, [q, k, v])

    return step


def gpt_step(model, substituted):
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(x):
        with tf.GradientTape() as tape:
            value = loss(x, model(x, training=True))
        return [tf.convert_to_tensor(g) for g in tape.gradient(value, model.trainable_variables)]

    return tf.function(attention.with_causal_blocks(step) if substituted else step, jit_compile=True)


def timed(candidates: dict, inputs, rounds: int, calls: int) -> dict:
    """{name: (first call s, [ms per call per round])}, rounds alternating over the candidates."""
    results = {}
    for name, step in candidates.items():
        started = time.perf_counter()
        tf.nest.flatten(step(*inputs))[0].numpy()
        results[name] = (time.perf_counter() - started, [])
    for _ in range(rounds):
        for name, step in candidates.items():
            started = time.perf_counter()
            for _ in range(calls):
                out = step(*inputs)
            tf.nest.flatten(out)[0].numpy()
            results[name][1].append((time.perf_counter() - started) / calls * 1e3)
    return results


def print_rows(label, results, base_name="Keras's op"):
    """Markdown rows of `timed`'s results, each against `base_name`'s median."""
    base = statistics.median(results[base_name][1])
    for name, (first, times) in results.items():
        print(f"| {label} | {name} | {min(times):.1f} | {statistics.median(times):.1f} | "
              f"{base / statistics.median(times):.2f}x | {first:.2f} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--lengths", default="128,256,512")
    args = parser.parse_args(argv)
    print("| case | attention | min ms | median ms | vs Keras's op (median) | first call s |")
    print("|---|---|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for length in (int(n) for n in args.lengths.split(",")):
        inputs = [tf.constant(rng.normal(size=(TOKENS // length, length, HEADS, DEPTH)).astype("float32"))
                  for _ in range(3)]
        sizes = sorted({32, 64, attention.query_block(length), 2 * attention.query_block(length)})
        candidates = {"Keras's op": attention_step(keras_op, True)}
        for size in (s for s in sizes if length >= 2 * s):
            chosen = " (kerasfast's)" if size == attention.query_block(length) else ""
            candidates[f"blocks of {size}{chosen}"] = attention_step(blocks(size), True)
        print_rows(f"one attention, {length} tokens, XLA", timed(candidates, inputs, args.rounds, 10))
        if length == 128:
            graph = {"Keras's op": attention_step(keras_op, False),
                     f"blocks of {attention.query_block(length)}": attention_step(blocks(None), False)}
            print_rows(f"one attention, {length} tokens, no XLA", timed(graph, inputs, args.rounds, 10))
    keras.utils.set_random_seed(0)
    model = load_recipe("gpt").build_gpt(seq_len=128, layers=4, d_model=128, heads=4)
    x = tf.constant(rng.integers(0, 256, size=(32, 128)).astype("int32"))
    steps = {"Keras's op": gpt_step(model, False), f"kerasfast (blocks of {attention.query_block(128)})": gpt_step(model, True)}
    print_rows("GPT recipe train step, XLA", timed(steps, [x], args.rounds, 5))


if __name__ == "__main__":
    main()
