"""Build step that ships recipes/*.py inside the wheel, as kerasfast/_recipes/.

Everything else about the package is in pyproject.toml. The recipes stay at
the top of the repository as the readable scripts (one copy in git); a
non-editable install (`pip install .`, a wheel) gets them copied into the
package so that `kerasfast recipe NAME` works without a checkout. Editable
installs read the checkout's recipes/ folder directly, so nothing is copied
into the source tree.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

RECIPES = Path(__file__).resolve().parent / "recipes"


class build_py_with_recipes(build_py):  # noqa: N801 - setuptools command naming
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "kerasfast" / "_recipes"
        self.mkpath(str(target))
        for script in sorted(RECIPES.glob("*.py")):
            self.copy_file(str(script), str(target / script.name))

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            target = Path(self.build_lib) / "kerasfast" / "_recipes"
            outputs += [str(target / script.name) for script in sorted(RECIPES.glob("*.py"))]
        return outputs


setup(cmdclass={"build_py": build_py_with_recipes})
