"""`kerasfast launch` with real processes: the private network namespace (and
its fallback), held ports, what the workers bind, and stop signals.

The workers are small Python scripts (TensorFlow only where its server is
the point) started by the launcher as a user starts it, in a subprocess,
except where an in-process `launch()` is enough.
"""

import errno
import io
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from kerasfast.cli import main as cli
from kerasfast.distribute.launch import NamespaceUnavailable, PrivateNetwork, launch, reserve_ports
from kerasfast.errors import PlanError

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
LAUNCH = [sys.executable, "-m", "kerasfast.cli", "launch", "-n", "2", "--", sys.executable]
HOST_LAUNCH = [sys.executable, "-m", "kerasfast.cli", "launch", "-n", "2", "--host-network", "--", sys.executable]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
PRIVATE_LINE = "[kerasfast launch] workers in a private network namespace: they listen on its loopback only"
HOST_LINE = "[kerasfast launch] workers on the host network (--host-network): they listen on all interfaces"
FALLBACK_LINE = "[kerasfast launch] workers listen on all interfaces: could not create a private network namespace"


def _namespace_missing() -> str | None:
    """Why this machine cannot give the workers a private network namespace (None: it can)."""
    try:
        PrivateNetwork.create().close()
    except NamespaceUnavailable as error:
        return f"needs unprivileged user namespaces (or root): {error}"
    return None


NAMESPACE_MISSING = _namespace_missing()
needs_namespaces = pytest.mark.skipif(NAMESPACE_MISSING is not None, reason=NAMESPACE_MISSING or "")
# The launcher as the user runs it, in each network mode.
NETWORKS = [pytest.param(LAUNCH, id="private", marks=needs_namespaces),
            pytest.param(HOST_LAUNCH, id="host-network")]

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
import socket
report = {"pid": os.getpid(), "address": config["cluster"]["worker"][index], "sum": float(total),
          "uid": os.getuid(), "interfaces": [name for _, name in socket.if_nameindex()]}
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


def _tables(net_dir: pathlib.Path):
    """(address, port, state, inode) of every TCP socket in a network namespace's /proc tables."""
    for table in ("tcp", "tcp6"):
        path = net_dir / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, port = fields[1].rsplit(":", 1)
            yield _address(address), int(port, 16), fields[3], fields[9]


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in pathlib.Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    return inodes


def listening(pid: int) -> set[tuple[str, int]]:
    """The (address, port) pairs process `pid` listens on, as its own network namespace shows them."""
    inodes = socket_inodes(pid)
    # 0A: LISTEN
    return {(address, port) for address, port, state, inode in _tables(pathlib.Path(f"/proc/{pid}/net"))
            if state == "0A" and inode in inodes}


def host_listeners() -> set[tuple[int, str]]:
    """(port, inode) of every listening TCP socket in this (the test's, the host's) network namespace."""
    return {(port, inode) for _, port, state, inode in _tables(pathlib.Path("/proc/self/net")) if state == "0A"}


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


def test_a_requested_port_in_use_is_refused_before_any_worker_starts_on_the_host_network(tmp_path):
    marker = tmp_path / "started"
    script = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('started')"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PlanError, match=f"port {port} is in use"):
            launch([sys.executable, "-c", script], 2, port=port, host_network=True)
        shown = CliRunner().invoke(cli, ["launch", "-n", "2", "--port", str(port), "--host-network", "--",
                                         sys.executable, "-c", script])
    assert shown.exit_code == 1 and f"port {port} is in use" in shown.output
    # also when the port's listener shares with SO_REUSEPORT, as a worker of an earlier job still running does
    namespace = {}
    exec(BIND_LIKE_TENSORFLOW, namespace)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with namespace["bind_like_tensorflow"](port):
        with pytest.raises(PlanError, match=f"port {port} is in use"):
            launch([sys.executable, "-c", script], 1, port=port, host_network=True)
    assert not marker.exists()
    for host_network in (True, False):
        with pytest.raises(PlanError, match="ports end at 65535"):
            launch([sys.executable, "-c", script], 2, port=65535, host_network=host_network)


