"""keras-hub tasks fine-tune with `kerasfast.fit` as with `task.fit`: with their preprocessors attached (raw
strings and images as arrays, `tf.data` and a `PyDataset`) and without, LoRA, frozen backbones, the task's own
compile defaults; afterwards `generate()`, `save()` / `load_model()` and the user's preprocessor and sampler are
as keras-hub leaves them. Tiny backbones built from their constructors (tests/hub_tasks.py)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasfast
from tests import hub_tasks

pytest.importorskip("keras_hub", reason="keras-hub is in the [test] extra (pip install -e '.[test]')")

FIT = dict(run_dir=False, verbose=0, precision="float32", tune="off")  # float32: step-for-step comparisons


def _variables(model):
    return model.trainable_variables + model.non_trainable_variables


def _snapshot(model):
    return [np.array(v.numpy()) for v in _variables(model)]


def _changed(model, before) -> list[int]:
    """Positions of the variables training changed (names differ between two builds: seed_generator_5, ...)."""
    return [i for i, (v, b) in enumerate(zip(_variables(model), before, strict=True)) if not np.array_equal(v, b)]


def _twins(build):
    """Two tasks with the same initial weights."""
    keras.utils.set_random_seed(0)
    first = build()
    keras.utils.set_random_seed(0)
    return first, build()


def _string_pydataset(x, y, batch):
    class Texts(keras.utils.PyDataset):
        def __len__(self):
            return len(x) // batch

        def __getitem__(self, index):
            rows = slice(index * batch, (index + 1) * batch)
            return tf.constant(x[rows]), y[rows]

    return Texts()


@pytest.mark.parametrize("form", ["arrays", "dataset", "pydataset"])
def test_a_classifier_with_its_preprocessor_trains_on_strings_as_task_fit_does(form):
    x, y = hub_tasks.text_labels(64)
    keras_task, ours = _twins(hub_tasks.bert_classifier)
    preprocessor, optimizer = ours.preprocessor, ours.optimizer
    expected = keras_task.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    data = {"arrays": lambda: dict(x=x, y=y, batch_size=16),
            "dataset": lambda: dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(16)),
            "pydataset": lambda: dict(x=_string_pydataset(x, y, 16))}[form]()
    result = kerasfast.fit(ours, **data, epochs=2, shuffle=False, **FIT)
    np.testing.assert_allclose(result.history["loss"], expected["loss"], rtol=1e-5)
    np.testing.assert_allclose(result.history["sparse_categorical_accuracy"], expected["sparse_categorical_accuracy"])
    # Preprocessed by kerasfast (arrays: once; else in its pipeline), and said so; the task is the user's as before.
    assert "BertTextClassifierPreprocessor " + ("applied once" if form == "arrays" else "in the input pipeline") \
        in result.data
    assert ours.preprocessor is preprocessor and ours.optimizer is optimizer
    np.testing.assert_allclose(ours.predict(x[:8], verbose=0), keras_task.predict(x[:8], verbose=0), atol=1e-5)


def test_validation_strings_are_preprocessed_too():
    x, y = hub_tasks.text_labels(64)
    keras_task, ours = _twins(hub_tasks.bert_classifier)
    expected = keras_task.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                              validation_data=(x[:24], y[:24])).history
    result = kerasfast.fit(ours, x, y, batch_size=16, epochs=2, shuffle=False, validation_data=(x[:24], y[:24]), **FIT)
    np.testing.assert_allclose(result.history["val_loss"], expected["val_loss"], rtol=1e-5)
    split = kerasfast.fit(hub_tasks.bert_classifier(), x, y, batch_size=16, epochs=1, validation_split=0.25, **FIT)
    assert np.isfinite(split.history["val_loss"][0]) and split.data.startswith("arrays, 48 samples")


def test_a_task_without_preprocessor_trains_on_its_token_arrays():
    x, y = hub_tasks.text_labels(64)
    tokens = {name: np.asarray(value) for name, value in hub_tasks.bert_classifier().preprocessor(x).items()}
    keras_task, ours = _twins(lambda: hub_tasks.bert_classifier(preprocessor=False))
    expected = keras_task.fit(tokens, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    result = kerasfast.fit(ours, tokens, y, batch_size=16, epochs=2, shuffle=False, **FIT)
    np.testing.assert_allclose(result.history["loss"], expected["loss"], rtol=1e-5)
    assert "Preprocessor" not in result.data


def test_lora_trains_exactly_the_weights_task_fit_trains():
    x, y = hub_tasks.text_labels(64)

    def build():
        task = hub_tasks.bert_classifier()
        task.backbone.enable_lora(2)
        return task

    keras_task, ours = _twins(build)
    before = _snapshot(ours)
    keras_task.fit(x, y, batch_size=16, epochs=1, verbose=0)
    kerasfast.fit(ours, x, y, batch_size=16, epochs=1, **FIT)
    changed = _changed(ours, before)
    assert changed == _changed(keras_task, before)
    lora = {i for i, v in enumerate(_variables(ours)) if "lora" in v.path}
    frozen = {i for i, v in enumerate(_variables(ours)) if not v.trainable and "seed_generator" not in v.path}
    assert lora & set(changed), "the LoRA factors train"
    assert frozen and not frozen & set(changed), "LoRA leaves the backbone's own weights as they were"


def test_a_frozen_backbone_stays_frozen():
    x, y = hub_tasks.text_labels(64)
    task = hub_tasks.bert_classifier()
    task.backbone.trainable = False
    backbone_before = [np.array(w) for w in task.backbone.get_weights()]
    head_before = _snapshot(task)
    kerasfast.fit(task, x, y, batch_size=16, epochs=1, **FIT)
    assert all(np.array_equal(a, b) for a, b in zip(task.backbone.get_weights(), backbone_before, strict=True))
    assert _changed(task, head_before), "the classifier head trains"


def test_a_causal_lm_generates_saves_and_loads_after_fit(tmp_path):
    lm = hub_tasks.gpt2_causal_lm()
    lm.compile(sampler="greedy", optimizer=keras.optimizers.Adam(1e-2))  # keras-hub's loss and metrics stay "auto"
    sampler, preprocessor, loss = lm.sampler, lm.preprocessor, lm.loss
    result = kerasfast.fit(lm, hub_tasks.CODE, batch_size=8, epochs=3, **FIT)
    losses = result.history["loss"]
    assert losses[-1] < losses[0] and "GPT2CausalLMPreprocessor" in result.data
    assert lm.sampler is sampler and lm.preprocessor is preprocessor and lm.loss is loss
    generated = lm.generate("def", max_length=10)
    assert isinstance(generated, str) and generated.startswith("def")
    lm.save(tmp_path / "lm.keras")
    loaded = keras.saving.load_model(tmp_path / "lm.keras")
    assert type(loaded) is type(lm)
    assert all(np.array_equal(a, b) for a, b in zip(loaded.get_weights(), lm.get_weights(), strict=True))
    loaded.compile(sampler="greedy")  # keras-hub saves no sampler (a loaded task samples top-k, as after task.fit)
    assert loaded.generate("def", max_length=10) == generated


def test_a_seq2seq_lm_trains_on_pairs_of_strings_and_generates():
    task = hub_tasks.bart_seq2seq()
    task.compile(optimizer=keras.optimizers.Adam(1e-2))
    result = kerasfast.fit(task, {"encoder_text": hub_tasks.CODE, "decoder_text": hub_tasks.CODE}, batch_size=8,
                           epochs=2, **FIT)
    assert result.history["loss"][-1] < result.history["loss"][0]
    assert isinstance(task.generate("import os", max_length=8), str)


def test_an_image_classifier_with_its_preprocessor_resizes_raw_images():
    x, y = hub_tasks.images_labels(32, size=24)  # the model takes 16x16: its preprocessor resizes
    keras_task, ours = _twins(hub_tasks.resnet_classifier)
    expected = keras_task.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    result = kerasfast.fit(ours, x, y, batch_size=8, epochs=2, shuffle=False, **FIT)
    np.testing.assert_allclose(result.history["loss"], expected["loss"], rtol=1e-4)
    assert "ResNetImageClassifierPreprocessor" in result.data


def test_the_tasks_own_compile_defaults_are_kept():
    x, y = hub_tasks.text_labels(32)
    task = hub_tasks.bert_classifier()
    optimizer, loss = task.optimizer, task.loss
    result = kerasfast.fit(task, x, y, batch_size=16, epochs=1, **FIT)
    assert task.optimizer is optimizer and task.loss is loss
    assert result.plan.optimizer == type(optimizer).__name__
    assert result.plan.learning_rate == pytest.approx(float(optimizer.learning_rate.numpy()))


def test_a_task_in_its_own_bfloat16_trains_in_it_and_the_plan_says_so():
    """A preset loaded with dtype="bfloat16" computes in bfloat16 under task.fit: so it does under kerasfast.fit,
    whatever precision the plan picks for the rest."""
    x, y = hub_tasks.text_labels(64)
    keras_task, ours = _twins(lambda: hub_tasks.bert_classifier(dtype="bfloat16"))
    expected = keras_task.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    result = kerasfast.fit(ours, x, y, batch_size=16, epochs=2, shuffle=False, **FIT)
    np.testing.assert_allclose(result.history["loss"], expected["loss"], rtol=1e-3)
    assert ours.backbone.dtype_policy.name == "bfloat16"
    assert "keras-hub BertTextClassifier; its own dtype: bfloat16" in result.model_preparation


def test_the_plan_names_lora_and_how_many_weights_train():
    task = hub_tasks.bert_classifier()
    task.backbone.enable_lora(2)
    x, y = hub_tasks.text_labels(32)
    how = kerasfast.fit(task, x, y, batch_size=16, epochs=1, **FIT).model_preparation
    trainable = sum(int(np.prod(w.shape)) for w in task.trainable_weights)
    assert "LoRA rank 2 on 2 layers" in how and f"{trainable:,} of " in how


def test_a_pydataset_of_numpy_strings_is_named_with_the_fix():
    """Keras's PyDataset adapter cannot read NumPy string arrays (task.fit fails too): named, with the fix."""
    x, y = hub_tasks.text_labels(32)

    class Texts(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return x[index * 16:(index + 1) * 16], y[index * 16:(index + 1) * 16]

    with pytest.raises(kerasfast.DataError, match=r"NumPy strings.*tf\.constant"):
        kerasfast.fit(hub_tasks.bert_classifier(), Texts(), epochs=1, **FIT)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["mirrored", "multi_worker"])
