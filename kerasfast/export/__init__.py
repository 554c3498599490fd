"""Export a Keras 3 model to serving and edge formats, each verified.

    result = kerasfast.export(model, "out", representative_data=x[:300],
                              eval_data=(x_test, y_test))
    print(result.table())

`kerasfast.export(...)` is `kerasfast.export.export_model(...)`: the module
is callable so that the one-call API reads like `kerasfast.fit`.
"""

import sys
import types

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


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return export_model(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
