"""Image classification: a small ResNet, trained, pruned and shipped as int8 TFLite.

**Model:** a ResNet-style convnet (residual blocks with batch normalization), or
MobileNetV3-Small / EfficientNet-B0 / ResNet50 from `keras.applications`
(`weights=None`, trained from scratch) with `--model`.
**Data:** scikit-learn's bundled handwritten digits (1,797 8x8 images, no
download), or your own folder of images with `--data DIR` (one sub-folder per
class: `DIR/cat/001.jpg`, `DIR/dog/002.png`, ...).

## Introduction

This recipe walks the whole path a convnet takes with kerasfast:

1. **Data to TFRecords.** The images are written once to TFRecord shards with
   `kerasfast.data.write_tfrecords` and read back by kerasfast's tuned input
   pipeline (parallel interleave, batch-then-parse, prefetch).
2. **Training with the auto plan.** `kerasfast.fit` picks precision, XLA,
   steps per execution and the distribution strategy for this machine, prints
   the plan and saves it with the run. Defaults: AdamW with warm-up + cosine.
3. **Evaluation** on held-out images.
4. **Pruning** (`--prune 0.8`): a short fine-tuning run that prunes every
   convolution and dense kernel to the target sparsity.
5. **Export** (`--export`): `.keras`, float32 and full-integer int8 TFLite,
   each run in the LiteRT interpreter and evaluated on the test images.

The `keras.applications` models need inputs of at least 32x32 RGB: a
`Resizing` layer inside the model upscales the images (the 8x8 digits to
`--image-size`) and grayscale images are repeated to three channels, so the
data path and the exported model take the images as they are.

## Run it

    python recipes/image_classification.py                       # small ResNet on digits
    python recipes/image_classification.py --prune 0.8 --export  # + pruned int8 TFLite
    python recipes/image_classification.py --model mobilenetv3 --image-size 32
    python recipes/image_classification.py --data photos/ --image-size 96 --epochs 30
    kerasfast launch -n 2 -- python recipes/image_classification.py --strategy multi_worker

The run folder (`--out`, default `kerasfast_runs/image_classification`)
holds `train/` (plan.json, history.json, model.keras), `prune/`, `export/`
(artifacts and report.md), `metrics.json`, `curves.png` and `throughput.png`.
"""

from __future__ import annotations

import pathlib

import kerasfast  # before Keras: TensorFlow then loads with oneDNN's CPU kernels (kerasfast/onednn.py)
import keras
import numpy as np

from kerasfast import recipes

MODELS = ("resnet", "mobilenetv3", "efficientnet", "resnet50")
# The smallest input keras.applications accepts.
MIN_APPLICATION_SIZE = 32
# Keras's default 0.99 needs hundreds of steps before the moving statistics
# that evaluation uses settle; these runs are a few hundred steps at most.
BN_MOMENTUM = 0.9
# --smoke: enough steps (6 x 8) for those statistics to be usable.
SMOKE_EPOCHS = 6


# ## The models


def residual_block(x, filters: int, stride: int = 1):
    """Two 3x3 convolutions with batch normalization, added to a shortcut."""
    shortcut = x
    y = keras.layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
    y = keras.layers.BatchNormalization(momentum=BN_MOMENTUM)(y)
    y = keras.layers.ReLU()(y)
    y = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
    y = keras.layers.BatchNormalization(momentum=BN_MOMENTUM)(y)
    if stride != 1 or shortcut.shape[-1] != filters:
        # A 1x1 projection when the block changes the resolution or width.
        shortcut = keras.layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
        shortcut = keras.layers.BatchNormalization(momentum=BN_MOMENTUM)(shortcut)
    return keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))


def small_resnet(input_shape, num_classes: int, width: int = 32) -> keras.Model:
    """A ResNet-style convnet: a stem and three residual stages (~0.3M parameters at width 32).

    Example:

    >>> small_resnet((8, 8, 1), 10).output_shape
    (None, 10)
    """
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
    x = keras.layers.ReLU()(x)
    x = residual_block(x, width)
    x = residual_block(x, 2 * width, stride=2)
    x = residual_block(x, 4 * width, stride=2)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, classifier_head(x, num_classes), name="small_resnet")


