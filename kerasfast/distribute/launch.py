"""`kerasfast launch`: run a script as an N-worker job on this machine.

Starts N copies of a command, each with a `TF_CONFIG` that names all workers
on free loopback ports and its own index, exactly as a cluster scheduler
(Kubeflow TFJob, Vertex AI, SageMaker, Slurm) would. Each output line is
prefixed with its worker's index. When one worker fails, the others are
stopped at once instead of hanging in a collective, and the launcher exits
with the failed worker's code.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

# A stopped worker gets this long to exit after SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 5.0


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports that are free on `host` right now."""
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


def tf_config(workers: list[str], index: int) -> str:
    """The `TF_CONFIG` value for worker `index` of `workers`."""
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def _pump(stream, prefix: str, out) -> None:
    for line in iter(stream.readline, ""):
        out.write(f"{prefix}{line}")
        out.flush()
    stream.close()


def launch(command: list[str], num_workers: int, *, port: int | None = None, host: str = "127.0.0.1",
           env: dict | None = None, out=None) -> int:
    """Runs `command` as `num_workers` local workers and waits for them.

    Args:
        command: The program and its arguments, e.g. `["python", "train.py"]`.
        num_workers: Number of worker processes.
        port: First port to use (then port+1, ...); free ports when None.
        host: Address the workers listen on.
        env: Base environment (default: this process's).
        out: Where prefixed output goes (default: stdout).

    Returns:
        0 when every worker succeeded, else the exit code of the first
        worker that failed (a worker killed by a signal counts as 128+N).

    Example:

    >>> launch([sys.executable, "train.py"], num_workers=2)
    0
    """
    if num_workers < 1:
        raise ValueError(f"num_workers={num_workers} must be >= 1.")
    if not command:
        raise ValueError("no command to launch: pass it after --, e.g. kerasfast launch -n 2 -- python train.py")
    out = out or sys.stdout
    ports = list(range(port, port + num_workers)) if port else free_ports(num_workers, host)
    workers = [f"{host}:{p}" for p in ports]
    base_env = dict(os.environ if env is None else env)
    processes = []
    pumps = []
    for index in range(num_workers):
        worker_env = {**base_env, "TF_CONFIG": tf_config(workers, index), "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(command, env=worker_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True)
        processes.append(process)
        pump = threading.Thread(target=_pump, args=(process.stdout, f"[worker {index}] ", out), daemon=True)
        pump.start()
        pumps.append(pump)
    failed_code = 0
    try:
        while True:
            codes = [p.poll() for p in processes]
            failures = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failures:
                index, code = failures[0]
                failed_code = code if code > 0 else 128 - code
                out.write(f"[kerasfast launch] worker {index} exited with code {code}; stopping the others\n")
                out.flush()
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        failed_code = 130
    finally:
        _stop(processes)
        for pump in pumps:
            pump.join(timeout=5)
    return failed_code


def _stop(processes) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
