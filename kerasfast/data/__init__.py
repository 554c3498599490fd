"""kerasfast.data: TFRecord input pipelines at full speed.

Write any source to TFRecord shards with a schema beside them, read them back
as a tuned `tf.data.Dataset`, check files for damage (and locate it after
TensorFlow failed on it), and time a pipeline.

Example:

>>> import numpy as np, tempfile, kerasfast.data as kd
>>> out = tempfile.mkdtemp()
>>> x = np.random.randint(0, 255, (64, 8, 8, 3), dtype=np.uint8)
>>> y = np.arange(64) % 10
>>> kd.write_tfrecords((x, y), out, shards=4).num_records
64
>>> ds = kd.tfrecord_dataset(out, batch_size=16)
>>> ds.kerasfast_info.steps_per_epoch
4
"""

# Loaded on first use (kerasfast/_lazy.py): `kerasfast convert --help` and
# the data-service commands start without TensorFlow.
_EXPORTS = {
    **dict.fromkeys(("ArrayDatasetInfo", "array_dataset"), "kerasfast.data.arrays"),
    "RecordProblem": "kerasfast.data.framing",
    **dict.fromkeys(("DatasetInfo", "PipelineSettings", "dataset_info", "explain_data_error", "tfrecord_dataset"),
                    "kerasfast.data.reader"),
    **dict.fromkeys(("SCHEMA_FILENAME", "FeatureSchema", "Schema"), "kerasfast.data.schema"),
    **dict.fromkeys(("ValidationReport", "check_tfrecords", "damage_error", "locate_damage"),
                    "kerasfast.data.validation"),
    **dict.fromkeys(("WriteResult", "write_tfrecords"), "kerasfast.data.writer"),
}

__all__ = [
    "ArrayDatasetInfo",
    "BenchmarkResult",
    "DatasetInfo",
    "FeatureSchema",
    "PipelineSettings",
    "RecordProblem",
    "SCHEMA_FILENAME",
    "Schema",
    "ValidationReport",
    "WriteResult",
    "array_dataset",
    "benchmark",
    "check_tfrecords",
    "damage_error",
    "dataset_info",
    "explain_data_error",
    "locate_damage",
    "tfrecord_dataset",
    "write_tfrecords",
]

from kerasfast._lazy import lazy_exports as _lazy_exports  # noqa: E402

# Imported now (it needs no TensorFlow): the function `benchmark` shares its
# module's name, and importing the module later would put the module, not
# the function, at `kerasfast.data.benchmark`.
from kerasfast.data.benchmark import BenchmarkResult, benchmark  # noqa: E402

__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())
