"""Does `tune=` find the fastest plan, and does the whole call pay for itself?

For each model, in one run: plain `model.fit` (float32, Keras defaults) and
`kerasfast.fit` with `tune="off"` (the rules) and `tune="auto"` (its default,
with its own budget: 10% of the run's estimated time) on a run sized to last
about `--seconds` under plain Keras, timing each whole call (plan, tuning,
model rebuild, compilation and training).

The oracle is the best plan an expert could pick by hand: every candidate
of the tuning grid is forced with `tune="off"` for the same number of
epochs as the whole calls. The best of the grid and auto's own plan are
then run again, alternately, `--confirm` times each, and "auto / oracle"
compares their means: taking the single best of ten noisy runs would
otherwise favour whichever candidate was lucky. Rates are steady-state
samples/s after the first (compiling) execution. The rules' call and the
tuned call are also made alternately `--confirm` times each (every tuned
call with an empty cache, so each one tunes); "tuning" is the mean tuned
call's extra seconds over the mean rules' call, as a share of the plain run,
and "tuning, as the plan says" the mean of the plan's own `tuning_seconds`
(tuning's time less the compilation training reuses), free of the noise
between two whole calls.

    python benchmarks/tune.py [--quick] [--seconds 20] [--confirm 2] [--only NAME[,NAME]] [--no-oracle]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's kerasfast, not an installed one: a worktree measures its own code

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kerasfast  # noqa: E402
from kerasfast.plan import candidate_plans  # noqa: E402
from kerasfast.quickstart import digits_convnet  # noqa: E402
from kerasfast.recipes import load_recipe  # noqa: E402
from kerasfast.training.throughput import ThroughputMeter, samples_counter  # noqa: E402
from tests.kerasio_models import build_text_transformer  # noqa: E402

SPARSE_CE = keras.losses.SparseCategoricalCrossentropy(from_logits=False)
LOGITS_CE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def models(quick: bool):
    """(name, build, x, y, batch_size, loss) for each benchmark model."""
    rng = np.random.default_rng(0)
    n = 1024 if quick else 4096
    (x_digits, y_digits), _ = kerasfast.datasets.digits(test_fraction=0.0)
    images = rng.random((n // 2, 32, 32, 3), dtype=np.float32)
    labels = rng.integers(0, 10, n // 2).astype("int32")
    series = rng.normal(size=(n, 32, 16)).astype("float32")
    series_y = (series[:, -1, 0] > 0).astype("int32")
    table = rng.normal(size=(4 * n, 30)).astype("float32")
    table_y = (table[:, :3].sum(axis=1) > 0).astype("int32")
    image, tabular, text, gpt = (load_recipe(name) for name in ("image_classification", "tabular",
                                                               "text_classification", "gpt"))
    (x_text, y_text), _, packages = text.stdlib_chunks(128, 100 if quick else 300, 10)
    seq_len = 64
    (x_gpt, y_gpt), _ = gpt.corpus_arrays(gpt.corpus_files(), seq_len, max_bytes=(32 if quick else 128) * seq_len * 32)
    # keras.io's "Text classification with Transformer" at its own sizes (20,000-word vocabulary, 200 tokens,
    # embedding and feed-forward 32, batch 32); reviews are random word ids labelled by a word count.
    reviews = rng.integers(1, 20_000, size=(n, 200)).astype("int32")
    review_labels = ((reviews < 10_000).sum(axis=1) > 100).astype("int32")

    def cnn():
        layers = [keras.Input((32, 32, 3))]
        for filters in (32, 64, 128):
            layers += [keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
                       keras.layers.Conv2D(filters, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D()]
        return keras.Sequential(layers + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])

    def lstm():
        return keras.Sequential([keras.Input((32, 16)), keras.layers.LSTM(64), keras.layers.Dense(2)])

    def mobilenet():
        return keras.applications.MobileNetV3Small(input_shape=(32, 32, 3), weights=None, classes=10,
                                                   include_preprocessing=False, classifier_activation=None)

    return [
        ("digits convnet", digits_convnet, x_digits, y_digits, 64, SPARSE_CE),
        ("6-conv CNN 32x32x3", cnn, images, labels, 128, LOGITS_CE),
        ("LSTM (32 steps x 16)", lstm, series, series_y, 64, LOGITS_CE),
        ("tabular MLP (recipe)", lambda: tabular.build_mlp(table, table_y, 2), table, table_y, 256, SPARSE_CE),
        ("MobileNetV3-Small 32x32", mobilenet, images, labels, 64, LOGITS_CE),
        ("small ResNet (image recipe)", lambda: image.small_resnet((8, 8, 1), 10), x_digits, y_digits, 64,
         SPARSE_CE),
        ("text encoder (text recipe)", lambda: text.text_encoder(128, len(packages)), x_text, y_text, 64, SPARSE_CE),
        ("keras.io text transformer (200 tokens)", lambda: build_text_transformer(20_000, 200, 32, 32), reviews,
         review_labels, 32, SPARSE_CE),
        ("GPT (gpt recipe, 64 tokens)", lambda: gpt.build_gpt(seq_len=seq_len), x_gpt.astype("int32"),
         y_gpt.astype("int32"), 32, LOGITS_CE),
    ]


def plain(build, x, y, batch_size, loss, epochs):
    keras.utils.set_random_seed(0)
    started = time.perf_counter()
    model = build()
    model.compile("adam", loss)
    meter = ThroughputMeter(samples_counter(batch_size, len(x)), -(-len(x) // batch_size))
    model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, callbacks=[meter])
    return meter.result().samples_per_second, time.perf_counter() - started


def fast(build, x, y, batch_size, loss, epochs, **options):
    keras.utils.set_random_seed(0)
    started = time.perf_counter()
    result = kerasfast.fit(build, x, y, batch_size=batch_size, epochs=epochs, loss=loss, optimizer="adam",
                           run_dir=False, verbose=0, **options)
    return result.throughput.samples_per_second, time.perf_counter() - started, result


def plan_options(plan) -> dict:
    """The `fit` overrides that force `plan`'s tuned fields."""
    return {"precision": plan.precision, "jit_compile": plan.jit_compile,
            "steps_per_execution": plan.steps_per_execution}


