"""Export writes only its own files: user files, sub-folders and folder modes survive.

Real exports of tiny Keras models into real folders; the interrupted export
is a real subprocess killed mid-export.
"""

import fcntl
import json
import re
import os
import signal
import subprocess
import sys
import textwrap
import time

import keras
import pytest

from kerasfast.errors import ExportError
from kerasfast.export import export_model
from kerasfast.export.atomic import MANIFEST_NAME, TEMP_PREFIX

OWN = ["kerasfast-export.json", "model.keras", "report.json", "report.md"]


def tiny_model(name="tiny", units=3):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    return keras.Model(inputs, keras.layers.Dense(units, name="out")(inputs), name=name)


def mode(path):
    return os.stat(path).st_mode & 0o777


def files(folder):
    """{relative path: bytes} of every file under `folder`; folders as None."""
    return {
        p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))
    }


def manifest_entries(folder):
    return json.loads((folder / MANIFEST_NAME).read_text())["entries"]


@pytest.fixture
def project(tmp_path):
    """A user's folder (mode 0755) with a notes file and a sub-folder."""
    folder = tmp_path / "project"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("my notes")
    (folder / "sub" / "data.csv").write_text("a,b\n1,2\n")
    folder.chmod(0o755)
    return folder


def test_refusal_names_user_files_and_overwrite_leaves_them_alone(project):
    user_files = files(project)
    with pytest.raises(ExportError) as refused:
        export_model(tiny_model(), project, formats=["keras"])
    message = str(refused.value)
    assert f"out_dir {project} holds 2 entries kerasfast did not write: notes.txt, sub/." in message
    assert "pass overwrite=True (command line: --overwrite)" in message
    assert "pick an empty or new out_dir" in message
    assert files(project) == user_files

    export_model(tiny_model(), project, formats=["keras"], overwrite=True)
    assert sorted(p.name for p in project.iterdir()) == sorted([*OWN, "notes.txt", "sub"])
    assert {k: v for k, v in files(project).items() if k in user_files} == user_files
    assert mode(project) == 0o755
    assert manifest_entries(project) == ["model.keras", "report.json", "report.md"]


def test_refusal_quotes_a_few_foreign_names_and_counts_all(tmp_path):
    for letter in "abcdefgh":
        (tmp_path / f"{letter}.txt").write_text(letter)
    with pytest.raises(ExportError, match=r"holds 8 entries kerasfast did not write: a.txt, b.txt, c.txt, d.txt, "
                       r"e.txt and 3 more\."):
        export_model(tiny_model(), tmp_path, formats=["keras"])


def test_folder_mode_is_kept_and_new_folders_follow_the_umask(tmp_path):
    previous_umask = os.umask(0o027)
    try:
        kept = tmp_path / "kept"
        kept.mkdir()
        kept.chmod(0o751)
        (kept / "notes.txt").write_text("mine")
        export_model(tiny_model(), kept, formats=["keras"], overwrite=True)
        export_model(tiny_model(), kept, formats=["keras"], overwrite=True)  # and when replacing
        assert mode(kept) == 0o751

        fresh = tmp_path / "new" / "nested"
        export_model(tiny_model(), fresh, formats=["keras", "saved_model"])
    finally:
        os.umask(previous_umask)
    folders = [fresh.parent, fresh, *(p for p in fresh.rglob("*") if p.is_dir())]
    assert {p.name: mode(p) for p in folders} == {p.name: 0o750 for p in folders}
    written = [p for p in fresh.rglob("*") if p.is_file()]
    assert {p.name: mode(p) for p in written} == {p.name: 0o640 for p in written}


