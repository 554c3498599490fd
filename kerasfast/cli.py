"""The `kerasfast` command line.

    kerasfast info [--json]         hardware found and the default plan
    kerasfast quickstart [--out D]  train the digits convnet with the auto plan
    kerasfast launch -n N -- CMD    run CMD as an N-worker job on this machine (--restarts K)
    kerasfast convert SRC OUT       write TFRecord shards + schema
    kerasfast data-service dispatcher|worker   tf.data service servers (fit's data_service=)
    kerasfast export MODEL OUT      SavedModel / TFLite, verified in LiteRT
    kerasfast recipe NAME [flags]   run an end-to-end recipe from recipes/
    kerasfast report RUN_DIR        (re)write a run folder's report.html
"""

from __future__ import annotations

import json
import os
import sys

import click

from kerasfast.plan import PRECISIONS


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kerasfast")
def main():
    """Train Keras 3 models the fast way."""


def _default_plan(hardware):
    from kerasfast.onednn import onednn_state
    from kerasfast.plan import RunFacts, resolve_plan
    from kerasfast.threads import current_threads, runtime_started

    intra, inter = current_threads()
    return resolve_plan(hardware, run=RunFacts(tf_runtime_started=runtime_started(), onednn=onednn_state(),
                                               current_intra_op_threads=intra, current_inter_op_threads=inter))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def info(as_json):
    """Show the hardware found and the plan `fit` would choose by default."""
    from kerasfast.hardware import detect_hardware

    hardware = detect_hardware()
    plan = _default_plan(hardware)
    if as_json:
        click.echo(json.dumps({"hardware": hardware.to_dict(), "plan": plan.to_dict()}, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="Hardware", show_header=False)
    table.add_row("CPU", hardware.cpu_model)
    table.add_row("usable cores", str(hardware.cpu_cores))
    table.add_row("notable CPU flags", ", ".join(f.upper() for f in hardware.cpu_flags) or "none")
    table.add_row("bf16 on CPU", "yes" if hardware.cpu_has_bf16 else "no")
    if hardware.gpus:
        for index, gpu in enumerate(hardware.gpus):
            cc = ".".join(map(str, gpu.compute_capability)) if gpu.compute_capability else "?"
            memory = f"{gpu.memory_mib} MiB" if gpu.memory_mib else "memory unknown"
            table.add_row(f"GPU {index}", f"{gpu.name}, compute capability {cc}, {memory}")
    else:
        table.add_row("GPUs", "none")
    table.add_row("TPU cores", str(hardware.tpu_cores))
    console.print(table)
    plan_table = Table(title="Default plan of kerasfast.fit (model- and data-dependent fields are resolved at fit time)")
    plan_table.add_column("field")
    plan_table.add_column("value")
    plan_table.add_column("why")
    for name, value, reason in plan.rows():
        plan_table.add_row(name, value, reason)
    console.print(plan_table)


@main.command()
@click.option("--out", "out_dir", default="kerasfast_quickstart", show_default=True, type=click.Path(file_okay=False),
              help="Run folder to write.")
@click.option("--epochs", default=30, show_default=True, type=click.IntRange(min=1),
              help="Training epochs (the pruning fine-tune after them runs epochs of its own).")
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(min=1), help="Global batch size.")
@click.option("--precision", default="auto", show_default=True, type=click.Choice(["auto", *PRECISIONS]),
              help="Compute precision (auto: the plan picks it for the hardware).")
@click.option("--resume", default="auto", show_default=True, type=click.Choice(["auto", "fresh", "force"]),
              help="With a backup of an interrupted run in --out: auto resumes it when the options that change "
                   "training are the same (refusing otherwise), fresh discards it and starts again, force "
                   "resumes it anyway.")
