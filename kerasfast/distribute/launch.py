"""`kerasfast launch`: run a script as an N-worker job on this machine.

Starts N copies of a command, each with a `TF_CONFIG` that names all workers
on loopback ports and its own index, exactly as a cluster scheduler
(Kubeflow TFJob, Vertex AI, SageMaker, Slurm) would. Each output line is
prefixed with its worker's index. When one worker fails, the others are
stopped at once instead of hanging in a collective, and the launcher exits
with the failed worker's code.

Network. By default the workers run in one private network namespace of
their own (Linux), where only its loopback exists: whatever they listen on
cannot be reached from outside it, and they cannot reach other machines.
This matters because TensorFlow 2.21's gRPC server (`GrpcServer::Init`)
listens on `"0.0.0.0:" + port` whatever host `TF_CONFIG` names (gRPC makes
that a dual-stack `[::]`): `ServerDef` has a `port` field but no address,
and the only environment variable `Init` reads is `TF_GRPC_REUSE_PORT`, so
on the host network the workers' unauthenticated servers listen on every
interface. The namespace is made by a short-lived holder process (`python
-I -S`): `unshare(CLONE_NEWNET)` where the launcher may (root), else
`unshare(CLONE_NEWUSER | CLONE_NEWNET)` with the invoking uid and gid mapped
to themselves (so the workers keep their uid, and what they write belongs
to the invoking user on the host); it brings `lo` up with `SIOCSIFFLAGS`.
The launcher keeps the namespaces open by file descriptor, and each worker
starts through a trampoline (`python -I -S`) that `setns()`es into them and
then `exec`s the command, so the worker's pid, process group and exit code
are the command's. When a namespace cannot be made (not Linux, user
namespaces refused, e.g. in a container; or `KERASFAST_LAUNCH_NO_NAMESPACE=1`,
a test and escape hatch), the workers use the host network and the launcher
says why in one line; `host_network=True` (`--host-network`) asks for the
host network. The launcher prints which it uses at the start.
`tests/test_launch.py` checks both, and what the workers listen on, to tell
us when TensorFlow changes.

Ports. In the private namespace nothing else can take a port, so the
workers get `NAMESPACE_FIRST_PORT`, +1, ... (below the kernel's ephemeral
range, which the workers' own outgoing connections use), or `--port`'s.
On the host network the launcher binds the workers' ports itself before it
starts them and holds them until the job ends, so no other program can take
a port between its choice and the worker's bind. TensorFlow's server cannot
adopt an open socket, but with `TF_GRPC_REUSE_PORT=1` (set in every worker)
it binds with SO_REUSEPORT, which Linux and macOS let it share with the
launcher's held socket (same user, both with SO_REUSEPORT); a program
without SO_REUSEPORT gets "address in use". The held socket never listens,
so every connection goes to the worker.

Restarts. With `restarts=K` (`--restarts K`), a job whose worker fails
(killed, out of memory, lost peer, any non-zero exit) is stopped as a
whole, and after `restart_delay_s` started again, up to K times: every
worker of the new attempt starts afresh, and a script that trains with
`kerasfast.fit` resumes exactly from the backup in its run folder (which
every worker must see: a shared volume on a cluster). Each worker gets
`KERASFAST_LAUNCH_ATTEMPT` (1, 2, ...). The launcher prints which attempt
runs and, from the workers' own records (`kerasfast.distribute.worker_state`),
the step it resumed from; after the last failed attempt it prints every failure and exits with
the last one's code. A stop signal to the launcher is never restarted.

Signals. SIGINT, SIGTERM and SIGHUP to the launcher are forwarded to every
worker's process group; a worker still running `TERMINATE_GRACE_S` later
is killed (SIGKILL to its group), and the launcher exits with 128 + the
signal's number.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import typing

from kerasfast._quiet import filter_chatter, verbose_requested
from kerasfast.distribute import worker_state
from kerasfast.errors import PlanError

# A stopped worker gets this long after the first signal before SIGKILL, so
# that every worker is gone within 5 s of the launcher being told to stop.
TERMINATE_GRACE_S = 3.0
# Once the workers are gone, their output is drained for at most this long
# (longer only when something they started outside their group keeps the
# pipe open).
OUTPUT_DRAIN_S = 2.0
# The signals that stop the job (SIGHUP: the terminal was closed).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
# Where SO_REUSEPORT is missing (Windows), the held ports are released just
# before the workers start, and a port can be taken in between.
_SHARES_PORTS = hasattr(socket, "SO_REUSEPORT")
# In a private namespace the workers' ports start here: below the kernel's
# ephemeral range (32768-60999 in a new namespace), from which the workers'
# own outgoing connections take their ports.
NAMESPACE_FIRST_PORT = 20000
# Set (to anything but "" or "0") in the launcher's environment, it makes
# the namespace "unavailable": the workers use the host network, as where
# namespaces are refused (for tests, and as an escape hatch).
NO_NAMESPACE_ENV = "KERASFAST_LAUNCH_NO_NAMESPACE"
# Each worker's environment says which attempt of the job it belongs to.
ATTEMPT_ENV = "KERASFAST_LAUNCH_ATTEMPT"
# Pause between a failed attempt and the next: long enough for a crashed
# peer's sockets and a full disk's temporary files to clear, short against
# any training run.
RESTART_DELAY_S = 2.0

# The holder: makes the namespace, brings its loopback up, says "ready
# <kind>" (or "error <reason>") and waits until its stdin closes, by which
# time the launcher has opened its namespaces. Run as `python -I -S -c`, so
# that it is single-threaded (unshare(CLONE_NEWUSER) requires it) and
# starts in ~10 ms.
_HOLDER = r"""
import ctypes, fcntl, os, socket, struct, sys

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def fail(step, code):
    sys.stdout.write("error %s: %s\n" % (step, os.strerror(code)))
    sys.stdout.flush()
    sys.exit(1)


libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.geteuid(), os.getegid()
# A network namespace alone where allowed (root keeps all its privileges);
# else a user namespace too, which unprivileged users may create.
if libc.unshare(CLONE_NEWNET) == 0:
    kind = "net"
else:
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        fail("unshare", ctypes.get_errno())
    kind = "user"
    # The invoking uid and gid map to themselves: the workers keep them
    # (and no capabilities once they exec), and their files are the user's.
    for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)),
                       ("gid_map", "%d %d 1" % (gid, gid))):
        try:
            with open("/proc/self/" + name, "w") as f:
                f.write(text)
        except FileNotFoundError:
            if name != "setgroups":  # kernels before 3.19 have no setgroups file
                fail("writing /proc/self/" + name, 2)
        except OSError as error:
            fail("writing /proc/self/" + name, error.errno)
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
except OSError as error:
    fail("bringing up lo", error.errno)
sys.stdout.write("ready %s\n" % kind)
sys.stdout.flush()
sys.stdin.read()
"""

# The trampoline each worker starts with: joins the namespaces given as
# file descriptors (argv[1], "fd,fd"), closes them and execs the command
# (argv[2:]; none: just check that joining works). Also `python -I -S -c`:
# setns() into a user namespace requires a single-threaded caller.
_TRAMPOLINE = r"""
import errno, os, sys

fds = [int(fd) for fd in sys.argv[1].split(",")]
try:
    if hasattr(os, "setns"):  # Python 3.12+
        for fd in fds:
            os.setns(fd, 0)
    else:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        for fd in fds:
            if libc.setns(fd, 0) != 0:
                code = ctypes.get_errno()
                raise OSError(code, os.strerror(code))
except OSError as error:
    sys.stderr.write("kerasfast launch: setns: %s\n" % error.strerror)
    sys.exit(126)
for fd in fds:
    os.close(fd)
command = sys.argv[2:]
if command:
    try:
        os.execvp(command[0], command)
    except OSError as error:
        sys.stderr.write("kerasfast launch: cannot run %r: %s\n" % (command[0], error.strerror))
        sys.exit(127 if error.errno == errno.ENOENT else 126)
