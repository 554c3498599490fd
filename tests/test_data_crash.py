"""write_tfrecords killed at each step of its commit: the folder reads as exactly the old or the new dataset.

Every write runs in its own real process that KERASFAST_TEST_CRASH_AT=k makes die with os._exit() right after
commit step k, so no cleanup code runs, as with a kill. Each k gets its own copy of the old dataset. To import
TensorFlow once instead of once per k, one subprocess imports kerasfast.data and forks a process per write.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import kerasfast.data as kd
from kerasfast.data.writer import CRASH_ENV, CRASH_EXIT_CODE
from kerasfast.errors import DataError

ROOT = pathlib.Path(__file__).resolve().parents[1]
N = 10
OLD = {i: float(i) for i in range(N)}
NEW = {i: float(i + 100) for i in range(N)}

# argv: JSON [[folder, k], ...] and the new shard count; prints {k: exit code of the write killed at k}.
FORK_SERVER = f"""
import json, os, sys
import numpy as np, kerasfast.data as kd
jobs, shards, codes = json.loads(sys.argv[1]), int(sys.argv[2]), {{}}
for folder, k in jobs:
    pid = os.fork()
    if pid == 0:
        os.environ["{CRASH_ENV}"] = str(k)
        try:
            kd.write_tfrecords((np.arange({N}, dtype=np.float32) + 100, np.arange({N})), folder, shards=shards,
                               shuffle=False)
            os._exit(0)  # not killed: there was no step k
        except BaseException as exc:
            print(repr(exc), file=sys.stderr)
            os._exit(1)
    codes[k] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(codes))
"""


def contents(folder):
    """{label: x} of everything the folder reads as; a record read twice or lost shows."""
    ds = kd.tfrecord_dataset(str(folder), batch_size=64, shuffle=False)
    pairs = [(int(y), float(x)) for xb, yb in ds for x, y in zip(xb.numpy(), yb.numpy(), strict=True)]
    assert len(pairs) == len({p[0] for p in pairs}) == ds.kerasfast_info.num_records
    return dict(pairs)


def run_killed(jobs, new_shards):
    """Writes NEW into each folder of `jobs` ([(folder, k)]), killed after step k; returns {k: exit code}."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", FORK_SERVER, json.dumps([[str(f), k] for f, k in jobs]),
                           str(new_shards)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {int(k): code for k, code in json.loads(done.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.parametrize("old_shards,new_shards", [(1, 1), (2, 1)], ids=["same-names", "fewer-shards"])
def test_write_killed_at_every_commit_step_leaves_old_or_new(tmp_path, old_shards, new_shards):
    # Steps: 1 shards complete under temporary names, 2 commit record written (the commit point),
    # 3..2+n each shard renamed (same-names: replacing the old shard), then schema.json replaced,
    # old shards removed, commit record removed.
    last = 5 + new_shards
    old = tmp_path / "old"
    kd.write_tfrecords((np.arange(N, dtype=np.float32), np.arange(N)), old, shards=old_shards, shuffle=False)
    folders = {k: shutil.copytree(old, tmp_path / f"k{k}") for k in range(1, last + 1)}
    codes = run_killed([(folder, k) for k, folder in folders.items()], new_shards)
    assert codes == {k: CRASH_EXIT_CODE for k in folders}, "0: no step k; 1: the write failed"

    for k, folder in folders.items():
        assert contents(folder) == (OLD if k == 1 else NEW), f"killed after step {k}: {sorted(os.listdir(folder))}"
        assert kd.check_tfrecords(str(folder)).ok, k
        if k == last:  # killed after the last step = finished: nothing left over
            assert sorted(os.listdir(folder)) == [f"data-0000{i}-of-0000{new_shards}.tfrecord"
                                                  for i in range(new_shards)] + ["schema.json"]
        # The next write finishes the interrupted commit first, then replaces it cleanly.
        kd.write_tfrecords((np.arange(N, dtype=np.float32) + 200, np.arange(N)), folder, shards=2, shuffle=False)
        assert sorted(os.listdir(folder)) == ["data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord",
                                              "schema.json"], k
        assert contents(folder) == {i: float(i + 200) for i in range(N)}


def test_reader_follows_an_interrupted_commit_without_writing(tmp_path, monkeypatch):
    # The same state in-process: the writer "dies" after renaming the first of two shards.
    old = tmp_path / "ds"
    kd.write_tfrecords((np.arange(N, dtype=np.float32), np.arange(N)), old, shards=2, shuffle=False)
    from kerasfast.data import writer

    class Killed(BaseException):
        pass

    def die_at(k):
        def step(self):
            self.done += 1
            if self.done == k:
                raise Killed
        return step

    monkeypatch.setattr(writer._CommitSteps, "__call__", die_at(3))
    with pytest.raises(Killed):
        kd.write_tfrecords((np.arange(N, dtype=np.float32) + 100, np.arange(N)), old, shards=2, shuffle=False)
    names = sorted(os.listdir(old))
    assert "schema.json.pending" in names and sum(n.startswith(".data-") for n in names) == 1
    assert contents(old) == NEW
    info = kd.dataset_info(str(old))
    assert info.schema_path.endswith("schema.json.pending") and info.total_records == N
    assert sorted(os.listdir(old)) == names  # reading never writes (a reader may lack write access)
    with pytest.raises(DataError, match="overwrite=True"):
        kd.write_tfrecords((np.zeros(2, np.float32),), old, overwrite=False)
    assert sorted(os.listdir(old)) == names
    # A next write stopped before its own commit point: the interrupted one was finished first, and stays.
    monkeypatch.setattr(writer._CommitSteps, "__call__", die_at(1))
    with pytest.raises(Killed):
        kd.write_tfrecords((np.arange(N, dtype=np.float32) + 300, np.arange(N)), old, shards=3, shuffle=False)
    assert contents(old) == NEW
    assert sorted(n for n in os.listdir(old) if not n.startswith(".")) == [
        "data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord", "schema.json"]
