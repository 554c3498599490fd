"""Text classification with a small BERT-style transformer encoder, on byte tokens.

**Model:** token + position embeddings, a stack of transformer encoder blocks
(`keras.layers.MultiHeadAttention`, a feed-forward layer, residual
connections and layer normalization, as in BERT), mean pooling over the
sequence and a softmax classifier.
**Data:** a task built from text every Python installation ships with: given
a 128-byte chunk of source code from the running interpreter's standard
library, predict which package it comes from (`asyncio`, `email`, `json`,
`unittest`, `xml`, ...). Or your own CSV / Parquet file with a text and a label
column: `--data reviews.csv --text-column review --label sentiment`.

## Introduction

Tokens are bytes: the UTF-8 bytes of the text, each shifted by one so that 0
can pad short texts (vocabulary of 257). That needs no tokenizer to train or
ship, and works for any language and for code.

The standard-library task is harder than it looks: a chunk is two or three
lines of code, often without the package's name in it. The model must
pick up each package's vocabulary (`loop`, `future` and `await` for asyncio,
`header` and `charset` for email, `element` and `namespace` for xml). Every
source file is split into consecutive, non-overlapping chunks; the first 80%
of each file's chunks are for training and the last 20% for testing, so no
test chunk overlaps a training one. Classes are balanced by sampling the same
number of chunks from each package, so chance is 1 / number of packages.

The path is the same as in the other recipes: token arrays to TFRecords
(`kerasfast.data.write_tfrecords`), `kerasfast.fit` with the auto plan
(AdamW with warm-up + cosine decay), evaluation, then `--prune` and
`--export` (float32 and int8 TFLite, each evaluated in LiteRT).

## Run it

    python recipes/text_classification.py
    python recipes/text_classification.py --prune 0.7 --export
    python recipes/text_classification.py --data reviews.parquet --text-column review --label sentiment
    kerasfast launch -n 2 -- python recipes/text_classification.py --strategy multi_worker

The run folder (`--out`, default `kerasfast_runs/text_classification`) holds
`train/` (plan.json, history.json, model.keras), `data/` (TFRecords), `prune/`,
`export/`, `metrics.json`, `curves.png` and `throughput.png`.
"""

from __future__ import annotations

import pathlib
import sysconfig

import kerasfast  # before Keras: TensorFlow then loads with oneDNN's CPU kernels (kerasfast/onednn.py)
import keras
import numpy as np

from kerasfast import recipes

PACKAGES = ("asyncio", "email", "json", "unittest", "xml", "multiprocessing", "importlib", "http", "logging",
            "urllib")
PAD = 0  # token 0 pads; byte b is token b + 1
VOCABULARY_SIZE = 257


# ## The data


def encode(texts, sequence_length: int) -> np.ndarray:
    """UTF-8 byte tokens (byte + 1), cut or padded with 0 to `sequence_length`.

    Example:

    >>> encode(["hi"], 4)
    array([[105, 106,   0,   0]], dtype=int32)
    """
    tokens = np.full((len(texts), sequence_length), PAD, dtype="int32")
    for row, text in enumerate(texts):
        data = np.frombuffer(str(text).encode("utf-8")[:sequence_length], dtype="uint8")
        tokens[row, : len(data)] = data.astype("int32") + 1
    return tokens


