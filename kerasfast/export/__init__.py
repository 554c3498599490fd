"""Export a Keras 3 model to serving and edge formats, each verified.

    result = kerasfast.export.export_model(model, "out", representative_data=x[:300],
                                           eval_data=(x_test, y_test))
    print(result.table())
"""

from kerasfast.export.exporter import ExportResult, export_model
from kerasfast.export.formats import DEFAULT_FORMATS, FORMATS, ExportFormat
from kerasfast.export.litert import LiteRTModel
from kerasfast.export.report import ArtifactReport

__all__ = [
    "DEFAULT_FORMATS",
    "FORMATS",
    "ArtifactReport",
    "ExportFormat",
    "ExportResult",
    "LiteRTModel",
    "export_model",
]
