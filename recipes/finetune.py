"""Fine-tuning a pretrained keras-hub model, the fast way: a text classifier, or a causal LM with LoRA.

**Models:** keras-hub tasks with their preprocessors attached, as keras-hub's
own guides use them: a `TextClassifier` (BERT) or a `CausalLM` (GPT-2). With
`--preset PATH` the task loads from a local preset folder (keras-hub's
`from_preset` on a folder: how machines without internet, and clusters, load
pretrained weights); without it the recipe builds a small one from its
constructors, with a tokenizer whose vocabulary comes from the training text.

**Data:** text every Python installation ships with. The classifier learns
which package of the standard library a few lines of code come from
(`asyncio`, `email`, `json`, `unittest`); the LM continues the docstrings of
the standard library. Raw strings go to `kerasfast.fit` as they would go to
`task.fit`: kerasfast maps the task's preprocessor over the batches in its
input pipeline, in parallel and ahead of the training step.

**Training:** `kerasfast.fit(task, texts, labels)` with the auto plan; LoRA
(`--lora-rank`, on by default for the LM) trains low-rank factors of the
attention projections and leaves the backbone's weights as they were (on the
small model built here, whose backbone starts random, `--lora-rank 0` trains
it all). The
task keeps its own compile defaults (loss, metrics), with the recipe's
learning rate. `--prune S` fine-tunes again while pruning the classifier's
kernels to sparsity S; `--export` writes the classifier as `.keras`, float32
and int8 TFLite, each verified and evaluated in LiteRT on the test texts
(tokenised by the task's own preprocessor).

Run it:

    python recipes/finetune.py                                   # the classifier
    python recipes/finetune.py --task lm --lora-rank 8
    python recipes/finetune.py --preset ~/presets/bert_tiny_en_uncased --export
    kerasfast launch -n 2 -- python recipes/finetune.py --smoke --strategy multi_worker
"""

from __future__ import annotations

import ast
import pathlib
import sysconfig

import kerasfast  # before Keras: TensorFlow then loads with oneDNN's CPU kernels (kerasfast/onednn.py)
import keras
import numpy as np
import tensorflow as tf

from kerasfast import recipes

keras_hub = recipes.import_optional("keras_hub", extra="hub")

PACKAGES = ("asyncio", "email", "json", "unittest")
LINES_PER_TEXT = 4


# ## The data