@needs_namespaces
def test_a_port_in_use_on_the_host_is_free_in_the_private_namespace(tmp_path):
    # Each worker binds its port plainly (no SO_REUSEPORT) on every interface and listens: on the host
    # the test's own listeners have them, but the workers' namespace has ports of its own.
    script = ("import json, os, socket\n"
              "config = json.loads(os.environ['TF_CONFIG'])\n"
              "port = int(config['cluster']['worker'][config['task']['index']].rsplit(':', 1)[1])\n"
              "sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
              "sock.bind(('0.0.0.0', port)); sock.listen()\n"
              "print('listening on', port, 'with', os.environ.get('TF_GRPC_REUSE_PORT'))\n")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken, \
            socket.socket(socket.AF_INET, socket.SOCK_STREAM) as next_one:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            next_one.bind(("0.0.0.0", port + 1))
        except OSError:
            pytest.skip(f"port {port + 1} is in use on this machine")
        next_one.listen()
        out = io.StringIO()
        assert launch([sys.executable, "-c", script], 2, port=port, out=out) == 0, out.getvalue()
    text = out.getvalue()
    assert text.startswith(PRIVATE_LINE), text
    # in the namespace no port is held for the workers (nothing else can take one there)
    for index in range(2):
        assert f"[worker {index}] listening on {port + index} with None" in text


def test_workers_start_with_their_ports_held_for_them_on_the_host_network(tmp_path):
    script = write_script(tmp_path, HELD_PORT_WORKER)
    assert launch([sys.executable, script, str(tmp_path)], 2, out=open(os.devnull, "w"), host_network=True) == 0
    for index in range(2):
        result = json.loads((tmp_path / f"worker{index}.json").read_text())
        assert result == {"TF_GRPC_REUSE_PORT": "1", "127.0.0.1": "EADDRINUSE", "0.0.0.0": "EADDRINUSE",
                          "like_tensorflow": "listening"}, index


def _run_tensorflow_job(tmp_path, launcher_command, check_while_running):
    """Runs TF_WORKER as a 2-worker job; `check_while_running(workers)` once both all-reduced."""
    script = write_script(tmp_path, TF_WORKER)
    log = tmp_path / "launch.log"
    with open(log, "w") as output:
        launcher = subprocess.Popen([*launcher_command, script, str(tmp_path)], stdout=output,
                                    stderr=subprocess.STDOUT, env=ENV)
    try:
        reports = [tmp_path / f"worker{i}.json" for i in range(2)]
        wait_for(lambda: all(r.exists() for r in reports), 300, "the workers' all-reduce", launcher, log)
        workers = [json.loads(r.read_text()) for r in reports]
        assert [w["sum"] for w in workers] == [2.0, 2.0]  # the all-reduce worked
        for worker in workers:
            host, port = worker["address"].rsplit(":", 1)
            assert host == "127.0.0.1"
            worker["port"] = int(port)
            worker["listening"] = {address for address, bound in listening(worker["pid"]) if bound == int(port)}
            assert worker["listening"], f"worker {worker} does not listen on its port {port}"
        check_while_running(workers)
        (tmp_path / "done").touch()
        assert launcher.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
            launcher.wait(timeout=30)
    return log.read_text()


@linux_only
@needs_namespaces
def test_tensorflow_workers_in_the_private_namespace_cannot_be_reached_from_the_host(tmp_path):
    """The default: TensorFlow still listens on every interface, but of the workers' own namespace.

    The workers' sockets appear in their namespace's /proc/PID/net tables, and
    neither their sockets nor their ports in the host's.
    """
    before = {port for port, _ in host_listeners()}

    def check(workers):
        on_host = host_listeners()
        for worker in workers:
            # TensorFlow 2.21 binds the wildcard (see the host-network test), of the namespace's interfaces
            assert worker["listening"] <= {"::", "0.0.0.0"}, worker["listening"]
            assert worker["interfaces"] == ["lo"], worker["interfaces"]
            assert worker["uid"] == os.getuid()
            assert not socket_inodes(worker["pid"]) & {inode for _, inode in on_host}, (
                f"worker {worker} has a socket listening on the host")
            if worker["port"] not in before:
                assert worker["port"] not in {port for port, _ in on_host}, (
                    f"port {worker['port']} of worker {worker} is listening on the host")

    text = _run_tensorflow_job(tmp_path, LAUNCH, check)
    assert text.count(PRIVATE_LINE) == 1 and FALLBACK_LINE not in text, text[:1000]
    for index in range(2):  # written by the workers: the invoking user's on the host
        written = (tmp_path / f"worker{index}.json").stat()
        assert (written.st_uid, written.st_gid) == (os.getuid(), os.getgid())