def classifier_head(features, num_classes: int):
    logits = keras.layers.Dense(num_classes)(features)
    # Softmax in float32 even under mixed precision, so the loss is computed in full precision.
    return keras.layers.Activation("softmax", dtype="float32", name="probabilities")(logits)


def application_model(name: str, input_shape, num_classes: int, image_size: int) -> keras.Model:
    """A `keras.applications` backbone, trained from scratch, for images in [0, 1].

    The images are resized to `image_size` and repeated to 3 channels inside
    the model, so the model (and its TFLite file) take them as stored.
    """
    if image_size < MIN_APPLICATION_SIZE:
        raise kerasfast.PlanError(f"--model {name} needs --image-size >= {MIN_APPLICATION_SIZE} (keras.applications' "
                                  f"minimum input size), got {image_size}.")
    inputs = keras.Input(input_shape)
    x = keras.layers.Resizing(image_size, image_size)(inputs)
    if input_shape[-1] == 1:
        x = keras.layers.Concatenate()([x, x, x])  # the applications' stems expect RGB
    shape = (image_size, image_size, 3)
    if name == "mobilenetv3":
        backbone = keras.applications.MobileNetV3Small(
            input_shape=shape, weights=None, include_top=False, pooling="avg", include_preprocessing=False)
    elif name == "efficientnet":
        # EfficientNet divides its input by 255 itself; our images are already in [0, 1].
        x = keras.layers.Rescaling(255.0)(x)
        backbone = keras.applications.EfficientNetB0(input_shape=shape, weights=None, include_top=False, pooling="avg")
    elif name == "resnet50":
        backbone = keras.applications.ResNet50(input_shape=shape, weights=None, include_top=False, pooling="avg")
    else:
        raise kerasfast.PlanError(f"--model {name!r} is not known: use one of {', '.join(MODELS)}.")
    return keras.Model(inputs, classifier_head(backbone(x), num_classes), name=f"{name}_classifier")


# ## The data


def digits_to_tfrecords(folder: pathlib.Path, smoke: bool):
    """scikit-learn's digits, written to TFRecords: returns (train folder, (x_test, y_test), classes)."""
    (x_train, y_train), (x_test, y_test) = kerasfast.datasets.digits()
    if smoke:
        x_train, y_train, x_test, y_test = x_train[:512], y_train[:512], x_test[:200], y_test[:200]
    kerasfast.data.write_tfrecords((x_train, y_train), folder / "train", shards=8)
    return str(folder / "train"), (x_test, y_test), [str(c) for c in range(10)]


def image_folder_to_tfrecords(source: str, folder: pathlib.Path, image_size: int, batch_size: int):
    """Your image folder, written to TFRecords: returns (train dataset, (x_test, y_test), classes).

    The images are shuffled when written and dealt round-robin to 10 shards,
    so the last two shards are a random 20% held out for testing.
    """
    import tensorflow as tf

    written = kerasfast.data.write_tfrecords(source, folder / "images", shards=10)
    files = sorted(str(p) for p in (folder / "images").glob("data-*.tfrecord"))
    size = (image_size, image_size)

    def to_unit_range(images, labels):
        return tf.cast(images, "float32") / 255.0, labels

    train = kerasfast.data.tfrecord_dataset(files[:-2], batch_size=batch_size, image_size=size, seed=0)
    test = kerasfast.data.tfrecord_dataset(files[-2:], batch_size=256, image_size=size, shuffle=False)
    test_batches = [(x.numpy(), y.numpy()) for x, y in test.map(to_unit_range)]
    x_test = np.concatenate([x for x, _ in test_batches])
    y_test = np.concatenate([y for _, y in test_batches])
    return train.map(to_unit_range), (x_test, y_test), list(written.schema.classes)


