"""TensorFlow's oneDNN kernels: turned on by `import kerasfast` before TensorFlow loads, and reported
by the plan whoever decided (kerasfast/onednn.py)."""

import json
import os
import platform
import subprocess
import sys

import pytest

from kerasfast.hardware import Hardware
from kerasfast.plan import RunFacts, resolve_plan

X86_64_LINUX = sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")
needs_x86_64_linux = pytest.mark.skipif(
    not X86_64_LINUX, reason="needs Linux on x86-64, where TensorFlow reads TF_ENABLE_ONEDNN_OPTS")

# A fresh process: the imports in the given order, then what TensorFlow loaded with and what the plan says.
PROBE = """
import json, os, sys
for name in sys.argv[1].split(","):
    __import__(name)
from tensorflow.python.util import _pywrap_util_port
from kerasfast.onednn import onednn_state
from kerasfast.hardware import Hardware
from kerasfast.plan import RunFacts, resolve_plan
plan = resolve_plan(Hardware(), run=RunFacts(onednn=onednn_state()))
print(json.dumps({"loaded_on": bool(_pywrap_util_port.IsMklEnabled()), "env": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                  "plan": plan.onednn, "reason": plan.reasons["onednn"]}))
"""


def _probe(order, env_value=None):
    env = {key: value for key, value in os.environ.items() if key != "TF_ENABLE_ONEDNN_OPTS"}
    if env_value is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = env_value
    done = subprocess.run([sys.executable, "-c", PROBE, order], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_x86_64_linux
def test_import_kerasfast_first_loads_tensorflow_with_onednn_and_the_plan_says_who_chose():
    state = _probe("kerasfast,tensorflow")
    assert state["env"] == "1" and state["loaded_on"] is True and state["plan"] is True
    assert "set by `import kerasfast`" in state["reason"]


@needs_x86_64_linux
def test_a_users_choice_is_kept_and_named():
    state = _probe("kerasfast,tensorflow", env_value="0")
    assert state["env"] == "0" and state["loaded_on"] is False and state["plan"] is False
    assert state["reason"] == "your TF_ENABLE_ONEDNN_OPTS=0"


@needs_x86_64_linux
def test_tensorflow_imported_first_keeps_its_default_and_the_plan_says_how_to_change_it():
    state = _probe("tensorflow,kerasfast")
    assert state["env"] is None  # kerasfast sets nothing once TensorFlow has loaded
    assert state["plan"] is state["loaded_on"]
    if state["loaded_on"]:  # a CPU with AVX512-VNNI/BF16 or AMX: TensorFlow turns oneDNN on itself
        assert state["reason"] == "TensorFlow's default on this CPU"
    else:
        assert "import kerasfast first" in state["reason"] and "TF_ENABLE_ONEDNN_OPTS=1" in state["reason"]


def test_the_plan_prints_the_kernels_in_force_with_the_reason_it_was_given():
    plan = resolve_plan(Hardware(cpu_cores=2), run=RunFacts(onednn=(False, "your TF_ENABLE_ONEDNN_OPTS=0")))
    assert plan.onednn is False and plan.to_dict()["fields"]["onednn"]["reason"] == "your TF_ENABLE_ONEDNN_OPTS=0"
    row = [line for line in str(plan).splitlines() if line.strip().startswith("onednn")]
    assert row and "False" in row[0] and "your TF_ENABLE_ONEDNN_OPTS=0" in row[0]