"""


class NamespaceUnavailable(Exception):
    """A private network namespace cannot be made here; `str()` says why."""


class PrivateNetwork:
    """A network namespace with only loopback, up, for a job's workers.

    Held open by file descriptors (a user namespace's, then the network
    namespace's) until `close()`; `command()` wraps a worker's command so
    that it runs inside, and `pass_fds` must be given to its `Popen`.

    Attributes:
        kind: "user" (a user and a network namespace: unprivileged users) or
            "net" (a network namespace only: where the launcher may, as root).
        pass_fds: The namespace file descriptors.
    """

    def __init__(self, fds: list[int], kind: str):
        self.pass_fds = tuple(fds)
        self.kind = kind

    @classmethod
    def create(cls) -> "PrivateNetwork":
        """Makes the namespace and checks that a process can join it.

        Raises:
            NamespaceUnavailable: Not Linux, namespaces refused (EPERM in
                many containers, EINVAL, ENOSPC), or `NO_NAMESPACE_ENV` set.
        """
        if os.environ.get(NO_NAMESPACE_ENV, "") not in ("", "0"):
            raise NamespaceUnavailable(f"{NO_NAMESPACE_ENV}={os.environ[NO_NAMESPACE_ENV]} is set")
        if not sys.platform.startswith("linux"):
            raise NamespaceUnavailable(f"network namespaces are Linux-only, this is {sys.platform}")
        if not sys.executable:
            raise NamespaceUnavailable("no Python executable to start the namespace with")
        try:
            holder = subprocess.Popen([sys.executable, "-I", "-S", "-c", _HOLDER], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as error:
            raise NamespaceUnavailable(f"cannot start {sys.executable}: {error.strerror}") from error
        fds = []
        try:
            answer = holder.stdout.readline().strip()
            if not answer.startswith("ready "):
                rest = answer + holder.stdout.read()
                reason = rest.strip().splitlines()[-1] if rest.strip() else f"exit code {holder.wait()}"
                raise NamespaceUnavailable(reason.removeprefix("error "))
            kind = answer.split()[1]
            names = ("user", "net") if kind == "user" else ("net",)
            for name in names:
                fds.append(os.open(f"/proc/{holder.pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        finally:
            holder.stdin.close()
            try:
                holder.wait(timeout=10)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait()
            holder.stdout.close()
        namespace = cls(fds, kind)
        try:
            probe = subprocess.run(namespace.command([]), pass_fds=namespace.pass_fds, capture_output=True,
                                   text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as error:
            namespace.close()
            raise NamespaceUnavailable(f"cannot join the namespace: {error}") from error
        if probe.returncode != 0:
            namespace.close()
            lines = probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"]
            raise NamespaceUnavailable(lines[-1].removeprefix("kerasfast launch: "))
        return namespace

    def command(self, command: list[str]) -> list[str]:
        """`command`, started so that it runs inside the namespace."""
        fds = ",".join(str(fd) for fd in self.pass_fds)
        return [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, fds, *command]

    def close(self) -> None:
        for fd in self.pass_fds:
            os.close(fd)
        self.pass_fds = ()


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports that are free on `host` right now.

    They are released on return, so another program may take one before it
    is used; `launch` holds its ports instead (`reserve_ports`).
    """
    sockets, ports = [], []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in sockets:
            sock.close()
    return ports


class PortReservation:
    """TCP ports held for a job's workers until `release()`.

    Attributes:
        ports: The held ports, one per worker.
        shared: Whether a worker's TensorFlow server can bind a port while
            it is held (SO_REUSEPORT); when False, release before starting
            the workers.
    """

    def __init__(self, sockets: list[socket.socket], shared: bool):
        self._sockets = sockets
        self.ports = [sock.getsockname()[1] for sock in sockets]
        self.shared = shared

    def worker_env(self) -> dict[str, str]:
        """What a worker's environment needs to bind its held port."""
        # TensorFlow's GrpcServer sets SO_REUSEPORT on its listener only when asked.
        return {"TF_GRPC_REUSE_PORT": "1"} if self.shared else {}

    def release(self) -> None:
        for sock in self._sockets:
            sock.close()
        self._sockets = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def _held_socket(port: int, shared: bool) -> socket.socket:
    """A socket bound to `port` on every interface, as TensorFlow's server binds it.

    Raises:
        OSError: EADDRINUSE when the port is taken on any interface.
    """
    last_error = None
    # gRPC listens on a dual-stack [::] socket, or on 0.0.0.0 where IPv6 is
    # off; holding the same wildcard makes a port taken on any interface
    # (which would fail the worker's bind) fail here instead.
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as error:  # no IPv6 in this kernel
            last_error = error
            continue
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            if shared and port:
                # SO_REUSEPORT would also share a chosen port with a listener
                # of this user already on it (say, a worker of an earlier job
                # still running), which would then get some of the new job's
                # connections: first make sure that nothing is bound to it.
                with socket.socket(family, socket.SOCK_STREAM) as probe:
                    if family == socket.AF_INET6:
                        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                    probe.bind((address, port))
            if shared:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((address, port))
            return sock
        except OSError as error:
            sock.close()
            if error.errno == errno.EADDRINUSE:
                raise
            last_error = error  # e.g. EADDRNOTAVAIL: IPv6 disabled; try IPv4
    raise last_error


def reserve_ports(count: int, first: int | None = None) -> PortReservation:
    """Binds `count` ports for workers and holds them (see the module docstring).

    Args:
        count: Number of ports.
        first: First port (then first+1, ...); free ports chosen by the
            kernel when None.

    Raises:
        PlanError: When one of the requested ports is in use.
    """
    if first and first + count - 1 > 65535:
        raise PlanError(f"--port {first} leaves no room for {count} workers: ports end at 65535.")
    sockets = []
    try:
        for offset in range(count):
            port = first + offset if first else 0
            try:
                sockets.append(_held_socket(port, _SHARES_PORTS))
            except OSError as error:
                if first and error.errno == errno.EADDRINUSE:
                    raise PlanError(f"port {port} is in use on this machine: choose another --port, or leave it "
                                    "out to use free ports.") from error
                raise
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return PortReservation(sockets, _SHARES_PORTS)


def tf_config(workers: list[str], index: int) -> str:
    """The `TF_CONFIG` value for worker `index` of `workers`."""
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


class _Output:
    """Where the launcher and its workers write; survives losing it.

    After SIGHUP the terminal may be gone (writes fail with EIO), and a
    closed pipe fails with EPIPE: the launcher then drops output instead of
    failing, and keeps reading the workers' pipes so that no worker blocks
    on a full pipe.
    """

    def __init__(self, out):
        self._out = out
        self._lock = threading.Lock()
        self._broken = False

    def write(self, text: str) -> None:
        with self._lock:
            if self._broken:
                return
            try:
                self._out.write(text)
                self._out.flush()
            except (OSError, ValueError):
                self._broken = True


def _pump(stream, prefix: str, out: _Output) -> None:
    # A worker that imported TensorFlow before kerasfast (or never imports
    # kerasfast) prints TensorFlow's start-up notices; they are dropped here,
    # as kerasfast drops them in its own process.
    quiet = not verbose_requested()
    for line in iter(stream.readline, ""):
        if not (quiet and not filter_chatter(line)):
            out.write(f"{prefix}{line}")
    stream.close()


class AttemptOutcome:
    """How one attempt of a job ended.

    A plain class, not a dataclass: tests load this module on its own, as
    an unprivileged user, outside `sys.modules`.

    Attributes:
        code: The launcher's exit code for it (0, a failed worker's code,
            128 + a worker's or the launcher's signal).
        failed_worker: Index of the first worker that failed, or None.
        worker_code: That worker's own return code (negative: killed by
            that signal).
        stop_signal: The signal that stopped the launcher, or None.
        resumed_from: "epoch E, step S" when the workers resumed from a
            backup in this attempt.
        seconds: How long the attempt ran.
    """

    def __init__(self, code: int = 0):
        self.code = code
        self.failed_worker: int | None = None
        self.worker_code: int | None = None
        self.stop_signal: int | None = None
        self.resumed_from: str | None = None
        self.seconds = 0.0

    def describe(self) -> str:
        if self.failed_worker is None:
            return f"exit code {self.code}"
        how = (f"killed by {signal.Signals(-self.worker_code).name}" if self.worker_code < 0
               else f"exited with code {self.worker_code}")
        return f"worker {self.failed_worker} {how} after {self.seconds:.1f} s"


class _StopSignals:
    """Records SIGINT/SIGTERM/SIGHUP while the workers run, instead of dying at once.

    The handler only records: the launcher's loop forwards the signal to
    the workers. Signals the launcher was started to ignore (under `nohup`,
    as a background job) stay ignored, and outside the main thread, where
    Python cannot install handlers, nothing changes.
    """

    def __init__(self):
        self.received: list[int] = []
        self._previous = {}

    def _record(self, signum, frame):
        self.received.append(signum)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) != signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._record)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            # None: a handler installed outside Python, which cannot be put back.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def launch(command: list[str], num_workers: int, *, port: int | None = None, host: str = "127.0.0.1",
           env: dict | None = None, out=None, host_network: bool = False, restarts: int = 0,
           restart_delay_s: float = RESTART_DELAY_S) -> int:
    """Runs `command` as `num_workers` local workers and waits for them.

    Args:
        command: The program and its arguments, e.g. `["python", "train.py"]`.
        num_workers: Number of worker processes.
        port: First port to use (then port+1, ...); when None, free ports
            on the host network, `NAMESPACE_FIRST_PORT`... in a namespace.
        host: The workers' address in `TF_CONFIG`; a loopback address
            unless `host_network`. On the host network TensorFlow 2.21
            listens on every interface whatever it says (module docstring).
        env: Base environment (default: this process's).
        out: Where prefixed output goes (default: stdout).
        host_network: Run the workers on the host network (they can reach
            other machines, and be reached) instead of in a private network
            namespace with only loopback. Also what happens, with a line
            saying why, where no namespace can be made.
        restarts: How many times a failed job is started again, whole
            (module docstring); 0: never.
        restart_delay_s: Seconds between a failed attempt and the next.

    Returns:
        0 when every worker of an attempt succeeded; else the exit code of
        the first worker that failed in the last attempt (a worker killed
        by a signal counts as 128+N); 128+N when the launcher was stopped
        by signal N.

    Raises:
        PlanError: When a requested port is in use (host network), or the
            ports would pass 65535.

    Example:

    Not run as a doctest: it starts worker processes that train.

    >>> launch([sys.executable, "train.py"], num_workers=2, restarts=3)  # doctest: +SKIP
    0
    """
    if num_workers < 1:
        raise ValueError(f"num_workers={num_workers} must be >= 1.")
    if restarts < 0 or isinstance(restarts, bool) or not isinstance(restarts, int):
        raise ValueError(f"restarts={restarts!r} must be an int >= 0 (how many times a failed job starts again).")
    if not command:
        raise ValueError("no command to launch: pass it after --, e.g. kerasfast launch -n 2 -- python train.py")
    if not host_network and not _is_loopback(host):
        raise ValueError(f"host={host!r}: a private network namespace has only loopback; pass a loopback "
                         "address, or host_network=True.")
    first = port or NAMESPACE_FIRST_PORT
    if port and first + num_workers - 1 > 65535:
        raise PlanError(f"--port {first} leaves no room for {num_workers} workers: ports end at 65535.")
    output = _Output(out or sys.stdout)
    namespace, why_not = None, None
    if not host_network:
        try:
            namespace = PrivateNetwork.create()
        except NamespaceUnavailable as error:
            why_not = str(error)
    with contextlib.ExitStack() as stack:
        if namespace is not None:
            stack.callback(namespace.close)
            reservation = None
            ports = list(range(first, first + num_workers))
            if ports[-1] > 65535:
                raise PlanError(f"{num_workers} workers do not fit in the ports from {first} to 65535.")
            output.write("[kerasfast launch] workers in a private network namespace: they listen on its loopback "
                         "only, unreachable from outside, and cannot reach other machines (--host-network to "
                         "give them the host's network)\n")
        else:
            reservation = stack.enter_context(reserve_ports(num_workers, port))
            ports = reservation.ports
            if host_network:
                output.write("[kerasfast launch] workers on the host network (--host-network): they listen on all "
                             "interfaces, without authentication\n")
            else:
                output.write("[kerasfast launch] workers listen on all interfaces: could not create a private "
                             f"network namespace ({why_not})\n")
        workers = [f"{host}:{p}" for p in ports]
        base_env = {**(os.environ if env is None else env), **(reservation.worker_env() if reservation else {}),
                    "PYTHONUNBUFFERED": "1"}
        with _StopSignals() as signals:
            job = _Job(command, workers, base_env, output, namespace, signals)
            return _run_attempts(job, reservation, restarts, restart_delay_s)


