"""The main job on a built-in default: a small convnet on scikit-learn's digits.

`kerasfast quickstart` runs `run_quickstart()`: it trains with the auto plan,
prints the plan and the result (test accuracy, samples/s) and leaves a run
folder with the plan, history, metrics and model.
"""

from __future__ import annotations

import pathlib

import keras

from kerasfast import datasets
from kerasfast.runs import write_json
from kerasfast.training import fit


def digits_convnet(num_classes: int = 10) -> keras.Model:
    """A small convnet for 8x8x1 digit images (~20k parameters).

    Example:

    >>> model = digits_convnet()
    >>> model.output_shape
    (None, 10)
    """
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(num_classes, activation="softmax"),
        ],
        name="digits_convnet",
    )


def run_quickstart(out_dir: str | pathlib.Path = "kerasfast_quickstart", *, epochs: int = 15,
                   batch_size: int = 64, verbose="auto", **fit_options) -> dict:
    """Trains the digits convnet with the auto plan and reports the result.

    Args:
        out_dir: The run folder to write.
        epochs: Training epochs.
        batch_size: Global batch size.
        verbose: As in `kerasfast.fit`.
        **fit_options: Any other `kerasfast.fit` override (e.g. precision=).

    Returns:
        The metrics written to `metrics.json`: test accuracy, samples/s, ...
    """
    out_dir = pathlib.Path(out_dir)
    (x_train, y_train), (x_test, y_test) = datasets.digits()
    result = fit(
        digits_convnet,
        (x_train, y_train),
        validation_data=(x_test, y_test),
        epochs=epochs,
        batch_size=batch_size,
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        run_dir=out_dir,
        verbose=verbose,
        seed=0,
        **fit_options,
    )
    test_loss, test_accuracy = result.model.evaluate(x_test, y_test, verbose=0)
    metrics = {
        "test_accuracy": float(test_accuracy),
        "test_loss": float(test_loss),
        "samples_per_second": result.throughput.samples_per_second,
        "steps_per_second": result.throughput.steps_per_second,
        "first_execution_s": result.throughput.first_execution_s,
        "precision": result.plan.precision,
        "run_dir": str(out_dir),
    }
    write_json(out_dir / "metrics.json", metrics)
    return metrics
