"""The benchmark suite: plain Keras vs kerasfast for every recipe model, side by side.

For each recipe's model, in one run on this machine: plain Keras
(`model.fit` on in-memory NumPy arrays, float32, Keras defaults: batch as
given, one step per execution, no XLA on CPU) against `kerasfast.fit` (auto
plan, kerasfast's input pipeline; the image model reads TFRecords). Runs
alternate (Keras, kerasfast, Keras, ...) so that machine noise hits both, the
best steady-state rate of each is kept (the first, compiling execution is
excluded from both), and the ratio is printed. Then the GPT recipe's model
FLOPs utilisation and the benchmarks of `SUBPROCESS_SECTIONS` (the quick
check, the divergence guard, GPT width, input pipeline, compression).

Each result is one section of docs/benchmarks.md (`## TITLE`, its command,
commit, date and machine, then its tables), and `--out` gets only those
sections replaced (or appended when missing): the page's other sections
(tuning, the tf.data service, precision, start-up), made by their own
commands and explained in prose, stay as they are. A benchmark that fails
leaves its section as it was, with its earlier commit and date, and the run
exits with an error naming it.

    python benchmarks/run_all.py [--repeats 2] [--quick] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's kerasfast, not an installed one: a worktree measures its own code

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasfast  # noqa: E402
from kerasfast import costs, datasets  # noqa: E402
from kerasfast.plan import compute_dtype  # noqa: E402
from kerasfast.recipes import load_recipe  # noqa: E402
from kerasfast.training.throughput import ThroughputMeter, samples_counter  # noqa: E402

SPARSE_CE = "sparse_categorical_crossentropy"


class Workload:
    """One recipe model: how to build it, its data and its loss."""

    def __init__(self, name, build, x, y, batch_size, epochs, loss, unit="samples/s", scale=1.0, kerasfast_data=None):
        self.name, self.build, self.x, self.y = name, build, x, y
        self.batch_size, self.epochs, self.loss = batch_size, epochs, loss
        self.unit, self.scale = unit, scale
        self.kerasfast_data = kerasfast_data if kerasfast_data is not None else (x, y)


def workloads(quick: bool, workdir: pathlib.Path) -> list[Workload]:
    image = load_recipe("image_classification")
    tabular = load_recipe("tabular")
    text = load_recipe("text_classification")
    gpt = load_recipe("gpt")
    epochs = 2 if quick else 3  # the first execution compiles; a rate needs later ones

    (x_digits, y_digits), _ = datasets.digits(test_fraction=0.0)
    records = kerasfast.data.write_tfrecords((x_digits, y_digits), workdir / "digits", shards=8)

    from sklearn.datasets import load_breast_cancer

    cancer = load_breast_cancer()
    x_tab = np.tile(cancer.data.astype("float32"), (8, 1))
    y_tab = np.tile(cancer.target.astype("int32"), 8)

    (x_text, y_text), _, packages = text.stdlib_chunks(128, 200 if quick else 400, 10)

    seq_len = gpt.DEFAULTS["seq_len"]
    (x_gpt, y_gpt), _ = gpt.corpus_arrays(gpt.corpus_files(), seq_len, max_bytes=(64 if quick else 256) * seq_len * 32)
    x_gpt, y_gpt = x_gpt.astype("int32"), y_gpt.astype("int32")

    return [
        Workload("image: small ResNet (digits 8x8, batch 64)", lambda: image.small_resnet((8, 8, 1), 10),
                 x_digits, y_digits, 64, epochs, SPARSE_CE, kerasfast_data=str(records.out_dir)),
        Workload("tabular: MLP (breast cancer x8, batch 256)", lambda: tabular.build_mlp(x_tab, y_tab, 2),
                 x_tab, y_tab, 256, epochs, SPARSE_CE),
        Workload("text: transformer encoder (stdlib chunks, 128 bytes, batch 64)",
                 lambda: text.text_encoder(128, len(packages)), x_text, y_text, 64, epochs, SPARSE_CE),
        Workload(f"GPT: decoder LM (stdlib bytes, {seq_len} tokens, batch 32)",
                 lambda: gpt.build_gpt(seq_len=seq_len),
                 x_gpt, y_gpt, 32, epochs, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 unit="tokens/s", scale=seq_len),
    ]


def plain_keras(work: Workload) -> float:
    keras.utils.set_random_seed(0)
    model = work.build()
    model.compile("adam", work.loss)
    meter = ThroughputMeter(samples_counter(work.batch_size, len(work.x)), -(-len(work.x) // work.batch_size))
    model.fit(work.x, work.y, batch_size=work.batch_size, epochs=work.epochs, verbose=0, callbacks=[meter])
    return meter.result().samples_per_second * work.scale


def with_kerasfast(work: Workload):
    keras.utils.set_random_seed(0)
    result = kerasfast.fit(work.build, work.kerasfast_data, batch_size=work.batch_size, epochs=work.epochs,
                           loss=work.loss, optimizer="adam", run_dir=False, verbose=0)
    return result.throughput.samples_per_second * work.scale, result


def side_by_side(work: Workload, repeats: int):
    """Alternates plain Keras and kerasfast `repeats` times; returns the best
    rate of each and the kerasfast run that gave its best."""
    keras_best = fast_best = 0.0
    best_run = None
    for _ in range(repeats):
        keras_best = max(keras_best, plain_keras(work))
        rate, run = with_kerasfast(work)
        if rate >= fast_best:
            fast_best, best_run = rate, run
    print(f"{work.name}: keras {keras_best:,.0f} vs kerasfast {fast_best:,.0f} {work.unit} "
          f"= {fast_best / keras_best:.2f}x", flush=True)
    return keras_best, fast_best, best_run


def model_flops_utilisation(work: Workload, result) -> dict:
    """Achieved training FLOP/s over the measured peak in the plan's compute dtype."""
    model = result.train_model
    dtype = compute_dtype(result.plan.precision)
    forward = costs.forward_flops_per_sample(model, tuple(work.x.shape[1:]), tf.as_dtype(work.x.dtype))
    peak = costs.measure_peak_flops(dtype, size=2048, repeats=5)
    achieved = costs.TRAIN_STEP_FLOPS_PER_FORWARD * forward * result.throughput.samples_per_second
    return {"forward_flops_per_sequence": forward, "achieved_flops": achieved, "peak_flops": peak,
            "peak_dtype": dtype, "mfu": achieved / peak}