@linux_only
def test_tensorflow_workers_on_the_host_network_listen_on_every_interface(tmp_path):
    """TensorFlow 2.21 cannot be told to listen on TF_CONFIG's loopback host.

    `GrpcServer::Init` listens on "0.0.0.0:" + port (a dual-stack [::] in
    gRPC); `ServerDef` has no bind address (docs/distributed.md). When this
    fails because the workers listen on 127.0.0.1 only, TensorFlow has
    changed: assert loopback here and update the docs (the private
    namespace is then a second fence, no longer the only one).
    """

    def check(workers):
        on_host = host_listeners()
        for worker in workers:
            assert worker["listening"] <= {"::", "0.0.0.0"}, (
                f"TensorFlow now listens on {worker['listening']}: assert loopback here and update "
                "docs/distributed.md")
            # on the host network, the host's tables are the worker's
            assert socket_inodes(worker["pid"]) & {inode for port, inode in on_host if port == worker["port"]}

    text = _run_tensorflow_job(tmp_path, HOST_LAUNCH, check)
    assert text.count(HOST_LINE) == 1 and PRIVATE_LINE not in text, text[:1000]


def _default_stop_signals():
    """Gives the launcher default stop-signal handling even when pytest runs
    under `nohup` or as a background job (SIGHUP / SIGINT ignored), which
    the launcher would otherwise rightly keep ignoring."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


@linux_only
@pytest.mark.parametrize("launcher_command", NETWORKS)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_signal_stops_every_worker_within_5_seconds(tmp_path, signum, launcher_command):
    script = write_script(tmp_path, SIGNAL_WORKER)
    log = tmp_path / "launch.log"
    with open(log, "w") as output:
        launcher = subprocess.Popen([*launcher_command, script, str(tmp_path)], stdout=output,
                                    stderr=subprocess.STDOUT, env=ENV, preexec_fn=_default_stop_signals)
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
        assert (PRIVATE_LINE if launcher_command is LAUNCH else HOST_LINE) in text
        assert gone_after < 5.0
    finally:
        for pid in pids:
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


# Reports what a worker sees of the network and writes a file as the host sees it.
NETWORK_WORKER = """
import json, os, pathlib, socket, sys
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
report = {"interfaces": sorted(name for _, name in socket.if_nameindex()), "uid": os.getuid(), "gid": os.getgid(),
          "reuse_port": os.environ.get("TF_GRPC_REUSE_PORT")}
