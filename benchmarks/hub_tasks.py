"""keras-hub tasks with their preprocessors: `task.fit` vs `kerasfast.fit`, each in a process of its own.

The fine-tuning recipe's models (recipes/finetune.py, without --smoke): a BERT text classifier and a GPT-2
causal LM on raw strings of the standard library, and a ResNet image classifier on raw uint8 images its
preprocessor resizes; each trained from the same initial weights and data by keras-hub's own `task.fit`
(its preprocessing mapped over every batch in its own tf.data pipeline; TensorFlow's own oneDNN default, as
in a script without kerasfast), by `task.fit` tuned by hand (the data preprocessed once with
`task.preprocessor(x, y)`, then `preprocessor=None`, and oneDNN on with TF_ENABLE_ONEDNN_OPTS=1: what an
expert does without kerasfast) and by `kerasfast.fit(task, ...)` (auto plan). Each
side runs in a fresh process, alternating, so one does not warm the other; the best of `--rounds` of each is
kept. "steady" is samples/s after the first execution (a ThroughputMeter callback on both sides), "whole"
the seconds of the fit call, first step and compilation included.

    python benchmarks/hub_tasks.py [--rounds 2] [--epochs 3] [--only bert,gpt2,resnet]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = ("bert", "gpt2", "resnet")
SIDES = ("task.fit", "by hand", "kerasfast.fit")


def _task_and_data(name: str):
    import keras
    import keras_hub
    import numpy as np

    from kerasfast import recipes

    finetune = recipes.load_recipe("finetune")
    keras.utils.set_random_seed(0)
    if name == "bert":
        (x, y), _ = finetune.package_texts(600)
        return finetune.classifier(x, len(finetune.PACKAGES), 64, None, smoke=False), x, y, 32
    if name == "gpt2":
        x, _ = finetune.docstrings(2400)
        return finetune.causal_lm(x, 64, None, smoke=False), x, None, 32
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64, 128],
        stackwise_num_blocks=[1, 1], stackwise_num_strides=[1, 2], block_type="basic_block", image_shape=(32, 32, 3))
    preprocessor = keras_hub.models.ResNetImageClassifierPreprocessor(
        keras_hub.layers.ResNetImageConverter(image_size=(32, 32), scale=1 / 255.0))
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, 2048).astype("int32")
    x = rng.integers(0, 256, (2048, 48, 48, 3)).astype("uint8")
    return keras_hub.models.ResNetImageClassifier(backbone, num_classes=10, preprocessor=preprocessor), x, y, 64


def _one_side(name: str, side: str, epochs: int) -> dict:
    """Runs in a child process: one fit, its steady rate and whole time."""
    if side == "task.fit":
        import tensorflow  # noqa: F401 - first: TensorFlow's own oneDNN default, as in a script without kerasfast
    import kerasfast  # first on the other sides: oneDNN on (by hand: TF_ENABLE_ONEDNN_OPTS=1 from the parent)
    from tensorflow.python.util import _pywrap_util_port

    from kerasfast.training.throughput import ThroughputMeter, samples_counter

    task, x, y, batch = _task_and_data(name)
    meter = ThroughputMeter(samples_counter(batch, len(x)))
    start = time.perf_counter()
    if side == "task.fit":
        task.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, callbacks=[meter])
        rate = meter.result().samples_per_second
    elif side == "by hand":  # what an expert does without kerasfast: preprocess once, then fit without it
        import keras
        import tensorflow as tf

        inputs, targets, weights = keras.utils.unpack_x_y_sample_weight(task.preprocessor(tf.constant(x), y))
        task.preprocessor = None
        task.fit(inputs, targets, sample_weight=weights, batch_size=batch, epochs=epochs, verbose=0,
                 callbacks=[meter])
        rate = meter.result().samples_per_second
    else:
        result = kerasfast.fit(task, x, y, batch_size=batch, epochs=epochs, verbose=0, run_dir=False)
        rate = result.throughput.samples_per_second
    return {"steady": rate, "whole": time.perf_counter() - start, "onednn": bool(_pywrap_util_port.IsMklEnabled())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--only", default=",".join(MODELS))
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "SIDE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_one_side(*args.child, args.epochs)))
        return
    from kerasfast.hardware import detect_hardware

    hardware = detect_hardware()
    print(f"machine: {hardware.cpu_model}, {hardware.cpu_cores} cores, flags {', '.join(hardware.cpu_flags) or 'none'}")
    for name in args.only.split(","):
        best = {}
        for _ in range(args.rounds):
            for side in SIDES:
                env = {key: value for key, value in os.environ.items() if key != "TF_ENABLE_ONEDNN_OPTS"}
                if side == "by hand":
                    env["TF_ENABLE_ONEDNN_OPTS"] = "1"
                done = subprocess.run([sys.executable, __file__, "--epochs", str(args.epochs), "--child", name, side],
                                      capture_output=True, text=True, check=True, cwd=ROOT, env=env)
                run = json.loads(done.stdout.strip().splitlines()[-1])
                kept = best.setdefault(side, run)
                best[side] = {"steady": max(kept["steady"] or 0, run["steady"] or 0),
                              "whole": min(kept["whole"], run["whole"]), "onednn": run["onednn"]}
        ours = best["kerasfast.fit"]
        print(f"{name}: " + "; ".join(f"{side} {best[side]['steady']:,.0f} samples/s, {best[side]['whole']:.1f} s whole"
                                      f" (oneDNN {'on' if best[side]['onednn'] else 'off'})" for side in SIDES))
        for side in SIDES[:-1]:
            print(f"  kerasfast.fit vs {side}: steady {ours['steady'] / best[side]['steady']:.2f}x, whole call "
                  f"{best[side]['whole'] / ours['whole']:.2f}x")


if __name__ == "__main__":
    main()
