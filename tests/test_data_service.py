"""fit(data_service=): real tf.data service servers (`kerasfast data-service`
processes on loopback) feeding real training, every record counted."""

import collections
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import kerasfast
from kerasfast.distribute.launch import free_ports
from kerasfast.errors import PlanError
from tests.workers.data_service_model import (
    NUM_RECORDS,
    PerEpochCounts,
    counting_model,
    write_records,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
FIT = dict(batch_size=16, loss="sparse_categorical_crossentropy", learning_rate=0.05, precision="float32",
           jit_compile=False, tune="off", run_dir=False, verbose=0)


def _start(args, pattern):
    """Starts `python -m kerasfast.cli data-service ARGS`; returns (process, the line matching `pattern`)."""
    process = subprocess.Popen([sys.executable, "-m", "kerasfast.cli", "data-service", *args], env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            # Keep reading what the server prints: a full pipe would block it, even in its exit.
            process.output = seen
            threading.Thread(target=lambda: seen.extend(process.stdout), daemon=True).start()
            return process, line
    process.kill()
    raise AssertionError(f"data-service {args} did not start: {''.join(seen)[-2000:]}")


def _stop(*processes):
    """SIGTERMs `processes` together (each may take its grace period); their exit codes."""
    for process in processes:
        process.send_signal(signal.SIGTERM)
    try:
        return [process.wait(timeout=90) for process in processes]
    except subprocess.TimeoutExpired as error:
        printed = "".join(line for process in processes for line in getattr(process, "output", []))
        raise AssertionError(f"{error.cmd} did not exit within 90 s of SIGTERM; the servers printed: "
                             f"{printed[-2000:]}") from error
    finally:
        for process in processes:
            process.kill()


@pytest.fixture(scope="module")
def service():
    """A dispatcher and 2 service workers, as `kerasfast data-service` processes on loopback."""
    dispatcher_port, *worker_ports = free_ports(3)
    dispatcher, line = _start(["dispatcher", "--port", str(dispatcher_port)], r"serving grpc://")
    assert f":{dispatcher_port}" in line
    workers = [_start(["worker", "--dispatcher", f"localhost:{dispatcher_port}", "--port", str(port)],
                      rf"serving localhost:{port}")[0] for port in worker_ports]
    yield f"grpc://localhost:{dispatcher_port}"
    # SIGTERM stops each server: cleanly (exit 0), or, for a worker still producing an element for a job
    # a test left behind, once its grace has passed (exit 1, saying where it waited).
    processes = (*workers, dispatcher)
    for process, status in zip(processes, _stop(*processes), strict=True):
        assert status == 0 or (status == 1 and "Timeout" in "".join(process.output)), "".join(process.output)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return write_records(tmp_path_factory.mktemp("records")).out_dir


def test_fit_through_the_service_sees_every_record_once_per_epoch_and_learns(service, records):
    counts = PerEpochCounts()
    result = kerasfast.fit(counting_model, str(records), epochs=3, callbacks=[counts], data_service=service, **FIT)
    # 120 records, batch 16: 8 steps per epoch, the last of 8 records, as when reading locally.
    assert result.plan.steps_per_epoch == 8
    for epoch in counts.per_epoch:
        assert collections.Counter(epoch) == {1: NUM_RECORDS}
    loss = result.history.history["loss"]
    assert loss[-1] < 0.7 * loss[0], loss
    assert "via tf.data service" in result.data and "DYNAMIC" in result.data


def test_a_tf_data_dataset_of_tensorflow_ops_is_served(service, records):
    dataset = kerasfast.data.tfrecord_dataset(str(records), batch_size=16, repeat=1).map(
        lambda x, y: ({**x, "x": x["x"] * 2.0}, y))
    counts = PerEpochCounts()
    kerasfast.fit(counting_model(), dataset, epochs=2, steps_per_epoch=8, callbacks=[counts],
                  data_service=service, **{**FIT, "batch_size": None})
    for epoch in counts.per_epoch:
        assert collections.Counter(epoch) == {1: NUM_RECORDS}


@pytest.mark.slow
def test_two_service_workers_feed_two_training_workers_every_record_once_per_epoch(service, records, tmp_path):
    command = [sys.executable, "-m", "kerasfast.cli", "launch", "-n", "2", "--host-network", "--", sys.executable,
               str(ROOT / "tests" / "workers" / "data_service.py"), str(records), service, str(tmp_path), "2"]
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    chief, other = (json.loads((tmp_path / f"worker{i}.json").read_text()) for i in range(2))
    assert chief["strategy"] == "multi_worker"
    assert chief["counts"] == other["counts"] and len(chief["counts"]) == 2
    # Each training worker reads its own 2 of the 4 files, split between the 2 service workers.
    for epoch in chief["counts"]:
        assert collections.Counter(epoch) == {1: NUM_RECORDS}
    assert chief["loss"] == other["loss"] and chief["loss"][-1] < chief["loss"][0]


# -- refusals: before any training step, naming the argument and the way out ------------------------------------


@pytest.mark.parametrize("address", ["", "localhost", "http://localhost:5050", "grpc://localhost:port", 5050])
def test_a_malformed_address_is_refused(address):
    with pytest.raises(PlanError, match=r"data_service=.*grpc://HOST:PORT"):
        kerasfast.fit(counting_model(), "unused", epochs=1, data_service=address, **FIT)


def test_an_address_where_nothing_listens_is_refused(records):
    (port,) = free_ports(1)
    with pytest.raises(PlanError, match=rf"nothing accepts connections.*data-service dispatcher --port {port}"
                                        r".*--host-network"):
        kerasfast.fit(counting_model(), str(records), epochs=1, data_service=f"grpc://127.0.0.1:{port}", **FIT)


def test_in_memory_arrays_are_refused():
    x = {"id": np.arange(32), "x": np.zeros((32, 8), "float32")}
    with pytest.raises(PlanError, match=r"cannot serve in-memory arrays.*write_tfrecords"):
        kerasfast.fit(counting_model(), x, np.zeros(32, "int64"), epochs=1, data_service="grpc://localhost:1", **FIT)


def test_python_generators_and_python_ops_are_refused(records):
    def batches():
        while True:
            yield {"id": np.arange(16), "x": np.zeros((16, 8), "float32")}, np.zeros(16, "int64")

    with pytest.raises(PlanError, match=r"cannot serve a generator: its Python code runs in this process"):
        kerasfast.fit(counting_model(), batches(), epochs=1, steps_per_epoch=2, data_service="grpc://localhost:1",
                      **FIT)
    dataset = kerasfast.data.tfrecord_dataset(str(records), batch_size=16, repeat=1).map(
        lambda x, y: (x, tf.numpy_function(lambda a: a, [y], tf.int64)))
    with pytest.raises(PlanError, match=r"calls back into Python \(.*PyFunc"):
        kerasfast.fit(counting_model(), dataset, epochs=1, data_service="grpc://localhost:1", **FIT)


def test_skipping_damaged_records_is_refused(records):
    with pytest.raises(PlanError, match=r"on_error='skip'.*read in Python"):
        kerasfast.fit(counting_model(), str(records), epochs=1, on_error="skip", data_service="grpc://localhost:1",
                      **FIT)


def test_resuming_a_backup_is_refused_unless_forced(service, records, tmp_path):
    """A run stopped after its first epoch leaves a backup; with a data
    service, resume='auto' refuses it and resume='force' goes on from its step."""

    import keras

    class Crash(RuntimeError):
        pass

    class CrashAfterFirstEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise Crash

    run = dict(FIT, run_dir=tmp_path / "run", backup_every=4)
    with pytest.raises(Crash):
        kerasfast.fit(counting_model, str(records), epochs=2, callbacks=[CrashAfterFirstEpoch()], data_service=service, **run)
    assert (tmp_path / "run" / "backup" / "state.npz").is_file()
    with pytest.raises(PlanError, match=r"cannot resume exactly.*resume='force'.*resume='fresh'"):
        kerasfast.fit(counting_model, str(records), epochs=2, data_service=service, **run)
    counts = PerEpochCounts()
    result = kerasfast.fit(counting_model, str(records), epochs=2, resume="force", callbacks=[counts],
                           data_service=service, **run)
    assert result.history.epoch == [0, 1] and len(counts.per_epoch) == 1
    assert collections.Counter(counts.per_epoch[0]) == {1: NUM_RECORDS}


def test_the_servers_refuse_a_port_in_use():
    import socket

    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "kerasfast.cli", "data-service", "dispatcher", "--port",
                               str(port)], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode != 0
    assert f"could not start the tf.data service dispatcher on port {port}" in done.stderr, done.stderr[-2000:]
    assert "pass another --port" in done.stderr


SLOW_SECOND_ELEMENT = """
import sys
import tensorflow as tf
from tensorflow.python.data.experimental.ops import testing

# The worker produces element 0 at once and then spends 300 s on element 1.
dataset = tf.data.Dataset.from_tensors(0).concatenate(
    tf.data.Dataset.from_tensors(1).apply(testing.sleep(300_000_000)))
for element in dataset.apply(tf.data.experimental.service.distribute("parallel_epochs", sys.argv[1])):
    print("received", int(element), flush=True)
"""


@pytest.mark.slow
def test_a_worker_producing_an_element_stops_within_its_grace():
    # TensorFlow's stop waits for the element in production while holding the GIL: the worker once
    # outlived the suite's 90 s wait for it. Its stop now ends STOP_GRACE_S after the signal.
    from kerasfast.data.service import STOP_GRACE_S

    dispatcher_port, worker_port = free_ports(2)
    dispatcher, _ = _start(["dispatcher", "--port", str(dispatcher_port)], r"serving grpc://")
    worker, _ = _start(["worker", "--dispatcher", f"localhost:{dispatcher_port}", "--port", str(worker_port)],
                       r"serving localhost:")
    client = subprocess.Popen([sys.executable, "-c", SLOW_SECOND_ELEMENT, f"grpc://localhost:{dispatcher_port}"],
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert client.stdout.readline() == "received 0\n"
        signalled = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        status = worker.wait(timeout=STOP_GRACE_S + 60)
        waited = time.monotonic() - signalled
        time.sleep(0.5)  # the reader thread takes in the last lines
        printed = "".join(worker.output)
        assert status == 1, printed[-2000:]
        assert STOP_GRACE_S <= waited < STOP_GRACE_S + 60
        assert f"TensorFlow's server gets {STOP_GRACE_S:g} s" in printed
        assert "Timeout" in printed and "stop_server" in printed, printed[-2000:]
    finally:
        client.kill()
        worker.kill()
        assert _stop(dispatcher) == [0]