pathlib.Path(sys.argv[1], "worker%d.json" % index).write_text(json.dumps(report))
print("worker", index, "done")
"""


def _host_interfaces():
    return sorted(name for _, name in socket.if_nameindex())


@linux_only
def test_without_a_namespace_the_job_runs_on_the_host_network_saying_why(tmp_path):
    """KERASFAST_LAUNCH_NO_NAMESPACE=1 (the escape hatch) takes the path of a machine that refuses namespaces."""
    script = write_script(tmp_path, NETWORK_WORKER)
    done = subprocess.run([*LAUNCH, script, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env={**ENV, "KERASFAST_LAUNCH_NO_NAMESPACE": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = f"{FALLBACK_LINE} (KERASFAST_LAUNCH_NO_NAMESPACE=1 is set)\n"
    assert done.stdout.count(line) == 1 and PRIVATE_LINE not in done.stdout, done.stdout
    assert "[worker 0] worker 0 done" in done.stdout and "[worker 1] worker 1 done" in done.stdout
    for index in range(2):  # the host network, with the ports held for the workers
        report = json.loads((tmp_path / f"worker{index}.json").read_text())
        assert report["interfaces"] == _host_interfaces() and report["reuse_port"] == "1"


@linux_only
@needs_namespaces
def test_where_the_kernel_refuses_namespaces_the_job_runs_on_the_host_network_saying_why(tmp_path):
    """A real refusal: in a user namespace whose limits allow no further network or user namespace."""
    if not shutil.which("unshare"):
        pytest.skip("needs util-linux unshare")
    script = write_script(tmp_path, NETWORK_WORKER)
    limits = "echo 0 > /proc/sys/user/max_net_namespaces && echo 0 > /proc/sys/user/max_user_namespaces"
    done = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", f'{limits} && exec "$@"', "sh",
                           *LAUNCH, script, str(tmp_path)], capture_output=True, text=True, timeout=300, env=ENV)
    if "max_net_namespaces" in done.stderr:
        pytest.skip(f"cannot lower namespace limits here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = f"{FALLBACK_LINE} (unshare: {os.strerror(errno.ENOSPC)})\n"
    assert done.stdout.count(line) == 1, done.stdout
    for index in range(2):
        report = json.loads((tmp_path / f"worker{index}.json").read_text())
        assert report["interfaces"] == _host_interfaces() and report["reuse_port"] == "1"


@linux_only
@needs_namespaces
def test_workers_in_the_namespace_see_only_loopback_and_write_files_as_the_invoking_user(tmp_path):
    script = write_script(tmp_path, NETWORK_WORKER)
    done = subprocess.run([*LAUNCH, script, str(tmp_path)], capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count(PRIVATE_LINE) == 1, done.stdout
    for index in range(2):
        written = tmp_path / f"worker{index}.json"
        report = json.loads(written.read_text())
        assert report["interfaces"] == ["lo"] and report["reuse_port"] is None
        assert (report["uid"], report["gid"]) == (os.getuid(), os.getgid())  # their own ids, inside too
        assert (written.stat().st_uid, written.stat().st_gid) == (os.getuid(), os.getgid())


# The launcher module alone (it needs only kerasfast.errors), for a Python
# without TensorFlow: the system's, run as an unprivileged user.
UNPRIVILEGED_LAUNCHER = """
import importlib.util, sys, types
root, out, script = sys.argv[1:4]
package = types.ModuleType("kerasfast")
package.__path__ = [root + "/kerasfast"]
sys.modules["kerasfast"] = package
spec = importlib.util.spec_from_file_location("launch_alone", root + "/kerasfast/distribute/launch.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.exit(module.launch([sys.executable, script, out], 2))
"""


@linux_only
@pytest.mark.skipif(os.getuid() != 0, reason="run as root: then the launcher runs as nobody (as this user, the "
                                             "test above already takes the user-namespace path)")
def test_an_unprivileged_user_gets_a_user_namespace_and_owns_the_workers_files():
    """As root the launcher needs no user namespace; an ordinary user's path is checked as nobody."""
    import tempfile

    python, setpriv = "/usr/bin/python3", shutil.which("setpriv")
    if not setpriv or not os.access(python, os.X_OK):
        pytest.skip("needs setpriv and /usr/bin/python3 to run the launcher as an unprivileged user")
    nobody = 65534
    folder = pathlib.Path(tempfile.mkdtemp(prefix="kerasfast-launch-"))
    try:
        folder.chmod(0o755)
        out = folder / "out"
        out.mkdir()
        os.chown(out, nobody, nobody)
        (folder / "launcher.py").write_text(UNPRIVILEGED_LAUNCHER)
        (folder / "worker.py").write_text(NETWORK_WORKER)
        done = subprocess.run([setpriv, f"--reuid={nobody}", f"--regid={nobody}", "--clear-groups", python,
                               str(folder / "launcher.py"), str(ROOT), str(out), str(folder / "worker.py")],
                              capture_output=True, text=True, timeout=300, cwd=folder,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        if FALLBACK_LINE in done.stdout:
            pytest.skip(f"needs unprivileged user namespaces: {done.stdout.strip()}")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert done.stdout.count(PRIVATE_LINE) == 1, done.stdout
        for index in range(2):
            written = out / f"worker{index}.json"
            report = json.loads(written.read_text())
            assert report["interfaces"] == ["lo"]
            assert (report["uid"], report["gid"]) == (nobody, nobody)  # not root inside the namespace
            assert (written.stat().st_uid, written.stat().st_gid) == (nobody, nobody)
    finally:
        shutil.rmtree(folder)


# Worker 1 fails (exit 5) in the attempts listed in argv[2]; worker 0 waits
# for a peer that never finishes unless it is stopped. Both log their attempt.
FLAKY_WORKER = """
import json, os, pathlib, sys, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
attempt = int(os.environ["KERASFAST_LAUNCH_ATTEMPT"])
with open(pathlib.Path(sys.argv[1], "attempts.log"), "a") as log:
    log.write("%d %d\\n" % (attempt, index))
if attempt > 1:  # the record kerasfast.fit writes when it resumes from a backup
    from kerasfast.distribute import worker_state
    worker_state.report(worker_state.RESUMED, epoch=2, step=4 * attempt)
if index == 1 and str(attempt) in sys.argv[2].split(","):
    sys.exit(5)
time.sleep(0.5 if index == 1 else 1.5)
"""


def test_a_failed_job_is_restarted_whole_until_an_attempt_succeeds(tmp_path):
    script = write_script(tmp_path, FLAKY_WORKER)
    done = subprocess.run([sys.executable, "-m", "kerasfast.cli", "launch", "-n", "2", "--restarts", "3",
                           "--restart-delay", "0.2", "--", sys.executable, script, str(tmp_path), "1,2"],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = done.stdout
    for attempt in (1, 2, 3):
        assert f"[kerasfast launch] attempt {attempt} of 4\n" in text
    assert "attempt 4 of 4" not in text
    assert "attempt 1 failed (worker 1 exited with code 5 after" in text and "3 restart(s) left" in text
    assert "attempt 2 failed (worker 1 exited with code 5 after" in text and "2 restart(s) left" in text
    assert "[kerasfast launch] attempt 3 resumed from epoch 2, step 12\n" in text
    # Every attempt started every worker afresh, and the job stopped at the first success.
    lines = sorted((tmp_path / "attempts.log").read_text().split("\n")[:-1])
    assert lines == ["1 0", "1 1", "2 0", "2 1", "3 0", "3 1"]


def test_a_job_that_keeps_failing_stops_after_its_restarts_with_every_failure_listed(tmp_path):
    script = write_script(tmp_path, FLAKY_WORKER)
    out = io.StringIO()
    code = launch([sys.executable, script, str(tmp_path), "1,2,3"], 2, restarts=2, restart_delay_s=0.1, out=out,
                  env=ENV)
    assert code == 5
    text = out.getvalue()
    assert "[kerasfast launch] giving up: 3 attempt(s) failed (attempt 1: worker 1 exited with code 5 after" in text
    assert "attempt 2: worker 1 exited with code 5 after" in text and ", resumed from epoch 2, step 8;" in text
    assert "attempt 3: worker 1 exited with code 5 after" in text and ", resumed from epoch 2, step 12)" in text


def test_restarts_are_checked():
    with pytest.raises(ValueError, match="restarts=-1 must be an int >= 0"):
        launch([sys.executable, "-c", "pass"], 1, restarts=-1)
    result = CliRunner().invoke(cli, ["launch", "-n", "2", "--restarts", "-2", "--", "true"])
    assert result.exit_code == 2 and "--restarts" in result.output


@linux_only
def test_a_stop_signal_is_never_restarted(tmp_path):
    script = write_script(tmp_path, SIGNAL_WORKER)
    log = tmp_path / "launch.log"
    with open(log, "w") as output:
        launcher = subprocess.Popen([*HOST_LAUNCH[:6], "--restarts", "3", *HOST_LAUNCH[6:], script, str(tmp_path)],
                                    stdout=output, stderr=subprocess.STDOUT, env=ENV)
    try:
        wait_for(lambda: "tick" in log.read_text(), 300, "the workers to start", launcher, log)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=15) == 128 + signal.SIGTERM
        text = log.read_text()
        assert "received SIGTERM; stopping the workers" in text
        assert "attempt 1 of 4" in text and "attempt 2 of 4" not in text and "restarting" not in text
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
