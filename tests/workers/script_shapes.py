"""A worker of a multi-worker test: runs, one after the other in the same
process, every script shape the docs and kerasfast's own error messages
suggest (a model made after `setup()`, a builder, a model made in
`strategy.scope()`; the optimizer a string, an instance or absent; a run
folder or none; a backup or none), and writes for each what the user's
model object holds before and after, and what the trained model holds.

    kerasfast launch -n 2 -- python tests/workers/script_shapes.py OUT_DIR
"""

import json
import os
import pathlib
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

out_dir = pathlib.Path(sys.argv[1])

import kerasfast  # noqa: E402

strategy = kerasfast.distribute.setup()  # first thing, as docs/distributed.md says

import keras  # noqa: E402
import numpy as np  # noqa: E402

index = kerasfast.distribute.cluster_from_env().index
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x[:, :4].sum(axis=1) > 0).astype("int32")
LOSS = "sparse_categorical_crossentropy"


def make_model():
    keras.utils.set_random_seed(3)  # every worker starts from the same weights
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(2, activation="softmax")])


def make_functional():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((8,))
    outputs = keras.layers.Dense(2, activation="softmax")(keras.layers.Dense(16, activation="relu")(inputs))
    return keras.Model(inputs, outputs)


def compiled(model, optimizer):
    model.compile(optimizer=optimizer, loss=LOSS)
    return model


def in_scope(build):
    with strategy.scope():
        return build()


def run_dir(name):
    return out_dir / "runs" / name


# name: (what fit gets as its model, fit's own arguments)
SHAPES = {
    "after_setup_optimizer_string": (make_model, dict(optimizer="adam", loss=LOSS, run_dir="path")),
    "after_setup_optimizer_instance_no_backup": (
        make_model, dict(optimizer=keras.optimizers.Adam(0.01), loss=LOSS, run_dir="path", backup_dir=False)),
    "after_setup_no_optimizer": (make_model, dict(loss=LOSS, run_dir=False)),
    "after_setup_compiled": (lambda: compiled(make_model(), keras.optimizers.SGD(0.1)), dict(run_dir=False)),
    "after_setup_functional_optimizer_instance": (
        make_functional, dict(optimizer=keras.optimizers.RMSprop(0.01), loss=LOSS, run_dir=False)),
    "builder_optimizer_string": ("builder", dict(optimizer="adam", loss=LOSS, run_dir="path")),
    "builder_compiled_no_backup": (
        "builder_compiled", dict(run_dir="path", backup_dir=False)),
    "in_scope_optimizer_string": (lambda: in_scope(make_model), dict(optimizer="adam", loss=LOSS, run_dir="path")),
    "in_scope_compiled": (lambda: in_scope(lambda: compiled(make_model(), keras.optimizers.Adam(0.01))),
                          dict(run_dir=False)),
}


def model_argument(kind):
    if kind == "builder":
        return lambda: make_model()  # the form kerasfast's errors suggest
    if kind == "builder_compiled":
        return lambda: compiled(make_model(), "adam")
    return kind()


def iterations(optimizer):
    return None if optimizer is None or not optimizer.built else int(keras.ops.convert_to_numpy(optimizer.iterations))


def same_state(ours, trained):
    """Whether two optimizers hold the same variables (step count, moments, ...)."""
    if ours is None or trained is None or not ours.built:
        return False
    values = [[keras.ops.convert_to_numpy(v) for v in optimizer.variables] for optimizer in (ours, trained)]
    return len(values[0]) == len(values[1]) and all(
        np.array_equal(a, b) for a, b in zip(*values, strict=True))


def run(name, kind, arguments):
    model = model_argument(kind)
    given_optimizer = arguments.get("optimizer")
    if arguments.get("run_dir") == "path":
        arguments = {**arguments, "run_dir": run_dir(name)}
    before = model.get_weights() if isinstance(model, keras.Model) else make_model().get_weights()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = kerasfast.fit(model, (x, y), epochs=2, batch_size=32, verbose=0, seed=0, **arguments)
    user_model = result.model
    np.savez(out_dir / f"{name}.worker{index}.npz", *[w.astype("float64") for w in user_model.get_weights()])
    trained = result.train_model.get_weights()
    return {
        "returned": True,
        "preparation": result.model_preparation,
        "is_users_object": user_model is model if isinstance(model, keras.Model) else None,
        "changed": any(not np.array_equal(a, b) for a, b in zip(before, user_model.get_weights(), strict=True)),
        "equals_trained": all(np.array_equal(a, b) for a, b in zip(trained, user_model.get_weights(), strict=True)),
        "user_iterations": iterations(user_model.optimizer),
        "trained_iterations": iterations(result.train_model.optimizer),
        "optimizer_equals_trained": same_state(user_model.optimizer, result.train_model.optimizer),
        "keeps_given_optimizer": (user_model.optimizer is given_optimizer
                                  if isinstance(given_optimizer, keras.optimizers.Optimizer) else None),
        "run_files": sorted(p.name for p in run_dir(name).iterdir()) if index == 0 and run_dir(name).is_dir() else [],
        "loss": result.history.history["loss"],
        "warnings": [str(w.message) for w in caught if str(w.message).startswith("kerasfast")],
    }


results = {}
for shape, (kind, arguments) in SHAPES.items():
    try:
        results[shape] = run(shape, kind, arguments)
    except Exception as error:  # noqa: BLE001 - recorded for the test to name; later shapes still run
        results[shape] = {"returned": False, "error": f"{type(error).__name__}: {error}"[:2000]}
(out_dir / f"results.worker{index}.json").write_text(json.dumps(results))
print(f"worker {index} done: {len(results)} shapes")
