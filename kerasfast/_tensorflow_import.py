"""What kerasfast does as TensorFlow is first imported, by whatever imports it.

Some of TensorFlow's settings are read once, as it loads or at its first use
(its oneDNN switch, its XLA flags), and its import prints start-up chatter:
`around_import` runs that import inside a context (e.g. a stderr filter),
`after_import` runs a function once it is done. One finder on `sys.meta_path`
serves both; it leaves once TensorFlow is imported, and a mere look-up
(`importlib.util.find_spec("tensorflow")`) keeps it in place.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys

_around: list = []  # context manager factories, entered in order around the import
_after: list = []  # functions called after it


def around_import(context) -> None:
    """Runs TensorFlow's first import inside `context()` (a context manager factory)."""
    if context not in _around:
        _around.append(context)
    _install()


def after_import(function) -> None:
    """Calls `function()` once TensorFlow is imported: at once if it is already."""
    if "tensorflow" in sys.modules:
        function()
        return
    if function not in _after:
        _after.append(function)
    _install()


def _install() -> None:
    if "tensorflow" not in sys.modules and not any(isinstance(f, _TensorFlowImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _TensorFlowImport())


class _TensorFlowImport(importlib.abc.MetaPathFinder):
    def __init__(self):
        self._finding = False

    def find_spec(self, fullname, path, target=None):
        if fullname != "tensorflow" or self._finding:
            return None
        self._finding = True  # the look-up below passes through this finder again
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self)
        return spec


class _Loader(importlib.abc.Loader):
    """Runs `loader`'s module inside the registered contexts, then the registered functions, and hands
    the module its own loader back (importlib.resources and pickling look at it)."""

    def __init__(self, loader, finder):
        self._loader = loader
        self._finder = finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self._finder)
        try:
            with contextlib.ExitStack() as stack:
                for context in _around:
                    stack.enter_context(context())
                self._loader.exec_module(module)
        finally:
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
        for function in _after:
            function()

    def __getattr__(self, name):
        return getattr(self._loader, name)
