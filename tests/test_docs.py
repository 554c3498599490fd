"""Every ```python block in the README and docs/ runs, so examples cannot rot.

The blocks of one page run in order in one fresh interpreter (later blocks
may use what earlier ones defined), in a temporary working directory.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page: pathlib.Path) -> list[str]:
    return BLOCK.findall(page.read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)], ids=lambda p: p.name)
def test_page_examples_run(page, tmp_path):
    script = "\n\n".join(python_blocks(page))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, f"{page.name} examples failed:\n{done.stderr[-4000:]}"


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