class _Job(typing.NamedTuple):
    """What every attempt of a job starts and watches."""

    command: list
    workers: list
    base_env: dict
    output: object
    namespace: object
    signals: object


def _run_attempts(job: _Job, reservation, restarts, restart_delay_s) -> int:
    """Runs attempts of the job until one succeeds, is stopped, or `restarts` are spent."""
    command, workers, base_env, output, namespace, signals = job
    failures: list[AttemptOutcome] = []
    attempts = restarts + 1
    if reservation is not None and not reservation.shared:
        reservation.release()
    for attempt in range(1, attempts + 1):
        if restarts:
            output.write(f"[kerasfast launch] attempt {attempt} of {attempts}\n")
        outcome = _run(command, workers, {**base_env, ATTEMPT_ENV: str(attempt)}, output, namespace, signals)
        if outcome.resumed_from and restarts:
            output.write(f"[kerasfast launch] attempt {attempt} resumed from {outcome.resumed_from}\n")
        if outcome.code == 0 or outcome.stop_signal is not None:
            return outcome.code
        failures.append(outcome)
        if attempt == attempts:
            break
        output.write(f"[kerasfast launch] attempt {attempt} failed ({outcome.describe()}); restarting the job in "
                     f"{restart_delay_s:g} s ({attempts - attempt} restart(s) left)\n")
        deadline = time.monotonic() + restart_delay_s
        while time.monotonic() < deadline:
            if signals.received:
                stop_with = signals.received[0]
                output.write(f"[kerasfast launch] received {signal.Signals(stop_with).name}; not restarting\n")
                return 128 + stop_with
            time.sleep(0.05)
    if restarts:
        history = "; ".join(f"attempt {i}: {f.describe()}"
                            + (f", resumed from {f.resumed_from}" if f.resumed_from else "")
                            for i, f in enumerate(failures, 1))
        output.write(f"[kerasfast launch] giving up: {len(failures)} attempt(s) failed ({history})\n")
    return failures[-1].code


