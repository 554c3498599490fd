"""Public names of a package that load on first use (PEP 562).

`import kerasfast` (and so every `kerasfast` command, `--help` included)
would otherwise import TensorFlow and Keras, seconds of start-up, before
anything asked for them. A package lists where each public name lives; the
module holding it is imported the first time the name is read
(`kerasfast.fit`, `from kerasfast import fit`) and the value is kept in the
package, so later reads cost nothing.
"""

from __future__ import annotations

import importlib


def lazy_exports(package: str, names: dict[str, str], module_globals: dict):
    """`(__getattr__, __dir__)` for `package` that import its public names on demand.

    Args:
        package: The package's `__name__`.
        names: `{public name: module holding it}`; a module path equal to
            `package + "." + name` means the name is that submodule.
        module_globals: The package's `globals()`, where loaded values are kept.

    Returns:
        The two functions to assign to the package's `__getattr__` and `__dir__`.

    Example:

    >>> import kerasfast
    >>> "fit" in dir(kerasfast)
    True
    """

    def __getattr__(name):
        module_path = names.get(name)
        if module_path is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(module_path)
        value = module if module_path == f"{package}.{name}" else getattr(module, name)
        module_globals[name] = value
        return value

    def __dir__():
        return sorted(set(module_globals) | set(names))

    return __getattr__, __dir__
