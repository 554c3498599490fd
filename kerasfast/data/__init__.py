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

from kerasfast.data.arrays import ArrayDatasetInfo, array_dataset
from kerasfast.data.benchmark import BenchmarkResult, benchmark
from kerasfast.data.framing import RecordProblem
from kerasfast.data.reader import (
    DatasetInfo,
    PipelineSettings,
    dataset_info,
    explain_data_error,
    tfrecord_dataset,
)
from kerasfast.data.schema import SCHEMA_FILENAME, FeatureSchema, Schema
from kerasfast.data.validation import ValidationReport, check_tfrecords, damage_error, locate_damage
from kerasfast.data.writer import WriteResult, write_tfrecords

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
