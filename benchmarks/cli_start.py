"""How long the `kerasfast` command takes to answer `--help` and `--version`.

Each command runs in a fresh interpreter (a subprocess, as a user runs it);
the best of `--runs` wall-clock times counts, since a shared machine only
ever adds time. None of these commands imports TensorFlow: a recipe's
`--help` is answered from the parser its script builds, without running
the script (whose top imports Keras).

    python benchmarks/cli_start.py [--runs 5]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time

COMMANDS = [
    ["--help"],
    ["--version"],
    ["info", "--help"],
    ["quickstart", "--help"],
    ["launch", "--help"],
    ["convert", "--help"],
    ["export", "--help"],
    ["data-service", "dispatcher", "--help"],
    ["recipe", "--help"],
    ["recipe", "tabular", "--help"],
    ["recipe", "gpt", "--help"],
]


def best_seconds(command: list[str], runs: int) -> float:
    """The shortest of `runs` wall-clock times of `command`, which must succeed."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per command; the best counts")
    args = parser.parse_args(argv)
    # The installed entry point, as a user types it; `python -m` where it is not on PATH.
    program = [shutil.which("kerasfast")] if shutil.which("kerasfast") else [sys.executable, "-m", "kerasfast.cli"]
    print(f"| command | best of {args.runs} (s) |")
    print("|---|---:|")
    print(f"| `python -c pass` (the interpreter alone) | {best_seconds([sys.executable, '-c', 'pass'], args.runs):.2f} |")
    for command in COMMANDS:
        print(f"| `kerasfast {' '.join(command)}` | {best_seconds(program + command, args.runs):.2f} |", flush=True)


if __name__ == "__main__":
    main()
