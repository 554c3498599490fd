"""The documentation site (mkdocs.yml) builds with `mkdocs build --strict`.

Strict mode turns every warning into a failure: a broken link in a guide, a
cross-reference to a name that no longer exists, a reference page naming a
renamed function, a guide left out of the navigation. On top of that, every
public module of kerasfast has its reference page, and every name a package
exports (its `__all__`) is documented there, so a new module or export
without documentation fails here.
"""

import importlib
import os
import pathlib
import pkgutil
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kerasfast"
PUBLIC_MODULES = sorted(m.name for m in pkgutil.iter_modules([str(PACKAGE)]) if not m.name.startswith("_"))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    # NO_MKDOCS_2_WARNING: Material's banner about MkDocs 2.0, not a build warning.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return out


def exported_names(module: str) -> list[str]:
    """The names `kerasfast.<module>` lists in `__all__`, or [] when it has none."""
    path = PACKAGE / module / "__init__.py" if (PACKAGE / module).is_dir() else PACKAGE / f"{module}.py"
    if "__all__" not in path.read_text(encoding="utf-8"):
        return []
    return list(importlib.import_module(f"kerasfast.{module}").__all__)


def anchors(page: pathlib.Path) -> set[str]:
    return set(re.findall(r'id="(kerasfast[\w.]*)"', page.read_text(encoding="utf-8")))


def test_guides_and_home_page_are_built(site):
    assert (site / "index.html").is_file()
    for guide in (ROOT / "docs").glob("*.md"):
        page = site / ("index.html" if guide.stem == "index" else f"{guide.stem}/index.html")
        assert page.is_file(), f"docs/{guide.name} is not in the site: add it to mkdocs.yml's nav"


def test_doctests_render_as_code(site):
    # docs/reference/doctest_blocks.py fences `>>>` examples; unfenced, Markdown
    # would make each `>>>` line a nested block quote.
    page = (site / "reference" / "datasets" / "index.html").read_text(encoding="utf-8")
    assert '<span class="gp">&gt;&gt;&gt; </span>' in page
    assert "<blockquote>" not in page


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_public_module_has_a_reference_page(site, module):
    page = site / "reference" / module / "index.html"
    assert page.is_file(), (f"kerasfast.{module} has no reference page: add docs/reference/{module}.md "
                            f"(`::: kerasfast.{module}`) and list it under API reference in mkdocs.yml")
    found = anchors(page)
    assert f"kerasfast.{module}" in found
    missing = [name for name in exported_names(module)
               if not any(anchor.endswith(f".{name}") for anchor in found)]
    assert not missing, (f"kerasfast.{module} exports {missing} but docs/reference/{module}.md does not "
                         "document them: add a `::: kerasfast.<module where it is defined>.<name>` line each")


def test_every_name_of_the_package_root_is_linked_from_its_page(site):
    root_page = (site / "reference" / "kerasfast" / "index.html").read_text(encoding="utf-8")
    documented = set().union(*(anchors(page) for page in (site / "reference").glob("*/index.html")))
    for name in importlib.import_module("kerasfast").__all__:
        if name in PUBLIC_MODULES:
            assert f'href="../{name}/"' in root_page, f"docs/reference/kerasfast.md does not link kerasfast.{name}"
            continue
        targets = [anchor for anchor in documented if anchor.endswith(f".{name}")]
        assert targets, f"kerasfast.{name} is documented on no reference page"
        assert any(f"#{target}" in root_page for target in targets), (
            f"docs/reference/kerasfast.md does not link kerasfast.{name} to its entry ({targets[0]})")
