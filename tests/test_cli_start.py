"""The command line answers at once: help and version never import TensorFlow.

What is checked is which modules are loaded, not a wall-clock time (the
start-up times are measured by benchmarks/cli_start.py).
"""

import json
import os
import subprocess
import sys
import types

import pytest
from click.testing import CliRunner

from kerasfast.cli import main
from kerasfast.recipes import available_recipes, static_parser

HELP_COMMANDS = [
    ["--help"], ["--version"], ["info", "--help"], ["quickstart", "--help"], ["launch", "--help"],
    ["convert", "--help"], ["export", "--help"], ["report", "--help"], ["recipe", "--help"],
    ["data-service", "--help"], ["data-service", "dispatcher", "--help"], ["data-service", "worker", "--help"],
]

# Runs every command above in one fresh interpreter, then lists what it imported.
PROBE = """
import json, sys
from kerasfast.cli import main
codes = []
for args in json.loads(sys.argv[1]):
    try:
        main(args, prog_name="kerasfast")
    except SystemExit as exit:
        codes.append(exit.code or 0)
heavy = sorted({name.split(".")[0] for name in sys.modules} & {"tensorflow", "keras", "tf_keras"})
print(json.dumps({"codes": codes, "heavy": heavy}))
"""


def _probe(commands):
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(commands)], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_help_and_version_import_neither_tensorflow_nor_keras():
    result = _probe(HELP_COMMANDS)
    assert result["codes"] == [0] * len(HELP_COMMANDS)
    assert result["heavy"] == [], f"--help/--version imported {result['heavy']}"


def test_importing_kerasfast_loads_its_public_names_on_first_use():
    code = ("import sys, kerasfast\n"
            "before = 'tensorflow' in sys.modules\n"
            "from kerasfast import fit\n"
            "print(before, 'tensorflow' in sys.modules, kerasfast.fit is fit, callable(kerasfast.export),\n"
            "      sorted(set(kerasfast.__all__) - set(dir(kerasfast))))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "True", "True", "True", "[]"]


def test_every_public_name_resolves():
    import kerasfast

    # The modules of the package root; every other public name is a class,
    # function or constant, even after its own module was imported.
    modules = {"compress", "data", "datasets", "distribute", "export"}
    for package in (kerasfast, kerasfast.data, kerasfast.export):
        for name in package.__all__:
            value = getattr(package, name)
            is_module = isinstance(value, types.ModuleType)
            assert is_module == (package is kerasfast and name in modules), f"{package.__name__}.{name} is {value!r}"
    try:
        kerasfast.no_such_name  # noqa: B018
    except AttributeError as error:
        assert "no_such_name" in str(error)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_recipe_help_names_the_recipe():
    for name in ("text_classification", "tabular"):
        result = CliRunner().invoke(main, ["recipe", name, "--help"], prog_name="kerasfast")
        assert result.exit_code == 0, result.output
        assert result.output.startswith(f"usage: kerasfast recipe {name} [-h]"), result.output[:300]
        assert "--smoke" in result.output


# `kerasfast recipe NAME --help` in a fresh interpreter: its first line and
# what it imported.
RECIPE_HELP_PROBE = """
import contextlib, io, json, sys
from kerasfast.cli import main
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    try:
        main(["recipe", sys.argv[1], "--help"], prog_name="kerasfast")
        code = None
    except SystemExit as exit:
        code = exit.code or 0
heavy = sorted({name.split(".")[0] for name in sys.modules} & {"tensorflow", "keras", "tf_keras"})
print(json.dumps({"code": code, "help": printed.getvalue(), "heavy": heavy}))
"""


@pytest.mark.parametrize("name", available_recipes())
def test_recipe_help_imports_neither_tensorflow_nor_keras(name):
    done = subprocess.run([sys.executable, "-c", RECIPE_HELP_PROBE, name], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 0
    assert result["help"].startswith(f"usage: kerasfast recipe {name} [-h]"), result["help"][:300]
    assert result["heavy"] == [], f"`kerasfast recipe {name} --help` imported {result['heavy']}"


# Every recipe's help as the command line prints it without running the
# recipe, then as the recipe's own main() prints it after importing it.
SAME_HELP_PROBE = """
import contextlib, io, json, sys
import kerasfast.recipes as recipes
from kerasfast.cli import main

def captured(call):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        try:
            call()
        except SystemExit:
            pass
    return printed.getvalue()

names = recipes.available_recipes()
static = {name: captured(lambda: main(["recipe", name, "--help"], prog_name="kerasfast")) for name in names}
imported = {}
for name in names:
    recipes._command_line = f"kerasfast recipe {name}"
    imported[name] = captured(lambda: recipes.load_recipe(name).main(["--help"]))
print(json.dumps({"static": static, "imported": imported, "keras": "keras" in sys.modules}))
"""


def test_recipe_help_is_the_help_the_recipe_itself_prints():
    done = subprocess.run([sys.executable, "-c", SAME_HELP_PROBE], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "COLUMNS": "100"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["keras"], "the recipes' own main() must have imported Keras"
    for name, imported in result["imported"].items():
        assert imported.startswith(f"usage: kerasfast recipe {name} "), imported[:300]
        assert result["static"][name] == imported, name


def test_a_parser_built_from_imported_names_is_refused_by_name(tmp_path):
    script = tmp_path / "needs_numpy.py"
    script.write_text("import numpy as np\nfrom kerasfast import recipes\n\n"
                      "def main(argv=None):\n"
                      "    parser = recipes.parser('x', epochs=1, batch_size=np.int64(8))\n"
                      "    return parser.parse_args(argv)\n")
    with pytest.raises(ValueError, match=r"needs_numpy\.py without running it: name 'np' is not defined"):
        static_parser(script)
    script.write_text("def main(argv=None):\n    return 3\n")
    with pytest.raises(ValueError, match="never calls parse_args"):
        static_parser(script)
    # A literal the script later replaces is not taken for the parser's value.
    script.write_text("from kerasfast import recipes\nimport os\n\nEPOCHS = 3\nEPOCHS = int(os.environ['N'])\n\n"
                      "def main(argv=None):\n"
                      "    parser = recipes.parser('x', epochs=EPOCHS, batch_size=8)\n"
                      "    return parser.parse_args(argv)\n")
    with pytest.raises(ValueError, match="name 'EPOCHS' is not defined"):
        static_parser(script)


def test_a_parser_from_literal_constants_is_built_without_running_the_script(tmp_path):
    script = tmp_path / "literal.py"
    script.write_text("import no_such_module_anywhere\nfrom kerasfast import recipes\n\n"
                      "SIZES = dict(small=1, large=2)\nCHOICES = tuple(SIZES)\n\n"
                      "def _parser():\n"
                      "    parser = recipes.parser('Literal.', epochs=2, batch_size=4)\n"
                      "    parser.add_argument('--size', choices=CHOICES, default=CHOICES[0])\n"
                      "    return parser\n\n"
                      "def main(argv=None):\n    args = _parser().parse_args(argv)\n    no_such_module_anywhere.run(args)\n")
    args = static_parser(script).parse_args(["--size", "large"])
    assert (args.size, args.epochs, args.batch_size) == ("large", 2, 4)
