"""tf.data service: the input pipeline's preprocessing on other machines.

When one host's CPUs cannot feed its accelerators, TensorFlow's answer is
the tf.data service: a dispatcher and any number of service workers run the
pipeline (reading, parsing, augmentation) and stream finished batches to the
training processes over gRPC. `kerasfast.fit(..., data_service="grpc://HOST:PORT")`
sends its training pipeline there; `kerasfast data-service dispatcher|worker`
starts the servers.

What it guarantees (the sharding policy is `ShardingPolicy.DYNAMIC`):

- **Every record once per epoch.** Each training worker keeps its own
  files, as without the service (kerasfast shards a TFRecord folder between
  training workers by file), and reads them as one job per pass: the
  dispatcher hands that pass's files out one at a time to whichever service
  worker asks next, so each record is produced exactly once per pass, however
  many service workers share the work. The batches the service workers send
  are cut again into the batch size (`Dataset.rebatch`) in the training
  process, so an epoch has exactly the steps, and holds exactly the records,
  of a pass read locally. DYNAMIC gives *at most once*: a service worker
  that dies mid-pass loses the rest of the file it was reading.
- **No order.** Which service worker reads which file, and whose batch
  arrives first, changes from run to run: the order is not reproducible,
  with or without a seed, and `shuffle=False` does not give file order.
  With `shuffle=True` each service worker shuffles the records it reads
  (a fresh order every pass).
- **Resume from the step, not the batches.** A backup restores weights,
  optimizer state and the step count, but the batches after it cannot be
  replayed; `resume="auto"` therefore refuses to resume a backup with a data
  service, and `resume="force"` resumes from the step with a fresh pass.

What it refuses (`PlanError`, before training): in-memory arrays, Python
generators and `keras.utils.PyDataset` (see `check_servable`), a
`tf.data.Dataset` under several training workers, a TFRecord folder with
fewer files than training workers, `on_error="skip"`, and an address where
nothing listens.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
import urllib.parse

import click

from kerasfast.errors import KerasfastError, PlanError

SHARDING_POLICY = "DYNAMIC"
# How long `fit` tries to open a TCP connection to the dispatcher before
# refusing the address: long enough for a loaded machine, short enough that a
# wrong address fails before any model is built.
CONNECT_TIMEOUT_S = 5.0
# How often a training process asks the dispatcher for a new job's tasks (see
# `distribute_pass`).
TASK_REFRESH_MS = 100
# Ops that call back into the Python process that built the dataset; a
# service worker is another process and cannot run them.
_PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


def parse_address(data_service) -> tuple[str, int]:
    """`(host, port)` of a `data_service=` argument.

    Args:
        data_service: "grpc://HOST:PORT" (or "HOST:PORT"), the address a
            `kerasfast data-service dispatcher` prints.

    Returns:
        `(host, port)`.

    Raises:
        PlanError: For anything else, with the form it must take.

    Example:

    >>> parse_address("grpc://10.0.0.5:5050")
    ('10.0.0.5', 5050)
    """
    if not isinstance(data_service, str) or not data_service.strip():
        raise PlanError(f"data_service={data_service!r} is not valid: pass the dispatcher's address as a string 'grpc://HOST:PORT', "
                        "e.g. data_service='grpc://10.0.0.5:5050' (started with `kerasfast data-service "
                        "dispatcher --port 5050`).")
    text = data_service.strip()
    parsed = urllib.parse.urlsplit(text if "://" in text else f"grpc://{text}")
    try:
        port = parsed.port
    except ValueError:
        port = None
    if parsed.scheme != "grpc" or not parsed.hostname or port is None or parsed.path not in ("", "/"):
        raise PlanError(f"data_service={data_service!r} is not valid: use 'grpc://HOST:PORT', the address a "
                        "`kerasfast data-service dispatcher` prints (the tf.data service speaks gRPC only).")
    return parsed.hostname, port


def check_reachable(host: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raises `PlanError` unless something accepts TCP connections at `host:port`.

    TensorFlow's client would otherwise retry for as long as training waits
    for its first batch, saying nothing.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as error:
        reason = error.strerror or type(error).__name__
    raise PlanError(
        f"data_service='grpc://{host}:{port}': nothing accepts connections there ({reason}). Start a dispatcher "
        f"with `kerasfast data-service dispatcher --port {port}` and service workers with `kerasfast data-service "
        f"worker --dispatcher {host}:{port}`, or drop data_service=. Workers started by `kerasfast launch` run in a "
        "private network namespace and cannot reach this machine's loopback: launch them with --host-network."
    )


def _python_ops(dataset) -> list[str]:
    """The Python-calling ops in `dataset`'s graph (function library included)."""
    import tensorflow as tf

    from kerasfast import _compat

    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(_compat.serialized_dataset_graph(dataset))
    nodes = list(graph.node) + [node for function in graph.library.function for node in function.node_def]
    return sorted({node.op for node in nodes if node.op in _PYTHON_OPS})


