"""fit measures how long its steps wait for input, and its advice follows."""

import json
import time

import tensorflow as tf

import kerasfast
from kerasfast.training.throughput import input_advice
from tests.helpers import small_convnet


def _slow(image):
    time.sleep(0.001)  # a decode step that is far slower than the model
    return image


def test_a_slow_pipeline_is_reported_input_bound(digits, tmp_path):
    (x, y), _ = digits
    x, y = x[:512], y[:512]
    slow = (tf.data.Dataset.from_tensor_slices((x, y))
            .map(lambda image, label: (tf.py_function(_slow, [image], tf.float32), label))
            .map(lambda image, label: (tf.ensure_shape(image, (8, 8, 1)), label))
            .batch(64))
    result = kerasfast.fit(small_convnet(), slow, epochs=3, steps_per_execution=1, run_dir=tmp_path,
                           loss="sparse_categorical_crossentropy", verbose=0)
    fraction = result.throughput.input_wait_fraction
    assert fraction > 0.5  # ~64 ms of sleeping per batch against a ~ms step
    assert result.input_report.startswith("input-bound")
    assert "num_parallel_calls" in result.input_report  # advice for a tf.data pipeline
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["input"] == result.input_report
    assert saved["throughput"]["input_wait_fraction"] == fraction


def test_in_memory_arrays_keep_up(digits):
    (x, y), _ = digits
    result = kerasfast.fit(small_convnet(), (x, y), epochs=3, batch_size=64, run_dir=False,
                           loss="sparse_categorical_crossentropy", verbose=0)
    # Gathering batches from memory is cheap; on 2 shared cores the pipeline
    # still competes with the model for CPU, so the wait is small, not zero.
    fraction = result.throughput.input_wait_fraction
    assert 0 <= fraction < 0.5
    assert result.input_report == input_advice(fraction, "arrays", result.plan)


def test_advice_follows_the_measurement():
    assert input_advice(0.01, "arrays").startswith("not input-bound: 1%")
    assert input_advice(0.1, "tfrecords").startswith("partly input-bound: 10%")
    bound = input_advice(0.35, "tfrecords")
    assert bound.startswith("input-bound: 35% of step time waiting for input")
    assert "cache='memory'" in bound and "shards" in bound
    assert input_advice(None, "arrays") == "input wait not measured (run too short)"


def test_advice_never_asks_for_longer_executions_than_the_epoch():
    """Executions that already span the epoch cannot grow: the advice for
    input-bound arrays then names the batch size alone."""
    from kerasfast.hardware import Hardware
    from kerasfast.plan import DataFacts, ModelFacts, Overrides, resolve_plan

    def plan(steps_per_execution):
        return resolve_plan(Hardware(cpu_cores=2), model=ModelFacts(forward_flops_per_sample=50_000),
                            data=DataFacts(num_samples=384),
                            overrides=Overrides(batch_size=32, steps_per_execution=steps_per_execution))

    capped = plan(12)
    assert (capped.steps_per_epoch, capped.steps_per_execution) == (12, 12)
    advice = input_advice(0.4, "arrays", capped)
    assert "or steps_per_execution" not in advice
    assert "steps_per_execution already spans the epoch's 12 steps" in advice
    assert "or steps_per_execution" in input_advice(0.4, "arrays", plan(4))


def test_advice_for_a_pipeline_names_what_it_lacks():
    import numpy as np

    rows = tf.data.Dataset.from_tensor_slices(np.zeros((8, 2), "float32"))
    bare = rows.map(tf.identity).map(tf.identity).batch(4)
    advice = input_advice(0.4, "dataset", dataset=bare)
    assert "to its 2 map() call(s) without it" in advice
    assert ".cache()" in advice and ".prefetch(tf.data.AUTOTUNE)" in advice
    tuned = rows.map(tf.identity, num_parallel_calls=tf.data.AUTOTUNE).cache().batch(4).prefetch(tf.data.AUTOTUNE)
    advice = input_advice(0.4, "dataset", dataset=tuned)
    assert "num_parallel_calls" not in advice and ".prefetch" not in advice and ".cache()" not in advice
    assert "the work per element is the limit" in advice
    assert "PyDataset workers=" in input_advice(0.4, "python")
    # tf.data's own maps (inside unbatch(), rebatch()) are not the user's to parallelise.
    rebatched = rows.batch(2).unbatch().rebatch(4).cache().prefetch(tf.data.AUTOTUNE)
    advice = input_advice(0.4, "dataset", dataset=rebatched)
    assert "num_parallel_calls" not in advice and "its maps run in parallel" not in advice
    assert advice.endswith("it is cached and it prefetches: the work per element is the limit: batch() before map() "
                           "to work on whole batches, or a larger batch_size")

    def generator():
        yield np.zeros(2, "float32")

    generated = tf.data.Dataset.from_generator(generator, output_signature=tf.TensorSpec([2], tf.float32))
    assert "come from a Python generator (Dataset.from_generator)" in input_advice(0.4, "dataset", dataset=generated)


def test_a_slow_generator_is_advised_as_python_code(digits):
    (x, y), _ = digits

    def batches():
        for start in range(0, 256, 64):
            time.sleep(0.05)
            yield x[start:start + 64], y[start:start + 64]

    result = kerasfast.fit(small_convnet(), batches(), epochs=1, steps_per_execution=1, run_dir=False,
                           loss="sparse_categorical_crossentropy", verbose=0)
    assert "come from Python code" in result.input_report
