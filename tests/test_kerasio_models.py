"""keras.io examples train through kerasfast.fit about as well as through model.fit.

Each model in tests/kerasio_models.py is copied from a keras.io example or guide (shrunk for
CPU) and compiled as the example compiles it; its data come as the keyword arguments the
example passes to fit. Every example is trained twice from the same initial weights: once
with Keras's own `model.fit` (the reference, run once per session and cached) and once with
`kerasfast.fit(model, **data, ...)`. Both runs must learn: every expected metric in the
History, one finite real value per epoch, not all zero; the loss lower after the last epoch
than after the first; the trained weights moved. The kerasfast run must also get about as
far as Keras did (see `test_kerasfast_fit_learns_like_keras`).
"""

import functools
import math

import keras
import numpy as np
import pytest

import kerasfast
from tests.kerasio_models import EXAMPLES

_BY_NAME = {name: (build, data, expected) for name, build, data, expected in EXAMPLES}

# kerasfast's final loss must close at least this fraction of the gap between Keras's first-
# and last-epoch losses (see test_kerasfast_fit_learns_like_keras).
GAP_FRACTION = 0.5


def _params():
    return [pytest.param(name, id=name) for name, _, _, _ in EXAMPLES]


def _trained_weights(model):
    """The weights that training must move: the generator's for the GAN, else all trainable."""
    generator = getattr(model, "generator", None)
    if isinstance(generator, keras.Model):
        return generator.trainable_weights
    return model.trainable_weights


def _snapshot(model):
    weights = [np.array(w.numpy(), dtype="float32") for w in _trained_weights(model)]
    assert weights, "the model has no trainable weights before fit; the weight checks would be empty"
    return weights


def _moved(before, after):
    return any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))


def _check_learned(who, history, expected, epochs, weights_before, weights_after):
    for key in expected:
        assert key in history, f"{who}: {key!r} missing from History (has {sorted(history)})"
        values = history[key]
        assert len(values) == epochs, f"{who}: {key} has {len(values)} values for {epochs} epochs"
        for value in values:
            assert not isinstance(value, complex), f"{who}: {key} = {value!r} is not real"
            assert math.isfinite(float(value)), f"{who}: {key} = {list(values)} is not finite"
        assert any(float(v) != 0.0 for v in values), f"{who}: {key} = {list(values)} is all zeros"
    if "loss" in expected:
        losses = [float(v) for v in history["loss"]]
        assert losses[-1] < losses[0], f"{who}: loss did not fall: {losses}"
    # The GAN's d_loss/g_loss need not fall (the two players push against each other); its
    # check is that the losses are finite (above) and that the generator's weights moved.
    assert _moved(weights_before, weights_after), f"{who}: fit left the trained weights unchanged"


@functools.lru_cache(maxsize=None)
def _keras_reference(name):
    """Train with Keras's own model.fit once per session: (history dict, initial weights)."""
    build, data, expected = _BY_NAME[name]
    keras.config.set_dtype_policy("float32")
    model = build()
    initial = _snapshot(model)
    history = model.fit(**data(), verbose=0)
    return history.history, initial, _snapshot(model)


@pytest.mark.parametrize("name", _params())
def test_keras_fit_learns_the_example(name):
    """The reference half: the example, its data and its metrics work with plain Keras."""
    _, data, expected = _BY_NAME[name]
    history, initial, final = _keras_reference(name)
    _check_learned("model.fit", history, expected, data()["epochs"], initial, final)


@pytest.mark.parametrize("name", _params())
def test_kerasfast_fit_learns_like_keras(name):
    build, data, expected = _BY_NAME[name]
    keras_history, keras_initial, _ = _keras_reference(name)

    model = build()
    initial = _snapshot(model)
    assert all(np.array_equal(a, b) for a, b in zip(initial, keras_initial, strict=True)), (
        "the two builds start from different weights; the comparison would not be fair"
    )
    kwargs = data()
    result = kerasfast.fit(model, **kwargs, run_dir=False, verbose=0)
    history = result.history.history
    _check_learned("kerasfast.fit", history, expected, kwargs["epochs"], initial, _snapshot(model))

    if "loss" not in expected:
        return  # the GAN: no loss that must fall, see _check_learned
    keras_first = float(keras_history["loss"][0])
    keras_final = float(keras_history["loss"][-1])
    final = float(history["loss"][-1])
    # Tolerance: kerasfast may train in another precision (bfloat16 on this CPU), draw its
    # batches in another shuffle order and fuse steps, so its losses are not Keras's to the
    # digit. What it must do is get about as far: its last-epoch loss has to close at least
    # half of the gap that Keras closed between its first and last epochs,
    #     final <= keras_final + GAP_FRACTION * (keras_first - keras_final).
    # This bound is scale-free (the losses here run from 1e-4 with class weights to ~100
    # for the VAE's summed cross-entropy), lies below Keras's first-epoch loss, and every
    # example's data make Keras's loss fall by a quarter or more, so a kerasfast run whose
    # weights do not move (which stays near the untrained loss, above Keras's first-epoch
    # average) or that learns only a little cannot pass.
    bound = keras_final + GAP_FRACTION * (keras_first - keras_final)
    assert final <= bound, (
        f"kerasfast's final loss {final:.4g} is above {bound:.4g}, halfway between Keras's "
        f"first ({keras_first:.4g}) and final ({keras_final:.4g}) epoch losses; "
        f"kerasfast losses {[float(v) for v in history['loss']]}"
    )
