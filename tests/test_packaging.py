"""A non-editable install (a wheel) carries the recipes and runs them outside the checkout.

The wheel is built from this checkout (`pip wheel . --no-deps`, ~5 s) and
installed with `--no-deps` into a fresh virtual environment that reuses the
test environment's installed dependencies (a .pth line to its
site-packages; that folder's own .pth files, among them the editable
kerasfast finder, are not processed), so nothing is downloaded and the
kerasfast that runs is the wheel's.
"""

import os
import pathlib
import subprocess
import sys
import sysconfig
import venv
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECIPE_SCRIPTS = sorted(p.name for p in (ROOT / "recipes").glob("*.py"))
ENV = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}, "TF_CPP_MIN_LOG_LEVEL": "3"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        capture_output=True, text=True, timeout=600, env=ENV,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.glob("kerasfast-*.whl")
    return path


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """bin/ of a fresh venv holding the wheel's kerasfast."""
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(home)
    python = home / "bin" / "python"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True, text=True, timeout=600, env=ENV,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (pathlib.Path(site) / "_reuse_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return home / "bin"


def _run(args, cwd, timeout=300):
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=ENV)


def test_wheel_ships_the_recipes_and_not_tfmot(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        for script in RECIPE_SCRIPTS:
            assert archive.read(f"kerasfast/_recipes/{script}") == (ROOT / "recipes" / script).read_bytes()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    assert RECIPE_SCRIPTS and not any(n.startswith("recipes/") for n in names)
    tfmot = [line for line in requires if "tensorflow-model-optimization" in line]
    assert tfmot and all("extra ==" in line for line in tfmot), tfmot  # only in an extra (test)


def test_installed_wheel_lists_and_finds_recipes_outside_the_checkout(installed, tmp_path):
    where = _run([installed / "python", "-c", "import kerasfast.recipes as r; print(r.__file__); "
                  "print(r.recipes_folder()); print(','.join(r.available_recipes()))"], tmp_path)
    assert where.returncode == 0, where.stderr[-3000:]
    module, folder, names = where.stdout.strip().splitlines()[-3:]
    assert pathlib.Path(module).is_relative_to(installed.parent), module  # the wheel's kerasfast, not the checkout's
    assert pathlib.Path(folder) == pathlib.Path(module).parent / "_recipes"
    assert names.split(",") == [s.removesuffix(".py") for s in RECIPE_SCRIPTS]

    helped = _run([installed / "kerasfast", "recipe", "--help"], tmp_path)
    assert helped.returncode == 0 and "Run recipe NAME" in helped.stdout, helped.stderr[-3000:]
    recipe_help = _run([installed / "kerasfast", "recipe", "tabular", "--help"], tmp_path)
    assert recipe_help.returncode == 0 and "--smoke" in recipe_help.stdout, recipe_help.stderr[-3000:]
    unknown = _run([installed / "kerasfast", "recipe", "nope"], tmp_path)
    assert unknown.returncode != 0 and "the recipes are finetune, gpt, image_classification" in unknown.stderr
    quick = _run([installed / "kerasfast", "quickstart", "--help"], tmp_path)
    assert quick.returncode == 0 and "digits" in quick.stdout, quick.stderr[-3000:]


@pytest.mark.slow
def test_installed_wheel_runs_the_tabular_recipe(installed, tmp_path):
    done = _run([installed / "kerasfast", "recipe", "tabular", "--smoke", "--out", tmp_path / "run"], tmp_path,
                timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "metrics.json").exists()