def test_reexport_replaces_only_the_manifest_artifacts(project):
    first = export_model(tiny_model("first"), project, formats=["keras", "tflite_float32"], overwrite=True,
                         measure_latency=False)
    assert manifest_entries(project) == ["model.keras", "model_float32.tflite", "report.json", "report.md"]
    first_keras = first.path("keras").read_bytes()
    (project / "later.txt").write_text("written after the first export")
    user_files = {k: v for k, v in files(project).items() if k in ("notes.txt", "later.txt", "sub", "sub/data.csv")}

    second = export_model(tiny_model("second", units=4), project, formats=["keras"], overwrite=True)
    assert sorted(p.name for p in project.iterdir()) == sorted([*OWN, "later.txt", "notes.txt", "sub"])
    assert not first.path("tflite_float32").exists()  # the earlier export's, not written again: removed
    assert second.path("keras").read_bytes() != first_keras
    assert keras.saving.load_model(second.path("keras")).name == "second"
    assert manifest_entries(project) == ["model.keras", "report.json", "report.md"]
    assert {k: v for k, v in files(project).items() if k in user_files} == user_files
    assert not [p for p in project.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_folder_with_only_a_previous_export_is_replaced_without_overwrite(tmp_path):
    out_dir = tmp_path / "exported"
    export_model(tiny_model("first"), out_dir, formats=["keras"])
    export_model(tiny_model("second"), out_dir, formats=["keras"])
    assert sorted(p.name for p in out_dir.iterdir()) == OWN
    assert json.loads((out_dir / "report.json").read_text())["model_name"] == "second"


def test_user_file_at_an_artifact_name_is_refused_even_with_overwrite(tmp_path):
    (tmp_path / "model.keras").write_bytes(b"the user's own model")
    for overwrite in (False, True):
        with pytest.raises(ExportError, match=r"holds model.keras, which kerasfast did not write, at a name this "
                           r"export would replace.*even with overwrite=True"):
            export_model(tiny_model(), tmp_path, formats=["keras"], overwrite=overwrite)
    assert [p.name for p in tmp_path.iterdir()] == ["model.keras"]
    assert (tmp_path / "model.keras").read_bytes() == b"the user's own model"


def test_user_file_inside_an_artifact_folder_is_never_deleted(tmp_path):
    out_dir = tmp_path / "exported"
    export_model(tiny_model(), out_dir, formats=["saved_model"])
    (out_dir / "saved_model" / "my_notes.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"holds 1 entry kerasfast did not write: saved_model/ \(holds "
                       r"saved_model/my_notes.txt, which kerasfast did not write\)"):
        export_model(tiny_model(), out_dir, formats=["keras"])
    with pytest.raises(ExportError, match="at a name this export would replace"):
        export_model(tiny_model(), out_dir, formats=["saved_model"], overwrite=True)
    # A different export leaves the whole folder alone and stops claiming it.
    export_model(tiny_model(), out_dir, formats=["keras"], overwrite=True)
    assert (out_dir / "saved_model" / "my_notes.txt").read_text() == "mine"
    assert (out_dir / "saved_model" / "saved_model.pb").is_file()
    assert manifest_entries(out_dir) == ["model.keras", "report.json", "report.md"]


def test_export_written_before_the_manifest_is_recognised_by_its_report(project):
    export_model(tiny_model(), project, formats=["keras"], overwrite=True)
    (project / MANIFEST_NAME).unlink()  # what an export looked like before the manifest
    with pytest.raises(ExportError, match=r"holds 2 entries kerasfast did not write: notes.txt, sub/\."):
        export_model(tiny_model(), project, formats=["keras"])
    export_model(tiny_model(), project, formats=["keras"], overwrite=True)
    assert sorted(p.name for p in project.iterdir()) == sorted([*OWN, "notes.txt", "sub"])


def test_leftovers_of_an_interrupted_export_are_removed_by_the_next_one(project):
    export_model(tiny_model("first"), project, formats=["keras"], overwrite=True)
    # What a killed export leaves, named as the code names them: a staging
    # folder with a half-written artifact, an artifact folder retired but
    # not yet deleted, a manifest not yet renamed into place.
    stage = project / f"{TEMP_PREFIX}stage-0123456789ab"
    (stage / "saved_model" / "variables").mkdir(parents=True)
    (stage / "model.keras").write_bytes(b"half a zip")
    (project / f"{TEMP_PREFIX}old-ba9876543210" / "variables").mkdir(parents=True)
    (project / f"{TEMP_PREFIX}manifest-0a1b2c3d4e5f").write_text('{"entries": [')
    user_files = {k: v for k, v in files(project).items() if k in ("notes.txt", "sub", "sub/data.csv")}

    with pytest.raises(ExportError, match=r"holds 2 entries kerasfast did not write: notes.txt, sub/\."):
        export_model(tiny_model("second"), project, formats=["keras"])  # leftovers are not foreign
    assert (stage / "model.keras").read_bytes() == b"half a zip"  # a refused export removes nothing
    export_model(tiny_model("second"), project, formats=["keras"], overwrite=True)
    assert sorted(p.name for p in project.iterdir()) == sorted([*OWN, "notes.txt", "sub"])
    assert {k: v for k, v in files(project).items() if k in user_files} == user_files


KILLED_EXPORT = textwrap.dedent(
    """
    import sys
    import keras
    from kerasfast.export import export_model

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    hidden = keras.layers.Flatten()(keras.layers.Conv2D(8, 3, activation="relu")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(10)(hidden), name="killed")
    export_model(model, sys.argv[1], overwrite=True,
                 formats=["keras", "tflite_float32", "tflite_dynamic_int8", "tflite_float16"])
    """
)


def test_killed_export_leaves_no_half_artifact_and_the_next_export_cleans_up(project):
    export_model(tiny_model("previous"), project, formats=["keras"], overwrite=True)
    before = files(project)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    process = subprocess.Popen([sys.executable, "-c", KILLED_EXPORT, str(project)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # model.keras in the staging folder: the TFLite files are still to
        # come (seconds of conversion and LiteRT checks), so this is mid-export.
        deadline = time.monotonic() + 240
        while not list(project.glob(f"{TEMP_PREFIX}stage-*/model.keras")):
            assert process.poll() is None, process.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the export never reached its first artifact"
            time.sleep(0.005)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    leftovers = [p.name for p in project.iterdir() if p.name.startswith(TEMP_PREFIX)]
    assert leftovers and all(name.startswith(f"{TEMP_PREFIX}stage-") for name in leftovers)
    # Under the final names: the previous export, whole, and the user's files.
    assert {k: v for k, v in files(project).items() if not k.startswith(TEMP_PREFIX)} == before

    export_model(tiny_model("after"), project, formats=["keras"], overwrite=True)
    assert sorted(p.name for p in project.iterdir()) == sorted([*OWN, "notes.txt", "sub"])


def test_failed_export_keeps_everything_and_creates_no_folder(project, tmp_path):
    inputs = keras.Input((6,))
    outputs = keras.layers.Lambda(lambda t: keras.ops.erfinv(keras.ops.tanh(t) * 0.5), name="erfinv_layer")(inputs)
    no_tflite = keras.Model(inputs, outputs)
    before = files(project)
    with pytest.raises(ExportError, match="not TFLite builtins"):
        export_model(no_tflite, project, formats=["saved_model", "tflite_float32"], overwrite=True)
    assert files(project) == before
    with pytest.raises(ExportError, match="not TFLite builtins"):
        export_model(no_tflite, tmp_path / "new" / "out", formats=["saved_model", "tflite_float32"])
    assert not (tmp_path / "new").exists()


def test_concurrent_export_into_the_same_folder_is_refused(tmp_path):
    out_dir = tmp_path / "exported"
    export_model(tiny_model(), out_dir, formats=["keras"])
    before = files(out_dir)
    # Another export holds the folder (its lock); this one must not touch its temporaries.
    holder = os.open(out_dir, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(ExportError, match=f"Another kerasfast export is writing into out_dir {out_dir}"):
            export_model(tiny_model(), out_dir, formats=["keras"])
    finally:
        os.close(holder)
    assert files(out_dir) == before


@pytest.mark.parametrize("name", ["model.keras", "model.tflite", "net.onnx"])
def test_an_out_dir_named_like_a_model_file_is_refused(tmp_path, name):
    # It made a folder model.keras/ holding model.keras/model.keras.
    with pytest.raises(ExportError, match=rf"out_dir .*{re.escape(name)} is named like a \.\w+ file, but it is the "
                                          r"folder the artifacts are written into .*: pass a folder, e\.g\. "):
        export_model(tiny_model("m"), tmp_path / name, formats=["keras"])
    assert not (tmp_path / name).exists()