# The sections of docs/benchmarks.md this script writes besides the first:
# (title, script, its arguments, its arguments with --quick).
SUBPROCESS_SECTIONS = (
    ("kerasfast.fit vs plain model.fit, quick check", "fit_vs_keras.py", ["--repeats", "2"], ["--repeats", "2"]),
    ("Divergence guard's cost", "guard_overhead.py", [], ["--repeats", "2"]),
    ("GPT width", "gpt_width.py", [], ["--widths", "128", "256"]),
    ("Input pipeline", "input_pipeline.py", ["--records", "20000"], ["--records", "5000"]),
    ("Compression", "compression.py", [], []),
)
FIT_SECTION = "kerasfast.fit vs plain model.fit"
PAGE_HEADER = "# Benchmarks\n\n"
# The page's opening paragraph names the machine of every table that does not name its own.
MACHINE_LINE = "The machine, unless a table says otherwise: "


@dataclasses.dataclass
class Section:
    """One benchmark's section of the page: `## title`, where its figures
    come from, then `body` (prose and tables)."""

    title: str
    body: str
    runs: str = ""  # the script run_all ran for it ("" for its own table)
    note: str = ""  # said in brackets after the command


def subprocess_tables(script: str, argv: list[str]) -> str:
    """The markdown tables `benchmarks/SCRIPT ARGV` prints (one blank line between tables).

    Raises:
        RuntimeError: The script failed; the message holds its last error line.
    """
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *argv], capture_output=True, text=True,
                          timeout=1800)
    if done.returncode:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit code {done.returncode}"
        raise RuntimeError(f"benchmarks/{script} {' '.join(argv)} failed: {last}")
    tables, blank = [], False
    for line in done.stdout.splitlines():
        if line.startswith("|"):
            if blank and tables:
                tables.append("")
            tables.append(line)
            blank = False
        else:
            blank = True
    return "\n".join(tables)