def describe(options: dict) -> str:
    return f"{options['precision']}, jit={options['jit_compile']}, spe={options['steps_per_execution']}"


def oracle(build, x, y, batch_size, loss, epochs, rules, auto, hardware, confirm):
    """(best grid plan's options, its mean rate, auto's plan's mean rate)
    from alternating re-runs of the grid's best and auto's plan."""
    grid = candidate_plans(rules.plan, hardware, kerasfast.plan.ModelFacts(), kerasfast.plan.RunFacts(),
                           mode="auto")
    rates = {describe(plan_options(rules.plan)): rules.throughput.samples_per_second}
    for candidate in grid[1:]:
        options = plan_options(candidate)
        rates[describe(options)] = fast(build, x, y, batch_size, loss, epochs, tune="off", **options)[0]
    best = max(grid, key=lambda plan: rates[describe(plan_options(plan))])
    best_options, auto_options = plan_options(best), plan_options(auto.plan)
    if best_options == auto_options:  # auto picked the oracle: nothing to confirm
        return best_options, rates[describe(best_options)], rates[describe(best_options)]
    best_rates, auto_rates = [], []
    for _ in range(confirm):
        best_rates.append(fast(build, x, y, batch_size, loss, epochs, tune="off", **best_options)[0])
        auto_rates.append(fast(build, x, y, batch_size, loss, epochs, tune="off", **auto_options)[0])
    return best_options, float(np.mean(best_rates)), float(np.mean(auto_rates))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="length of the plain-Keras run the whole calls are compared on")
    parser.add_argument("--confirm", type=int, default=2,
                        help="alternating re-runs of the grid's best plan and auto's plan")
    parser.add_argument("--budget", type=float, default=None, help="tune_budget_s (default: tune='auto''s own)")
    parser.add_argument("--no-oracle", action="store_true",
                        help="leave out the grid (the oracle columns): the whole calls and rates only")
    parser.add_argument("--only", default="",
                        help="comma-separated texts: run only the models whose name contains one of them")
    args = parser.parse_args(argv)
    import os
    import tempfile

    def fresh_cache():  # every tuned call here measures
        os.environ["KERASFAST_CACHE_DIR"] = tempfile.mkdtemp(prefix="kerasfast-tune-bench-")

    hardware = kerasfast.detect_hardware()
    wanted = [text.strip().lower() for text in args.only.split(",")]
    print(f"Runs of ~{args.seconds:.0f} s of plain Keras; every grid candidate for the same epochs; the grid's best "
          f"and auto's plan re-run alternately {args.confirm} times each.\n")
    print("| model | epochs | plain fit s | rules call s (mean) | auto call s (mean) | auto / plain (whole call) "
          "| plain samples/s | auto call samples/s (mean) | auto / plain | oracle plan | oracle (mean) "
          "| auto's plan (mean) | auto / oracle | tuning s (share) | tuning, as the plan says s (share) | auto's choice |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|")
    for name, build, x, y, batch_size, loss in models(args.quick):
        if not any(text in name.lower() for text in wanted):
            continue
        short_rate, _ = plain(build, x, y, batch_size, loss, 2)
        epochs = max(3, round(args.seconds * short_rate / len(x)))
        plain_rate, plain_s = plain(build, x, y, batch_size, loss, epochs)
        options = {} if args.budget is None else {"tune_budget_s": args.budget}
        rules_calls, auto_calls = [], []
        for _ in range(max(1, args.confirm)):
            rules_calls.append(fast(build, x, y, batch_size, loss, epochs, tune="off"))
            fresh_cache()
            auto_calls.append(fast(build, x, y, batch_size, loss, epochs, tune="auto", **options))
        rules, auto = rules_calls[0][2], auto_calls[0][2]
        rules_s = float(np.mean([seconds for _, seconds, _ in rules_calls]))
        auto_s = float(np.mean([seconds for _, seconds, _ in auto_calls]))
        auto_rate = float(np.mean([rate for rate, _, _ in auto_calls]))
        own_s = float(np.mean([result.plan.tuning_seconds or 0.0 for _, _, result in auto_calls]))
        if args.no_oracle:
            oracle_columns = "— | — | — | —"
        else:
            best, best_rate, auto_plan_rate = oracle(build, x, y, batch_size, loss, epochs, rules, auto, hardware,
                                                     args.confirm)
            oracle_columns = (f"{describe(best)} | {best_rate:,.0f} | {auto_plan_rate:,.0f} | "
                              f"{auto_plan_rate / best_rate:.2f}x")
        choices = " / ".join(dict.fromkeys(
            describe(plan_options(result.plan)) + ("" if result.plan.tuning else " (not tuned)")
            for _, _, result in auto_calls))
        print(f"| {name} | {epochs} | {plain_s:.1f} | {rules_s:.1f} | {auto_s:.1f} | {plain_s / auto_s:.2f}x | "
              f"{plain_rate:,.0f} | {auto_rate:,.0f} | {auto_rate / plain_rate:.2f}x | {oracle_columns} "
              f"| {auto_s - rules_s:.1f} ({(auto_s - rules_s) / plain_s:.0%}) | {own_s:.1f} ({own_s / plain_s:.0%}) | "
              f"{choices} |", flush=True)


if __name__ == "__main__":
    main()
