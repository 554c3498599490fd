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
# kerasfast's own output: silenced before TensorFlow is first imported,
# unless KERASFAST_VERBOSE_TF=1 (see kerasfast/_quiet.py).
from kerasfast._quiet import quiet_tensorflow as _quiet_tensorflow

_quiet_tensorflow()

__version__ = "0.1.0"

from kerasfast.errors import (  # noqa: E402
    DataError, ExportError, KerasfastError, ModelError, PlanError, RunFolderWarning,
)
from kerasfast.hardware import GPU, Hardware, detect_hardware  # noqa: E402
from kerasfast.plan import Plan, resolve_plan  # noqa: E402
from kerasfast.threads import configure_threads  # noqa: E402
from kerasfast.training import FitResult, OneCycle, Throughput, fit, warmup_cosine  # noqa: E402
from kerasfast.training.lr_finder import LearningRateFinding, find_learning_rate  # noqa: E402
from kerasfast.reporting import write_report  # noqa: E402
from kerasfast import compress, data, datasets, distribute, export  # noqa: E402

__all__ = [
    "DataError", "ExportError", "FitResult", "GPU", "Hardware", "KerasfastError", "LearningRateFinding",
    "ModelError", "OneCycle", "Plan", "PlanError", "RunFolderWarning", "Throughput", "compress", "configure_threads", "data", "datasets",
    "detect_hardware", "distribute", "export", "find_learning_rate", "fit", "resolve_plan", "warmup_cosine",
    "write_report",
]
