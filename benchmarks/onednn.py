"""Plain Keras with TensorFlow's oneDNN CPU kernels off and on: what `import kerasfast` first buys.

TensorFlow decides once, as it loads, whether to run oneDNN's kernels; with
`TF_ENABLE_ONEDNN_OPTS` unset it turns them on only on x86 CPUs with
AVX512-VNNI, AVX512-BF16 or AMX (kerasfast/onednn.py). Each model of
`benchmarks/tune.py` (the quick data) is trained with plain `model.fit`
(float32, Keras defaults) for `--epochs` epochs, in one process per setting,
alternating `--rounds` times; the table keeps each setting's best steady
samples/s.

    python benchmarks/onednn.py [--epochs 3] [--rounds 2] [--only NAME[,NAME]]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SETTINGS = {"off": "0", "on": "1"}


def worker(epochs: int, only: str) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT))
    import tune
    from tensorflow.python.util import _pywrap_util_port

    wanted = [text.strip().lower() for text in only.split(",")]
    rates = {}
    for name, build, x, y, batch_size, loss in tune.models(quick=True):
        if any(text in name.lower() for text in wanted):
            rates[name] = tune.plain(build, x, y, batch_size, loss, epochs)[0]
    print(json.dumps({"onednn": bool(_pywrap_util_port.IsMklEnabled()), "rates": rates}))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated texts: only the models whose name has one")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.epochs, args.only)
    best: dict[str, dict[str, float]] = {setting: {} for setting in SETTINGS}
    for _ in range(args.rounds):
        for setting, value in SETTINGS.items():
            done = subprocess.run(
                [sys.executable, __file__, "--worker", "--epochs", str(args.epochs), "--only", args.only],
                capture_output=True, text=True, check=False,
                env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": value, "TF_CPP_MIN_LOG_LEVEL": "3"})
            if done.returncode:
                raise RuntimeError(f"oneDNN {setting} failed:\n{done.stderr[-3000:]}")
            report = json.loads(done.stdout.strip().splitlines()[-1])
            if report["onednn"] != (value == "1"):
                raise RuntimeError(f"TF_ENABLE_ONEDNN_OPTS={value} did not take effect (this TensorFlow build?)")
            for name, rate in report["rates"].items():
                best[setting][name] = max(rate, best[setting].get(name, 0.0))
    print(f"plain model.fit, float32, {args.epochs} epochs, best of {args.rounds} process(es) per setting\n")
    print("| model | oneDNN off: samples/s | oneDNN on: samples/s | on / off |")
    print("|---|---:|---:|---:|")
    for name, off in best["off"].items():
        on = best["on"][name]
        print(f"| {name} | {off:,.0f} | {on:,.0f} | {on / off:.2f}x |")
    return best


if __name__ == "__main__":
    main()
