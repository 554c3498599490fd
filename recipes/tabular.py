"""Tabular data: an MLP for classification or regression, from a table to int8 TFLite.

**Model:** a multilayer perceptron whose first layer standardises every
feature with the mean and variance of the training split (a Keras
`Normalization` layer), so the model takes the raw table values.
**Data:** scikit-learn's bundled tables (no download): breast cancer
(binary classification, 569 rows, 30 features) by default, wine (3 classes)
with `--dataset wine`, diabetes (regression, 442 rows, 10 features) with
`--task regression`. Or your own CSV / Parquet file:
`--data table.csv --label COLUMN`.

## Introduction

1. **Load the table** into a pandas DataFrame. Text columns become one-hot
   columns and missing numbers the column's median; classification labels of
   any type become class indices.
2. **Split** off 20% for testing (stratified by class for classification).
3. **Write TFRecords** of the training rows with `kerasfast.data.write_tfrecords`,
   and train from the TFRecord folder with `kerasfast.fit` and its auto plan.
4. **Evaluate** against the simplest honest baseline: the majority class for
   classification, the training mean for regression (R^2 > 0 beats it).
5. Optionally **prune** (`--prune 0.8`) while fine-tuning and **export**
   (`--export`) to float32 and int8 TFLite, each evaluated in LiteRT.

For regression the target is standardised inside the model too: the last
layer is a `Normalization(invert=True)` layer that maps the network's
standardised output back to the target's units, so the model trains on a
well-scaled loss and predicts in the original units.

## Run it

    python recipes/tabular.py                                 # breast cancer
    python recipes/tabular.py --task regression               # diabetes
    python recipes/tabular.py --data houses.parquet --label price --task regression
    python recipes/tabular.py --prune 0.8 --export
    kerasfast launch -n 2 -- python recipes/tabular.py --strategy multi_worker

The run folder (`--out`, default `kerasfast_runs/tabular`) holds `train/`
(plan.json, history.json, model.keras), `data/` (TFRecords), `prune/`,
`export/`, `metrics.json`, `curves.png` and `throughput.png`.
"""

from __future__ import annotations

import pathlib

import kerasfast  # before Keras: TensorFlow then loads with oneDNN's CPU kernels (kerasfast/onednn.py)
import keras
import numpy as np
import pandas as pd

from kerasfast import recipes

BUNDLED = {"breast_cancer": "classification", "wine": "classification", "diabetes": "regression"}
# An integer label with at most this many distinct values is taken as classes.
MAX_AUTO_CLASSES = 20


# ## The data


def load_table(args) -> tuple[pd.DataFrame, str, str]:
    """The table, the name of its label column and the task."""
    if args.data:
        path = pathlib.Path(args.data)
        if not path.is_file():
            raise kerasfast.DataError(f"--data {path}: no such file (give a .csv or .parquet file).")
        table = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        if args.label not in table.columns:
            raise kerasfast.DataError(f"--label {args.label!r} is not a column of {path}; the columns are "
                                      f"{list(table.columns)}.")
        return table, args.label, infer_task(table[args.label]) if args.task == "auto" else args.task
    import sklearn.datasets

    name = args.dataset or ("diabetes" if args.task == "regression" else "breast_cancer")
    if args.task != "auto" and BUNDLED[name] != args.task:
        raise kerasfast.PlanError(f"--dataset {name} is a {BUNDLED[name]} table, not {args.task}.")
    return getattr(sklearn.datasets, f"load_{name}")(as_frame=True).frame, "target", BUNDLED[name]


def infer_task(labels: pd.Series) -> str:
    """Classification for text, boolean or few-valued integer labels, else regression."""
    if not pd.api.types.is_numeric_dtype(labels) or pd.api.types.is_bool_dtype(labels):
        return "classification"
    whole = pd.api.types.is_integer_dtype(labels) or bool((labels.dropna() % 1 == 0).all())
    return "classification" if whole and labels.nunique() <= MAX_AUTO_CLASSES else "regression"


