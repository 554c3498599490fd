"""`kerasfast.find_learning_rate`: the learning-rate range test, on real training.

The convex case has a known answer: for mean squared error the loss is
quadratic with Hessian H = 2/n [X 1]^T [X 1], and gradient descent diverges
above the rate 2 / lambda_max(H). A sensible suggestion lies below that
limit and not orders of magnitude under it.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasfast
from kerasfast import PlanError
from kerasfast.training.lr_finder import suggest


def _regression(n=512, features=8, seed=0):
    """Standardised, correlated features and a noisy linear target."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)) @ rng.normal(size=(features, features))
    x = ((x - x.mean(0)) / x.std(0)).astype("float32")
    y = (x @ rng.normal(size=(features, 1)) + 0.1 * rng.normal(size=(n, 1))).astype("float32")
    return x, y


def _stability_limit(x) -> float:
    """2 / lambda_max of the MSE Hessian of a Dense(1) layer (weights and bias)."""
    design = np.concatenate([x, np.ones((len(x), 1), "float32")], axis=1).astype("float64")
    hessian = 2.0 / len(x) * design.T @ design
    return 2.0 / float(np.linalg.eigvalsh(hessian).max())


def _linear_model():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def _state(model) -> dict:
    """Every number the model and its optimizer hold, as bytes (bit-exact comparison)."""
    def as_bytes(variables):
        return [np.asarray(v.numpy()).tobytes() for v in variables]

    return {
        "variables": as_bytes(model.variables),
        "optimizer": as_bytes(model.optimizer.variables) if getattr(model, "optimizer", None) else None,
        "iterations": int(model.optimizer.iterations.numpy()) if getattr(model, "optimizer", None) else None,
        "metrics": as_bytes(model.metrics_variables),
    }


@pytest.mark.parametrize("seed", [0, 1, 3, 7])
def test_suggestion_lies_below_the_stability_limit_of_linear_regression(seed):
    # Seeds 1, 3 and 7 (with batch 64) are ones where the plain steepest-slope
    # rule (Lightning's) picks a dip of batch noise near 1e-6.
    x, y = _regression(seed=seed)
    limit = _stability_limit(x)
    for batch_size in (32, 64, len(x)):
        keras.utils.set_random_seed(seed)
        finding = kerasfast.find_learning_rate(_linear_model(), x, y, batch_size=batch_size, seed=seed)

        assert finding.suggestion is not None, finding.reason
        assert limit / 100 < finding.suggestion < limit, (batch_size, finding.suggestion, limit, finding.reason)
        # max_lr=10 is far past the limit: the test stopped when the loss blew up.
        assert finding.diverged_at is not None and finding.diverged_at > limit
        assert "steepest descent" in finding.reason and "diverged" in finding.reason
        assert np.all(np.diff(finding.learning_rates) > 0)
        assert finding.learning_rates[0] == pytest.approx(1e-7)
        assert finding.plot_path is None


def test_model_optimizer_metrics_and_compile_state_come_back_bit_identical():
    x, y = _regression(n=256)
    model = keras.Sequential([
        keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.BatchNormalization(),
        keras.layers.Dropout(0.3), keras.layers.Dense(1),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", metrics=["mae"])
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)  # optimizer moments, metric totals, seed states
    optimizer, compile_config = model.optimizer, model.get_compile_config()
    dependencies = [(ref.name, id(ref.ref)) for ref in model._self_unconditional_checkpoint_dependencies]
    before = _state(model)
    evaluated = model.evaluate(x, y, verbose=0, return_dict=True)
    before_metrics = _state(model)["metrics"]

    finding = kerasfast.find_learning_rate(model, x, y, batch_size=32, num_steps=40, loss="mae", optimizer="sgd")

    assert len(finding.learning_rates) >= 10
    after = _state(model)
    assert after["variables"] == before["variables"]
    assert after["optimizer"] == before["optimizer"] and after["iterations"] == before["iterations"]
    assert after["metrics"] == before_metrics
    assert model.optimizer is optimizer and model.get_compile_config() == compile_config
    assert [(ref.name, id(ref.ref)) for ref in model._self_unconditional_checkpoint_dependencies] == dependencies
    assert model.evaluate(x, y, verbose=0, return_dict=True) == evaluated
    # Training afterwards continues the user's own optimizer.
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == before["iterations"] + 4


def test_a_learning_rate_schedule_is_left_in_place():
    x, y = _regression(n=128)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=10, decay_rate=0.5)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")

    finding = kerasfast.find_learning_rate(model, x, y, batch_size=32, num_steps=20, max_lr=1.0)

    assert len(finding.learning_rates) >= 10
    assert model.optimizer._learning_rate is schedule
    assert not model.optimizer.built  # the test trained a copy


def test_run_dir_gets_a_png_plot_and_the_curve(tmp_path):
    x, y = _regression(n=256)
    model = _linear_model()

    finding = kerasfast.find_learning_rate(model, x, y, batch_size=64, num_steps=30, run_dir=tmp_path / "lr")

    assert finding.plot_path == tmp_path / "lr" / "lr_find.png"
    assert finding.plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(finding.plot_path).shape[0] > 100  # decodes to a real image
    assert (tmp_path / "lr" / "lr_find.json").exists()
    assert sorted(p.name for p in (tmp_path / "lr").iterdir()) == ["lr_find.json", "lr_find.png"]


