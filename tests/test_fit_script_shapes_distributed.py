"""Every multi-worker script shape that docs/distributed.md shows or
kerasfast's errors suggest trains on 2 real worker processes and finishes:
`fit` returns, both workers hold identical weights, and the user's model
object holds the trained weights and optimizer state. The shapes run one
after the other in one launch (tests/workers/script_shapes.py)."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "workers" / "script_shapes.py"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
SHAPES = (
    "after_setup_optimizer_string", "after_setup_optimizer_instance_no_backup", "after_setup_no_optimizer",
    "after_setup_compiled", "after_setup_functional_optimizer_instance", "builder_optimizer_string",
    "builder_compiled_no_backup", "in_scope_optimizer_string", "in_scope_compiled",
)
WRITES_RUN_DIR = {"after_setup_optimizer_string", "after_setup_optimizer_instance_no_backup",
                  "builder_optimizer_string", "builder_compiled_no_backup", "in_scope_optimizer_string"}


def _weights(out_dir, name, worker):
    with np.load(out_dir / f"{name}.worker{worker}.npz") as data:
        return [data[key] for key in sorted(data.files, key=lambda k: int(k.split("_")[1]))]


@pytest.mark.slow
def test_every_documented_script_shape_finishes_on_two_workers_with_the_users_model_trained(tmp_path):
    command = [sys.executable, "-m", "kerasfast.cli", "launch", "-n", "2", "--", sys.executable, str(WORKER),
               str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = [json.loads((tmp_path / f"results.worker{i}.json").read_text()) for i in range(2)]
    for name in SHAPES:
        first, second = (worker[name] for worker in results)
        for result in (first, second):
            assert result["returned"], f"{name}: {result.get('error')}"
            assert result["changed"] and result["equals_trained"], f"{name}: {result}"
            assert result["user_iterations"] == result["trained_iterations"] == 16, f"{name}: {result}"
            assert result["optimizer_equals_trained"], f"{name}: {result}"
            assert result["warnings"] == [], f"{name}: {result['warnings']}"
            assert result["is_users_object"] in (True, None), name
            assert result["keeps_given_optimizer"] in (True, None), name  # an instance given is the model's
        assert first["loss"] == second["loss"], name
        assert (name in WRITES_RUN_DIR) == ("model.keras" in first["run_files"]), f"{name}: {first['run_files']}"
        assert not any(file.startswith("backup") for file in first["run_files"]), name  # cleared once finished
        for a, b in zip(_weights(tmp_path, name, 0), _weights(tmp_path, name, 1), strict=True):
            np.testing.assert_array_equal(a, b)
    assert "rebuilt" in results[0]["after_setup_optimizer_string"]["preparation"]
    assert "in place" in results[0]["in_scope_optimizer_string"]["preparation"]
