"""XLA's compiled programs kept between runs (`kerasfast.training.compile_cache`): real processes, each a
small `kerasfast.fit` under XLA, share one cache folder; TensorFlow's own log says what it loaded."""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from kerasfast import compile_cache

WORKER = pathlib.Path(__file__).parent / "workers" / "xla_cache.py"


def _run(cache_dir, *args):
    """The worker's JSON report and TensorFlow's log (the persistor's lines shown)."""
    env = {key: value for key, value in os.environ.items() if key not in (compile_cache.ENV, "TF_XLA_FLAGS")}
    env.update(TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="device_executable_persistor=1")
    done = subprocess.run([sys.executable, str(WORKER), str(cache_dir), *args], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _entries(cache_dir):
    return sorted((pathlib.Path(cache_dir) / "xla").glob("*/*.pb"))


def test_a_rerun_loads_what_the_first_run_compiled_and_a_cut_short_entry_is_compiled_afresh(tmp_path):
    first, log = _run(tmp_path)
    assert first["xla_cache"] and first["jit_compile"]
    assert "on:" in first["reason"] and "0 kept" in first["reason"], first["reason"]
    assert "Serializing and saving cache entry" in log and "Loading cached entry" not in log
    entries = _entries(tmp_path)
    assert entries and all(compile_cache.complete(entry) for entry in entries)
    assert [entry.parent for entry in entries] == [pathlib.Path(first["xla_cache"])] * len(entries)
    assert list((tmp_path / "xla" / "processes").iterdir()) == []  # the process's own folder went with it
    assert first["tf_xla_flags"] is None  # the flag was read by TensorFlow, not left for child processes

    second, log = _run(tmp_path)
    assert f"{len(entries)} kept" in second["reason"], second["reason"]
    assert "Loading cached entry" in log and "Serializing and saving cache entry" not in log
    assert second["loss"] == first["loss"]  # the loaded programs compute what the compiled ones did

    # An entry cut short (a process killed while writing it, where TensorFlow writes the folder itself):
    # TensorFlow would fail every compile of its program. It is left out, compiled afresh, and made whole.
    for entry in entries:
        entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
        assert not compile_cache.complete(entry)
    third, log = _run(tmp_path)
    assert "0 kept" in third["reason"] and "Loading cached entry" not in log
    assert third["loss"] == first["loss"]
    assert _entries(tmp_path) == entries and all(compile_cache.complete(entry) for entry in entries)


def test_tensorflow_imported_before_kerasfast_leaves_the_cache_off(tmp_path):
    report, _ = _run(tmp_path, "tensorflow_first")
    assert report["xla_cache"] is None
    assert report["reason"].startswith("off: TensorFlow was imported before kerasfast"), report["reason"]
    assert _entries(tmp_path) == []


@pytest.mark.parametrize("variable, value, reason", [
    (compile_cache.ENV, "off", "off: your KERASFAST_XLA_CACHE=off"),
    ("TF_XLA_FLAGS", "--tf_xla_persistent_cache_directory=/somewhere", "yours: TF_XLA_FLAGS names a cache folder"),
])
def test_the_users_setting_comes_first(tmp_path, monkeypatch, variable, value, reason):
    monkeypatch.delenv(compile_cache.ENV)  # the suite's own "off"
    monkeypatch.setenv(variable, value)
    assert compile_cache._prepared(tmp_path / "xla") == reason
    assert not (tmp_path / "xla").exists()


def _field(number: int, payload: bytes) -> bytes:
    length, encoded = len(payload), b""
    while True:
        byte, length = length & 0x7F, length >> 7
        encoded += bytes([byte | (0x80 if length else 0)])
        if not length:
            return bytes([number << 3 | 2]) + encoded + payload


def test_an_entry_is_complete_only_whole(tmp_path):
    whole = _field(1, b"key") + _field(2, b"h" * 300) + _field(3, b"x" * 200)
    path = tmp_path / "entry.pb"
    path.write_bytes(whole)
    assert compile_cache.complete(path)
    for cut in range(len(whole)):
        path.write_bytes(whole[:cut])
        assert not compile_cache.complete(path), cut
    for damaged in (whole + b"\0", _field(1, b"key") + _field(2, b"h") + _field(3, b""),
                    _field(2, b"h") + _field(1, b"key") + _field(3, b"x")):
        path.write_bytes(damaged)
        assert not compile_cache.complete(path)


def test_the_shared_folder_keeps_the_most_recently_used_entries(tmp_path):
    now = time.time()
    for age, name in enumerate(["newest", "middle", "oldest"]):
        (tmp_path / f"{name}.pb").write_bytes(b"x" * 100)
        os.utime(tmp_path / f"{name}.pb", (now - 100 * age, now - 100 * age))
    compile_cache._trim(tmp_path, max_bytes=250)
    assert sorted(path.stem for path in tmp_path.glob("*.pb")) == ["middle", "newest"]


def test_folders_of_processes_that_ended_are_removed(tmp_path):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone, mine = tmp_path / f"{ended.stdout.strip()}-abc", tmp_path / f"{os.getpid()}-def"
    gone.mkdir()
    mine.mkdir()
    compile_cache._remove_stale(tmp_path)
    assert not gone.exists() and mine.exists()