def test_stops_early_when_the_loss_diverges():
    x, y = _regression(n=256)
    model = _linear_model()
    before = _state(model)

    finding = kerasfast.find_learning_rate(model, x, y, batch_size=64, min_lr=1e-4, max_lr=1e4, num_steps=60)

    assert len(finding.learning_rates) < 60
    assert finding.diverged_at == finding.learning_rates[-1]
    assert all(np.isfinite(finding.losses[:-1]))
    assert finding.suggestion is not None and finding.suggestion <= finding.diverged_at / 10
    assert _state(model) == before  # the blown-up weights were put back


@pytest.mark.parametrize("arguments, named", [
    ({"min_lr": 0}, "min_lr="),
    ({"min_lr": -1e-3}, "min_lr="),
    ({"min_lr": float("nan")}, "min_lr="),
    ({"max_lr": 1e-8}, "max_lr="),
    ({"min_lr": 1e-2, "max_lr": 1e-2}, "max_lr="),
    ({"max_lr": float("inf")}, "max_lr="),
    ({"num_steps": 5}, "num_steps="),
    ({"num_steps": 20.5}, "num_steps="),
    ({"num_steps": True}, "num_steps="),
    ({"batch_size": 0}, "batch_size="),
    ({"smoothing": 1.0}, "smoothing="),
    ({"diverge_factor": 1.0}, "diverge_factor="),
    ({"optimizer": 3}, "optimizer="),
    ({"optimizer": "not-an-optimizer"}, "optimizer="),
])
def test_bad_arguments_are_refused(arguments, named):
    x, y = _regression(n=64)
    with pytest.raises(PlanError, match=named):
        kerasfast.find_learning_rate(_linear_model(), x, y, **arguments)


def test_a_model_without_a_loss_is_refused():
    x, y = _regression(n=64)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    with pytest.raises(PlanError, match="loss="):
        kerasfast.find_learning_rate(model, x, y)
    assert not model.compiled


def test_a_one_shot_generator_that_runs_out_is_refused():
    x, y = _regression(n=160)

    def five_batches():
        for start in range(0, 160, 32):
            yield x[start:start + 32], y[start:start + 32]

    with pytest.raises(PlanError, match="num_steps=5 or fewer"):
        kerasfast.find_learning_rate(_linear_model(), five_batches(), num_steps=20, shuffle=False)


def test_dict_inputs_of_a_functional_model_from_a_dataset():
    x, y = _regression(n=256)
    left, right = keras.Input((5,), name="left"), keras.Input((3,), name="right")
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([left, right]))
    model = keras.Model({"left": left, "right": right}, keras.layers.Dense(1)(hidden))
    # Four batches for 30 steps: the dataset is repeated.
    dataset = tf.data.Dataset.from_tensor_slices(({"right": x[:, 5:], "left": x[:, :5]}, y)).batch(64)
    weights = [w.copy() for w in model.get_weights()]

    finding = kerasfast.find_learning_rate(model, dataset, loss="mse", num_steps=30, max_lr=100.0)

    assert len(finding.learning_rates) >= 10 and len(finding.losses) == len(finding.learning_rates)
    assert finding.suggestion is not None, finding.reason
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), weights, strict=True))
    assert not model.compiled and not hasattr(model, "optimizer")  # left uncompiled, as given


def test_suggest_rule_on_recorded_curves():
    rates = np.geomspace(1e-6, 1.0, 61)
    # Falls around 1e-3, lowest near 3e-2, then rises: the steepest point is below the cap.
    falling = 1.0 / (1.0 + (rates / 1e-3) ** 2) + rates ** 2
    suggestion, reason = suggest(rates, falling, diverged=False)
    assert 3e-4 < suggestion < 3e-3 and reason.startswith("steepest descent")
    # A sharper dip of batch noise decades earlier does not win.
    noisy = falling.copy()
    noisy[15] -= 0.3
    assert suggest(rates, noisy, diverged=False)[0] == suggestion
    # Steepest right before the lowest point: capped at a tenth of the lowest-loss rate.
    late = 1.0 - rates ** 4 * 0.5
    suggestion, reason = suggest(rates, late, diverged=False)
    assert suggestion == pytest.approx(0.1) and "a tenth of the rate with the lowest smoothed loss" in reason
    # The divergent step is left out; the sentence says where it was.
    suggestion, reason = suggest(rates[:49], late[:48].tolist() + [np.inf], diverged=True)
    assert suggestion == pytest.approx(rates[47] / 10) and "diverged at 6.3e-2 after 49 of 49 steps" in reason
    # A loss that only rises, or diverges at once, gives no suggestion.
    assert suggest(rates, 1.0 + rates, diverged=False)[0] is None
    assert suggest(rates[:8], falling[:8], diverged=True, num_steps=60)[0] is None


def test_fit_with_learning_rate_find_trains_at_the_suggested_rate(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1))).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer=keras.optimizers.SGD())
    result = kerasfast.fit(model, x, y, learning_rate="find", epochs=2, run_dir=tmp_path, verbose=0)
    finding = json.loads((tmp_path / "lr_find.json").read_text())
    assert result.plan.learning_rate == pytest.approx(finding["suggestion"])
    assert result.plan.reasons["learning_rate"].startswith("found: ")
    assert (tmp_path / "lr_find.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.history.history["loss"][-1] < result.history.history["loss"][0]


def test_fit_refuses_to_find_a_rate_on_a_generator_training_needs():
    # The range test would read the generator's batches, which training then never sees.
    x, y = _regression(n=160)

    def five_batches():
        for start in range(0, 160, 32):
            yield x[start:start + 32], y[start:start + 32]

    model = _linear_model()
    with pytest.raises(PlanError, match="generator's batches are read once"):
        kerasfast.fit(model, five_batches(), learning_rate="find", epochs=1, run_dir=False, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0
