"""`kerasfast launch`: run a script as an N-worker job on this machine.

Starts N copies of a command, each with a `TF_CONFIG` that names all workers
on loopback ports and its own index, exactly as a cluster scheduler
(Kubeflow TFJob, Vertex AI, SageMaker, Slurm) would. Each output line is
prefixed with its worker's index. When one worker fails, the others are
stopped at once instead of hanging in a collective, and the launcher exits
with the failed worker's code.

Ports. The launcher binds the workers' ports itself before it starts them
and holds them until the job ends, so no other program can take a port
between its choice and the worker's bind. TensorFlow's server cannot adopt
an open socket, but with `TF_GRPC_REUSE_PORT=1` (set in every worker) it
binds with SO_REUSEPORT, which Linux and macOS let it share with the
launcher's held socket (same user, both with SO_REUSEPORT); a program
without SO_REUSEPORT gets "address in use". The held socket never listens,
so every connection goes to the worker.

Bind address. TensorFlow 2.21's gRPC server (`GrpcServer::Init`) listens on
`"0.0.0.0:" + port` whatever host `TF_CONFIG` names (gRPC makes that a
dual-stack `[::]`): `ServerDef` has a `port` field but no address, and the
only environment variable `Init` reads is `TF_GRPC_REUSE_PORT`. So the
workers listen on every interface, without authentication;
docs/distributed.md says how to confine them, and `tests/test_launch.py`
checks what they bind, to tell us when TensorFlow changes.

Signals. SIGINT, SIGTERM and SIGHUP to the launcher are forwarded to every
worker's process group; a worker still running `TERMINATE_GRACE_S` later
is killed (SIGKILL to its group), and the launcher exits with 128 + the
signal's number.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

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
    for line in iter(stream.readline, ""):
        out.write(f"{prefix}{line}")
    stream.close()


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


def launch(command: list[str], num_workers: int, *, port: int | None = None, host: str = "127.0.0.1",
           env: dict | None = None, out=None) -> int:
    """Runs `command` as `num_workers` local workers and waits for them.

    Args:
        command: The program and its arguments, e.g. `["python", "train.py"]`.
        num_workers: Number of worker processes.
        port: First port to use (then port+1, ...); free ports when None.
        host: The workers' address in `TF_CONFIG`. TensorFlow 2.21 listens
            on every interface whatever it says (see the module docstring).
        env: Base environment (default: this process's).
        out: Where prefixed output goes (default: stdout).

    Returns:
        0 when every worker succeeded; else the exit code of the first
        worker that failed (a worker killed by a signal counts as 128+N);
        128+N when the launcher was stopped by signal N.

    Raises:
        PlanError: When a requested port is in use.

    Example:

    >>> launch([sys.executable, "train.py"], num_workers=2)
    0
    """
    if num_workers < 1:
        raise ValueError(f"num_workers={num_workers} must be >= 1.")
    if not command:
        raise ValueError("no command to launch: pass it after --, e.g. kerasfast launch -n 2 -- python train.py")
    output = _Output(out or sys.stdout)
    reservation = reserve_ports(num_workers, port)
    workers = [f"{host}:{p}" for p in reservation.ports]
    base_env = {**(os.environ if env is None else env), **reservation.worker_env(), "PYTHONUNBUFFERED": "1"}
    processes = []
    pumps = []
    code = 0
    stop_with, signals_seen = signal.SIGTERM, 0
    with reservation, _StopSignals() as signals:
        try:
            if not reservation.shared:
                reservation.release()
            for index in range(num_workers):
                if signals.received:
                    break
                worker_env = {**base_env, "TF_CONFIG": tf_config(workers, index)}
                # Its own session, so that the worker and whatever it starts
                # form one process group that can be signalled as a whole.
                process = subprocess.Popen(command, env=worker_env, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True, errors="replace",
                                           start_new_session=True)
                processes.append(process)
                pump = threading.Thread(target=_pump, args=(process.stdout, f"[worker {index}] ", output),
                                        daemon=True)
                pump.start()
                pumps.append(pump)
            while True:
                if signals.received:
                    stop_with, signals_seen = signals.received[0], len(signals.received)
                    code = 128 + stop_with
                    output.write(f"[kerasfast launch] received {signal.Signals(stop_with).name}; "
                                 "stopping the workers\n")
                    break
                codes = [p.poll() for p in processes]
                failures = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
                if failures:
                    index, failed = failures[0]
                    code = failed if failed > 0 else 128 - failed
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
    return code


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
