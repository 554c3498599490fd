"""A model XLA cannot compile: jit_compile=True is refused before training
with the op and layer named; chosen automatically, XLA is turned off."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasfast
from kerasfast.errors import PlanError
from kerasfast.plan import Plan
from kerasfast.training.planning import checked_jit as _checked_jit


class RoundTripThroughText(keras.layers.Layer):
    """Formats numbers as strings and parses them back: string ops, which XLA has no kernels for."""

    def call(self, x):
        return tf.strings.to_number(tf.strings.as_string(x))


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), RoundTripThroughText(name="via_text"), keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd")
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")


def test_jit_compile_true_is_refused_before_training_naming_the_op_and_layer():
    x, y = _data()
    model = _model()
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(PlanError, match=r"XLA cannot compile op AsString \(in layer via_text\)") as refused:
        kerasfast.fit(model, x, y, jit_compile=True, run_dir=False, verbose=0)
    assert "jit_compile=False" in str(refused.value)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))  # nothing trained


def test_without_xla_the_same_model_trains():
    x, y = _data()
    result = kerasfast.fit(_model(), x, y, jit_compile=False, epochs=2, run_dir=False, verbose=0)
    assert np.isfinite(result.history.history["loss"]).all()


def test_an_automatic_choice_of_xla_falls_back_with_the_reason():
    # On a CPU "auto" never picks XLA, so the automatic case is checked on a
    # plan that chose it (as on a GPU).
    x, _ = _data()
    plan = kerasfast.resolve_plan(kerasfast.detect_hardware())
    chosen = Plan(**{**{f: getattr(plan, f) for f in plan.__dataclass_fields__}, "jit_compile": True,
                     "overridden": ()})
    checked = _checked_jit(chosen, _model(), x[:8])
    assert checked.jit_compile is False
    assert checked.reasons["jit_compile"] == "off: XLA cannot compile op AsString (in layer via_text)"
