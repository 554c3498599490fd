"""Plain Keras with TensorFlow's oneDNN CPU kernels off and on, and `kerasfast.fit`: what a user gets.

TensorFlow decides once, as it loads, whether to run oneDNN's kernels; with
`TF_ENABLE_ONEDNN_OPTS` unset it turns them on only on x86 CPUs with
AVX512-VNNI, AVX512-BF16 or AMX (kerasfast/onednn.py). Each model of
`benchmarks/tune.py` (the quick data) is trained for `--epochs` epochs in a
process per setting, as a user would run it:

- `off`: plain `model.fit` (float32, Keras defaults), oneDNN off (TensorFlow's
  default on such CPUs: what a Keras user gets);
- `on`: the same with `TF_ENABLE_ONEDNN_OPTS=1` (an expert's pick by hand);
- `kerasfast` (with `--kerasfast`): `import kerasfast` first, then
  `kerasfast.fit` on its auto plan.

Settings alternate `--rounds` times; the table keeps each one's best steady
samples/s (the first, compiling execution left out) and its quickest whole
call (model, plan, tuning, compilation and training). kerasfast's cache of
tuned plans starts empty: its round 1 is a first run, later rounds re-runs
(tuning's choice read back); each round's whole calls are printed.

    python benchmarks/onednn.py [--epochs 3] [--rounds 2] [--only NAME[,NAME]] [--kerasfast]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
SETTINGS = {"off": "0", "on": "1", "kerasfast": None}  # TF_ENABLE_ONEDNN_OPTS (None: unset, kerasfast decides)


def worker(epochs: int, only: str, setting: str) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT))
    if setting == "kerasfast":
        import kerasfast  # noqa: F401 - first, as docs/getting-started.md advises
    import tune
    from tensorflow.python.util import _pywrap_util_port

    wanted = [text.strip().lower() for text in only.split(",")]
    runs = {}
    for name, build, x, y, batch_size, loss in tune.models(quick=True):
        if any(text in name.lower() for text in wanted):
            measured = (tune.fast if setting == "kerasfast" else tune.plain)(build, x, y, batch_size, loss, epochs)
            runs[name] = measured[:2]
    print(json.dumps({"onednn": bool(_pywrap_util_port.IsMklEnabled()), "runs": runs}))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated texts: only the models whose name has one")
    parser.add_argument("--kerasfast", action="store_true", help="also kerasfast.fit, in a process of its own")
    parser.add_argument("--worker", choices=SETTINGS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.epochs, args.only, args.worker)
    settings = {name: value for name, value in SETTINGS.items() if name != "kerasfast" or args.kerasfast}
    best: dict[str, dict[str, list[float]]] = {setting: {} for setting in settings}
    caches = tempfile.TemporaryDirectory()  # kerasfast's tuned plans, this run's only
    for round_ in range(args.rounds):
        for setting, value in settings.items():
            env = {key: item for key, item in os.environ.items() if key != "TF_ENABLE_ONEDNN_OPTS"}
            env.update(TF_CPP_MIN_LOG_LEVEL="3", KERASFAST_CACHE_DIR=caches.name,
                       **({"TF_ENABLE_ONEDNN_OPTS": value} if value else {}))
            done = subprocess.run(
                [sys.executable, __file__, "--worker", setting, "--epochs", str(args.epochs), "--only", args.only],
                capture_output=True, text=True, check=False, env=env)
            if done.returncode:
                raise RuntimeError(f"{setting} failed:\n{done.stderr[-3000:]}")
            report = json.loads(done.stdout.strip().splitlines()[-1])
            if value is not None and report["onednn"] != (value == "1"):
                raise RuntimeError(f"TF_ENABLE_ONEDNN_OPTS={value} did not take effect (this TensorFlow build?)")
            for name, (rate, whole) in report["runs"].items():
                print(f"round {round_ + 1} {setting}: {name}: {rate:,.0f} samples/s, whole call {whole:.1f} s",
                      flush=True)
                kept = best[setting].get(name, [0.0, float("inf")])
                best[setting][name] = [max(rate, kept[0]), min(whole, kept[1])]
    caches.cleanup()
    print(f"\n{args.epochs} epochs, a process per setting, best of {args.rounds}: steady samples/s (whole call s)\n")
    columns = {"off": "plain Keras, oneDNN off", "on": "plain Keras, oneDNN on", "kerasfast": "kerasfast.fit"}
    print("| model | " + " | ".join(columns[s] for s in settings) + " | on / off"
          + (" | kerasfast / off: steady (whole call) | kerasfast / on: steady (whole call)" if args.kerasfast else "")
          + " |")
    print("|---|" + "---:|" * (len(settings) + 1 + 2 * args.kerasfast))
    for name, (off, off_whole) in best["off"].items():
        cells = [f"{best[s][name][0]:,.0f} ({best[s][name][1]:.1f})" for s in settings]
        on, on_whole = best["on"][name]
        row = f"| {name} | " + " | ".join(cells) + f" | {on / off:.2f}x"
        if args.kerasfast:
            fast, fast_whole = best["kerasfast"][name]
            row += (f" | {fast / off:.2f}x ({off_whole / fast_whole:.2f}x)"
                    f" | {fast / on:.2f}x ({on_whole / fast_whole:.2f}x)")
        print(row + " |")
    return best


if __name__ == "__main__":
    main()