def check_servable(data_service: str, x, train_data, distribution, *, steps_per_epoch: int | None,
                   resuming: bool, force_resume: bool, on_error: str) -> None:
    """Refuses, before training, what the tf.data service cannot serve as `fit` needs.

    Args:
        data_service: The `data_service=` argument.
        x: The training data as passed to `fit`.
        train_data: `prepare_data`'s `PreparedData` for it.
        distribution: The run's `Distribution`.
        steps_per_epoch: `fit`'s `steps_per_epoch=`.
        resuming: Whether a backup is about to be resumed.
        force_resume: Whether `resume="force"` was passed.
        on_error: `fit`'s `on_error=`.

    Raises:
        PlanError: Naming the argument and the way out.
    """
    where = f"data_service={data_service!r}"
    if train_data.source == "arrays":
        raise PlanError(
            f"{where} cannot serve in-memory arrays: the service ships the dataset's graph, arrays included, to "
            "every service worker (protocol buffers stop at 2 GB) and the arrays are already in this process. "
            "Write them as TFRecords (kerasfast.data.write_tfrecords(...) or `kerasfast convert`) on storage the "
            "service workers can read and pass that folder, or drop data_service=.")
    if train_data.source in ("dataset", "python") and not _is_tf_dataset(x):
        raise PlanError(
            f"{where} cannot serve a {type(x).__name__}: its Python code runs in this process, and a tf.data "
            "service worker is another process. Express the pipeline in tf.data ops (e.g. "
            "kerasfast.data.tfrecord_dataset(...).map(...)) or pass a TFRecord folder, or drop data_service=.")
    if _is_tf_dataset(x):
        found = _python_ops(x)
        if found:
            raise PlanError(
                f"{where} cannot serve this tf.data.Dataset: it calls back into Python ({', '.join(found)}, from "
                "Dataset.from_generator, tf.py_function or tf.numpy_function), which a service worker cannot run. "
                "Replace those with TensorFlow ops, or drop data_service=.")
        if distribution.name == "multi_worker":
            raise PlanError(
                f"{where} with several training workers needs a TFRecord folder, which kerasfast splits between "
                "the workers by file (every record once per epoch); a tf.data.Dataset cannot be split that way. "
                "Write the data with kerasfast.data.write_tfrecords and pass the folder, or drop data_service=.")
    if on_error == "skip":
        raise PlanError(f"{where} cannot be combined with on_error='skip': the records left in a damaged file are "
                        "read in Python, which a service worker cannot run. Repair or remove the damaged files "
                        "(kerasfast.data.check_tfrecords names them), or drop one of the two.")
    if train_data.source == "tfrecords" and distribution.name == "multi_worker":
        files = train_data.dataset.kerasfast_info.files
        workers = distribution.cluster.num_workers
        if len(files) < workers:
            raise PlanError(
                f"{where}: {len(files)} TFRecord file(s) cannot be split between {workers} training workers by "
                "file, and splitting by record is not exact when service workers read the files in any order. "
                f"Write the data with write_tfrecords(..., shards={workers * 4}), or drop data_service=.")
    if distribution.name == "multi_worker" and not (steps_per_epoch or train_data.facts.steps_per_epoch):
        raise PlanError(f"{where} with several training workers needs the epoch's length: pass steps_per_epoch= "
                        "(the files carry no record counts: write them with kerasfast.data.write_tfrecords).")
    if resuming and not force_resume:
        raise PlanError(
            f"{where}: a backup was found, but a run fed by the tf.data service cannot resume exactly (the "
            "service's batch order is not reproducible, so the batches after the backup cannot be replayed). "
            "Pass resume='force' to resume from the backup's step (same weights, optimizer state and step, other "
            "batches for the rest of the epoch), resume='fresh' to start again, or drop data_service=.")


def _is_tf_dataset(x) -> bool:
    import tensorflow as tf

    return isinstance(x, tf.data.Dataset)


def describe(data_service: str) -> str:
    """One line for the plan's data description."""
    host, port = parse_address(data_service)
    return (f"via tf.data service grpc://{host}:{port} (sharding {SHARDING_POLICY}: one job per pass, every "
            "record once per epoch, order not reproducible)")


