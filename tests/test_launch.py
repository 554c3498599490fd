"""`kerasfast launch` with real processes: held ports, what the workers bind, and stop signals.

The workers are small Python scripts (TensorFlow only where its server is
the point) started by the launcher as a user starts it, in a subprocess,
except where an in-process `launch()` is enough.
"""

import errno
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from kerasfast.cli import main as cli
from kerasfast.distribute.launch import launch, reserve_ports
from kerasfast.errors import PlanError

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
LAUNCH = [sys.executable, "-m", "kerasfast.cli", "launch", "-n", "2", "--", sys.executable]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# Binds a socket as TensorFlow's gRPC server does under TF_GRPC_REUSE_PORT=1:
# SO_REUSEPORT, every interface (dual-stack [::], else 0.0.0.0).
BIND_LIKE_TENSORFLOW = '''
def bind_like_tensorflow(port):
    import socket
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address = "::"
    except OSError:
        sock, address = socket.socket(socket.AF_INET, socket.SOCK_STREAM), "0.0.0.0"
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((address, port))
    sock.listen()
    return sock
'''

# Checks, at its start, that its port is held for it: a plain bind fails,
# a bind as TensorFlow's server does succeeds.
HELD_PORT_WORKER = BIND_LIKE_TENSORFLOW + '''
import errno, json, os, pathlib, socket, sys
config = json.loads(os.environ["TF_CONFIG"])
index = config["task"]["index"]
port = int(config["cluster"]["worker"][index].rsplit(":", 1)[1])
result = {"TF_GRPC_REUSE_PORT": os.environ.get("TF_GRPC_REUSE_PORT")}
for host in ("127.0.0.1", "0.0.0.0"):
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        plain.bind((host, port))
        result[host] = "bound"
    except OSError as error:
        result[host] = errno.errorcode[error.errno]
    plain.close()
listener = bind_like_tensorflow(port)
result["like_tensorflow"] = "listening"
pathlib.Path(sys.argv[1], f"worker{index}.json").write_text(json.dumps(result))
'''

# A real MultiWorkerMirroredStrategy: one all-reduce, then it waits for the
# test (which reads what it listens on) to create `done`.
TF_WORKER = '''
import json, os, pathlib, sys, time
out = pathlib.Path(sys.argv[1])
config = json.loads(os.environ["TF_CONFIG"])
index = config["task"]["index"]
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
report = {"pid": os.getpid(), "address": config["cluster"]["worker"][index], "sum": float(total)}
(out / f"worker{index}.tmp").write_text(json.dumps(report))
(out / f"worker{index}.tmp").rename(out / f"worker{index}.json")
deadline = time.monotonic() + 120
while not (out / "done").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
'''

# Worker 0 prints in a loop and stops when the launcher forwards a signal
# (recording which); worker 1 is silent and ignores the signals, so only
# the launcher's SIGKILL stops it.
SIGNAL_WORKER = '''
import json, os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]

def record(signum, frame):
    (out / "worker0.signal").write_text(str(signum))
    sys.exit(0)

for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, record if index == 0 else signal.SIG_IGN)
(out / f"worker{index}.pid").write_text(str(os.getpid()))
tick = 0
while True:
    if index == 0:
        print("tick", tick, flush=True)
        tick += 1
        time.sleep(0.01)
    else:
        time.sleep(1)
'''


def write_script(tmp_path, text, name="worker.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def wait_for(condition, timeout, what, launcher=None, log=None):
    deadline = time.monotonic() + timeout
    while not condition():
        if launcher is not None and launcher.poll() is not None:
            pytest.fail(f"the launcher exited ({launcher.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}" + (f":\n{log.read_text()[-3000:]}" if log else ""))
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is dead, just not yet reaped)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    # /proc/net/tcp* prints each 32-bit word of the address in host (little-endian) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET6 if len(raw) == 16 else socket.AF_INET, raw)


