"""Tiny keras-hub tasks built from their constructors (no preset can be downloaded here), with and without
their preprocessors, and the raw data each takes, for the fine-tuning tests."""

from __future__ import annotations

import numpy as np

WORDS = ["good", "bad", "fine", "poor"]


MERGES = ["Ġ t", "i n", "e r"]  # keras-hub's BPE tokenizers need at least one merge


def byte_vocabulary() -> dict:
    """GPT-2's byte-level vocabulary (the fine-tuning recipe's alphabet) and `MERGES`: every text tokenises,
    about one token per byte."""
    from kerasfast import recipes

    tokens = list(recipes.load_recipe("finetune").byte_alphabet().values()) + [m.replace(" ", "") for m in MERGES]
    return {token: index for index, token in enumerate(tokens + ["<|endoftext|>", "<pad>"])}


def bert_classifier(preprocessor: bool = True, sequence_length: int = 8, num_classes: int = 2, dropout=0.0,
                    dtype=None):
    """A one-layer BERT classifier; without dropout by default, so that two runs compare step for step."""
    import keras_hub

    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    backbone = keras_hub.models.BertBackbone(vocabulary_size=len(vocabulary), num_layers=1, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16, max_sequence_length=sequence_length,
                                             dropout=dropout, dtype=dtype)
    processor = keras_hub.models.BertTextClassifierPreprocessor(
        keras_hub.models.BertTokenizer(vocabulary=vocabulary), sequence_length=sequence_length)
    return keras_hub.models.BertTextClassifier(backbone, num_classes=num_classes, dropout=dropout,
                                               preprocessor=processor if preprocessor else None)


def text_labels(n: int = 64, seed: int = 0):
    """Strings of the four words with a learnable label: 1 when "good" or "fine" comes first."""
    rng = np.random.default_rng(seed)
    first = rng.integers(0, len(WORDS), n)
    x = np.array([f"{WORDS[i]} {WORDS[j]}" for i, j in zip(first, rng.integers(0, len(WORDS), n), strict=True)])
    return x, (first % 2 == 0).astype("int32")


def gpt2_causal_lm(preprocessor: bool = True, sequence_length: int = 16, dropout=0.0):
    import keras_hub

    vocabulary = byte_vocabulary()
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=len(vocabulary), num_layers=1, num_heads=2,
                                             hidden_dim=16, intermediate_dim=32, max_sequence_length=sequence_length,
                                             dropout=dropout)
    processor = keras_hub.models.GPT2CausalLMPreprocessor(
        keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=MERGES), sequence_length=sequence_length)
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=processor if preprocessor else None)


def bart_seq2seq(preprocessor: bool = True, sequence_length: int = 12):
    import keras_hub

    vocabulary = byte_vocabulary()
    vocabulary = {**{token: i + 4 for token, i in vocabulary.items()}, "<s>": 0, "<pad>": 1, "</s>": 2, "<mask>": 3}
    backbone = keras_hub.models.BartBackbone(vocabulary_size=len(vocabulary), num_layers=1, num_heads=2,
                                             hidden_dim=16, intermediate_dim=32, max_sequence_length=sequence_length)
    processor = keras_hub.models.BartSeq2SeqLMPreprocessor(
        keras_hub.models.BartTokenizer(vocabulary=vocabulary, merges=MERGES), encoder_sequence_length=sequence_length,
        decoder_sequence_length=sequence_length)
    return keras_hub.models.BartSeq2SeqLM(backbone, preprocessor=processor if preprocessor else None)


def resnet_classifier(preprocessor: bool = True, num_classes: int = 2, image_size: int = 16):
    import keras_hub

    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64, 64],
        stackwise_num_blocks=[1, 1], stackwise_num_strides=[1, 2], block_type="basic_block",
        image_shape=(image_size, image_size, 3))
    converter = keras_hub.layers.ResNetImageConverter(image_size=(image_size, image_size), scale=1 / 255.0)
    processor = keras_hub.models.ResNetImageClassifierPreprocessor(converter)
    return keras_hub.models.ResNetImageClassifier(backbone, num_classes=num_classes,
                                                  preprocessor=processor if preprocessor else None)


def images_labels(n: int = 32, size: int = 24, seed: int = 0):
    """uint8 images of another size than the model's (its preprocessor resizes them); label 1 when bright."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n).astype("int32")
    x = (rng.integers(0, 128, (n, size, size, 3)) + 127 * y[:, None, None, None]).astype("uint8")
    return x, y


CODE = np.array(["def f(x): return x", "import os", "class A: pass", "print(1)"] * 8)
