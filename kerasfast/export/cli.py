"""`kerasfast export MODEL.keras OUT_DIR ...`: the export step from a shell."""

from __future__ import annotations

import re
from pathlib import Path

import click

from kerasfast.errors import DataError, KerasfastError
from kerasfast.export.formats import FORMATS


def _np_arrays(file: Path, argument: str) -> dict:
    """The arrays of a .npy (as "x") or .npz file, read whole: an array NumPy cannot read (pickled
    objects, a damaged archive member) is named as the argument's."""
    import zipfile

    import numpy as np

    try:
        loaded = np.load(file, allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            return {"x": loaded}
        with loaded as archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise DataError(f"{argument} {file} is not an array file NumPy can read ({str(error).splitlines()[0][:200]}); "
                        f"save the arrays with np.save (.npy) or np.savez (.npz), numbers only.") from error


def _load_inputs(path: str, argument: str):
    """Inputs from .npy, or from .npz (array 'x', else the only array)."""
    file = Path(path)
    if file.suffix not in (".npy", ".npz"):
        raise DataError(f"{argument} {file} must be a .npy or .npz file.")
    arrays = _np_arrays(file, argument)
    if "x" in arrays:
        return arrays["x"]
    if len(arrays) == 1:
        return next(iter(arrays.values()))
    raise DataError(f"{argument} {file} holds arrays {sorted(arrays)}; name the inputs 'x'.")


def _load_eval(path: str):
    file = Path(path)
    if file.suffix != ".npz":
        raise DataError(f"--eval {file} must be a .npz file with arrays 'x' and 'y'.")
    arrays = _np_arrays(file, "--eval")
    if not {"x", "y"} <= set(arrays):
        raise DataError(f"--eval {file} holds arrays {sorted(arrays)}; it needs 'x' and 'y'.")
    return arrays["x"], arrays["y"]


def _load_model(model_path: str, *, safe_mode: bool):
    import zipfile

    import keras

    from kerasfast.recipes import import_recipe_layers

    # A model a recipe saved holds the recipe's layers, registered with Keras
    # only once the recipe's script is imported.
    import_recipe_layers(model_path)
    try:
        return keras.saving.load_model(model_path, safe_mode=safe_mode)
    except Exception as error:
        missing = re.search(r"Could not locate class '([^']+)'", str(error))
        if missing:
            raise DataError(
                f"Cannot load {model_path} as a Keras model: it uses the custom class {missing.group(1)!r}, which "
                "is not defined here. Load it in Python after importing the module that defines the class "
                "(decorated with @keras.saving.register_keras_serializable), then call "
                "kerasfast.export.export_model(model, ...)."
            ) from error
        if not zipfile.is_zipfile(model_path):
            raise DataError(
                f"Cannot load {model_path} as a Keras model: it is not a .keras file (a zip archive Keras writes); "
                "save the model with model.save('model.keras') and pass that file.") from error
        hint = (" If you trust the file, pass --unsafe-deserialization (loading runs the lambda's code)."
                if safe_mode and "safe_mode" in str(error) else "")
        raise DataError(f"Cannot load {model_path} as a Keras model: {str(error).splitlines()[0]}{hint}") from error


# export_model's argument spellings in its messages, and this command's options for them.
_FLAGS = (
    (re.compile(r"formats=\[([^\]]*)\]"), lambda m: "--formats " + ",".join(re.findall(r"'([^']+)'", m.group(1)))),
    (re.compile(r"^formats is empty"), lambda m: "--formats names no format"),
    (re.compile(r"representative_data=\.\.\."), lambda m: "--representative DATA.npy"),
    (re.compile(r"\brepresentative_data\b"), lambda m: "--representative"),
    (re.compile(r"\beval_data( x| y)?\b"), lambda m: "--eval" + (m.group(1) or "")),
    (re.compile(r"\bint8_input_output=True \(--int8-io\)"), lambda m: "--int8-io"),
    (re.compile(r"\bint8_input_output\b"), lambda m: "--int8-io"),
    (re.compile(r"\ballow_flex_ops=True\b"), lambda m: "--allow-flex-ops"),
)


def in_flags(message: str) -> str:
    """An export error's message with export_model's argument names replaced by this command's options, so
    that it says what to type (e.g. "needs representative_data=..." -> "needs --representative DATA.npy")."""
    for pattern, flag in _FLAGS:
        message = pattern.sub(flag, message)
    return message


@click.command("export")
@click.argument("model_path", metavar="MODEL.keras", type=click.Path(exists=True, dir_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option(
    "--formats",
    "formats",
    default=None,
    help=f"Comma-separated formats (default: all but saved_model_int8, onnx and onnx_int8; tflite_int8 needs "
    f"--representative, onnx_int8 is calibrated with it and dynamic int8 without). "
    f"Known: {', '.join(FORMATS)}.",
)
@click.option(
    "--representative",
    type=click.Path(exists=True, dir_okay=False),
    help="Calibration inputs for tflite_int8 and onnx_int8: DATA.npy, or DATA.npz with array 'x'.",
)
@click.option("--eval", "eval_path", type=click.Path(exists=True, dir_okay=False), help="DATA.npz with 'x' and 'y' for accuracy/loss.")
@click.option("--int8-io", is_flag=True, help="tflite_int8 with int8 input/output tensors.")
@click.option("--allow-flex-ops", is_flag=True, help="Allow TensorFlow (Flex) ops in .tflite files.")
@click.option(
    "--unsafe-deserialization",
    is_flag=True,
    help="Load a MODEL.keras holding Python lambdas (Lambda layers), which Keras refuses by default since "
    "loading runs their code: only for files you trust.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Export into OUT_DIR even though it holds files kerasfast did not write; they are left alone, "
    "only kerasfast's previous artifacts are replaced.",
)
def export_command(model_path, out_dir, formats, representative, eval_path, int8_io, allow_flex_ops,
                   unsafe_deserialization, overwrite):
    """Export MODEL.keras to OUT_DIR in serving and edge formats, each verified.

    Every .tflite file is run in LiteRT, every .onnx file (formats onnx,
    onnx_int8; pip install 'kerasfast[onnx]') in ONNX Runtime, and compared
    with the Keras model;
    report.json and report.md in OUT_DIR list size, gzipped size, accuracy,
    output difference and latency per artifact. Export writes only its own
    files (listed in OUT_DIR/kerasfast-export.json), each renamed into
    place once complete; an OUT_DIR holding other files is refused unless
    --overwrite is given, and even then they are left alone.
    """
    from kerasfast.export.exporter import export_model

    try:
        format_list = None if formats is None else [f.strip() for f in formats.split(",") if f.strip()]
        representative_data = None if representative is None else _load_inputs(representative, "--representative")
        eval_data = None if eval_path is None else _load_eval(eval_path)
        model = _load_model(model_path, safe_mode=not unsafe_deserialization)
        result = export_model(
            model,
            out_dir,
            formats=format_list,
            representative_data=representative_data,
            eval_data=eval_data,
            int8_input_output=int8_io,
            allow_flex_ops=allow_flex_ops,
            overwrite=overwrite,
            unsafe_deserialization=unsafe_deserialization,
        )
    except KerasfastError as error:
        raise click.ClickException(in_flags(str(error))) from error
    click.echo(result.table())
    click.echo(f"\nWrote {result.out_dir} (report.json, report.md; kerasfast-export.json lists what export wrote).")


if __name__ == "__main__":  # python -m kerasfast.export.cli
    export_command()
