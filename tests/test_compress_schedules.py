"""Sparsity schedules and mask functions, checked against tfmot's own."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from kerasfast.compress import ConstantSparsity, PolynomialDecay, PruningConfig, m_by_n_mask, magnitude_mask
from kerasfast.errors import PlanError


def test_polynomial_decay_reaches_documented_values():
    schedule = PolynomialDecay(0.0, 0.8, begin_step=0, end_step=1000, frequency=100)
    update, sparsity = schedule(500)
    assert bool(update)
    assert float(sparsity) == pytest.approx(0.7)
    assert float(schedule(0)[1]) == pytest.approx(0.0)
    assert float(schedule(1000)[1]) == pytest.approx(0.8)
    assert float(schedule(5000)[1]) == pytest.approx(0.8)


def test_schedule_fires_every_frequency_steps_and_exactly_at_end_step():
    schedule = PolynomialDecay(0.1, 0.9, begin_step=10, end_step=47, frequency=10)
    fired = [step for step in range(0, 80) if bool(schedule.should_update(step))]
    # tfmot would stop at 40 and never reach 0.9; the end step is added.
    assert fired == [10, 20, 30, 40, 47]


def test_a_schedule_of_one_step_reaches_its_final_sparsity_at_that_step():
    # What fit plans for a run of one or two updates: begin_step == end_step.
    schedule = PolynomialDecay(0.0, 0.8, begin_step=5, end_step=5, frequency=1)
    assert [(bool(fires), float(sparsity)) for fires, sparsity in map(schedule, (4, 5, 6))] == [
        (False, 0.0), (True, pytest.approx(0.8)), (False, pytest.approx(0.8))]


def test_constant_sparsity_without_end_keeps_firing():
    schedule = ConstantSparsity(0.5, begin_step=3, frequency=4)
    fired = [step for step in range(20) if bool(schedule.should_update(step))]
    assert fired == [3, 7, 11, 15, 19]
    assert float(schedule(100)[1]) == pytest.approx(0.5)


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_sparsity_outside_unit_interval_is_refused(value):
    with pytest.raises(PlanError, match=r"outside \[0, 1\)"):
        PolynomialDecay(0.0, value, begin_step=0, end_step=10)
    with pytest.raises(PlanError, match=r"outside \[0, 1\)"):
        ConstantSparsity(value)


@pytest.mark.parametrize("value", [np.float32(0.5), np.float16(0.5), np.float64(0.25)], ids=repr)
def test_numpy_scalar_sparsity_is_accepted(value):
    config = PruningConfig(target_sparsity=value, end_step=10)
    assert type(config.target_sparsity) is float and config.target_sparsity == float(value)


@pytest.mark.parametrize("value", ["0.5", None, True], ids=repr)
def test_sparsity_that_is_not_a_number_is_refused_as_such(value):
    with pytest.raises(PlanError, match=rf"initial_sparsity={value!r} is not a number"):
        PolynomialDecay(value, 0.5, begin_step=0, end_step=10)


def test_bad_steps_are_refused():
    with pytest.raises(PlanError, match="end_step=5 is before begin_step=10"):
        PolynomialDecay(0.0, 0.5, begin_step=10, end_step=5)
    with pytest.raises(PlanError, match="frequency=0"):
        ConstantSparsity(0.5, frequency=0)
    with pytest.raises(PlanError, match="polynomial schedule needs the step"):
        PolynomialDecay(0.0, 0.5, begin_step=0, end_step=-1)


def test_magnitude_mask_prunes_exact_count_even_with_ties():
    weights = np.zeros((10, 7), dtype="float32")  # all tied
    weights[0, :3] = [3.0, -2.0, 1.0]
    mask = magnitude_mask(np.abs(weights), 0.6).numpy()
    assert int((mask == 0).sum()) == round(0.6 * 70)
    assert mask[0, :3].tolist() == [1.0, 1.0, 1.0]  # the largest stay


def test_magnitude_mask_never_prunes_a_whole_kernel():
    weights = np.arange(1, 33, dtype="float32").reshape(32, 1)
    mask = magnitude_mask(weights, 0.99).numpy()  # round(0.99 * 32) = 32
    assert mask.ravel().tolist() == [0.0] * 31 + [1.0]  # the largest weight stays


def test_magnitude_mask_compiles_under_xla():
    compiled = tf.function(magnitude_mask, jit_compile=True)
    values = tf.random.stateless_uniform((33, 17), seed=(1, 2))
    mask = compiled(values, tf.constant(0.8)).numpy()
    assert int((mask == 0).sum()) == int(np.round(np.float32(0.8) * np.float32(33 * 17)))
    kept_min = values.numpy()[mask == 1].min()
    pruned_max = values.numpy()[mask == 0].max()
    assert pruned_max <= kept_min


def test_m_by_n_mask_keeps_two_largest_of_every_four_along_axis():
    rng = np.random.default_rng(0)
    kernel = rng.standard_normal((3, 3, 8, 5)).astype("float32")  # conv: in-channels at -2
    mask = m_by_n_mask(np.abs(kernel), axis=-2).numpy()
    groups = np.moveaxis(mask, -2, -1).reshape(-1, 4)
    assert (groups.sum(axis=1) == 2).all()
    magnitudes = np.moveaxis(np.abs(kernel), -2, -1).reshape(-1, 4)
    kept_min = np.where(groups == 1, magnitudes, np.inf).min(axis=1)
    pruned_max = np.where(groups == 0, magnitudes, -np.inf).max(axis=1)
    assert (pruned_max <= kept_min).all()


_TFMOT_CROSS_CHECK = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from tensorflow_model_optimization.python.core.sparsity.keras import pruning_schedule, pruning_utils
    poly = pruning_schedule.PolynomialDecay(0.1, 0.85, begin_step=5, end_step=205, power=3, frequency=20)
    const = pruning_schedule.ConstantSparsity(0.6, begin_step=3, end_step=-1, frequency=7)
    steps = list(range(0, 260, 3))
    weights = np.random.default_rng(1).standard_normal((6, 16)).astype("float32")
    print(json.dumps({
        "steps": steps,
        "poly": [[bool(poly(s)[0]), float(poly(s)[1])] for s in steps],
        "const": [[bool(const(s)[0]), float(const(s)[1])] for s in steps],
        "weights": weights.tolist(),
        "mask_2_4": pruning_utils.generate_m_by_n_mask(weights, (2, 4)).numpy().tolist(),
    }))
    """
)


