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


def overridden_step(model, method: str) -> str | None:
    """`"Class.method"` when a class of the user's overrides one of Keras's
    trainer methods (`train_step`, `test_step`, ...), else None."""
    for cls in type(model).__mro__:
        if method in cls.__dict__:
            if cls.__module__.split(".")[0] == "keras":
                return None
            return f"{cls.__name__}.{method}"
    return None


def compile_config(model) -> dict:
    """The arguments the user passed to `model.compile` (unserialised), or {}.

    Keras keeps the original objects here; the public `get_compile_config()`
    would lose custom, unregistered losses.
    """
    if not isinstance(model, keras.Model) or not model.compiled:
        return {}
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    if config is None:
        return {"optimizer": model.optimizer, "loss": getattr(model, "loss", None)}
    return dict(config)


def remat_mode(mode: str):
    """The object Keras stores on a layer created inside `RematScope(mode)`."""
    from keras.src.backend.common.remat import get_current_remat_mode

    with keras.RematScope(mode=mode):
        return get_current_remat_mode()


def get_remat(layer):
    return getattr(layer, "_remat_mode", None)


def set_remat(layer, mode) -> None:
    layer._remat_mode = mode


def attach_strategy(model, strategy) -> None:
    """Puts back the strategy a model was created under (see `detach_from_creation_strategy`)."""
    model._distribute_strategy = strategy


def is_multi_worker(strategy) -> bool:
    """Whether `strategy` is a MultiWorkerMirroredStrategy, the one keras issue 20585 breaks."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def creation_strategy(model):
    return getattr(model, "_distribute_strategy", None)


def flatten_layers(model, include_self: bool = False) -> list:
    """Every layer inside `model`, nested ones included."""
    return list(model._flatten_layers(include_self=include_self))


def train_validation_split(arrays, validation_split: float):
    """Keras's own split: the last `validation_split` of the samples, before shuffling."""
    from keras.src.trainers.data_adapters import array_slicing

    return array_slicing.train_validation_split(arrays, validation_split=validation_split)


def can_convert_arrays(structure) -> bool:
    """Whether Keras's fit would take `structure` as in-memory arrays."""
    from keras.src.trainers.data_adapters import array_data_adapter

    return array_data_adapter.can_convert_arrays(structure)


def data_adapter(x, *, class_weight=None, shuffle=False, steps_per_epoch=None):
    """Keras's adapter for a `PyDataset` or a Python generator."""
    from keras.src.trainers.data_adapters import get_data_adapter

    return get_data_adapter(x, class_weight=class_weight, shuffle=shuffle, steps_per_epoch=steps_per_epoch)


def first_batch(adapter):
    """The first batch of a Keras `PyDataset` or generator adapter, without consuming it."""
    batches = getattr(adapter, "_first_batches", None)  # generators: peeked and put back by Keras
    if batches:
        return batches[0]
    return adapter.py_dataset[0]  # a PyDataset is indexable


def tensors(structure):
    """A batch as tensors (lists made tuples, as Keras's adapters yield them)."""
    import tensorflow as tf

    return keras.tree.map_structure(tf.convert_to_tensor, keras.tree.lists_to_tuples(structure))
