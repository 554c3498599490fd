"""benchmarks/run_all.py rewrites only its own sections of docs/benchmarks.md.

The page holds one section per benchmark; run_all.py makes some of them,
other commands (and prose) the rest. Its writer is checked here on small
synthetic tables, without running the benchmarks.
"""

import pathlib
import re

from benchmarks.run_all import (FIT_SECTION, MACHINE_LINE, SUBPROCESS_SECTIONS, Section, _split_sections,
                                replace_sections, write_sections)

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
OWN_TITLES = [FIT_SECTION, *(title for title, *_ in SUBPROCESS_SECTIONS)]


def _titled(page: str) -> dict[str, str]:
    return {piece.splitlines()[0][3:]: piece for piece in _split_sections(page)[1:]}


def test_replace_sections_keeps_the_rest_of_the_page_byte_for_byte():
    page = ("# Benchmarks\n\nOpening prose.\n\n"
            "## Mine\n\nCommand: old.\n\n| a |\n|---|\n| 1 |\n\n"
            "## Theirs\n\nHand-written notes.\n\n```text\n## not a heading: inside a code block\n```\n\n"
            "## Mine too\n\n| b |\n|---|\n| 2 |\n")
    replaced = replace_sections(page, {"Mine": "## Mine\n\n| a |\n|---|\n| 9 |\n",
                                       "Mine too": "## Mine too\n\n| b |\n|---|\n| 8 |\n",
                                       "New": "## New\n\n| c |\n|---|\n| 7 |\n"})
    assert replaced == ("# Benchmarks\n\nOpening prose.\n\n"
                        "## Mine\n\n| a |\n|---|\n| 9 |\n\n"
                        "## Theirs\n\nHand-written notes.\n\n```text\n## not a heading: inside a code block\n```\n\n"
                        "## Mine too\n\n| b |\n|---|\n| 8 |\n\n"
                        "## New\n\n| c |\n|---|\n| 7 |\n")


def _synthetic_sections() -> list[Section]:
    return [Section(title, f"| workload | rate |\n|---|---:|\n| synthetic {index} | {index},000 samples/s |",
                    runs="" if title == FIT_SECTION else f"benchmarks/script{index}.py")
            for index, title in enumerate(OWN_TITLES)]


def test_the_current_page_keeps_its_other_sections_and_gets_its_own_in_place(tmp_path):
    original = PAGE.read_text(encoding="utf-8")
    machine = re.search(rf"^{re.escape(MACHINE_LINE)}(.*?)\. It is shared", original, re.M).group(1)
    out = tmp_path / "benchmarks.md"
    out.write_text(original, encoding="utf-8")

    written = write_sections(out, _synthetic_sections(), command="python benchmarks/run_all.py --quick",
                             commit="abc1234", date="2026-12-03", machine=machine)

    assert out.read_text(encoding="utf-8") == written
    before, after = _titled(original), _titled(written)
    # The same sections in the same order: every title run_all writes is one the page has.
    assert list(after) == list(before)
    assert set(OWN_TITLES) <= set(before)
    assert _split_sections(written)[0] == _split_sections(original)[0]
    for title in before:
        if title not in OWN_TITLES:
            assert after[title] == before[title], f"section {title!r} changed"
    index = OWN_TITLES.index("Compression")
    assert after["Compression"] == (
        f"## Compression\n\nCommand: `python benchmarks/run_all.py --quick`, which runs `benchmarks/script{index}.py`;"
        " commit abc1234, 2026-12-03, the machine above.\n\n"
        f"| workload | rate |\n|---|---:|\n| synthetic {index} | {index},000 samples/s |\n\n")
    assert "the machine above.\n\n| workload | rate |\n|---|---:|\n| synthetic 0 |" in after[FIT_SECTION]
    # Writing again changes nothing more.
    again = write_sections(out, _synthetic_sections(), command="python benchmarks/run_all.py --quick",
                           commit="abc1234", date="2026-12-03", machine=machine)
    assert again == written


def test_a_new_page_gets_a_title_and_each_section_names_another_machine(tmp_path):
    out = tmp_path / "new.md"
    sections = [Section("GPT width", "| a |\n|---|\n| 1 |", runs="benchmarks/gpt_width.py"),
                Section(FIT_SECTION, "| b |\n|---|\n| 2 |", note="12 s")]
    written = write_sections(out, sections, command="python benchmarks/run_all.py", commit="abc1234",
                             date="2026-12-03", machine="Some CPU, 8 cores")
    assert written == (
        "# Benchmarks\n\n"
        "## GPT width\n\nCommand: `python benchmarks/run_all.py`, which runs `benchmarks/gpt_width.py`; "
        "commit abc1234, 2026-12-03, on Some CPU, 8 cores.\n\n| a |\n|---|\n| 1 |\n\n"
        f"## {FIT_SECTION}\n\nCommand: `python benchmarks/run_all.py` (12 s); "
        "commit abc1234, 2026-12-03, on Some CPU, 8 cores.\n\n| b |\n|---|\n| 2 |\n")
