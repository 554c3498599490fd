"""What every recipe in `recipes/` shares: its flags and its run folder.

A recipe is a short script that reads top to bottom like a keras-io
example. The parts that would otherwise be copied into each of them live
here: the common command-line flags, turning them into `kerasfast.fit`
options, and finishing a run folder (metrics JSON, PNG plots of the
loss/metric curves and throughput, and the run report `report.html`).

Example (inside a recipe):

    parser = recipes.parser("Train a tabular MLP.", epochs=20, batch_size=128)
    args = parser.parse_args(argv)
    cluster = recipes.start(args)          # before any tensor or model exists
    result = kerasfast.fit(build, data, **recipes.fit_options(args), ...)
    if cluster.is_chief:
        recipes.finish(args.out, result, {"test_accuracy": acc})

`kerasfast recipe NAME [flags]` (`recipe_command`) runs `recipes/NAME.py`.
"""

from __future__ import annotations

import argparse
import ast
import atexit
import importlib.util
import json
import math
import os
import re
import pathlib
import shutil
import sys
import tempfile
import textwrap
import zipfile

import click

from kerasfast.plan import PRECISIONS
from kerasfast.runs import write_json

RECIPES = ("image_classification", "gpt", "text_classification", "tabular", "finetune")
# How a recipe's layers name their module in a saved model's config: the
# name `_load_script` imports the recipe under.
_RECIPE_MODULE = re.compile(r"kerasfast_recipe_(\w+)")

# "kerasfast recipe NAME" while `recipe_command` runs a recipe, so that the
# recipe's usage line names it (argparse would take the program's name,
# "kerasfast"); None when the recipe runs as a script.
_command_line = None
# The run folder (--out) of the recipe parsed last: where `recipe_command`
# looks for a backup when the run is interrupted.
_run_folder = None


class _RecipeParser(argparse.ArgumentParser):
    """An argument parser that keeps what it parsed, and from which script,
    on the result (`recipe_argv`, `recipe_script`): `start` hands the same
    command line to Ray Train workers (`--ray-workers`)."""

    script: str | None = None

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = super().parse_known_args(args, namespace)
        parsed.recipe_argv = [str(arg) for arg in (sys.argv[1:] if args is None else args)]
        parsed.recipe_script = self.script
        global _run_folder
        _run_folder = getattr(parsed, "out", None)
        return parsed, extras


def _whole_number(least: int):
    """An argparse type: an integer >= `least`, refused while parsing (before a recipe writes anything)."""
    def whole_number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below {least}")
        return value

    return whole_number


def _real_number(*, above_zero: bool):
    """An argparse type: a finite float > 0 (`above_zero`) or >= 0, refused while parsing."""
    def real_number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < 0 or (above_zero and value == 0):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number {'above' if above_zero else 'of at least'} 0")
        return value

    return real_number


# argparse types for the recipes' numeric flags: a value out of range is
# refused with the flag's name before the recipe writes any data.
positive_int = _whole_number(1)
non_negative_int = _whole_number(0)
positive_float = _real_number(above_zero=True)
non_negative_float = _real_number(above_zero=False)


