"""Pruning under MirroredStrategy over 2 logical CPU devices (own process:
logical devices must be configured before TensorFlow initialises)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import json
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    from kerasfast.compress import PruningConfig, apply_pruning, finalize_pruning, measure_sparsity
    from kerasfast.compress.attach import pruning_constraints

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((16,)),
            keras.layers.Dense(32, activation="relu", name="hidden"),
            keras.layers.Dense(4, name="logits"),
        ])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    apply_pruning(model, PruningConfig(target_sparsity=0.7, end_step=12, frequency=3))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 16)).astype("float32")
    y = rng.integers(0, 4, 256)
    model.fit(x, y, batch_size=32, epochs=2, verbose=0)  # 16 steps; each replica gets 16 of every 32 samples
    masks_equal, kernels_equal = [], []
    for variable, constraint in pruning_constraints(model):
        replicas = [np.asarray(v) for v in constraint.mask.value.values]
        masks_equal.append(len(replicas) == 2 and all((r == replicas[0]).all() for r in replicas))
        kernels = [np.asarray(v) for v in variable.value.values]
        kernels_equal.append(all((k == kernels[0]).all() for k in kernels))
    summary = finalize_pruning(model)
    print(json.dumps({
        "replicas": strategy.num_replicas_in_sync,
        "masks_equal": masks_equal,
        "kernels_equal": kernels_equal,
        "summary": summary,
        "measured": measure_sparsity(model),
    }))
    """
)


@pytest.mark.slow
def test_pruning_under_mirrored_strategy_gives_identical_masks_and_exact_sparsity():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    completed = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    assert result["masks_equal"] == [True, True]
    assert result["kernels_equal"] == [True, True]
    for row in result["measured"]:
        assert row["zeros"] == round(0.7 * row["params"]), row
