"""`kerasfast convert SOURCE OUT_DIR`: the command-line face of `write_tfrecords`."""

from __future__ import annotations

import warnings

import click

from kerasfast.data.sources import CSV_PARSERS
from kerasfast.errors import DataError


@click.command("convert")
@click.argument("source")
@click.argument("out_dir")
@click.option("--shards", type=click.IntRange(min=1), default=None,
              help="Number of shards (default: ~128 MB each, at least 8).")
@click.option("--compression", type=click.Choice(["none", "GZIP", "ZLIB"], case_sensitive=False), default="none",
              show_default=True, help="Compression of the shards.")
@click.option("--label", default=None, help="Label column/feature (default: 'label' if present).")
@click.option("--no-label", is_flag=True, help="Write no label (e.g. a text corpus or inputs only).")
@click.option("--image-encoding", type=click.Choice(["png", "jpeg"]), default=None,
              help="Encode uint8 image arrays as PNG/JPEG instead of raw bytes.")
@click.option("--text-unit", type=click.Choice(["line", "file"]), default="line", show_default=True,
              help="For text corpora: one record per line or per file.")
@click.option("--source-type", type=click.Choice(["parquet", "csv", "images", "text"]), default=None,
              help="How to read SOURCE when it cannot be told from the path.")
@click.option("--on-error", type=click.Choice(["raise", "skip"]), default="raise", show_default=True,
              help="Stop at the first bad record, or skip bad records and list them.")
@click.option("--overwrite/--no-overwrite", default=True, show_default=True,
              help="Replace a dataset already in OUT_DIR.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the write-time shuffle.")
@click.option("--prefix", default="data", show_default=True,
              help="File name prefix of the shards, e.g. to write beside other files named like 'data' shards.")
@click.option("--csv-dtype", "csv_dtype", multiple=True, metavar="COLUMN=DTYPE",
              help=f"Type of a CSV column instead of the inferred one, DTYPE one of {', '.join(sorted(CSV_PARSERS))} "
                   "(repeat for several columns), e.g. --csv-dtype id=int64.")
def convert_command(source, out_dir, shards, compression, label, no_label, image_encoding, text_unit,
                    source_type, on_error, overwrite, seed, prefix, csv_dtype):
    """Convert SOURCE (Parquet/CSV/text file, folder or glob, or an image folder
    with one sub-folder per class) into TFRecord shards in OUT_DIR, with a
    schema.json that `kerasfast.data.tfrecord_dataset` reads."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kerasfast.data.sources import AUTO
    from kerasfast.data.writer import SkippedRecordsWarning, write_tfrecords

    if label is not None and no_label:
        raise click.UsageError(f"--label {label} and --no-label contradict each other: pass one of them.")
    csv_dtypes = _csv_dtypes(csv_dtype)
    console = Console(stderr=True)
    with Progress(TextColumn("converting"), BarColumn(), MofNCompleteColumn(), TextColumn("records"),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("convert", total=None)

        def progress(done, total):
            bar.update(task, completed=done, total=total)

        # Recorded, not shown: Python would print each with a source line of this file, and the lines below
        # already say most of them.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result = write_tfrecords(
                    source, out_dir, shards=shards,
                    compression=None if compression.lower() == "none" else compression,
                    label=None if no_label else (label or AUTO), image_encoding=image_encoding, text_unit=text_unit,
                    source_type=source_type, on_error=on_error, overwrite=overwrite, seed=seed, progress=progress,
                    csv_dtypes=csv_dtypes, prefix=prefix,
                )
            except DataError as exc:
                raise click.ClickException(str(exc)) from exc
    click.echo(str(result))
    for note in [*result.notes, *_unsaid_warnings(caught, result.notes, SkippedRecordsWarning)]:
        click.echo(f"note: {note}")
    for location, reason in result.skipped[:20]:
        click.echo(f"skipped: {location}: {reason}")
    if len(result.skipped) > 20:
        click.echo(f"skipped: ... and {len(result.skipped) - 20} more")
    click.echo(f"schema: {result.schema_path}")


def _csv_dtypes(options) -> dict:
    """`--csv-dtype COLUMN=DTYPE` options as write_tfrecords's csv_dtypes; the last wins for a column named
    twice, as for any repeated option."""
    csv_dtypes = {}
    for option in options:
        column, sep, dtype = option.rpartition("=")
        if not sep or not column:
            raise click.BadParameter(f"{option!r}: use COLUMN=DTYPE, e.g. id=int64.", param_hint="--csv-dtype")
        csv_dtypes[column] = dtype
    return csv_dtypes


def _unsaid_warnings(caught, notes, skipped_category) -> list:
    """The messages of the warnings caught during a conversion that the command does not print otherwise:
    not the skipped records (its `skipped:` lines), nor a warning repeating a note, each message once."""
    messages = []
    for warning in caught:
        message = str(warning.message).strip().removesuffix(".")
        if issubclass(warning.category, skipped_category) or any(note in message for note in notes):
            continue
        if message not in messages:
            messages.append(message)
    return messages
