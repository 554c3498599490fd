"""Dropout masks from a counter hash against Keras's: one dropout, and the text recipe's encoder's train step.

Keras's TensorFlow dropout draws a float per value with
`tf.random.stateless_uniform`; `kerasfast.training.dropout` keeps the
values whose hash of (seed, position) clears the rate, in one XLA-compiled
loop. This times a forward and backward pass of each, side by side in one
process, runs alternating (min and median ms of `--rounds`), with the first
call's time (tracing and compilation):

- one dropout (rate 0.1) of the text recipe's encoder's attention
  probabilities (64 sequences x 4 heads x 128 x 128 values), in a
  TensorFlow graph and in an XLA-compiled function;
- the text recipe's encoder (2 blocks, 128 tokens, batch 64, dropout 0.1 on
  the attention probabilities and after each sub-layer): loss and gradients
  as kerasfast's train step computes them, without XLA (its plan) and with.

    python benchmarks/dropout.py [--rounds 6]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's kerasfast, not an installed one: a worktree measures its own code

import kerasfast  # noqa: E402,F401  (first: TensorFlow then loads with oneDNN's CPU kernels, as in a run)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.attention import print_rows, timed  # noqa: E402
from kerasfast.recipes import load_recipe  # noqa: E402
from kerasfast.training.dropout import with_hashed_dropout  # noqa: E402

KERAS, HASHED = "Keras's masks", "hashed masks (kerasfast's)"


def dropout_step(hashed: bool, jit_compile: bool):
    layer = keras.layers.Dropout(0.1, seed=1)

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.square(layer(x, training=True)))
        return tape.gradient(loss, x)

    return tf.function(with_hashed_dropout(step) if hashed else step, jit_compile=jit_compile, autograph=False)


def encoder_step(model, hashed: bool, jit_compile: bool):
    loss = keras.losses.SparseCategoricalCrossentropy()

    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        return [tf.convert_to_tensor(g) for g in tape.gradient(value, model.trainable_variables)]

    return tf.function(with_hashed_dropout(step) if hashed else step, jit_compile=jit_compile, autograph=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    print("| case | masks | min ms | median ms | vs Keras's masks (median) | first call s |")
    print("|---|---|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    probabilities = tf.constant(rng.random(size=(64, 4, 128, 128)).astype("float32"))
    for jit_compile in (False, True):
        steps = {KERAS: dropout_step(False, jit_compile), HASHED: dropout_step(True, jit_compile)}
        label = f"one dropout, 64x4x128x128, {'XLA' if jit_compile else 'no XLA'}"
        print_rows(label, timed(steps, [probabilities], args.rounds, 5), KERAS)
    text = load_recipe("text_classification")
    keras.utils.set_random_seed(0)
    model = text.text_encoder(128, 10)
    x = tf.constant(rng.integers(0, text.VOCABULARY_SIZE, size=(64, 128)).astype("int32"))
    y = tf.constant(rng.integers(0, 10, size=(64,)).astype("int32"))
    for jit_compile in (False, True):
        steps = {KERAS: encoder_step(model, False, jit_compile), HASHED: encoder_step(model, True, jit_compile)}
        label = f"text recipe's encoder, train step, {'XLA' if jit_compile else 'no XLA'}"
        print_rows(label, timed(steps, [x, y], args.rounds, 3), KERAS)


if __name__ == "__main__":
    main()