def test_a_task_built_in_the_strategys_scope_trains_on_strings(tmp_path, strategy):
    """A function that builds the task (LoRA on), as Keras requires under a strategy: its preprocessing joins
    the pipeline once the model is made; two devices, or two worker processes on loopback, end identical."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    command = [sys.executable, str(root / "tests" / "workers" / "hub_tasks.py"), str(tmp_path), strategy]
    if strategy == "multi_worker":
        command = [sys.executable, "-m", "kerasfast.cli", "launch", "-n", "2", "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers = 2 if strategy == "multi_worker" else 1
    results = [json.loads((tmp_path / f"results.worker{i}.json").read_text()) for i in range(workers)]
    for result in results:
        assert result["replicas"] == 2 and "BertTextClassifierPreprocessor" in result["data"]
        assert all(np.isfinite(result["history"]["val_loss"])) and result["replica_gap"] < 1e-5
    if workers == 2:
        first, second = (np.load(tmp_path / f"weights.worker{i}.npz") for i in range(2))
        assert all(np.array_equal(first[key], second[key]) for key in first.files)
        np.testing.assert_array_equal(results[0]["predicted"], results[1]["predicted"])


def test_a_deterministic_preprocessor_runs_once_a_random_one_every_batch():
    """Tokenising is the same every epoch: applied to the arrays once. A masked-LM preprocessor draws new masks
    for every batch, as in task.fit: mapped per batch in the pipeline."""
    import keras_hub

    x, y = hub_tasks.text_labels(64)
    once = kerasfast.fit(hub_tasks.bert_classifier(), x, y, batch_size=16, epochs=1, **FIT)
    assert "BertTextClassifierPreprocessor applied once before training" in once.data

    classifier = hub_tasks.bert_classifier()
    masked_lm = keras_hub.models.BertMaskedLM(classifier.backbone, preprocessor=keras_hub.models.BertMaskedLMPreprocessor(
        classifier.preprocessor.tokenizer, sequence_length=8, mask_selection_rate=0.5, mask_selection_length=2))
    result = kerasfast.fit(masked_lm, x, batch_size=16, epochs=2, **FIT)
    assert "BertMaskedLMPreprocessor in the input pipeline" in result.data
    assert all(np.isfinite(result.history["loss"]))
