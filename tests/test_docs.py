"""Every example in the README and docs/ runs, so examples cannot rot.

Per page, one fresh interpreter runs its blocks in order (later blocks may
use what earlier ones defined), in a temporary working directory:

- every ```python block;
- every ```bash block of `kerasfast ...` commands, through the command
  line's own entry point inside that interpreter (no TensorFlow start-up per
  command). A bash block that is not run must say why in an HTML comment on
  the line right before it, `<!-- not run: trains for minutes -->`; an
  unmarked block holding any other command fails the test;
- a ```text block right after a block that ran quotes that block's output:
  each quoted line must appear in what the block printed, in order, with
  `...` standing for machine-dependent text (a line of only `...` for any
  lines).

docs/fit.md's signature block and its table of plan fields are checked
against `kerasfast.fit` and `kerasfast.plan` themselves.
"""

import ast
import dataclasses
import inspect
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.S | re.M)
NOT_RUN = re.compile(r"<!--\s*not run:(.*?)-->\s*$")
# Printed between blocks, so each block's output can be told apart.
SEPARATOR = "@@kerasfast-docs-block {}@@"
SEPARATOR_LINE = re.compile(r"^@@kerasfast-docs-block (\d+)@@$", re.M)
RUN_CLI = '''
def _kerasfast_cli(args):
    from kerasfast.cli import main
    try:
        code = main.main(args=args, prog_name="kerasfast", standalone_mode=False)
    except SystemExit as exit:  # argparse (a recipe's --help) exits directly
        code = exit.code
    if code not in (0, None):
        raise SystemExit(f"kerasfast {' '.join(args)} exited with {code}")
'''


@dataclasses.dataclass
class Block:
    language: str
    code: str
    not_run: str | None  # the reason given in a `<!-- not run: ... -->` marker
    after_block: bool  # only blank lines between this block and the one before
    line: int