def section_markdown(section: Section, *, command: str, commit: str, date: str, machine: str) -> str:
    """The section as the page lays it out: heading, `Command: ...; commit, date, machine.`, body."""
    source = (f"`{command}`" + (f" ({section.note})" if section.note else "")
              + (f", which runs `{section.runs}`" if section.runs else ""))
    return f"## {section.title}\n\nCommand: {source}; commit {commit}, {date}, {machine}.\n\n{section.body.strip()}\n"


def _split_sections(page: str) -> list[str]:
    """The page cut before each `## ` heading outside code fences: [preamble, section, ...]."""
    pieces, current, fenced = [], [], False
    for line in page.splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        if line.startswith("## ") and not fenced:
            pieces.append("".join(current))
            current = []
        current.append(line)
    pieces.append("".join(current))
    return pieces


def replace_sections(page: str, sections: dict[str, str]) -> str:
    """`page` with the sections titled as the keys of `sections` replaced by their values.

    A section runs from its `## TITLE` line to the next `## ` heading (or
    the end). Every other part of the page is kept byte for byte; a title
    the page lacks is appended at its end, in the order given.

    Example:

    >>> page = "# B\\n\\n## Old\\n\\n1\\n\\n## Kept\\n\\nprose\\n"
    >>> print(replace_sections(page, {"Old": "## Old\\n\\n2\\n", "New": "## New\\n\\n3\\n"}))
    # B
    <BLANKLINE>
    ## Old
    <BLANKLINE>
    2
    <BLANKLINE>
    ## Kept
    <BLANKLINE>
    prose
    <BLANKLINE>
    ## New
    <BLANKLINE>
    3
    <BLANKLINE>
    """
    pieces = _split_sections(page)
    missing = dict(sections)
    for index, piece in enumerate(pieces[1:], start=1):
        title = piece.splitlines()[0][3:].strip()
        if title in missing:
            last = index == len(pieces) - 1
            pieces[index] = missing.pop(title).rstrip("\n") + ("\n" if last else "\n\n")
    text = "".join(pieces)
    for replacement in missing.values():
        text = text.rstrip("\n") + "\n\n" + replacement.rstrip("\n") + "\n"
    return text


def write_sections(path, sections: list[Section], *, command: str, commit: str, date: str, machine: str) -> str:
    """Replaces (or appends) `sections` in the markdown page at `path`; returns the new page.

    A page that does not exist yet is started with a `# Benchmarks` title.
    Where the page's opening names this machine ("The machine, unless a
    table says otherwise: ..."), the sections say "the machine above".
    """
    path = pathlib.Path(path)
    page = path.read_text(encoding="utf-8") if path.exists() else PAGE_HEADER
    where = "the machine above" if f"{MACHINE_LINE}{machine}." in page else f"on {machine}"
    text = replace_sections(page, {
        section.title: section_markdown(section, command=command, commit=commit, date=date, machine=where)
        for section in sections
    })
    path.write_text(text, encoding="utf-8")
    return text