def listening(pid: int) -> set[tuple[str, int]]:
    """The (address, port) pairs process `pid` listens on, from /proc."""
    fd_dir = pathlib.Path(f"/proc/{pid}/fd")
    sockets = set()
    for fd in fd_dir.iterdir():
        try:
            sockets.add(os.readlink(fd))
        except OSError:
            pass
    found = set()
    for table in ("tcp", "tcp6"):
        path = pathlib.Path(f"/proc/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and f"socket:[{inode}]" in sockets:  # 0A: LISTEN
                address, port = local.rsplit(":", 1)
                found.add((_address(address), int(port, 16)))
    return found


def test_reserved_ports_are_refused_to_other_programs_until_released():
    namespace = {}
    exec(BIND_LIKE_TENSORFLOW, namespace)
    with reserve_ports(2) as reservation:
        assert len(set(reservation.ports)) == 2 and reservation.shared
        assert reservation.worker_env() == {"TF_GRPC_REUSE_PORT": "1"}
        for port in reservation.ports:
            for host in ("127.0.0.1", "0.0.0.0"):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other, pytest.raises(OSError) as refused:
                    other.bind((host, port))
                assert refused.value.errno == errno.EADDRINUSE
            # ...but TensorFlow's server (TF_GRPC_REUSE_PORT=1) binds it, and gets the connections
            with namespace["bind_like_tensorflow"](port) as server:
                client = socket.create_connection(("127.0.0.1", port), timeout=5)
                connection, _ = server.accept()
                client.close()  # first, so that the TIME_WAIT is on the client's port, not this one
                assert connection.recv(1) == b""
                connection.close()
        ports = reservation.ports
    for port in ports:  # released: anyone may bind it again
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
            other.bind(("127.0.0.1", port))


def test_a_requested_port_in_use_is_refused_before_any_worker_starts(tmp_path):
    marker = tmp_path / "started"
    script = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('started')"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PlanError, match=f"port {port} is in use"):
            launch([sys.executable, "-c", script], 2, port=port)
        shown = CliRunner().invoke(cli, ["launch", "-n", "2", "--port", str(port), "--", sys.executable, "-c", script])
    assert shown.exit_code == 1 and f"port {port} is in use" in shown.output
    # also when the port's listener shares with SO_REUSEPORT, as a worker of an earlier job still running does
    namespace = {}
    exec(BIND_LIKE_TENSORFLOW, namespace)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with namespace["bind_like_tensorflow"](port):
        with pytest.raises(PlanError, match=f"port {port} is in use"):
            launch([sys.executable, "-c", script], 1, port=port)
    assert not marker.exists()
    with pytest.raises(PlanError, match="ports end at 65535"):
        launch([sys.executable, "-c", script], 2, port=65535)


def test_workers_start_with_their_ports_held_for_them(tmp_path):
    script = write_script(tmp_path, HELD_PORT_WORKER)
    assert launch([sys.executable, script, str(tmp_path)], 2, out=open(os.devnull, "w")) == 0
    for index in range(2):
        result = json.loads((tmp_path / f"worker{index}.json").read_text())
        assert result == {"TF_GRPC_REUSE_PORT": "1", "127.0.0.1": "EADDRINUSE", "0.0.0.0": "EADDRINUSE",
                          "like_tensorflow": "listening"}, index


@linux_only
def test_tensorflow_workers_bind_their_held_ports_and_listen_on_every_interface(tmp_path):
    """TensorFlow 2.21 cannot be told to listen on TF_CONFIG's loopback host.

    `GrpcServer::Init` listens on "0.0.0.0:" + port (a dual-stack [::] in
    gRPC); `ServerDef` has no bind address (docs/distributed.md). When this
    fails because the workers listen on 127.0.0.1 only, TensorFlow has
    changed: assert loopback here and drop the caveat from the docs.
    """
    script = write_script(tmp_path, TF_WORKER)
    log = tmp_path / "launch.log"
    with open(log, "w") as output:
        launcher = subprocess.Popen([*LAUNCH, script, str(tmp_path)], stdout=output, stderr=subprocess.STDOUT,
                                    env=ENV)
    try:
        reports = [tmp_path / f"worker{i}.json" for i in range(2)]
        wait_for(lambda: all(r.exists() for r in reports), 300, "the workers' all-reduce", launcher, log)
        workers = [json.loads(r.read_text()) for r in reports]
        # the all-reduce worked while the launcher held the ports
        assert [w["sum"] for w in workers] == [2.0, 2.0]
        for worker in workers:
            host, port = worker["address"].rsplit(":", 1)
            assert host == "127.0.0.1"
            addresses = {address for address, bound in listening(worker["pid"]) if bound == int(port)}
            assert addresses, f"worker {worker} does not listen on its port {port}"
            assert addresses <= {"::", "0.0.0.0"}, (
                f"TensorFlow now listens on {addresses}: assert loopback here and update docs/distributed.md")
        (tmp_path / "done").touch()
        assert launcher.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
            launcher.wait(timeout=30)


@linux_only
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_signal_stops_every_worker_within_5_seconds(tmp_path, signum):
    script = write_script(tmp_path, SIGNAL_WORKER)
    log = tmp_path / "launch.log"
    with open(log, "w") as output:
        launcher = subprocess.Popen([*LAUNCH, script, str(tmp_path)], stdout=output, stderr=subprocess.STDOUT,
                                    env=ENV)
    pid_files = [tmp_path / f"worker{i}.pid" for i in range(2)]
    pids = []
    try:
        wait_for(lambda: all(p.exists() and p.read_text() for p in pid_files) and "tick" in log.read_text(), 300,
                 "both workers to start", launcher, log)
        pids = [int(p.read_text()) for p in pid_files]
        assert all(alive(pid) for pid in pids)
        sent = time.monotonic()
        launcher.send_signal(signum)
        while any(alive(pid) for pid in pids) and time.monotonic() - sent < 5.0:
            time.sleep(0.02)
        gone_after = time.monotonic() - sent
        assert not any(alive(pid) for pid in pids), f"workers still running 5 s after {signum.name}"
        assert launcher.wait(timeout=10) == 128 + signum
        # the printing worker got the launcher's signal itself; the silent one, which ignores it, was killed
        assert (tmp_path / "worker0.signal").read_text() == str(int(signum))
        text = log.read_text()
        assert "[worker 0] tick" in text and f"received {signum.name}; stopping the workers" in text
        assert gone_after < 5.0
    finally:
        for pid in pids:
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