def blocks(page: pathlib.Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found, end = [], None
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.search(before)
        found.append(Block(match.group(1), match.group(2), marker.group(1).strip() if marker else None,
                           end is not None and not text[end:match.start()].strip(),
                           text.count("\n", 0, match.start()) + 1))
        end = match.end()
    return found


def commands(bash: str) -> list[str]:
    """The commands of a bash block: continuations joined, comments dropped."""
    joined = bash.replace("\\\n", " ")
    return [line for line in (shlex.split(raw, comments=True) for raw in joined.splitlines()) if line]


def runnable(block: Block) -> bool:
    return block.language in ("python", "bash") and block.not_run is None


def page_script(page_blocks: list[Block]) -> str:
    parts = [RUN_CLI]
    for index, block in enumerate(page_blocks):
        if not runnable(block):
            continue
        # On a line of its own, even after output without a final newline.
        parts.append(f"print({chr(10) + SEPARATOR.format(index)!r}, flush=True)")
        if block.language == "python":
            parts.append(block.code)
        else:
            parts.extend(f"_kerasfast_cli({command[1:]!r})" for command in commands(block.code))
    return "\n\n".join(parts)


def outputs(stdout: str) -> dict[int, str]:
    pieces = SEPARATOR_LINE.split(stdout)
    return {int(index): text for index, text in zip(pieces[1::2], pieces[2::2], strict=True)}


def quoted_lines_missing(quote: str, printed: str) -> list[str]:
    """The quoted lines not found, in order, among the printed ones."""
    printed_lines = [line.rstrip() for line in printed.splitlines()]
    position, missing = 0, []
    for line in quote.rstrip().splitlines():
        if line.strip() in ("", "..."):
            continue
        pattern = re.compile(".*?".join(re.escape(part) for part in line.rstrip().split("...")))
        hit = next((i for i in range(position, len(printed_lines)) if pattern.fullmatch(printed_lines[i])), None)
        if hit is None:
            missing.append(line)
        else:
            position = hit + 1
    return missing


def unmarked_shell_commands(page_blocks: list[Block]) -> list[str]:
    bad = []
    for block in page_blocks:
        if block.language == "bash" and block.not_run is None:
            bad += [f"line {block.line}: {shlex.join(c)}" for c in commands(block.code) if c[0] != "kerasfast"]
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_bash_block_runs_or_says_why_not(page):
    page_blocks = blocks(page)
    assert not unmarked_shell_commands(page_blocks), (
        f"{page.name}: these commands are neither run nor marked; run only kerasfast commands in a block, "
        "or put '<!-- not run: REASON -->' on the line before it:\n" + "\n".join(unmarked_shell_commands(page_blocks)))
    empty = [block.line for block in page_blocks if block.not_run == ""]
    assert not empty, f"{page.name}: 'not run' markers without a reason before the blocks at lines {empty}"


@pytest.mark.parametrize("page", [p for p in PAGES if any(runnable(b) for b in blocks(p))], ids=lambda p: p.name)
def test_page_examples_run(page, tmp_path):
    page_blocks = blocks(page)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", page_script(page_blocks)], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, f"{page.name} examples failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    printed = outputs(done.stdout)
    for index, block in enumerate(page_blocks):
        if block.language == "text" and block.after_block and runnable(page_blocks[index - 1]):
            missing = quoted_lines_missing(block.code, printed[index - 1])
            assert not missing, (f"{page.name} line {block.line} quotes output the block before it did not print:\n"
                                 + "\n".join(missing) + "\n--- it printed:\n" + printed[index - 1][-3000:])


def documented_fit_signature() -> ast.arguments:
    text = next(b.code for b in blocks(ROOT / "docs" / "fit.md") if b.code.startswith("result = kerasfast.fit("))
    source = text.replace("result = kerasfast.fit(", "def fit(", 1).rstrip() + ": pass"
    return ast.parse(source).body[0].args


def test_fit_signature_in_docs_is_the_real_one():
    import kerasfast
    from kerasfast.plan import Overrides

    documented = documented_fit_signature()
    positional = documented.args
    doc_defaults = dict(zip([a.arg for a in positional[-len(documented.defaults):]], documented.defaults, strict=True))
    doc_defaults.update({a.arg: d for a, d in zip(documented.kwonlyargs, documented.kw_defaults, strict=True)})
    doc_params = [(a.arg, "positional") for a in positional] + [(a.arg, "keyword") for a in documented.kwonlyargs]

    real = inspect.signature(kerasfast.fit).parameters.values()
    real_params = [(p.name, "keyword" if p.kind is p.KEYWORD_ONLY else "positional")
                   for p in real if p.kind is not p.VAR_KEYWORD]
    assert doc_params[:len(real_params)] == real_params, "docs/fit.md's signature block differs from kerasfast.fit's"
    for parameter in real:
        if parameter.default is not parameter.empty:
            assert ast.literal_eval(doc_defaults[parameter.name]) == parameter.default, parameter.name

    # What follows is kerasfast.fit's **options: the plan overrides, with their own defaults.
    overrides = {f.name: f.default for f in dataclasses.fields(Overrides)}
    documented_overrides = [name for name, _ in doc_params[len(real_params):]]
    assert sorted(documented_overrides) == sorted(set(overrides) - {name for name, _ in real_params})
    for name in documented_overrides:
        assert ast.literal_eval(doc_defaults[name]) == overrides[name], name


def test_every_plan_field_is_in_fit_table_with_an_argument_fit_takes():
    import kerasfast
    from kerasfast.plan import FIELD_ORDER, Overrides

    text = (ROOT / "docs" / "fit.md").read_text(encoding="utf-8")
    table = text[text.index("| field | auto choice | override |"):]
    rows = [line.split(" | ") for line in table[:table.index("\n\n")].splitlines()[2:]]
    fields = {name for row in rows for name in re.findall(r"`(\w+)`", row[0])}
    assert set(FIELD_ORDER) <= fields, f"plan fields missing from docs/fit.md's table: {set(FIELD_ORDER) - fields}"
    accepted = set(inspect.signature(kerasfast.fit).parameters) | set(Overrides.names())
    named = {name for row in rows for name in re.findall(r"`(\w+)=", row[-1])}
    assert named and named <= accepted, f"docs/fit.md names arguments fit does not take: {named - accepted}"


def test_readme_opens_with_the_two_setup_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"^```bash\n(.*?)\n```", text, re.S | re.M)
    assert len(commands) >= 2
    install_and_run, install_and_test = commands[0], commands[1]
    assert "python3.11 -m venv" in install_and_run and "kerasfast quickstart" in install_and_run
    assert "python3.11 -m venv" in install_and_test and "pytest" in install_and_test
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    # CI installs and tests exactly as the README says.
    assert 'pip install -e ".[test]"' in ci and install_and_test.split("&& ")[-1] in ci
