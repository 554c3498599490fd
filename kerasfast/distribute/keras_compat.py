"""The few Keras internals kerasfast must touch to train under tf.distribute.

Keras 3.15's TensorFlow trainer fails under MultiWorkerMirroredStrategy in
`_maybe_symbolic_build` (it reduces a tuple of PerReplica batches with
`strategy.reduce("MEAN", ...)`, keras issue 20585). kerasfast builds every
piece of state itself under the strategy's scope, then detaches the model
from the strategy it was created under so that Keras skips that build, and
runs `fit` inside the strategy's scope so that Keras still distributes the
data. Everything here is guarded by the Keras version; `tests/
test_distribute_compat.py` fails when upstream changes, to tell us.
"""

from __future__ import annotations

import keras

TESTED_KERAS = ("3.15",)


def check_keras_version() -> None:
    """Raises when the installed Keras is not one this module was written for."""
    if not keras.__version__.startswith(TESTED_KERAS):
        raise RuntimeError(
            f"kerasfast's distributed training was verified with Keras {', '.join(TESTED_KERAS)}.x, "
            f"not {keras.__version__}: install keras>=3.15,<3.16 (see pyproject.toml)."
        )


def build_state(model, sample_batch) -> None:
    """Creates model, loss, metric and optimizer state (call under the strategy's scope)."""
    check_keras_version()
    model._symbolic_build(data_batch=sample_batch)
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)


def detach_from_creation_strategy(model) -> None:
    """Makes Keras take the strategy from the surrounding scope instead of the
    one the model was created under, which skips the failing symbolic build."""
    check_keras_version()
    model._distribute_strategy = None


def loss_tracker(model):
    """The `Mean` metric behind the "loss" entry of Keras's logs."""
    return model._loss_tracker


def call_has_training_arg(model) -> bool:
    return model._call_has_training_arg
