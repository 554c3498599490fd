"""A griffe extension that reads kerasfast's docstrings as they are written.

kerasfast's docstrings hold doctests (`>>>` lines and their output) as plain
text under `Example:`, the way `python -m pytest --doctest-modules` reads
them. Rendered as Markdown, those lines would become nested block quotes and
`x[:3]` a link; fencing each run of doctest lines as `pycon` code shows them
as a console session. An `Args:` entry may also name several parameters over
more than one line (`epochs, verbose,` then `validation_freq: ...`), which
griffe's Google parser reads one line at a time; those lines are joined.
Only the rendered copy changes, never the source.

mkdocs.yml loads it: `extensions: [docs/reference/doctest_blocks.py]`.
"""

from __future__ import annotations

import re

import griffe

# An indented line of parameter names that ends with a comma: the entry's
# names go on over the next line.
_CONTINUED_NAMES = re.compile(r"^(\s+)\w+(, \w+)*,$")


def fence_doctests(text: str) -> str:
    r"""`text` with each run of doctest lines (a `>>>` line to the next blank line) fenced.

    Args:
        text: A docstring, already dedented.

    Returns:
        The docstring with every doctest wrapped in a ```` ```pycon ```` fence
        at the indentation of its first `>>>` line.

    Example:

    >>> fence_doctests("Example:\n\n>>> 1 + 1\n2\n\nDone.").splitlines()
    ['Example:', '', '```pycon', '>>> 1 + 1', '2', '```', '', 'Done.']
    """
    out, indent, in_fence = [], None, False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            in_fence = not in_fence  # a fence the author wrote stays as written
        if indent is None and not in_fence and stripped.startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
        elif indent is not None and not stripped:
            out.append(f"{indent}```")
            indent = None
        out.append(line)
    if indent is not None:
        out.append(f"{indent}```")
    return "\n".join(out)


def join_continued_names(text: str) -> str:
    r"""`text` with each `Args:` entry's names on one line.

    Args:
        text: A docstring, already dedented.

    Returns:
        The docstring with a line of names ending in a comma joined to the
        next line when that one has the same indentation.

    Example:

    >>> print(join_continued_names("Args:\n    a, b,\n    c: Numbers."))
    Args:
        a, b, c: Numbers.
    """
    lines = text.splitlines()
    out = []
    for line in lines:
        previous = _CONTINUED_NAMES.match(out[-1]) if out else None
        if previous and line.startswith(previous.group(1)) and not line[len(previous.group(1))].isspace():
            out[-1] = f"{out[-1]} {line.strip()}"
        else:
            out.append(line)
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    """Prepares every docstring griffe loads (see `fence_doctests`, `join_continued_names`)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(join_continued_names(obj.docstring.value))