def test_schedules_and_2_4_mask_match_tfmot():
    # tfmot is imported only in a child process: importing it switches
    # tf.keras to the legacy package process-wide (see schedules.py).
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    output = subprocess.run(
        [sys.executable, "-c", _TFMOT_CROSS_CHECK], capture_output=True, text=True, env=env, timeout=180, check=True
    ).stdout
    reference = json.loads(output.strip().splitlines()[-1])
    poly = PolynomialDecay(0.1, 0.85, begin_step=5, end_step=205, power=3, frequency=20)
    const = ConstantSparsity(0.6, begin_step=3, end_step=-1, frequency=7)
    for step, (tf_update, tf_sparsity) in zip(reference["steps"], reference["poly"], strict=True):
        update, sparsity = poly(step)
        assert float(sparsity) == pytest.approx(tf_sparsity, abs=1e-6), step
        # Same firing steps, except that ours also fires at end_step (205).
        assert bool(update) == (tf_update or step == 205), step
    for step, (tf_update, tf_sparsity) in zip(reference["steps"], reference["const"], strict=True):
        update, sparsity = const(step)
        assert (bool(update), float(sparsity)) == (tf_update, pytest.approx(tf_sparsity)), step
    weights = np.asarray(reference["weights"], dtype="float32")
    ours = m_by_n_mask(np.abs(weights), axis=-1).numpy()
    np.testing.assert_array_equal(ours, np.asarray(reference["mask_2_4"]))