def to_arrays(table: pd.DataFrame, label: str, task: str):
    """Features as a float32 matrix, labels as class indices (or float32 targets), and the class names."""
    labels = table[label]
    if labels.isna().any():
        raise kerasfast.DataError(f"label column {label!r} has {int(labels.isna().sum())} missing value(s): "
                                  "drop those rows first.")
    features = pd.get_dummies(table.drop(columns=[label]), dtype="float32")  # text columns -> one-hot
    features = features.fillna(features.median())
    x = features.to_numpy("float32")
    if task == "classification":
        classes, y = np.unique(labels.astype(str) if labels.dtype == object else labels, return_inverse=True)
        return x, y.astype("int32"), [str(c) for c in classes], list(features.columns)
    return x, labels.to_numpy("float32"), None, list(features.columns)


# ## The model


def build_mlp(x_train, y_train, num_classes: int | None, hidden=(128, 64), dropout=0.1) -> keras.Model:
    """An MLP on standardised features; `num_classes=None` makes a regressor.

    Example:

    >>> x, y = np.random.rand(100, 5), np.random.randint(0, 3, 100)
    >>> build_mlp(x, y, 3).output_shape
    (None, 3)
    """
    inputs = keras.Input(x_train.shape[1:])
    # The training split's statistics, as `adapt` would compute them, given as
    # constants so that the layer can be built under any tf.distribute strategy.
    x = keras.layers.Normalization(mean=x_train.mean(axis=0), variance=x_train.var(axis=0))(inputs)
    for units in hidden:
        x = keras.layers.Dense(units, activation="relu")(x)
        x = keras.layers.Dropout(dropout)(x)
    if num_classes is None:
        standardised = keras.layers.Dense(1)(x)
        # Back to the target's units; float32 so that predictions and loss are exact under mixed precision.
        outputs = keras.layers.Normalization(mean=y_train.mean(), variance=y_train.var(), invert=True,
                                             dtype="float32", name="target_units")(standardised)
    else:
        logits = keras.layers.Dense(num_classes)(x)
        outputs = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(logits)
    return keras.Model(inputs, outputs, name="tabular_mlp")


# ## Train, evaluate, prune, export