def package_sources(package: str) -> list[pathlib.Path]:
    """The package's .py files in this interpreter's standard library, without its tests."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"]) / package
    return sorted(p for p in root.rglob("*.py") if not {"test", "tests"} & set(p.relative_to(root).parts))


def stdlib_chunks(sequence_length: int, train_per_class: int, test_per_class: int, seed: int = 0):
    """The "which package is this code from?" task: ((x_train, y_train), (x_test, y_test), packages)."""
    rng = np.random.default_rng(seed)
    splits = {"train": ([], []), "test": ([], [])}
    found = []
    for package in PACKAGES:
        train, test = [], []
        for path in package_sources(package):
            data = path.read_bytes()
            chunks = [data[i:i + sequence_length] for i in range(0, len(data) - sequence_length + 1, sequence_length)]
            cut = int(len(chunks) * 0.8)  # the end of each file is held out
            train += chunks[:cut]
            test += chunks[cut:]
        if len(train) < 10 or len(test) < 2:
            continue  # a stripped-down installation may lack the package
        found.append(package)
        for split, chunks, count in (("train", train, train_per_class), ("test", test, test_per_class)):
            picked = rng.choice(len(chunks), size=min(count, len(chunks)), replace=False)
            splits[split][0].extend(chunks[i] for i in picked)
            splits[split][1].extend([len(found) - 1] * len(picked))
    if len(found) < 2:
        raise kerasfast.DataError(f"found fewer than 2 of the packages {PACKAGES} in the standard library at "
                                  f"{sysconfig.get_paths()['stdlib']}: pass your own data with --data.")

    def arrays(split):
        chunks, labels = splits[split]
        tokens = np.stack([np.frombuffer(c, dtype="uint8").astype("int32") + 1 for c in chunks])
        return tokens, np.asarray(labels, dtype="int32")

    return arrays("train"), arrays("test"), found


def table_texts(path: str, text_column: str, label_column: str, sequence_length: int):
    """Your CSV / Parquet file: ((x_train, y_train), (x_test, y_test), class names), 20% held out."""
    import pandas as pd
    from sklearn.model_selection import train_test_split

    path = pathlib.Path(path)
    if not path.is_file():
        raise kerasfast.DataError(f"--data {path}: no such file (give a .csv or .parquet file).")
    table = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    missing = [c for c in (text_column, label_column) if c not in table.columns]
    if missing:
        raise kerasfast.DataError(f"{path} has no column(s) {missing}; its columns are {list(table.columns)}. "
                                  "Name them with --text-column and --label.")
    table = table.dropna(subset=[text_column, label_column])
    classes, labels = np.unique(table[label_column].astype(str), return_inverse=True)
    x_train, x_test, y_train, y_test = train_test_split(
        encode(table[text_column].tolist(), sequence_length), labels.astype("int32"), test_size=0.2,
        random_state=0, stratify=labels)
    return (x_train, y_train), (x_test, y_test), [str(c) for c in classes]


# ## The model


@keras.saving.register_keras_serializable(package="kerasfast_recipes")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """The sum of a learned embedding of each token and of its position.

    Args:
        sequence_length: Longest sequence (number of positions).
        vocabulary_size: Number of token ids.
        embed_dim: Size of each embedding vector.
    """

    def __init__(self, sequence_length: int, vocabulary_size: int, embed_dim: int, **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = sequence_length
        self.vocabulary_size = vocabulary_size
        self.embed_dim = embed_dim
        # The sub-layers take this layer's dtype policy, not the global one at
        # creation time: a reloaded mixed-precision model must compute alike.
        self.token_embedding = keras.layers.Embedding(vocabulary_size, embed_dim, dtype=self.dtype_policy,
                                                      name="token")
        self.position_embedding = keras.layers.Embedding(sequence_length, embed_dim, dtype=self.dtype_policy,
                                                         name="position")

    def build(self, input_shape):
        # Built here, not on first call, so that saved weights load into a fresh copy.
        self.token_embedding.build(input_shape)
        self.position_embedding.build((self.sequence_length,))
        super().build(input_shape)

    def call(self, tokens):
        positions = keras.ops.arange(keras.ops.shape(tokens)[-1])
        return self.token_embedding(tokens) + self.position_embedding(positions)

    def get_config(self):
        return {**super().get_config(), "sequence_length": self.sequence_length,
                "vocabulary_size": self.vocabulary_size, "embed_dim": self.embed_dim}


def encoder_block(x, num_heads: int, feed_forward_dim: int, dropout: float):
    """A post-norm transformer encoder block, as in BERT."""
    embed_dim = x.shape[-1]
    attention = keras.layers.MultiHeadAttention(num_heads, embed_dim // num_heads, dropout=dropout)(x, x)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(keras.layers.Add()([x, keras.layers.Dropout(dropout)(attention)]))
    feed_forward = keras.layers.Dense(feed_forward_dim, activation="gelu")(x)
    feed_forward = keras.layers.Dense(embed_dim)(feed_forward)
    return keras.layers.LayerNormalization(epsilon=1e-6)(
        keras.layers.Add()([x, keras.layers.Dropout(dropout)(feed_forward)]))


def text_encoder(sequence_length: int, num_classes: int, embed_dim: int = 64, num_heads: int = 4,
                 num_blocks: int = 2, feed_forward_dim: int = 128, dropout: float = 0.1) -> keras.Model:
    """A small BERT-style classifier over byte tokens.

    Example:

    >>> text_encoder(128, 10).output_shape
    (None, 10)
    """
    tokens = keras.Input((sequence_length,), dtype="int32")
    x = TokenAndPositionEmbedding(sequence_length, VOCABULARY_SIZE, embed_dim)(tokens)
    for _ in range(num_blocks):
        x = encoder_block(x, num_heads, feed_forward_dim, dropout)
    x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dropout(dropout)(x)
    logits = keras.layers.Dense(num_classes)(x)
    # Softmax in float32 even under mixed precision, so the loss is computed in full precision.
    probabilities = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(logits)
    return keras.Model(tokens, probabilities, name="text_encoder")


# ## Train, evaluate, prune, export


def main(argv=None) -> dict:
    """Runs the recipe; returns the metrics written to `metrics.json`."""
    parser = recipes.parser("Text classification: a small BERT-style encoder on byte tokens -> int8 TFLite.",
                            epochs=10, batch_size=64, out="kerasfast_runs/text_classification")
    parser.add_argument("--sequence-length", type=recipes.positive_int, default=None, help="tokens (bytes) per text (default 128)")
    parser.add_argument("--per-class", type=recipes.positive_int, default=None,
                        help="training chunks per package for the built-in task (default 600)")
    parser.add_argument("--text-column", default="text", help="text column of --data")
    parser.add_argument("--label", default="label", help="label column of --data")
    parser.add_argument("--learning-rate", type=recipes.positive_float, default=2e-3, help="peak learning rate")
    args = parser.parse_args(argv)
    if args.smoke and args.epochs == parser.get_default("epochs"):
        args.epochs = 6
    sequence_length = args.sequence_length or (64 if args.smoke else 128)
    train_per_class = args.per_class or (150 if args.smoke else 600)
    cluster = recipes.start(args)  # before any tensor exists (multi-worker needs it)
    keras.utils.set_random_seed(0)  # every worker builds the same initial weights
    out = pathlib.Path(args.out)

    if args.data:
        (x_train, y_train), (x_test, y_test), classes = table_texts(args.data, args.text_column, args.label,
                                                                    sequence_length)
    else:
        (x_train, y_train), (x_test, y_test), classes = stdlib_chunks(sequence_length, train_per_class,
                                                                      test_per_class=max(20, train_per_class // 4))
    train_folder = recipes.data_dir(out, cluster) / "train"
    kerasfast.data.write_tfrecords((x_train, y_train), train_folder, shards=8)

    def build_model():
        if args.smoke:
            return text_encoder(sequence_length, len(classes), embed_dim=32, num_heads=2, num_blocks=1,
                                feed_forward_dim=64)
        return text_encoder(sequence_length, len(classes))

    compiled = dict(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    common = dict(validation_data=(x_test, y_test), seed=0, verbose=2,
                  **compiled, **recipes.fit_options(args))
    then = recipes.next_phase_options(common, out / "train")  # what the pruning resumes depends on training's
    trained = kerasfast.fit(build_model, str(train_folder), epochs=args.epochs, learning_rate=args.learning_rate,
                            run_dir=out / "train", **common)
    model = trained.model
    scores = recipes.evaluate(model, x_test, y_test, **compiled)
    metrics = {"data": args.data or f"stdlib of Python at {sysconfig.get_paths()['stdlib']}", "classes": classes,
               "sequence_length": sequence_length, "train_samples": len(y_train), "test_samples": len(y_test),
               "parameters": model.count_params(), "test_accuracy": scores["accuracy"],
               "test_loss": scores["loss"],
               "majority_class_accuracy": float(np.bincount(y_test).max() / len(y_test))}

    if args.prune:
        # Fine-tune while pruning: the weights adapt to the growing mask.
        kerasfast.fit(model, str(train_folder), epochs=max(1, args.epochs // 2),
                      learning_rate=args.learning_rate / 3, prune=args.prune, run_dir=out / "prune", **then)
        scores = recipes.evaluate(model, x_test, y_test, **compiled)
        metrics.update(dense_test_accuracy=metrics["test_accuracy"], test_accuracy=scores["accuracy"],
                       test_loss=scores["loss"], sparsity=args.prune)

    rates = {}
    if args.export and cluster.is_chief:
        rates = recipes.export_and_report(model, out / "export", representative_data=x_train[:300],
                                          eval_data=(x_test, y_test), metrics=metrics)

    if cluster.is_chief:
        metrics = recipes.finish(out, trained, metrics, rates=rates)
        print(f"text classification: test accuracy {metrics['test_accuracy']:.4f} over {len(classes)} classes "
              f"(majority class {metrics['majority_class_accuracy']:.4f}), "
              f"{recipes.rate_text(metrics['samples_per_s'])} ({metrics['precision']}); run folder: {out}")
    return metrics


if __name__ == "__main__":
    main()
