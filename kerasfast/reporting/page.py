"""The run report's HTML: one self-contained page, images embedded as base64.

The page needs nothing beside it (no scripts, stylesheets or image files),
so it can be mailed, attached to an issue or opened from any folder.
"""

from __future__ import annotations

import base64
import html
import pathlib

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.3em; margin-top: 2em; border-bottom: 1px solid #ddd; }
h3 { font-size: 1.1em; margin-top: 1.5em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; height: auto; display: block; margin: 0.5em 0 1em; }
.note { color: #555; font-size: 0.9em; } code { background: #f4f4f4; padding: 0 0.2em; }
"""


def escape(value) -> str:
    """`value` as HTML text (None as an empty cell)."""
    return "" if value is None else html.escape(str(value))


def image(path: pathlib.Path, alt: str) -> str:
    """An `<img>` holding the PNG at `path` as a base64 data URI.

    Example:

    >>> from kerasfast.reporting.plots import plot_curves
    >>> png = plot_curves({"loss": [0.9, 0.5]}, pathlib.Path("curves.png"))
    >>> image(png, "loss and metrics")[:32]
    '<img alt="loss and metrics" src='
    """
    data = base64.b64encode(pathlib.Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{data}">'


def table(header: list, rows: list, numeric: tuple = ()) -> str:
    """An HTML table; the columns named in `numeric` are right-aligned.

    Args:
        header: Column titles.
        rows: One sequence of cell values per row.
        numeric: Titles of the columns holding numbers.

    Returns:
        The `<table>` element.
    """
    head = "".join(f"<th>{escape(name)}</th>" for name in header)
    body = []
    for row in rows:
        cells = "".join(f'<td class="num">{escape(value)}</td>' if name in numeric else f"<td>{escape(value)}</td>"
                        for name, value in zip(header, row, strict=True))
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def paragraph(text: str, css: str = "") -> str:
    """A `<p>` of escaped text."""
    return f'<p class="{css}">{escape(text)}</p>' if css else f"<p>{escape(text)}</p>"


def heading(text: str, level: int = 2) -> str:
    """An `<hN>` of escaped text."""
    return f"<h{level}>{escape(text)}</h{level}>"


def page(title: str, parts: list[str]) -> str:
    """The whole HTML document: `title` and the (already HTML) `parts` in order."""
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f"<title>{escape(title)}</title>", f"<style>{STYLE}</style>", "</head>", "<body>",
        heading(title, 1), *parts, "</body>", "</html>", "",
    ])