def quickstart(out_dir, epochs, batch_size, precision, resume):
    """Train a small convnet on scikit-learn's digits with the auto plan.

    Ctrl-C stops it with exit status 130; running the same command again
    resumes from the backup in --out (--resume fresh starts afresh).
    """
    from kerasfast.errors import KerasfastError
    from kerasfast.quickstart import run_quickstart
    from kerasfast.recipes import interrupted
    from kerasfast.threads import configure_threads

    _check_writable(out_dir, "--out", make=True)
    configure_threads()  # before TensorFlow starts, so the plan's thread counts apply
    try:
        metrics = run_quickstart(out_dir, epochs=epochs, batch_size=batch_size, precision=precision,
                                 resume=resume, verbose=2)
    except KerasfastError as error:
        raise click.ClickException(str(error)) from error
    except KeyboardInterrupt:
        raise interrupted(out_dir) from None
    click.echo("")
    click.echo(metrics["export_table"])
    click.echo(quickstart_summary(metrics, out_dir))
    if metrics.get("report"):
        click.echo(f"report: {metrics['report']}")


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
def report(run_dir):
    """Write RUN_DIR/report.html (plots embedded) and its PNGs from the run's files.

    RUN_DIR is the run_dir of a kerasfast.fit run (plan.json, history.json,
    result.json), an export folder (report.json), or a folder holding them
    (the quickstart's or a recipe's). Prints the report's path.

    Example: kerasfast report kerasfast_runs/20261129-210300-3f2a
    """
    from kerasfast.errors import KerasfastError
    from kerasfast.reporting import write_report

    if os.path.isdir(run_dir):
        _check_writable(run_dir, "RUN_DIR", make=False)
    try:
        path = write_report(run_dir)
    except KerasfastError as error:
        raise click.ClickException(str(error)) from error
    click.echo(str(path))


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-n", "--num-workers", type=click.IntRange(min=1), required=True, help="Worker processes to start.")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="First port (default: free ports; 20000 in the private namespace).")
@click.option("--host-network", is_flag=True,
              help="Run the workers on the host network (e.g. to download data) instead of in a private "
                   "network namespace with only loopback; their servers then listen on all interfaces.")
@click.option("--restarts", type=click.IntRange(min=0), default=0, show_default=True,
              help="Start the whole job again this many times when a worker fails; kerasfast.fit resumes "
                   "from the run folder's backup.")
@click.option("--restart-delay", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="Seconds to wait between a failed attempt and the next.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def launch(num_workers, port, host_network, restarts, restart_delay, command):
    """Run COMMAND as an N-worker job on this machine (TF_CONFIG on loopback).

    The workers run in one private network namespace of their own, with only
    loopback: TensorFlow's worker servers, which listen on every interface
    without authentication whatever TF_CONFIG says, cannot be reached from
    outside it, and the workers cannot reach other machines. Where no
    namespace can be made (not Linux, user namespaces refused), or with
    --host-network, they use the host network; the first line printed says
    which, and why. On the host network the ports are held from their choice
    until the job ends. SIGINT, SIGTERM and SIGHUP are passed on to every
    worker, which is killed if still running 3 s later; the exit code is
    then 128 + the signal's number. With --restarts K, a job whose worker
    fails is stopped and started again, whole, up to K times; each attempt
    resumes from the backup in the script's run folder (shared by every
    worker). See docs/distributed.md.

    Example: kerasfast launch -n 2 --restarts 3 -- python train.py --epochs 3
    """
    from kerasfast.distribute.launch import launch as run_workers
    from kerasfast.errors import KerasfastError

    try:
        code = run_workers(list(command), num_workers, port=port, host_network=host_network, restarts=restarts,
                           restart_delay_s=restart_delay)
    except KerasfastError as error:
        raise click.ClickException(str(error)) from error
    sys.exit(code)


def _register_subcommands():
    from kerasfast.data.cli import convert_command
    from kerasfast.data.service import data_service_command
    from kerasfast.export.cli import export_command
    from kerasfast.recipes import recipe_command

    main.add_command(convert_command)
    main.add_command(data_service_command)
    main.add_command(export_command)
    main.add_command(recipe_command)


_register_subcommands()


def _check_writable(folder, name: str, *, make: bool) -> None:
    """Refuses a folder this process cannot write into (made first when `make`), naming the option."""
    try:
        if make:
            os.makedirs(folder, exist_ok=True)
        writable = os.access(folder, os.W_OK | os.X_OK)
    except OSError as error:
        raise click.BadParameter(f"{folder} cannot be made ({error.strerror or error}); pick a folder you can "
                                 "write to.", param_hint=name) from error
    if not writable:
        raise click.BadParameter(f"{folder} is not writable (read-only, or without permission); pick a folder "
                                 "you can write to.", param_hint=name)


def quickstart_summary(metrics: dict, out_dir) -> str:
    """The quickstart's last line: accuracies, throughput (n/a when no epoch after the first was timed,
    as in a one-epoch run) and the run folder."""
    from kerasfast.recipes import rate_text

    return (f"test accuracy {metrics['test_accuracy']:.4f} pruned to {metrics['sparsity']:.0%} "
            f"(dense {metrics['dense_test_accuracy']:.4f}); {rate_text(metrics['samples_per_second'])} "
            f"({metrics['precision']}); run folder: {out_dir}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
