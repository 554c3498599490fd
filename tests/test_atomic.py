"""replace_durably: the one atomic write; a failed write keeps the old file and leaves nothing behind."""

import errno

import pytest

from kerasfast._atomic import replace_durably


def _half_write_then_fail(error):
    def write(temporary):
        temporary.write_text("half of the new")
        raise error

    return write


def test_replaces_the_file_and_leaves_only_it(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("old")
    seen = []
    returned = replace_durably(str(path), lambda temporary: seen.append(temporary) or temporary.write_text("new"))
    assert returned == path and path.read_text() == "new"
    assert seen[0].parent == tmp_path and seen[0].name != path.name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_keep_suffix_names_the_temporary_after_the_file(tmp_path):
    seen = []
    replace_durably(tmp_path / "state.npz", lambda t: seen.append(t.name) or t.write_bytes(b"x"), keep_suffix=True)
    assert seen[0].endswith("-state.npz") and seen[0].startswith(".tmp-")


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), ValueError("bad content")])
def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path, error):
    path = tmp_path / "schema.json"
    path.write_text("old")
    with pytest.raises(type(error)) as raised:
        replace_durably(path, _half_write_then_fail(error))
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["schema.json"]
    if isinstance(error, OSError):
        assert raised.value.filename == str(path)  # names the file the user knows, not the temporary


def test_a_named_temporary_is_the_one_written_and_removed(tmp_path):
    path = tmp_path / "kerasfast-export.json"
    temporary = tmp_path / ".kerasfast-tmp-manifest-0123456789ab"
    seen = []
    replace_durably(path, lambda t: seen.append(t) or t.write_text("{}"), temporary=temporary)
    assert seen == [temporary] and path.read_text() == "{}" and not temporary.exists()
    with pytest.raises(OSError):
        replace_durably(path, _half_write_then_fail(OSError(errno.EIO, "I/O error")), temporary=str(temporary))
    assert path.read_text() == "{}" and not temporary.exists()


def test_the_folder_is_created(tmp_path):
    path = tmp_path / "run" / "history.json"
    replace_durably(path, lambda t: t.write_text("[]"))
    assert path.read_text() == "[]"