def _sparsity(text: str) -> float:
    """An argparse type: a target sparsity in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{value:g} is outside [0, 1): the share of weights set to zero")
    return value


def parser(description: str, *, epochs: int, batch_size: int, out: str | None = None,
           epochs_help: str | None = None) -> argparse.ArgumentParser:
    """An argument parser with the flags every recipe takes.

    Flags: --epochs, --batch-size, --precision, --strategy, --jit, --prune
    (target sparsity, 0 = off), --export (write the pruned int8 TFLite and
    report), --out RUN_DIR, --smoke (tiny sizes, under a minute on 2 cores),
    --data (the user's own data; each recipe says what it takes),
    --data-service grpc://HOST:PORT (fit's `data_service=`), --resume
    auto|fresh|force (fit's `resume=`: what to do with an interrupted run's
    backup in --out), --ray-workers N (the whole recipe on N Ray Train
    workers; see `start`).

    A recipe's own numeric flags take `positive_int`, `non_negative_int`,
    `positive_float` or `non_negative_float` as their `type`.
    """
    parser = _RecipeParser(prog=_command_line, description=description)
    # The recipe calling this: Ray Train workers run the same script.
    parser.script = sys._getframe(1).f_globals.get("__file__")
    parser.add_argument("--epochs", type=positive_int, default=epochs,
                        help=epochs_help or f"training epochs (default {epochs})")
    parser.add_argument("--batch-size", type=positive_int, default=batch_size,
                        help=f"global batch size (default {batch_size})")
    parser.add_argument("--precision", default="auto", choices=["auto", *PRECISIONS],
                        help="compute precision (default auto: the plan picks it for the hardware)")
    parser.add_argument("--strategy", default="auto", choices=["auto", "none", "mirrored", "multi_worker"],
                        help="tf.distribute strategy (default auto: the multi-worker job TF_CONFIG describes, "
                             "else MirroredStrategy over this machine's GPUs, else one device)")
    parser.add_argument("--jit", default="auto", choices=["auto", "on", "off"], help="XLA compilation")
    parser.add_argument("--prune", type=_sparsity, default=0.0, metavar="SPARSITY",
                        help="prune to this sparsity while fine-tuning after training (0 = off)")
    parser.add_argument("--export", action="store_true", help="export (pruned) int8 TFLite + report")
    out = out or f"kerasfast_runs/{pathlib.Path(sys.argv[0]).stem}"
    parser.add_argument("--out", default=out, help=f"run folder (default {out})")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: finishes in under a minute")
    parser.add_argument("--data", default=None, help="your own data instead of the built-in default")
    parser.add_argument("--data-service", default=None, metavar="grpc://HOST:PORT",
                        help="run the training input pipeline on a tf.data service (kerasfast data-service)")
    parser.add_argument("--resume", default="auto", choices=["auto", "fresh", "force"],
                        help="with a backup of an interrupted run in --out: auto resumes it when the flags that "
                             "change training are the same (refusing otherwise), fresh discards it and starts "
                             "again, force resumes it anyway")
    parser.add_argument("--ray-workers", type=int, default=0, metavar="N",
                        help="run the recipe on N Ray Train workers: a local Ray cluster, or the one RAY_ADDRESS "
                             "names; --out must then be a folder every node sees (pip install 'kerasfast[ray]')")
    return parser


def import_optional(module: str, *, extra: str):
    """`module`, imported; when it is not installed, a one-line `SystemExit` naming the kerasfast extra that
    brings it (`pip install -e ".[EXTRA]"`) instead of a traceback.

    Args:
        module: The module's import name, e.g. "keras_hub".
        extra: The extra of kerasfast's pyproject.toml that installs it, e.g. "hub".
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name != module.split(".")[0]:
            raise  # the module is there; something it imports is not: its own error says what
        script = pathlib.Path(sys._getframe(1).f_globals.get("__file__", "the recipe")).name
        raise SystemExit(f"{script} needs {module}, which is not installed: pip install -e \".[{extra}]\" "
                         f"(or pip install \"kerasfast[{extra}]\").") from None


def start(args):
    """Prepares the process for training; call it before any tensor or model exists.

    Sizes TensorFlow's thread pools and, when `TF_CONFIG` lists several
    workers (e.g. under `kerasfast launch -n 2`), creates the
    MultiWorkerMirroredStrategy, which TensorFlow only allows before its
    runtime starts.

    With `--ray-workers N` (and outside a Ray Train worker), this process
    instead starts N Ray Train workers that each run the recipe with the
    same flags (`kerasfast.distribute.ray_train.run_on_ray_workers`),
    waits for them, and exits: status 0 when they finished, 1 with the
    workers' error otherwise. The chief writes the run folder (`--out`)
    as under `kerasfast launch`; Ray's own records (per-epoch metrics, the
    final model) go to `--out`/ray.

    Args:
        args: The parsed common flags (uses `args.strategy`, `args.ray_workers`).

    Returns:
        This process's `kerasfast.distribute.ClusterSpec`: `.is_chief` says
        whether it writes the run folder.
    """
    from kerasfast import distribute
    from kerasfast.threads import configure_threads, runtime_started

    if getattr(args, "ray_workers", 0):  # a script's own parser may not have the flag
        _run_on_ray(args)
    if not runtime_started():
        configure_threads()
    _check_flags(args)
    distribute.setup(args.strategy)
    return distribute.cluster_from_env()


# fit's argument names as the recipes' flags spell them, for fit's messages about them.
_FLAGS = {"jit_compile=True": "--jit on", "jit_compile=False": "--jit off", "jit_compile": "--jit",
          "precision=": "--precision ", "data_service=": "--data-service ", "batch_size=": "--batch-size "}


def _check_flags(args) -> None:
    """Refuses flags fit would refuse whatever the model and data (a precision this machine cannot run,
    with --jit; a --data-service that is no address) before the recipe writes its data; the message
    names the flags."""
    from kerasfast.data import service
    from kerasfast.errors import KerasfastError, PlanError
    from kerasfast.hardware import detect_hardware
    from kerasfast.plan import Overrides, check_overrides

    try:
        check_overrides(detect_hardware(), Overrides.pick(fit_options(args)))
        if args.data_service:
            service.parse_address(args.data_service)
    except KerasfastError as error:
        message = str(error)
        for name, flag in _FLAGS.items():
            message = message.replace(name, flag)
        raise PlanError(message) from error


def _run_on_ray(args) -> None:
    """Runs the recipe's script with the same flags on `args.ray_workers`
    Ray Train workers, then exits (see `start`)."""
    from kerasfast.distribute import ray_train
    from kerasfast.errors import PlanError

    if ray_train.train_context() is not None:
        raise PlanError("--ray-workers was given inside a Ray Train worker: Ray runs do not nest. Leave the flag "
                        "out of the command line the workers run.")
    if args.ray_workers < 0:
        raise PlanError(f"--ray-workers {args.ray_workers}: give a number of workers (1 or more), or 0 for none.")
    if not args.recipe_script:
        raise PlanError("--ray-workers: this recipe's parser was not made by kerasfast.recipes.parser() in its "
                        "script, so the workers cannot tell which script to run.")
    out = pathlib.Path(args.out).resolve()
    # The flags given last win: each worker writes to the same absolute run
    # folder and starts no Ray run of its own.
    argv = [*args.recipe_argv, "--out", str(out), "--ray-workers", "0"]
    config = {"script": str(pathlib.Path(args.recipe_script).resolve()), "argv": argv, "cwd": os.getcwd()}
    failure = ray_train.run_on_ray_workers(_ray_worker_main, config, workers=args.ray_workers,
                                           storage=out, name="ray")
    if failure is not None:
        sys.exit(f"{pathlib.Path(args.recipe_script).name}: the Ray Train workers failed: {failure}")
    print(f"ray: {args.ray_workers} worker(s) finished; run folder {out}, Ray's records {out / 'ray'}")
    sys.exit(0)


def _ray_worker_main(config: dict) -> None:
    """What each Ray Train worker runs: the recipe's `main` with its flags.

    Relative paths in the flags (e.g. `--data`) are read from the folder
    the command ran in, where that folder exists on the worker's machine.
    """
    if os.path.isdir(config["cwd"]):
        os.chdir(config["cwd"])
    _load_script(pathlib.Path(config["script"])).main(config["argv"])


def data_dir(out, cluster) -> pathlib.Path:
    """Where this process writes the recipe's TFRecords.

    The chief keeps them in the run folder (`out/data`); other workers of a
    multi-worker job write their own copy to a temporary folder, removed at
    exit, so that only the chief writes the run folder.
    """
    if cluster.is_chief:
        return pathlib.Path(out) / "data"
    folder = pathlib.Path(tempfile.mkdtemp(prefix=f"kerasfast-recipe-worker{cluster.index}-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def evaluate(model, x, y, *, loss, metrics) -> dict:
    """Evaluates `model` on `(x, y)`: `{"loss": ..., metric: ...}` as floats.

    A model that was never compiled (e.g. one loaded from disk) is compiled
    with `loss` and `metrics` first. Under a multi-worker strategy every
    worker must call it (the evaluation is a collective).
    """
    if not model.compiled:
        model.compile(loss=loss, metrics=metrics)
    return {name: float(value) for name, value in model.evaluate(x, y, verbose=0, return_dict=True).items()}


def export_and_report(model, out_dir, *, representative_data, eval_data, metrics: dict,
                      formats=("keras", "tflite_float32", "tflite_int8"), headline="tflite_int8") -> dict:
    """Exports `model`, prints the report and adds it to `metrics`.

    Every .tflite is verified and evaluated in LiteRT by `kerasfast.export`.

    Returns:
        `{"LiteRT <format> (batch 1)": samples/s}` for the throughput plot.
    """
    from kerasfast.export import export_model

    exported = export_model(model, out_dir, formats=formats, representative_data=representative_data,
                            eval_data=eval_data)
    print(exported.table())
    metrics["export"] = [row.to_dict() for row in exported.rows]
    row = next(row for row in exported.rows if row.format == headline)
    metrics[f"{headline}_accuracy"] = row.accuracy
    label = headline.replace("tflite_", "").replace("dynamic_", "dynamic ")
    return {f"LiteRT {label}\n(batch 1)": 1000.0 / row.latency_ms} if row.latency_ms else {}


def fit_options(args) -> dict:
    """The `kerasfast.fit` overrides the common flags ask for."""
    jit = {"auto": "auto", "on": True, "off": False}[args.jit]
    options = {"precision": args.precision, "strategy": args.strategy, "jit_compile": jit,
               "batch_size": args.batch_size, "resume": getattr(args, "resume", "auto")}
    if args.data_service:
        options["data_service"] = args.data_service
    return options


def next_phase_options(options: dict, first_run_dir) -> dict:
    """`options` for a phase that goes on from the model the first phase
    trains in `first_run_dir` (pruning after training), to be called before
    the first phase runs.

    A backup of the next phase is resumed only when the first phase resumes
    its own too (`resume="fresh"` otherwise): one that finished, or never
    saved, trains its model again, and a backup made from the model of
    another run must not be put over it.
    """
    from kerasfast.training.backup import STATE_FILE

    first_resumes = (pathlib.Path(first_run_dir) / "backup" / STATE_FILE).is_file()
    return options if first_resumes else {**options, "resume": "fresh"}


def plot_history(history: dict, path: pathlib.Path, title: str) -> pathlib.Path:
    """One PNG with a panel per metric (training and validation curves)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name in history if not name.startswith("val_")]
    figure, axes = plt.subplots(1, max(1, len(names)), figsize=(4.5 * max(1, len(names)), 3.5), squeeze=False)
    # A figure with no curves still has one (empty) panel.
    for axis, name in zip(axes[0], names, strict=False):
        epochs = range(1, len(history[name]) + 1)
        axis.plot(epochs, history[name], marker="o", label="train")
        if f"val_{name}" in history:
            axis.plot(epochs, history[f"val_{name}"], marker="o", label="validation")
        axis.set_xlabel("epoch")
        axis.set_title(name)
        axis.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_throughput(rates: dict[str, float], path: pathlib.Path, unit: str) -> pathlib.Path:
    """A bar chart of measured rates, e.g. {"train": 1234.0, "LiteRT int8": 5678.0}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5, 3.5))
    labels = list(rates)
    axis.bar(labels, [rates[k] for k in labels])
    axis.set_ylabel(unit)
    axis.set_title("measured throughput")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def rate_text(rate: float | None, unit: str = "samples/s") -> str:
    """A measured rate as printed: "1,234 samples/s", or "n/a samples/s" when nothing was timed (a run of
    one epoch: the first, compiling execution is never counted).

    Example:

    >>> rate_text(1234.5), rate_text(None, "tokens/s")
    ('1,234 samples/s', 'n/a tokens/s')
    """
    return f"{'n/a' if rate is None else f'{rate:,.0f}'} {unit}"


def finish(out, result, metrics: dict, *, unit: str = "samples/s", rate_scale: float = 1.0,
           rates: dict[str, float] | None = None) -> dict:
    """Writes `metrics.json`, `curves.png`, `throughput.png` and `report.html` into the run folder.

    `report.html` (`kerasfast.write_report`) is one page for the recipe's
    `train/`, `prune/` and `export/` folders; its path is printed.

    Args:
        out: The run folder.
        result: The `kerasfast.FitResult` of the main training run.
        metrics: The recipe's own figures (accuracy, perplexity, ...).
        unit: Throughput unit for the plot ("samples/s", "tokens/s").
        rate_scale: Multiplier from samples/s to `unit` (e.g. sequence length).
        rates: Other measured rates in `unit` to plot beside training, e.g.
            {"LiteRT int8 (batch 1)": 2500.0}.

    Returns:
        The metrics as written, with throughput and plan figures added.
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rate = result.throughput.samples_per_second
    metrics = {
        **metrics,
        unit.replace("/", "_per_").replace(" ", "_"): rate * rate_scale if rate else None,
        "precision": result.plan.precision,
        "jit_compile": result.plan.jit_compile,
        "strategy": result.plan.strategy,
        "num_replicas": result.plan.num_replicas,
    }
    from kerasfast.reporting.sources import LEFT_FROM_EARLIER_RUNS, earlier_folders

    if result.run_dir is not None:  # the report leaves out what this run did not write
        earlier = earlier_folders(out, pathlib.Path(result.run_dir))
        if earlier:
            metrics[LEFT_FROM_EARLIER_RUNS] = earlier
    write_json(out / "metrics.json", metrics)
    plot_history(result.history.history, out / "curves.png", title=out.name)
    if rate:
        plot_throughput({"train": rate * rate_scale, **(rates or {})}, out / "throughput.png", unit)
    else:  # one left by an earlier run into this folder would pass for this run's
        (out / "throughput.png").unlink(missing_ok=True)
    from kerasfast.reporting import report_or_warning

    report = report_or_warning(out)  # a report that fails only warns: the run's figures stand
    if report is not None:
        print(f"report: {report}")
    return metrics


def recipes_folder() -> pathlib.Path:
    """The folder holding the recipe scripts.

    An installed package (`pip install .`, a wheel) carries them as
    `kerasfast/_recipes/` (copied from recipes/ by setup.py's build step);
    a checkout (editable install) uses its own top-level `recipes/` folder.

    Raises:
        click.ClickException: When neither exists.
    """
    import kerasfast

    package = pathlib.Path(kerasfast.__file__).resolve().parent
    for folder in (package / "_recipes", package.parent / "recipes"):
        if folder.is_dir() and any(folder.glob("*.py")):
            return folder
    raise click.ClickException(
        f"no recipe scripts in {package / '_recipes'} or {package.parent / 'recipes'}: this kerasfast "
        "installation is incomplete. Reinstall it (`pip install kerasfast`, or `pip install .` from a checkout)."
    )


def available_recipes() -> list[str]:
    """Names of the recipes in `recipes_folder()` (file names without `.py`)."""
    return sorted(p.stem for p in recipes_folder().glob("*.py") if not p.name.startswith("_"))


def recipe_path(name: str) -> pathlib.Path:
    """The script of recipe NAME.

    Raises:
        click.ClickException: When NAME is not one of `available_recipes()`.
            Only those names are accepted, never a path: `recipe ../x` or
            `recipe /tmp/x` must not run an arbitrary Python file.
    """
    names = available_recipes()
    if name not in names:
        raise click.ClickException(f"no recipe {name!r}: the recipes are {', '.join(names)}.")
    return recipes_folder() / f"{name}.py"


def load_recipe(name: str):
    """Imports `recipes/NAME.py` as a module (it is not a package on `sys.path`).

    Raises:
        click.ClickException: When NAME is not a recipe (see `recipe_path`),
            or its script has no `main(argv)`.
    """
    return _load_script(recipe_path(name))


def _modules_named(config):
    """Every `"module"` a Keras config (nested dicts and lists) names."""
    if isinstance(config, dict):
        if isinstance(config.get("module"), str):
            yield config["module"]
        for value in config.values():
            yield from _modules_named(value)
    elif isinstance(config, list):
        for value in config:
            yield from _modules_named(value)


def recipes_used_by(path) -> list[str]:
    """The recipes whose own layers the `.keras` file at `path` holds (its config names `kerasfast_recipe_NAME`).

    A file that is not a readable `.keras` archive holds none: Keras's own
    loading then says what is wrong with it.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return []
    found = {match.group(1) for module in _modules_named(config) if (match := _RECIPE_MODULE.fullmatch(module))}
    return sorted(found)


def import_recipe_layers(path) -> list[str]:
    """Imports the recipes whose layers the `.keras` file at `path` uses, so that Keras can load it.

    A recipe's custom layers (the GPT's `PositionEmbedding`, the text
    encoder's `TokenAndPositionEmbedding`, ...) are registered with Keras
    when its script is imported; a model a recipe saved loads only after
    that. Call it before `keras.saving.load_model(path)`; kerasfast's own
    loading (`kerasfast export`) does.

    Returns:
        The names of the recipes imported (those already imported count).

    Example:

    >>> import_recipe_layers("not-a-model.keras")
    []
    """
    names = [name for name in recipes_used_by(path) if name in available_recipes()]
    for name in names:
        if f"kerasfast_recipe_{name}" not in sys.modules:
            sys.modules[f"kerasfast_recipe_{name}"] = load_recipe(name)
    return names


def _load_script(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(f"kerasfast_recipe_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "main", None)):
        raise click.ClickException(f"{path} has no main(argv) function to run.")
    return module


# What a recipe's module-level constants may be built from for
# `static_parser`: literals, containers and earlier such constants.
_CONTAINER_CALLS = frozenset({"dict", "tuple", "list", "set", "frozenset"})
_LITERAL_NODES = (ast.Constant, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.keyword, ast.expr_context,
                  ast.UnaryOp, ast.unaryop, ast.BinOp, ast.operator)


def _is_literal(node: ast.expr, constants: set[str]) -> bool:
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            if child.id not in constants and child.id not in _CONTAINER_CALLS:
                return False
        elif isinstance(child, ast.Call):
            if not (isinstance(child.func, ast.Name) and child.func.id in _CONTAINER_CALLS):
                return False
        elif not isinstance(child, _LITERAL_NODES):
            return False
    return True


def _bound_names(statement: ast.stmt) -> set[str]:
    """The module-level names a statement (re)binds."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in statement.names}
    targets = {ast.Assign: lambda: statement.targets, ast.AnnAssign: lambda: [statement.target],
               ast.AugAssign: lambda: [statement.target]}.get(type(statement), list)()
    return {node.id for target in targets for node in ast.walk(target) if isinstance(node, ast.Name)}


def _literal_constants(tree: ast.Module) -> list[ast.Assign]:
    """The module-level assignments of literal values to names that no later statement rebinds."""
    constants: dict[str, ast.Assign] = {}
    for statement in tree.body:
        if (isinstance(statement, ast.Assign) and all(isinstance(t, ast.Name) for t in statement.targets)
                and _is_literal(statement.value, set(constants))):
            constants.update(dict.fromkeys((target.id for target in statement.targets), statement))
        else:
            for name in _bound_names(statement):
                constants.pop(name, None)
    return list(dict.fromkeys(constants.values()))


def _parse_args_call(statements) -> tuple[int, ast.Call]:
    """The index of the first statement calling `.parse_args(...)`, and that call."""
    for index, statement in enumerate(statements):
        for node in ast.walk(statement):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parse_args":
                return index, node
    raise ValueError("its main() never calls parse_args")


def _parser_source(tree: ast.Module) -> str:
    """Source defining the recipe's literal constants, the module functions
    its parser-building code calls, and `_help_parser()` returning the parser
    that `main` builds before `parse_args`."""
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    if "main" not in functions:
        raise ValueError("it has no main(argv) function")
    body = functions["main"].body
    if ast.get_docstring(functions["main"]) is not None:
        body = body[1:]
    index, call = _parse_args_call(body)
    builder = "\n".join([*(ast.unparse(statement) for statement in body[:index]),
                          f"return {ast.unparse(call.func.value)}"])
    called = {node.id for statement in [*body[:index], call.func.value] for node in ast.walk(statement)
              if isinstance(node, ast.Name)}
    helpers = [ast.unparse(functions[name]) for name in sorted(called & set(functions) - {"main"})]
    return "\n\n".join([*(ast.unparse(c) for c in _literal_constants(tree)), *helpers,
                         "def _help_parser():\n" + textwrap.indent(builder, "    ")])


def static_parser(path) -> argparse.ArgumentParser:
    """The argument parser of the recipe script at `path`, built without running the script.

    A recipe imports Keras (and so TensorFlow, seconds of start-up) at its
    top, like a keras.io example; its `--help` needs none of that. This
    reads the script's source and runs only what builds its parser: the
    statements of `main` before its `parse_args` call (or the function it
    calls there, e.g. `_parser()`), the module functions they call, and the
    module's constants whose values are literals, with `recipes` (this
    module) and `argparse` as the only other names.

    Args:
        path: The recipe's `.py` file.

    Returns:
        The parser `main` would build (its `prog` is the recipe's command
        line while `recipe_command` runs).

    Raises:
        ValueError: The script's parser cannot be built this way (its
            source is not shaped as above, or the parser needs a name the
            script imports); the message names the script and why.

    Example:

    >>> parser = static_parser(recipe_path("tabular"))
    >>> parser.parse_args(["--task", "regression", "--smoke"]).task
    'regression'
    """
    path = pathlib.Path(path)
    namespace = {"__name__": f"kerasfast_recipe_{path.stem}_help", "recipes": sys.modules[__name__],
                 "argparse": argparse}
    try:
        source = _parser_source(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        exec(compile(source, str(path), "exec"), namespace)  # noqa: S102 - the recipe's own code
        parser = namespace["_help_parser"]()
    except (SyntaxError, ValueError, NameError, AttributeError, TypeError) as error:
        raise ValueError(f"cannot build the argument parser of {path} without running it: {error}") from error
    if not isinstance(parser, argparse.ArgumentParser):
        raise ValueError(f"cannot build the argument parser of {path} without running it: main() calls "
                         f"parse_args on a {type(parser).__name__}, not an argparse.ArgumentParser")
    return parser


def _asks_for_help(flags) -> bool:
    before_separator = flags[:flags.index("--")] if "--" in flags else flags
    return any(flag in ("-h", "--help") for flag in before_separator)


def _print_help_without_running(name: str, flags) -> None:
    """Answers `--help` from the recipe's parser alone, with no TensorFlow start-up.

    Exits through argparse (help, or a usage error the recipe would give as
    well); returns when that cannot be done, and the recipe then runs as
    usual, which prints the same help the slow way.
    """
    try:
        parser = static_parser(recipe_path(name))
    except ValueError:
        # A recipe written differently (its parser built from imported names,
        # say) still gets its own, correct help: from running its main(),
        # which costs the seconds of importing Keras.
        return
    parser.parse_args(list(flags))  # `--help` prints and exits here


@click.command("recipe", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("name")
@click.argument("flags", nargs=-1, type=click.UNPROCESSED)
def recipe_command(name, flags):
    """Run recipe NAME end to end (FLAGS go to the recipe; NAME --help lists them).

    The recipes are the repository's recipes/ scripts (shipped inside the
    package too): image_classification, gpt, text_classification and tabular.

    Example: kerasfast recipe tabular --smoke --out runs/tabular
    """
    global _command_line
    from kerasfast.errors import KerasfastError

    _command_line = f"kerasfast recipe {name}"
    try:
        if _asks_for_help(flags):
            _print_help_without_running(name, flags)
        module = load_recipe(name)
        module.main(list(flags))
    except KerasfastError as error:
        raise click.ClickException(str(error)) from error
    except KeyboardInterrupt:
        raise interrupted(_run_folder) from None
    finally:
        _command_line = None


def interrupted(out) -> click.exceptions.Exit:
    """Says on stderr that Ctrl-C stopped the run writing `out`, and how to go on from there.

    Returns:
        The exit to raise: status 130, what a shell reports for a command
        SIGINT stopped.
    """
    from kerasfast.training.backup import STATE_FILE

    folder = pathlib.Path(out) if out is not None else None
    phases = sorted(path.parent.parent.name for path in folder.glob(f"*/backup/{STATE_FILE}")) if folder else []
    if folder is None:
        message = "Interrupted."
    elif (folder / "backup" / STATE_FILE).is_file() or "train" in phases:
        message = (f"Interrupted: {folder} holds a backup of the run. Run the same command again to resume "
                   "from it, or add --resume fresh to start afresh.")
    elif phases:  # a later phase's backup resumes only beside training's (`next_phase_options`)
        message = (f"Interrupted in {folder / phases[0]}, after training had finished: running the command again "
                   f"trains and {phases[0]}s afresh (a backup of {phases[0]}/ resumes only with a training run that "
                   "resumes too).")
    else:
        message = f"Interrupted before a backup was saved in {folder}: running the command again starts afresh."
    click.echo(message, err=True)
    return click.exceptions.Exit(130)
