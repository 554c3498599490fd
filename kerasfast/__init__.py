"""kerasfast: train any Keras 3 model the fast way from one call.

The layout follows a run's path: `hardware` and `plan` resolve what to do,
`data` feeds it, `training` and `distribute` run it, `compress` and
`export` ship it.

Example:

>>> import kerasfast
>>> x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
>>> y = (x.sum(axis=1) > 0).astype("int32")
>>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])
>>> result = kerasfast.fit(model, (x, y), epochs=2, loss="sparse_categorical_crossentropy",
...                        run_dir=False, verbose=0)
>>> print(result.plan)  # every choice and why; the choices depend on the machine
kerasfast plan
  strategy ...
"""

# TensorFlow's start-up chatter (oneDNN notices, CUDA probing) would bury
# kerasfast's own output: silenced when TensorFlow is first imported, by
# kerasfast or by the user's script after it, unless KERASFAST_VERBOSE_TF=1
# (see kerasfast/_quiet.py).
from kerasfast._quiet import quiet_tensorflow as _quiet_tensorflow

_quiet_tensorflow()

# TensorFlow reads whether to use its oneDNN CPU kernels once, as it loads;
# its default leaves them off on AVX2-only CPUs, where they made plain Keras
# 1.2-1.6x faster on most models measured (kerasfast/onednn.py).
from kerasfast.onednn import turn_on_before_tensorflow as _turn_on_onednn  # noqa: E402

_turn_on_onednn()

__version__ = "0.1.0"

# Where each public name lives. They load on first use (kerasfast/_lazy.py),
# so that `import kerasfast` and the command line's --help start in a
# fraction of a second; only what trains, converts or exports imports
# TensorFlow.
_EXPORTS = {
    **dict.fromkeys(("DataError", "ExportError", "KerasfastError", "ModelError", "PlanError",
                     "RunFolderWarning"), "kerasfast.errors"),
    **dict.fromkeys(("GPU", "Hardware", "detect_hardware"), "kerasfast.hardware"),
    **dict.fromkeys(("Plan", "resolve_plan"), "kerasfast.plan"),
    "configure_threads": "kerasfast.threads",
    **dict.fromkeys(("FitResult", "OneCycle", "Throughput", "fit", "warmup_cosine"), "kerasfast.training"),
    **dict.fromkeys(("LearningRateFinding", "find_learning_rate"), "kerasfast.training.lr_finder"),
    "write_report": "kerasfast.reporting",
    **{name: f"kerasfast.{name}" for name in ("compress", "data", "datasets", "distribute", "export")},
}

__all__ = sorted(_EXPORTS, key=str.lower)

from kerasfast._lazy import lazy_exports as _lazy_exports  # noqa: E402

__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())