def _run(command, workers, base_env, output, namespace, signals) -> AttemptOutcome:
    """Starts the workers (in `namespace` when given) and waits for them, as `launch` says."""
    processes = []
    pumps = []
    outcome = AttemptOutcome(code=0)
    started = time.monotonic()
    stop_with, signals_seen = signal.SIGTERM, len(signals.received)

    state_dir = _state_dir()
    try:
        for index in range(len(workers)):
            if signals.received:
                break
            worker_env = {**base_env, "TF_CONFIG": tf_config(workers, index),
                          worker_state.STATE_ENV: _state_file(state_dir, index)}
            # Its own session, so that the worker and whatever it starts
            # form one process group that can be signalled as a whole.
            process = subprocess.Popen(namespace.command(command) if namespace else command, env=worker_env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       errors="replace", start_new_session=True,
                                       pass_fds=namespace.pass_fds if namespace else ())
            processes.append(process)
            pump = threading.Thread(target=_pump, args=(process.stdout, f"[worker {index}] ", output), daemon=True)
            pump.start()
            pumps.append(pump)
        while True:
            if signals.received:
                stop_with, signals_seen = signals.received[0], len(signals.received)
                outcome.code, outcome.stop_signal = 128 + stop_with, stop_with
                output.write(f"[kerasfast launch] received {signal.Signals(stop_with).name}; "
                             "stopping the workers\n")
                break
            codes = [p.poll() for p in processes]
            failures = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failures:
                index, failed = failures[0]
                outcome.code = failed if failed > 0 else 128 - failed
                outcome.failed_worker, outcome.worker_code = index, failed
                output.write(f"[kerasfast launch] worker {index} exited with code {failed}; "
                             "stopping the others\n")
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(0.1)
    finally:
        _stop(processes, stop_with, lambda: len(signals.received) > signals_seen)
        deadline = time.monotonic() + OUTPUT_DRAIN_S
        for pump in pumps:
            pump.join(timeout=max(0.0, deadline - time.monotonic()))
        records = [record for index in range(len(processes))
                   for record in worker_state.read(_state_file(state_dir, index))]
        outcome.resumed_from = worker_state.resumed_from(records)
        shutil.rmtree(state_dir, ignore_errors=True)
    outcome.seconds = time.monotonic() - started
    return outcome