def distribute_pass(dataset, data_service: str, batch_size: int | None):
    """One pass of `dataset` produced by the service, batched like the original.

    Args:
        dataset: A finite, batched `tf.data.Dataset` whose sources can be
            split (files, `from_tensor_slices`, `range`).
        data_service: The dispatcher's address.
        batch_size: The batch size to cut the served batches back into
            (each service worker ends its share of a pass with a short
            batch), or None to keep them as served.

    Returns:
        A `tf.data.Dataset`; each iteration of it (e.g. each repetition of
        `.repeat()`) is a new job, i.e. a new pass.

    Example:

    Not run as a doctest: it needs a running dispatcher and service workers.

    >>> ds = distribute_pass(kerasfast.data.tfrecord_dataset("data/train", batch_size=64, repeat=1),
    ...                      "grpc://10.0.0.5:5050", 64)                       # doctest: +SKIP
    """
    import tensorflow as tf

    from kerasfast import _compat

    host, port = parse_address(data_service)
    service = tf.data.experimental.service
    # No job_name: each iterator gets a job of its own, so every pass (and
    # every training worker's files) is one job the dispatcher splits once.
    arguments = dict(processing_mode=service.ShardingPolicy.DYNAMIC, service=f"grpc://{host}:{port}")
    try:
        # Each pass is a new job, and the client learns of a job's tasks by
        # polling the dispatcher: TensorFlow's default period (1 s) measured
        # 1.0 s per pass on loopback, 100 ms 0.21 s. Only the private
        # function takes the period.
        transform = _compat.data_service_distribute(**arguments, task_refresh_interval_hint_ms=TASK_REFRESH_MS)
    except (ImportError, TypeError):
        transform = service.distribute(**arguments)
    served = dataset.apply(transform)
    return served.rebatch(batch_size) if batch_size else served


def service_stream(data_service: str, x, train_data, strategy, distribution, *, global_batch_size: int,
                   steps_per_epoch: int | None, shuffle: bool, on_error: str, class_weight=None):
    """`f(batches_done)` giving the training stream read through the service.

    `batches_done` is ignored: a resumed run (only with `resume="force"`)
    goes on from its step with a fresh pass (see the module's docstring).

    Args:
        data_service: The dispatcher's address.
        x: The training data as passed to `fit` (a TFRecord path or a
            `tf.data.Dataset`, as `check_servable` allowed).
        train_data: `prepare_data`'s `PreparedData` for it.
        strategy: The `tf.distribute.Strategy`, or None for one device.
        distribution: The run's `Distribution`.
        global_batch_size: The plan's global batch size.
        steps_per_epoch: The plan's steps per epoch: when known, the
            passes are repeated and an epoch is counted in steps; else an
            epoch lasts one pass.
        shuffle, on_error, class_weight: As given to `fit`.

    Returns:
        A function of one integer returning the dataset (or distributed
        dataset) to train on.
    """
    from kerasfast import data as kf_data

    repeat = bool(steps_per_epoch)

    def one_pass(batch_size, input_context=None):
        if train_data.source != "tfrecords":
            return x
        # repeat=1 leaves out the record count kerasfast asserts otherwise:
        # each service worker reads only a share of the files. No seed: a
        # fixed one would give every pass (each a fresh job) the same order.
        dataset = kf_data.tfrecord_dataset(os.fspath(x), batch_size=batch_size, shuffle=shuffle, seed=None,
                                           repeat=1, input_context=input_context, on_error=on_error)
        if class_weight is not None:
            from kerasfast.training.inputs import _class_weight_map

            dataset = dataset.map(_class_weight_map(class_weight))
        return dataset

    if distribution.name == "multi_worker":
        def stream_from(done: int):
            def worker_dataset(context):
                batch = context.get_per_replica_batch_size(global_batch_size)
                return distribute_pass(one_pass(batch, context), data_service, batch).repeat()

            return strategy.distribute_datasets_from_function(worker_dataset)

        return stream_from

    batch = global_batch_size if train_data.source == "tfrecords" else train_data.facts.batch_size

    def stream_from(done: int):
        served = distribute_pass(one_pass(batch), data_service, batch)
        return served.repeat() if repeat else served

    return stream_from


# -- the servers ---------------------------------------------------------------------------------------------------

# Seconds a stopping server gets before the process exits without it.
STOP_GRACE_S = 10.0