def representative_images(train, count: int = 300) -> np.ndarray:
    """A few hundred training images, to calibrate int8 quantisation."""
    if isinstance(train, str):
        train = kerasfast.data.tfrecord_dataset(train, batch_size=count, shuffle=False)
    return np.concatenate([x.numpy() for x, _ in train.take(max(1, count // 16))])[:count]


# ## Train, evaluate, prune, export


def main(argv=None) -> dict:
    """Runs the recipe; returns the metrics written to `metrics.json`."""
    parser = recipes.parser("Image classification: small ResNet (or keras.applications) -> pruned int8 TFLite.",
                            epochs=15, batch_size=64, out="kerasfast_runs/image_classification")
    parser.add_argument("--model", default="resnet", choices=MODELS, help="the convnet family")
    parser.add_argument("--image-size", type=recipes.positive_int, default=None,
                        help="side the images are resized to (default: 32 for keras.applications models and "
                             "for --data, digits stay 8x8 for the small ResNet)")
    parser.add_argument("--learning-rate", type=recipes.positive_float, default=3e-3, help="peak learning rate")
    args = parser.parse_args(argv)
    if args.smoke and args.epochs == parser.get_default("epochs"):
        args.epochs = SMOKE_EPOCHS
    cluster = recipes.start(args)  # before any tensor exists (multi-worker needs it)
    keras.utils.set_random_seed(0)  # every worker builds the same initial weights
    out = pathlib.Path(args.out)
    image_size = args.image_size or MIN_APPLICATION_SIZE

    folder = recipes.data_dir(out, cluster)
    if args.data:
        train, (x_test, y_test), classes = image_folder_to_tfrecords(args.data, folder, image_size, args.batch_size)
    else:
        train, (x_test, y_test), classes = digits_to_tfrecords(folder, args.smoke)
    input_shape = x_test.shape[1:]

    def build_model():
        if args.model == "resnet":
            return small_resnet(input_shape, len(classes), width=16 if args.smoke else 32)
        return application_model(args.model, input_shape, len(classes), image_size)

    compiled = dict(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    common = dict(validation_data=(x_test, y_test), seed=0, verbose=2,
                  **compiled, **recipes.fit_options(args))
    then = recipes.next_phase_options(common, out / "train")  # what the pruning resumes depends on training's
    trained = kerasfast.fit(build_model, train, epochs=args.epochs, learning_rate=args.learning_rate,
                            run_dir=out / "train", **common)
    model = trained.model
    scores = recipes.evaluate(model, x_test, y_test, **compiled)
    metrics = {"model": args.model, "classes": classes, "test_samples": len(y_test),
               "parameters": model.count_params(), "test_accuracy": scores["accuracy"],
               "test_loss": scores["loss"], "chance_accuracy": 1.0 / len(classes)}

    if args.prune:
        # Fine-tune while pruning: the weights adapt to the growing mask.
        kerasfast.fit(model, train, epochs=max(1, args.epochs // 2), learning_rate=args.learning_rate / 3,
                      prune=args.prune, run_dir=out / "prune", **then)
        scores = recipes.evaluate(model, x_test, y_test, **compiled)
        metrics.update(dense_test_accuracy=metrics["test_accuracy"], test_accuracy=scores["accuracy"],
                       test_loss=scores["loss"], sparsity=args.prune)

    rates = {}
    if args.export and cluster.is_chief:
        rates = recipes.export_and_report(model, out / "export", representative_data=representative_images(train),
                                          eval_data=(x_test, y_test), metrics=metrics)

    if cluster.is_chief:
        metrics = recipes.finish(out, trained, metrics, rates=rates)
        print(f"{args.model}: test accuracy {metrics['test_accuracy']:.4f} (chance {metrics['chance_accuracy']:.2f}), "
              f"{recipes.rate_text(metrics['samples_per_s'])} ({metrics['precision']}); run folder: {out}")
    return metrics


if __name__ == "__main__":
    main()
