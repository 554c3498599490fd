"""The command line answers at once: help and version never import TensorFlow.

What is checked is which modules are loaded, not a wall-clock time (the
start-up times are measured by benchmarks/cli_start.py).
"""

import json
import os
import subprocess
import sys
import types

from click.testing import CliRunner

from kerasfast.cli import main

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