def stdlib_files(package: str) -> list[pathlib.Path]:
    """The package's .py files in this interpreter's standard library, without its tests."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"]) / package
    return sorted(p for p in root.rglob("*.py") if not {"test", "tests"} & set(p.relative_to(root).parts))


def package_texts(per_class: int, seed: int = 0):
    """((x_train, y_train), (x_test, y_test)): texts of `LINES_PER_TEXT` non-blank lines of code and the index
    of their package; the last 20% of each file's texts are held out, so no test text is seen in training."""
    rng = np.random.default_rng(seed)
    splits = {"train": ([], []), "test": ([], [])}
    for label, package in enumerate(PACKAGES):
        train, test = [], []
        for path in stdlib_files(package):
            lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
            texts = [" ".join(lines[i:i + LINES_PER_TEXT]) for i in range(0, len(lines), LINES_PER_TEXT)]
            cut = int(len(texts) * 0.8)
            train, test = train + texts[:cut], test + texts[cut:]
        if len(train) < 10 or len(test) < 2:
            raise kerasfast.DataError(f"the standard library at {sysconfig.get_paths()['stdlib']} has too little "
                                      f"of package {package!r} for the built-in task.")
        for split, texts, count in (("train", train, per_class), ("test", test, max(20, per_class // 4))):
            picked = rng.choice(len(texts), size=min(count, len(texts)), replace=False)
            splits[split][0].extend(texts[i] for i in picked)
            splits[split][1].extend([label] * len(picked))
    return tuple((np.array(texts), np.array(labels, "int32")) for texts, labels in splits.values())


def docstrings(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation): the first paragraph of the standard library's module, class and function
    docstrings, shuffled; 10% held out."""
    found = []
    for path in sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node)
                if text and len(text) > 20:
                    found.append(" ".join(text.split("\n\n")[0].split()))
    texts = np.array(found)[np.random.default_rng(seed).permutation(len(found))][:count]
    cut = int(len(texts) * 0.9)
    return texts[:cut], texts[cut:]


# ## The models


def classifier(texts, num_classes: int, sequence_length: int, preset: str | None, smoke: bool):
    """A BERT text classifier with its preprocessor: from `preset`, else a small one with a WordPiece
    vocabulary computed from `texts`."""
    if preset:
        return keras_hub.models.TextClassifier.from_preset(preset, num_classes=num_classes)
    vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
        tf.data.Dataset.from_tensor_slices(texts).batch(256), vocabulary_size=1000 if smoke else 4000, lowercase=True,
        reserved_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocabulary, lowercase=True)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=tokenizer.vocabulary_size(), num_layers=1 if smoke else 2, num_heads=2,
        hidden_dim=32 if smoke else 64, intermediate_dim=64 if smoke else 128, max_sequence_length=sequence_length)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=sequence_length)
    return keras_hub.models.BertTextClassifier(backbone, num_classes=num_classes, preprocessor=preprocessor)


def causal_lm(texts, sequence_length: int, preset: str | None, smoke: bool):
    """A GPT-2 causal LM with its preprocessor: from `preset`, else a small one over GPT-2's byte alphabet
    with the most frequent pairs of `texts` as merges."""
    if preset:
        return keras_hub.models.CausalLM.from_preset(preset)
    vocabulary, merges = byte_pair_vocabulary(texts, merges=100 if smoke else 400)
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=len(vocabulary), num_layers=1 if smoke else 2, num_heads=2, hidden_dim=32 if smoke else 64,
        intermediate_dim=64 if smoke else 128, max_sequence_length=sequence_length)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=sequence_length)
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=preprocessor)


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-level alphabet: a printable character for each of the 256 byte values (printable bytes
    stand for themselves), so that any text tokenises.

    Example:

    >>> alphabet = byte_alphabet()
    >>> alphabet[ord("a")], alphabet[ord(" ")], len(set(alphabet.values()))
    ('a', 'Ġ', 256)
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    return {**{byte: chr(byte) for byte in printable}, **{byte: chr(256 + i) for i, byte in enumerate(others)}}


def byte_pair_vocabulary(texts, merges: int) -> tuple[dict, list[str]]:
    """GPT-2's byte alphabet plus the `merges` most frequent pairs of adjacent bytes within words of `texts`
    (one round of byte-pair encoding: every text still tokenises)."""
    from collections import Counter

    alphabet = byte_alphabet()
    pairs = Counter()
    for text in texts:
        for word in str(text).replace(" ", "\n ").split("\n"):
            characters = [alphabet[byte] for byte in word.encode("utf-8")]
            pairs.update(zip(characters, characters[1:], strict=False))
    kept = [f"{a} {b}" for (a, b), _ in pairs.most_common(merges)]
    tokens = list(alphabet.values()) + [merge.replace(" ", "") for merge in kept] + ["<|endoftext|>"]
    return {token: index for index, token in enumerate(tokens)}, kept


# ## Fine-tune, evaluate, prune, export


def main(argv=None) -> dict:
    """Runs the recipe; returns the metrics written to `metrics.json`."""
    parser = recipes.parser("Fine-tuning a keras-hub task (BERT classifier or GPT-2 LM with LoRA) -> int8 TFLite.",
                            epochs=4, batch_size=32, out="kerasfast_runs/finetune")
    parser.add_argument("--task", default="classifier", choices=["classifier", "lm"], help="what to fine-tune")
    parser.add_argument("--preset", default=None, metavar="PATH",
                        help="a local keras-hub preset folder to fine-tune (default: a small model built here)")
    parser.add_argument("--lora-rank", type=recipes.non_negative_int, default=None,
                        help="LoRA rank, 0 = off (default 4 for the LM, off for the classifier)")
    parser.add_argument("--sequence-length", type=recipes.positive_int, default=None,
                        help="tokens per text (default 64; 32 with --smoke)")
    parser.add_argument("--per-class", type=recipes.positive_int, default=None,
                        help="training texts per package for the classifier (default 800; 150 with --smoke)")
    parser.add_argument("--learning-rate", type=recipes.positive_float, default=None,
                        help="learning rate (default 1e-3; 1e-4 for a --preset)")
    args = parser.parse_args(argv)
    if args.data:
        parser.error("--data: this recipe trains on the standard library's text; fine-tune on your own with "
                     "kerasfast.fit(task, texts, labels) as in docs/finetuning.md.")
    if args.task == "lm" and (args.prune or args.export):
        parser.error("--prune and --export apply to --task classifier (the LM's generate() loop is not exported).")
    sequence_length = args.sequence_length or (32 if args.smoke else 64)
    lora_rank = args.lora_rank if args.lora_rank is not None else (4 if args.task == "lm" else 0)
    learning_rate = args.learning_rate or (1e-4 if args.preset else 1e-3)
    cluster = recipes.start(args)  # before any tensor exists (multi-worker needs it)
    keras.utils.set_random_seed(0)  # every worker builds the same initial weights
    out = pathlib.Path(args.out)

    if args.task == "classifier":
        (x_train, y_train), (x_test, y_test) = package_texts(args.per_class or (150 if args.smoke else 800))
        validation = (x_test, y_test)
    else:
        x_train, x_validation = docstrings(600 if args.smoke else 6000)
        y_train, validation = None, (x_validation,)

    def build_task():
        if args.task == "classifier":
            task = classifier(x_train, len(PACKAGES), sequence_length, args.preset, args.smoke)
        else:
            task = causal_lm(x_train, sequence_length, args.preset, args.smoke)
        if lora_rank:
            task.backbone.enable_lora(lora_rank)
        # The task's own loss and metrics ("auto"), with the recipe's learning rate.
        task.compile(optimizer=keras.optimizers.AdamW(learning_rate))
        return task

    options = dict(validation_data=validation, seed=0, verbose=2, **recipes.fit_options(args))
    then = recipes.next_phase_options(options, out / "train")
    trained = kerasfast.fit(build_task, x_train, y_train, epochs=args.epochs, run_dir=out / "train", **options)
    task = trained.model
    metrics = {"task": args.task, "preset": args.preset, "lora_rank": lora_rank, "sequence_length": sequence_length,
               "train_texts": len(x_train), "parameters": task.count_params(),
               "trainable_parameters": int(sum(np.prod(w.shape) for w in task.trainable_weights))}
    rates = {}
    if args.task == "lm":
        loss = task.evaluate(x_validation, verbose=0, return_dict=True)["loss"]
        metrics.update(validation_loss=loss, validation_perplexity=float(np.exp(loss)),
                       vocabulary_size=int(task.preprocessor.tokenizer.vocabulary_size()),
                       sample=task.generate(str(x_validation[0])[:12], max_length=sequence_length))
    else:
        metrics.update(test_accuracy=_accuracy(task, x_test, y_test),
                       majority_class_accuracy=float(np.bincount(y_test).max() / len(y_test)))
        if args.prune:
            kerasfast.fit(task, x_train, y_train, epochs=max(1, args.epochs // 2), prune=args.prune,
                          run_dir=out / "prune", **then)
            metrics.update(dense_test_accuracy=metrics["test_accuracy"], test_accuracy=_accuracy(task, x_test, y_test),
                           sparsity=args.prune)
        if args.export and cluster.is_chief:
            # The file takes token ids, as the task's preprocessor makes them (a serving client, or the app on
            # the phone, tokenises with the same vocabulary): evaluated on the test texts tokenised so.
            tokens = np.asarray(task.preprocessor(x_test)["token_ids"])
            rates = recipes.export_and_report(serving_classifier(task, tokens.shape[1]), out / "export",
                                              eval_data=(tokens, y_test), representative_data=tokens[:200],
                                              metrics=metrics)

    if cluster.is_chief:
        metrics = recipes.finish(out, trained, metrics, rates=rates)
        score = (f"test accuracy {metrics['test_accuracy']:.4f} over {len(PACKAGES)} packages (majority class "
                 f"{metrics['majority_class_accuracy']:.4f})" if args.task == "classifier" else
                 f"validation perplexity {metrics['validation_perplexity']:.1f}; sample: {metrics['sample']!r}")
        print(f"fine-tuning: {score}, {recipes.rate_text(metrics['samples_per_s'])} ({metrics['precision']}); "
              f"run folder: {out}")
    return metrics


def serving_classifier(task, sequence_length: int) -> keras.Model:
    """The fine-tuned classifier as a model of one input, token ids (what export takes): BERT's padding mask
    and segment ids follow from them (one segment, padding id 0). It shares the task's weights."""
    token_ids = keras.Input((sequence_length,), dtype="int32", name="token_ids")
    logits = task({"token_ids": token_ids, "padding_mask": keras.ops.not_equal(token_ids, 0),
                   "segment_ids": keras.ops.zeros_like(token_ids)})
    return keras.Model(token_ids, logits, name=f"{task.name}_token_ids")


def _accuracy(task, x, y) -> float:
    """Accuracy of the classifier on raw texts (`predict` runs the task's preprocessor)."""
    return float(np.mean(np.argmax(task.predict(x, verbose=0), axis=-1) == y))


if __name__ == "__main__":
    main()
