"""The learning-rate range test: which learning rate to train with, measured.

`find_learning_rate` trains the model for up to `num_steps` steps while the
learning rate grows exponentially from `min_lr` to `max_lr` (Leslie Smith,
"Cyclical Learning Rates for Training Neural Networks", 2017; fastai's
`lr_find`, Lightning's `Tuner.lr_find`), records the loss of every step,
stops once the loss diverges, and then gives the model back exactly as it
was: weights, optimizer, metrics and compile settings bit-identical.

The suggestion rule (in full in `find_learning_rate`'s docstring): the rate
where the smoothed loss falls fastest per decade of learning rate, within
two decades below the rate with the lowest smoothed loss, and no more than a
tenth of that rate (so also below a tenth of where it diverged). The steepest
descent alone is Lightning's rule; the search span keeps it from picking a
dip of batch noise early in the sweep, and the cap keeps it clear of
divergence where the smoothing's lag pushes the steepest point late.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import pathlib

import keras
import numpy as np

from kerasfast._atomic import replace_durably
from kerasfast import _compat
from kerasfast.distribute.strategy import scope_of
from kerasfast.errors import ModelError, PlanError, RunFolderError
from kerasfast.runs import write_json
from kerasfast.training import optimizers
from kerasfast.training.inputs import check_inputs_match, prepare_data

# A tenth of the rate with the lowest loss is the classic rule of thumb
# (fastai's "minimum / 10"); used here as a cap.
CAP_FRACTION = 0.1
# The first steps run at rates too small to move the loss, and the smoothed
# loss is still an average of few batches: its slopes there are batch-to-batch
# noise. Skipped: a tenth of the steps, at least 10 (Lightning skips the first
# 10 of 100), at most a third.
SKIP_FRACTION = 0.1
SKIP_MIN = 10
# The steepest descent is looked for within this factor below the rate with
# the lowest loss: where the loss falls into its minimum. Further down, the
# smoothed loss is an average of few batches (its weight on each new batch is
# about 1/step), so batch-to-batch noise there outweighs the real descent
# later on (measured: the unrestricted rule, Lightning's, picked ~1e-6 in 5
# of 24 linear-regression runs whose stability limit was 0.3 to 0.4).
SEARCH_SPAN = 100.0
PLOT_FILE = "lr_find.png"
CURVE_FILE = "lr_find.json"
_WHAT = "find_learning_rate data"

@dataclasses.dataclass(frozen=True)
class LearningRateFinding:
    """What a learning-rate range test measured and what it suggests.

    Attributes:
        learning_rates: The rate of each step run, increasing.
        losses: The smoothed loss after each step (exponentially weighted,
            bias-corrected); the last one is the divergent step when the
            test stopped early.
        raw_losses: Each step's own training loss.
        suggestion: The suggested learning rate, or None when the curve
            gives none (`reason` says why and what to change).
        reason: One sentence explaining the suggestion.
        diverged_at: The rate at which the loss diverged (the test stopped
            there), or None when it ran all its steps.
        plot_path: The PNG of the curve, or None when no `run_dir` was given.
    """

    learning_rates: tuple = dataclasses.field(repr=False)
    losses: tuple = dataclasses.field(repr=False)
    raw_losses: tuple = dataclasses.field(repr=False)
    suggestion: float | None
    reason: str
    diverged_at: float | None = None
    plot_path: pathlib.Path | None = None

    def summary(self) -> dict:
        """The finding as JSON-ready data (what `lr_find.json` holds)."""
        return {"suggestion": self.suggestion, "reason": self.reason, "diverged_at": self.diverged_at,
                "learning_rates": list(self.learning_rates), "losses": list(self.losses),
                "raw_losses": list(self.raw_losses)}


def find_learning_rate(model, x, y=None, *, batch_size: int | None = None, loss=None, optimizer=None,
                       min_lr: float = 1e-7, max_lr: float = 10.0, num_steps: int = 100, run_dir=None,
                       sample_weight=None, class_weight=None, shuffle: bool = True, seed: int | None = None,
                       smoothing: float = 0.98, diverge_factor: float = 4.0) -> LearningRateFinding:
    """Runs a learning-rate range test on `model` and suggests a learning rate.

    Trains for up to `num_steps` steps with the learning rate growing
    exponentially from `min_lr` to `max_lr` (one rate per step, the last
    step at `max_lr`), records each step's loss and its exponentially
    weighted, bias-corrected average (`smoothing` is the weight of the past),
    and stops early when that smoothed loss exceeds `diverge_factor` times
    the lowest one so far, or a loss is NaN/infinite. Then everything is put
    back: the model's variables (weights, normalisation statistics, random
    seed states), its optimizer and metrics, and its compile settings are
    bit-identical to what they were before the call.

    The test trains with a fresh copy of the optimizer (same class and
    settings; the model's compiled one, else `optimizer=`, else Adam), as a
    new training run would start, with its learning rate set each step. A
    learning-rate schedule on the optimizer is ignored during the test: use
    the suggestion as the schedule's peak rate. The model's compiled loss is
    used unless `loss=` is given; compiled metrics are not computed.

    Suggestion rule: skip the first tenth of the steps, at least 10 and at
    most a third (their rates are too small to move the loss and the smoothed
    loss still averages few batches, so their slopes are noise) and the
    divergent step; take the rate where the smoothed loss falls fastest per
    unit of log learning rate (the steepest negative slope, as Lightning's
    `lr_find`) within the two decades below the rate with the lowest
    smoothed loss (further down, batch noise in the barely smoothed early
    curve can out-slope the real descent); cap it at a tenth of the rate
    with the lowest smoothed loss (fastai's "minimum / 10"; that rate lies
    below the divergence point, so the cap is also below a tenth of where
    the loss diverged). No suggestion
    (None, with the reason) when the loss never decreases or diverges within
    the first few steps. For plain gradient descent on a quadratic loss this
    lands below the stability limit 2 / (largest Hessian eigenvalue); tests
    check it.

    Args:
        model: A Keras model (compiled or not; an unbuilt one is built first,
            as `fit` would).
        x, y, sample_weight, class_weight, batch_size, shuffle, seed: The
            training data, in any form `kerasfast.fit` takes (arrays, dicts
            by input name, a `tf.data.Dataset`, a `PyDataset`, a generator,
            TFRecords). Data shorter than `num_steps` batches is repeated
            (a one-shot generator cannot be, and is refused when it runs out).
        loss: A loss for the test (None: the model's compiled loss).
        optimizer: An optimizer (object or name) whose class and settings the
            test copies (None: the model's compiled one, else Adam).
        min_lr, max_lr: The first and last learning rate of the sweep.
        num_steps: The most steps to run (at least 10; 100 is typical).
        run_dir: Folder to write `lr_find.png` (the log-x loss curve with the
            suggestion marked; needs matplotlib) and `lr_find.json` (the
            curve) into; None or False: write nothing.
        smoothing: Weight of the past in the smoothed loss, in [0, 1).
        diverge_factor: Stop once the smoothed loss exceeds this many times
            the lowest smoothed loss so far (> 1).

    Returns:
        A `LearningRateFinding`: `suggestion`, `reason`, the curve
        (`learning_rates`, `losses`, `raw_losses`), `diverged_at`, `plot_path`.

    Raises:
        PlanError: For bad arguments, a model with no loss, or a one-shot
            generator that runs out before `num_steps` batches.
        ModelError: When `model` is not a Keras model.
        DataError: For data that cannot be used (as `kerasfast.fit`).
        RunFolderError: When `run_dir`'s files cannot be written.

    Example:

    >>> x = np.random.default_rng(0).normal(size=(512, 4)).astype("float32")
    >>> y = x @ np.array([1.0, -2.0, 3.0, 0.5], "float32")
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> finding = kerasfast.find_learning_rate(model, x, y, loss="mse", batch_size=32, run_dir="lr")
    >>> print(finding.reason)  # the rates depend on the data and the machine
    steepest descent of the smoothed loss at ...
    >>> result = kerasfast.fit(model, x, y, loss="mse", learning_rate=finding.suggestion, run_dir=False, verbose=0)
    >>> result.plan.learning_rate == finding.suggestion
    True
    """
    _check_arguments(batch_size, min_lr, max_lr, num_steps, smoothing, diverge_factor)
    if not isinstance(model, keras.Model):
        raise ModelError(f"find_learning_rate needs a keras.Model, got a {type(model).__name__}.")
    folder = None if run_dir is None or run_dir is False else pathlib.Path(run_dir)
    if folder is not None and importlib.util.find_spec("matplotlib") is None:
        raise PlanError(
            f"run_dir={os.fspath(folder)!r} asks for the plot lr_find.png, which needs matplotlib: "
            "pip install matplotlib (or kerasfast[recipes]), or pass run_dir=None for no files."
        )
    settings = _compile_settings(model, loss, optimizer, min_lr)
    prepared = prepare_data(x, y, sample_weight, batch_size=batch_size, class_weight=class_weight,
                            shuffle=shuffle, seed=seed, what=_WHAT, repeat=True)
    check_inputs_match(model, prepared.sample_inputs, _WHAT)
    rates = min_lr * (max_lr / min_lr) ** (np.arange(num_steps) / (num_steps - 1))
    strategy = getattr(model, "distribute_strategy", None)
    with scope_of(strategy):
        with _borrowed(model, settings, prepared.sample_batch):
            batches = _repeated(prepared.dataset, one_shot=_is_one_shot(x))
            raw, smoothed, stopped = _sweep(model, batches, rates, smoothing, diverge_factor)
    if len(raw) < num_steps and not stopped:
        raise PlanError(
            f"the data gave only {len(raw)} batches but num_steps={num_steps} needs {num_steps}: pass "
            f"num_steps={len(raw)} or fewer, or data that can be repeated (arrays, a tf.data.Dataset, a "
            "keras.utils.PyDataset) instead of a one-shot generator."
        )
    rates = rates[:len(raw)]
    suggestion, reason = suggest(rates, smoothed, diverged=stopped, num_steps=num_steps)
    finding = LearningRateFinding(
        learning_rates=tuple(float(r) for r in rates), losses=tuple(smoothed), raw_losses=tuple(raw),
        suggestion=suggestion, reason=reason, diverged_at=float(rates[-1]) if stopped else None,
    )
    if folder is not None:
        try:
            write_json(folder / CURVE_FILE, finding.summary())
            finding = dataclasses.replace(finding, plot_path=plot_finding(finding, folder / PLOT_FILE))
        except OSError as error:
            raise RunFolderError(
                f"could not write {error.filename}: {error.strerror or error}. The model is already restored; free "
                "space or fix permissions there, or pass another run_dir= (None: no files)."
            ) from error
    return finding


def _check_arguments(batch_size, min_lr, max_lr, num_steps, smoothing, diverge_factor) -> None:
    def number(value) -> bool:
        return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool) \
            and math.isfinite(value)

    if batch_size is not None and (not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool)
                                   or batch_size < 1):
        raise PlanError(f"batch_size={batch_size!r}: pass a positive integer (or None for the data's own / 32).")
    if not number(min_lr) or min_lr <= 0:
        raise PlanError(f"min_lr={min_lr!r}: pass a positive, finite learning rate, e.g. min_lr=1e-7.")
    if not number(max_lr) or max_lr <= min_lr:
        raise PlanError(f"max_lr={max_lr!r}: pass a finite learning rate above min_lr={min_lr!r}, e.g. max_lr=10.0.")
    if not isinstance(num_steps, (int, np.integer)) or isinstance(num_steps, bool) or num_steps < 10:
        raise PlanError(f"num_steps={num_steps!r}: pass an integer of at least 10 (100 is typical), so that the "
                        "loss curve has a slope to read.")
    if not number(smoothing) or not 0 <= smoothing < 1:
        raise PlanError(f"smoothing={smoothing!r}: pass the weight of the past in [0, 1), e.g. 0.98 (0: no smoothing).")
    if not number(diverge_factor) or diverge_factor <= 1:
        raise PlanError(f"diverge_factor={diverge_factor!r}: pass a number above 1, e.g. 4.0 (stop at 4x the lowest "
                        "smoothed loss).")


def _compile_settings(model, loss, optimizer, min_lr: float) -> dict:
    """The `compile` arguments of the test: the model's own, with the given
    loss, a fresh optimizer at `min_lr` and no metrics (not needed, and it
    keeps the user's metric objects out of the test)."""
    settings = _compat.compile_config(model)
    if _compat.overridden_step(model, "compile") is not None and not model.compiled:
        raise PlanError(f"{_compat.overridden_step(model, 'compile')} must be called before "
                        "find_learning_rate (as before model.fit).")
    if loss is not None:
        settings["loss"] = loss
    if settings.get("loss") is None and _compat.overridden_step(model, "train_step") is None \
            and not _compat.layers_add_losses(model):
        raise PlanError("no loss: the model is not compiled with one and find_learning_rate got no loss=. Pass loss= "
                        "(e.g. loss='sparse_categorical_crossentropy') or compile the model first.")
    template = optimizer if optimizer is not None else settings.get("optimizer")
    try:
        template = keras.optimizers.get(template) if isinstance(template, (str, dict)) else template
    except ValueError as error:
        raise PlanError(f"optimizer={optimizer!r}: {error} Pass a Keras optimizer (object or name, e.g. 'adam').") \
            from error
    template = optimizers.unwrap(template) if template is not None else keras.optimizers.Adam()
    if not isinstance(template, keras.optimizers.Optimizer):
        raise PlanError(f"optimizer={optimizer!r}: pass a Keras optimizer (object or name, e.g. 'adam').")
    try:
        # A constant rate replaces any schedule: the test drives the rate.
        fresh = type(template).from_config({**template.get_config(), "learning_rate": float(min_lr)})
    except (TypeError, ValueError, KeyError) as error:
        raise PlanError(
            f"cannot make a fresh copy of the {type(template).__name__} optimizer for the test ({error}): give it a "
            "get_config() that from_config() accepts, or pass optimizer= a Keras optimizer with the same settings."
        ) from error
    settings.update(optimizer=fresh, metrics=None, weighted_metrics=None, steps_per_execution=1)
    settings.setdefault("jit_compile", "auto")
    return settings


def _is_one_shot(x) -> bool:
    """A Python generator / iterator: it can be read only once."""
    return hasattr(x, "__next__") and not isinstance(x, keras.utils.PyDataset)


def _repeated(dataset, *, one_shot: bool):
    """Endless batches: arrays come as an endless stream already, other data
    is repeated here. A one-shot generator is not: repeated, Keras's adapter
    would replay only the batches it peeked at, so it simply ends."""
    import tensorflow as tf

    if one_shot or int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY:
        return dataset
    return dataset.repeat()


@contextlib.contextmanager
def _borrowed(model, settings: dict, sample_batch):
    """Compiles `model` for the test inside the block; afterwards its compile
    settings, variables and metric values are exactly as before."""
    metric_values = _values(model.metrics_variables)
    saved = {name: model.__dict__[name] for name in _compat.COMPILE_STATE if name in model.__dict__}
    saved_dependencies = _compile_dependencies(model)
    own_step = _compat.overridden_step(model, "train_step") is not None
    values = []
    try:
        # Keras's own compile even for a model overriding it: the test only
        # swaps in its loss and optimizer; a custom compile's extras stay.
        keras.Model.compile(model, **settings)
        model.__dict__["_compile_metrics"] = None  # compile keeps the old ones when given none
        _compat.build_state(model, sample_batch)
        variables = list(model.variables)
        if own_step:
            # A custom train_step may train optimizers of its own.
            for optimizer in optimizers.own_optimizers(model).values():
                if optimizer.built:
                    variables += list(optimizer.variables)
        values = _values(variables)
        yield
    finally:
        for name in _compat.COMPILE_STATE:
            if name in saved:
                model.__dict__[name] = saved[name]
            else:
                model.__dict__.pop(name, None)
        _restore_compile_dependencies(model, saved_dependencies)
        for variable, value in values + metric_values:
            variable.assign(value)


def _compile_dependencies(model) -> tuple[list, dict]:
    """TensorFlow's checkpoint dependencies of `model` named like compile
    state: compile records the optimizer there, and a later
    `tf.train.Checkpoint(model=...)` would save the test's copy."""
    references = model.__dict__.get(_compat.CHECKPOINT_DEPENDENCY_STATE[0]) or []
    names = model.__dict__.get(_compat.CHECKPOINT_DEPENDENCY_STATE[1]) or {}
    return ([reference for reference in references if reference.name in _compat.COMPILE_STATE],
            {name: value for name, value in names.items() if name in _compat.COMPILE_STATE})


def _restore_compile_dependencies(model, saved: tuple[list, dict]) -> None:
    """Puts back the compile-state dependencies only: any other ones (e.g.
    variables a subclassed model's build created during the test) stay."""
    references, names = model.__dict__.get(_compat.CHECKPOINT_DEPENDENCY_STATE[0]), model.__dict__.get(_compat.CHECKPOINT_DEPENDENCY_STATE[1])
    saved_references, saved_names = saved
    if references is not None:
        old = {reference.name: reference for reference in saved_references}
        kept = [old.pop(reference.name, None) if reference.name in _compat.COMPILE_STATE else reference
                for reference in references]
        references[:] = [reference for reference in kept if reference is not None] + list(old.values())
    if names is not None:
        for name in [name for name in names if name in _compat.COMPILE_STATE]:
            del names[name]
        names.update(saved_names)


def _values(variables) -> list:
    return [(variable, np.array(variable.numpy(), copy=True)) for variable in variables]


def _sweep(model, dataset, rates, smoothing: float, diverge_factor: float):
    """Runs one step per rate; returns (raw losses, smoothed losses, diverged)."""
    import tensorflow as tf

    inner = optimizers.unwrap(model.optimizer)
    raw, smoothed = [], []
    average, best = 0.0, math.inf
    # Keras's own train function on a dataset iterator, one batch per call
    # (steps_per_execution is 1): train_step gets each batch as fit gives it.
    model.make_train_function()
    batches = iter(dataset.take(len(rates)))
    for step, rate in enumerate(rates):
        inner.learning_rate = float(rate)
        model.reset_metrics()  # the loss tracker then holds this step's loss only
        try:
            logs = model.train_function(batches)
        except (StopIteration, tf.errors.OutOfRangeError):  # the data ran out (a generator's end)
            break
        if "loss" not in logs:
            raise PlanError(f"the model's train step returned no 'loss' (it returned {sorted(logs)}): the range test "
                            "reads the loss; return it from train_step as Keras's does.")
        loss = float(np.mean(keras.ops.convert_to_numpy(logs["loss"])))
        average = smoothing * average + (1 - smoothing) * loss
        value = average / (1 - smoothing ** (step + 1))  # bias correction: no pull towards the initial 0
        raw.append(loss)
        smoothed.append(value)
        if not math.isfinite(loss) or not math.isfinite(value):
            return raw, smoothed, True
        # The multiple of the lowest loss, measured from it so that a
        # negative loss (allowed in Keras) does not count as divergence.
        if step > 0 and value > best + (diverge_factor - 1) * abs(best):
            return raw, smoothed, True
        best = min(best, value)
    return raw, smoothed, False


def suggest(learning_rates, losses, *, diverged: bool, num_steps: int | None = None) -> tuple[float | None, str]:
    """The suggestion rule of `find_learning_rate`, on a recorded curve.

    Args:
        learning_rates: The increasing rates of the steps.
        losses: The smoothed loss after each step.
        diverged: Whether the last step is the one where the loss diverged
            (it is left out of the slopes).
        num_steps: The steps the test could have run (for the sentence).

    Returns:
        `(suggestion or None, a sentence saying why)`.

    Example:

    >>> rates = np.geomspace(1e-4, 1.0, 40)
    >>> suggest(rates, 1 / (1 + 30 * rates), diverged=False)[0] < 0.1
    True
    """
    rates = np.asarray(learning_rates, dtype="float64")
    losses = np.asarray(losses, dtype="float64")
    total = num_steps or len(rates)
    usable = len(rates) - 1 if diverged else len(rates)
    if diverged:
        ending = f"the loss diverged at {_rate(rates[-1])} after {len(rates)} of {total} steps"
    else:
        ending = f"the loss did not diverge up to {_rate(rates[-1])} in {len(rates)} steps"
    skip = min(max(SKIP_MIN, int(SKIP_FRACTION * total)), total // 3)
    if usable - skip < 3:
        return None, (f"no suggestion: {ending}, too early to read a slope; lower min_lr (or raise num_steps) so that "
                      "the loss has steps to fall before it diverges.")
    window_rates, window = rates[skip:usable], losses[skip:usable]
    lowest = int(np.argmin(window))
    slopes = np.gradient(window, np.log(window_rates))
    # The descent into the minimum, not a dip of batch noise decades before it.
    first = int(np.searchsorted(window_rates, window_rates[lowest] / SEARCH_SPAN))
    steepest = first + int(np.argmin(slopes[first:lowest + 1]))
    if slopes[steepest] >= 0 or lowest == 0:
        return None, (f"no suggestion: the smoothed loss did not fall between {_rate(window_rates[0])} and "
                      f"{_rate(window_rates[-1])} ({ending}); lower min_lr if it was already rising, else check that "
                      "the model can learn from this data (loss, labels, a frozen model).")
    # The lowest loss comes before any divergence, so this also caps the
    # suggestion below a tenth of where the loss diverged.
    cap = CAP_FRACTION * window_rates[lowest]
    cap_what = f"the rate with the lowest smoothed loss, {_rate(window_rates[lowest])}"
    if window_rates[steepest] <= cap:
        return float(window_rates[steepest]), (
            f"steepest descent of the smoothed loss at {_rate(window_rates[steepest])}, within a tenth of "
            f"{cap_what}; {ending}.")
    return float(cap), (
        f"{_rate(cap)}, a tenth of {cap_what}: the steepest descent of the smoothed loss, at "
        f"{_rate(window_rates[steepest])}, lies above that cap; {ending}.")


def _rate(value: float) -> str:
    """A learning rate as "3.2e-3"."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def plot_finding(finding: LearningRateFinding, path: str | os.PathLike) -> pathlib.Path:
    """Writes the range test's loss curve (log-x) with the suggestion marked as a PNG.

    Uses a bare matplotlib `Figure`, so the caller's pyplot backend and
    figures are left alone.

    Returns:
        The path written.
    """
    from matplotlib.figure import Figure

    rates = np.asarray(finding.learning_rates)
    raw = np.asarray(finding.raw_losses, dtype="float64")
    smoothed = np.asarray(finding.losses, dtype="float64")
    figure = Figure(figsize=(6, 4))
    axis = figure.add_subplot()
    shown = np.isfinite(raw)
    axis.plot(rates[shown], raw[shown], color="0.75", linewidth=1, label="loss of each step")
    shown = np.isfinite(smoothed)
    axis.plot(rates[shown], smoothed[shown], color="C0", linewidth=2, label="smoothed loss")
    kept = slice(None, -1) if finding.diverged_at is not None else slice(None)
    before = smoothed[kept][np.isfinite(smoothed[kept])]
    if before.size:
        # The divergent tail would squash the part of the curve that matters.
        lowest = min(float(before.min()), float(np.nanmin(np.where(np.isfinite(raw[kept]), raw[kept], np.nan))))
        span = float(before.max()) - lowest or abs(float(before.max())) or 1.0
        axis.set_ylim(lowest - 0.05 * span, float(before.max()) + 0.25 * span)
    if finding.diverged_at is not None:
        axis.axvline(finding.diverged_at, color="0.4", linestyle=":", label=f"diverged, {_rate(finding.diverged_at)}")
    if finding.suggestion is not None:
        axis.axvline(finding.suggestion, color="C3", linestyle="--", label=f"suggestion, {_rate(finding.suggestion)}")
    axis.set_xscale("log")
    axis.set_xlabel("learning rate")
    axis.set_ylabel("training loss")
    axis.set_title("learning-rate range test")
    axis.legend()
    figure.tight_layout()
    path = pathlib.Path(path)
    return replace_durably(path, lambda temporary: figure.savefig(temporary, format="png", dpi=100))