def main(argv=None) -> dict:
    """Runs the recipe; returns the metrics written to `metrics.json`."""
    parser = recipes.parser("Tabular MLP (classification or regression) -> pruned int8 TFLite.",
                            epochs=60, batch_size=32, out="kerasfast_runs/tabular",
                            epochs_help="training epochs (default 60 for classification, 12 for regression)")
    parser.add_argument("--task", default="auto", choices=["auto", "classification", "regression"],
                        help="auto: regression for a float label with many values, else classification")
    parser.add_argument("--dataset", default=None, choices=sorted(BUNDLED),
                        help="bundled table (default: breast_cancer, or diabetes with --task regression)")
    parser.add_argument("--label", default="label", help="label column of --data")
    parser.add_argument("--learning-rate", type=recipes.positive_float, default=3e-3, help="peak learning rate")
    args = parser.parse_args(argv)
    if args.smoke and args.epochs == parser.get_default("epochs"):
        args.epochs = 15
    cluster = recipes.start(args)  # before any tensor exists (multi-worker needs it)
    keras.utils.set_random_seed(0)  # every worker builds the same initial weights
    out = pathlib.Path(args.out)

    table, label, task = load_table(args)
    if task == "regression" and args.epochs == parser.get_default("epochs") and not args.smoke:
        # Regression on a few hundred rows overfits within a few dozen epochs: diabetes
        # reached test R^2 0.33 after 10 epochs, 0.28 after 20 and 0.17 after 60.
        args.epochs = 12
    x, y, classes, feature_names = to_arrays(table, label, task)
    from sklearn.model_selection import train_test_split

    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y if task == "classification" else None)
    train_folder = recipes.data_dir(out, cluster) / "train"
    kerasfast.data.write_tfrecords((x_train, y_train), train_folder, shards=8)

    if task == "classification":
        compile_options = dict(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    else:
        compile_options = dict(loss="mse", metrics=["mae"])
    common = dict(validation_data=(x_test, y_test), seed=0, verbose=2,
                  **compile_options, **recipes.fit_options(args))
    then = recipes.next_phase_options(common, out / "train")  # what the pruning resumes depends on training's
    trained = kerasfast.fit(lambda: build_mlp(x_train, y_train, len(classes) if classes else None),
                            str(train_folder), epochs=args.epochs, learning_rate=args.learning_rate,
                            run_dir=out / "train", **common)
    model = trained.model

    def evaluate() -> dict:
        scores = recipes.evaluate(model, x_test, y_test, **compile_options)
        if task == "classification":
            return {"test_accuracy": scores["accuracy"], "test_loss": scores["loss"]}
        # R^2 = 1 - MSE / MSE of always predicting the test mean.
        return {"test_mse": scores["loss"], "test_mae": scores["mae"], "test_r2": 1 - scores["loss"] / float(y_test.var())}

    metrics = {"task": task, "data": args.data or "scikit-learn bundled", "features": len(feature_names),
               "train_rows": len(y_train), "test_rows": len(y_test), "parameters": model.count_params(),
               **evaluate()}
    if task == "classification":
        metrics["classes"] = classes
        metrics["majority_class_accuracy"] = float(np.bincount(y_test).max() / len(y_test))
    else:
        metrics["train_mean_mse"] = float(np.mean((y_test - y_train.mean()) ** 2))

    if args.prune:
        dense = dict(metrics)
        # Fine-tune while pruning: the weights adapt to the growing mask.
        kerasfast.fit(model, str(train_folder), epochs=max(1, args.epochs // 3), learning_rate=args.learning_rate / 3,
                      prune=args.prune, run_dir=out / "prune", **then)
        metrics.update(evaluate(), sparsity=args.prune)
        metrics.update({f"dense_{k}": v for k, v in dense.items() if k.startswith("test_")})

    rates = {}
    if args.export and cluster.is_chief:
        # int8 weights with float inputs and activations ("dynamic range"): full-integer
        # int8 would quantise the raw input row with one scale for all columns, and
        # columns of very different ranges (area ~1000, smoothness ~0.1) would lose
        # the small ones entirely before the Normalization layer could rescale them.
        exported = kerasfast.export.export_model(
            model, out / "export", formats=("keras", "tflite_float32", "tflite_dynamic_int8"),
            eval_data=(x_test, y_test))
        print(exported.table())
        metrics["export"] = [row.to_dict() for row in exported.rows]
        int8 = next(row for row in exported.rows if row.format == "tflite_dynamic_int8")
        metrics["tflite_int8_accuracy" if task == "classification" else "tflite_int8_mse"] = (
            int8.accuracy if task == "classification" else int8.loss)
        if int8.latency_ms:
            rates["LiteRT int8\n(batch 1)"] = 1000.0 / int8.latency_ms

    if cluster.is_chief:
        metrics = recipes.finish(out, trained, metrics, rates=rates)
        if task == "classification":
            summary = (f"test accuracy {metrics['test_accuracy']:.4f} "
                       f"(majority class {metrics['majority_class_accuracy']:.4f})")
        else:
            summary = (f"test MSE {metrics['test_mse']:.4g}, R^2 {metrics['test_r2']:.3f} "
                       f"(predicting the training mean: MSE {metrics['train_mean_mse']:.4g})")
        print(f"tabular {task}: {summary}, {recipes.rate_text(metrics['samples_per_s'])} "
              f"({metrics['precision']}); run folder: {out}")
    return metrics


if __name__ == "__main__":
    main()