def current_commit() -> str:
    """The short hash of ROOT's HEAD, saying so when the code has changes not committed."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if git("status", "--porcelain", "--", "kerasfast", "benchmarks", "recipes"):
        commit += " with uncommitted changes"
    return commit


def fit_section(rows, mfu, repeats: int, note: str) -> Section:
    """The first section: plain `model.fit` against `kerasfast.fit` per recipe model, and the GPT MFU."""
    table = ["| workload | plain model.fit | kerasfast.fit | ratio | kerasfast plan |", "|---|---:|---:|---:|---|"]
    for work, keras_rate, fast_rate, plan in rows:
        choices = f"{plan.precision}, jit={plan.jit_compile}, steps_per_execution={plan.steps_per_execution}"
        table.append(f"| {work.name} | {keras_rate:,.0f} {work.unit} | {fast_rate:,.0f} {work.unit} | "
                     f"{fast_rate / keras_rate:.2f}x | {choices} |")
    mfu_text = (
        f"GPT recipe model: {mfu['forward_flops_per_sequence'] / 1e6:,.1f} MFLOP per sequence forward (TensorFlow "
        f"profiler), x{costs.TRAIN_STEP_FLOPS_PER_FORWARD} for a training step; achieved "
        f"{mfu['achieved_flops'] / 1e9:,.1f} GFLOP/s against a peak of {mfu['peak_flops'] / 1e9:,.0f} GFLOP/s "
        f"(a 2048x2048 {mfu['peak_dtype']} matmul measured in the same run): **MFU {mfu['mfu']:.1%}**."
        if mfu else "GPT MFU: not measured."
    )
    body = f"""Same model, data and batch size; plain Keras is `model.fit` on in-memory
NumPy arrays, float32, Keras defaults; kerasfast is `kerasfast.fit` with the
auto plan (the image model reads TFRecords through kerasfast's pipeline).
Steady-state rates after the first (compiling) execution, best of
{repeats} alternating runs of {rows[0][0].epochs} epoch(s) each.

{chr(10).join(table)}

{mfu_text}"""
    return Section(FIT_SECTION, body, note=note)


def subprocess_sections(quick: bool) -> tuple[list[Section], list[str]]:
    """Runs the benchmarks of `SUBPROCESS_SECTIONS`; returns their sections and the failures."""
    sections, failures = [], []
    for title, script, argv, quick_argv in SUBPROCESS_SECTIONS:
        argv = quick_argv if quick else argv
        try:
            sections.append(Section(title, subprocess_tables(script, argv),
                                    runs=" ".join([f"benchmarks/{script}", *argv])))
        except RuntimeError as error:
            print(error, flush=True)
            failures.append(str(error))
    return sections, failures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="two epochs per run, smaller data (a smoke test)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"),
                        help="markdown page whose sections of these benchmarks are replaced")
    parser.add_argument("--skip-tables", action="store_true", help="leave out the benchmarks run as scripts")
    args = parser.parse_args(argv)
    kerasfast.configure_threads()
    hardware = kerasfast.detect_hardware()
    machine = (f"{hardware.cpu_model}, {hardware.cpu_cores} cores, flags {', '.join(hardware.cpu_flags) or 'none'}, "
               f"GPUs: {', '.join(g.name for g in hardware.gpus) or 'none'}; Python {platform.python_version()}, "
               f"TensorFlow {tf.__version__}, Keras {keras.__version__}")
    print(f"machine: {machine}", flush=True)
    started = time.time()
    rows, mfu = [], None
    with tempfile.TemporaryDirectory() as workdir:
        for work in workloads(args.quick, pathlib.Path(workdir)):
            keras_best, fast_best, result = side_by_side(work, args.repeats)
            rows.append((work, keras_best, fast_best, result.plan))
            if work.unit == "tokens/s":
                mfu = model_flops_utilisation(work, result)
    sections, failures = subprocess_sections(args.quick) if not args.skip_tables else ([], [])
    given = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["python benchmarks/run_all.py", *given])
    note = f"{time.time() - started:,.0f} s" + ("; it also made the tables below that name it" if sections else "")
    sections.insert(0, fit_section(rows, mfu, args.repeats, note))
    write_sections(args.out, sections, command=command, commit=current_commit(),
                   date=datetime.date.today().isoformat(), machine=machine)
    print(f"\nwrote {len(sections)} section(s) of {args.out}")
    if failures:
        raise SystemExit("these benchmarks failed (their sections were left as they were):\n" + "\n".join(failures))
    return rows


if __name__ == "__main__":
    main()