def _serve(server, announce: str) -> None:
    """Prints `announce` and blocks until SIGINT or SIGTERM, then stops `server`
    and exits: status 0, or 1 when TensorFlow's server did not stop within
    STOP_GRACE_S (an element still being produced holds its stop)."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    click.echo(announce)
    sys.stdout.flush()
    # A timeout keeps the main thread returning to Python, where signal handlers run.
    while not stop.wait(0.5):
        pass
    from kerasfast import _compat

    # TensorFlow's stop waits for the element a task is producing and holds the GIL while it waits, so no
    # Python timer can end it: faulthandler's watchdog is a C thread, which prints where each thread
    # waits and exits with status 1 once the grace has passed.
    click.echo(f"kerasfast data-service: stopping (TensorFlow's server gets {STOP_GRACE_S:g} s, then the "
               "process exits without it)", err=True)
    sys.stderr.flush()
    faulthandler.dump_traceback_later(STOP_GRACE_S, exit=True, file=sys.stderr)
    _compat.stop_server(server)
    # Once the server has stopped there is nothing left to tear down, but the interpreter's own exit waits
    # on TensorFlow's gRPC threads (stopping a dispatcher and two workers took 64 s in the test suite's
    # teardown, under 4 s leaving at once): leave at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def serve_dispatcher(port: int, work_dir: str | None = None) -> None:
    """Runs a tf.data service dispatcher until SIGINT/SIGTERM.

    Args:
        port: Port to listen on (all interfaces).
        work_dir: Folder where the dispatcher journals its state, so that a
            restarted dispatcher carries on (fault-tolerant mode); None: in
            memory only.

    Example:

    >>> serve_dispatcher(5050)   # serves until stopped  # doctest: +SKIP
    """
    import tensorflow as tf

    service = tf.data.experimental.service
    config = service.DispatcherConfig(port=port, work_dir=work_dir, fault_tolerant_mode=work_dir is not None)
    server = _started(lambda: service.DispatchServer(config), "dispatcher", port)
    journal = f", journal in {work_dir}" if work_dir else ""
    _serve(server, f"kerasfast data-service dispatcher: serving grpc://{_host_name()}:{port}{journal} "
                   f"(pass data_service='grpc://HOST:{port}' to kerasfast.fit; Ctrl-C stops)")


def serve_worker(dispatcher: str, port: int = 0, host: str = "localhost") -> None:
    """Runs a tf.data service worker until SIGINT/SIGTERM.

    Args:
        dispatcher: The dispatcher's "HOST:PORT" (or "grpc://HOST:PORT").
        port: Port to listen on (0: a free one).
        host: The name training processes reach this worker by; the
            dispatcher hands it to them ("localhost" only serves training
            on this machine).

    Example:

    >>> serve_worker("10.0.0.5:5050", host="10.0.0.7")   # serves until stopped  # doctest: +SKIP
    """
    import tensorflow as tf

    dispatcher_host, dispatcher_port = parse_address(dispatcher)
    service = tf.data.experimental.service
    config = service.WorkerConfig(dispatcher_address=f"{dispatcher_host}:{dispatcher_port}", port=port,
                                  worker_address=f"{host}:%port%")
    server = _started(lambda: service.WorkerServer(config), "worker", port)
    address = server._address  # noqa: SLF001 (the port TensorFlow bound, when port=0)
    _serve(server, f"kerasfast data-service worker: serving {address} for dispatcher "
                   f"{dispatcher_host}:{dispatcher_port} (Ctrl-C stops)")


def _started(make, what: str, port: int):
    """The server `make()` starts, or a `KerasfastError` saying why it could not."""
    try:
        return make()
    except (RuntimeError, ValueError, _tf_errors()) as error:
        raise KerasfastError(
            f"could not start the tf.data service {what} on port {port} ({type(error).__name__}: {error}): the "
            "port is probably in use; pass another --port (a worker's --port 0 takes a free one).") from error


def _tf_errors():
    import tensorflow as tf

    return tf.errors.OpError


def _host_name() -> str:
    return socket.gethostname() or "localhost"


@click.group("data-service")
def data_service_command():
    """Run tf.data service servers: a dispatcher and its workers.

    Start one dispatcher, then service workers on the machines with spare
    CPUs (each pointing at the dispatcher), then train with
    kerasfast.fit(..., data_service="grpc://DISPATCHER_HOST:PORT") or a
    recipe's --data-service flag. The servers listen on all interfaces
    without authentication: keep them on a trusted network. See
    docs/distributed.md ("tf.data service").
    """


@data_service_command.command("dispatcher")
@click.option("--port", type=click.IntRange(1, 65535), required=True, help="Port to listen on.")
@click.option("--work-dir", type=click.Path(file_okay=False), default=None,
              help="Journal the dispatcher's state here, so a restarted dispatcher carries on.")
def dispatcher_command(port, work_dir):
    """Run a tf.data service dispatcher until Ctrl-C / SIGTERM.

    Example: kerasfast data-service dispatcher --port 5050
    """
    _run(serve_dispatcher, port, work_dir)


@data_service_command.command("worker")
@click.option("--dispatcher", required=True, help="The dispatcher's HOST:PORT.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port to listen on (0: a free one).")
@click.option("--host", default="localhost", show_default=True,
              help="This machine's name as training processes reach it (localhost serves this machine only).")
def worker_command(dispatcher, port, host):
    """Run a tf.data service worker until Ctrl-C / SIGTERM.

    Example: kerasfast data-service worker --dispatcher 10.0.0.5:5050 --host 10.0.0.7
    """
    _run(serve_worker, dispatcher, port, host)


def _run(serve, *args) -> None:
    try:
        serve(*args)
    except KerasfastError as error:
        raise click.ClickException(str(error)) from error