def _state_dir() -> str:
    """A folder for the workers' state files, which they can write also when
    they run as another user (a root launcher runs them as nobody)."""
    folder = tempfile.mkdtemp(prefix="kerasfast-launch-")
    os.chmod(folder, 0o755)
    return folder


def _state_file(folder: str, index: int) -> str:
    path = os.path.join(folder, f"worker{index}.jsonl")
    if not os.path.exists(path):
        with open(path, "w", encoding="utf-8"):
            pass
        os.chmod(path, 0o666)
    return path


def _signal_group(process, signum) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone (PermissionError: macOS for a group of zombies)


def _stop(processes, signum, hurry) -> None:
    """Stops the running workers: `signum` to each group, SIGKILL after the grace period.

    `hurry()` turning true (a further signal to the launcher, e.g. a second
    Ctrl-C) skips the rest of the grace period.
    """
    running = [p for p in processes if p.poll() is None]
    if not running:
        return
    for process in running:
        _signal_group(process, signum)
    deadline = time.monotonic() + TERMINATE_GRACE_S
    while time.monotonic() < deadline and not hurry():
        if all(p.poll() is not None for p in running):
            break
        time.sleep(0.05)
    for process in running:
        # Also when the worker itself has exited: what it started in its
        # group (data loaders, shells) must not outlive the job.
        _signal_group(process, signal.SIGKILL)
    for process in running:
        try:
            process.wait(timeout=TERMINATE_GRACE_S)
        except subprocess.TimeoutExpired:  # stuck in the kernel; SIGKILL lands when it returns
            pass
