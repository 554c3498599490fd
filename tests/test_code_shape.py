"""The package's functions stay readable: none over 80 lines of code (its
docstring aside), no private helper over 7 parameters (a run's state travels
on one object, `kerasfast.training.run.Run`). Complexity (at most 15 per
function) is ruff's rule C901, in pyproject.toml."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "kerasfast"
MAX_LINES = 80
MAX_HELPER_PARAMETERS = 7


def _functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}", node


def _code_lines(node) -> int:
    lines = node.end_lineno - node.lineno + 1
    if ast.get_docstring(node, clean=False) is not None:
        lines -= node.body[0].end_lineno - node.body[0].lineno + 1
    return lines


def test_no_function_is_longer_than_80_lines():
    long = [f"{where}: {_code_lines(node)} lines" for where, node in _functions() if _code_lines(node) > MAX_LINES]
    assert not long, long


def test_no_helper_takes_more_than_7_parameters():
    def parameters(node):
        arguments = node.args
        return [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs
                if a.arg not in ("self", "cls")]

    many = [f"{where}: {len(parameters(node))}" for where, node in _functions()
            if node.name.startswith("_") and not node.name.startswith("__")
            and len(parameters(node)) > MAX_HELPER_PARAMETERS]
    assert not many, many
