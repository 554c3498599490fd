"""Export a Keras 3 model to serving and edge formats, each verified.

    result = kerasfast.export(model, "out", representative_data=x[:300],
                              eval_data=(x_test, y_test))
    print(result.table())

`kerasfast.export(...)` is `kerasfast.export.export_model(...)`: the module
is callable so that the one-call API reads like `kerasfast.fit`.
"""

import sys
import types

from kerasfast._lazy import lazy_exports

# Loaded on first use (kerasfast/_lazy.py): `kerasfast export --help` starts
# without TensorFlow.
_EXPORTS = {
    **dict.fromkeys(("ExportResult", "export_model"), "kerasfast.export.exporter"),
    **dict.fromkeys(("DEFAULT_FORMATS", "FORMATS", "ExportFormat"), "kerasfast.export.formats"),
    "LiteRTModel": "kerasfast.export.litert",
    "ArtifactReport": "kerasfast.export.report",
}

__all__ = [
    "DEFAULT_FORMATS",
    "FORMATS",
    "ArtifactReport",
    "ExportFormat",
    "ExportResult",
    "LiteRTModel",
    "export_model",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return self.export_model(*args, **kwargs)

    @property
    def __signature__(self):
        # What `inspect.signature(kerasfast.export)` and IDEs show: export_model's arguments, not (*args, **kwargs).
        import inspect

        return inspect.signature(self.export_model)


sys.modules[__name__].__class__ = _CallableModule
