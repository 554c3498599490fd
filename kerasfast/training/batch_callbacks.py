"""What the user's callbacks need from the plan: which must see every
batch, as `model.fit` shows them, and which set the learning rate.

Keras calls a callback's batch hooks once per execution: with 8 steps per
execution, `on_train_batch_end` runs for every 8th batch, and
`ModelCheckpoint(save_freq=10)` or `TerminateOnNaN` act on what they see.
A run whose callbacks depend on every batch therefore runs one step per
execution (the plan names them); the others keep longer executions.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import re
import textwrap

import keras

from kerasfast.errors import PlanError

# Every hook Keras calls per batch, in training, validation and prediction.
BATCH_HOOKS = (
    "on_batch_begin", "on_batch_end",
    "on_train_batch_begin", "on_train_batch_end",
    "on_test_batch_begin", "on_test_batch_end",
    "on_predict_batch_begin", "on_predict_batch_end",
)
# Keras's own callbacks whose batch hooks only display or record what the
# execution's last batch shows: they lose nothing under longer executions.
DISPLAY_ONLY = (keras.callbacks.ProgbarLogger, keras.callbacks.History)
# Keras's callbacks that set `optimizer.learning_rate` as training goes.
LEARNING_RATE_CALLBACKS = (keras.callbacks.ReduceLROnPlateau, keras.callbacks.LearningRateScheduler)


def per_batch_callbacks(callbacks) -> tuple[str, ...]:
    """Names (with the setting that makes them so) of the callbacks that act
    on every batch.

    Args:
        callbacks: The callbacks passed to fit.

    Returns:
        One entry per such callback, e.g. `"ModelCheckpoint(save_freq=10)"`.

    Example:

    >>> per_batch_callbacks([keras.callbacks.TerminateOnNaN(), keras.callbacks.EarlyStopping()])
    ('TerminateOnNaN(on_batch_end)',)
    """
    return tuple(entry for entry in map(_per_batch, callbacks) if entry)


def learning_rate_callbacks(callbacks) -> tuple[str, ...]:
    """Names of the callbacks that set the optimizer's learning rate as training
    goes (Keras's `ReduceLROnPlateau` and `LearningRateScheduler`, subclasses
    too, and a callback of the user's whose code assigns
    `optimizer.learning_rate`): a planned schedule would fight them, and Keras
    cannot set a schedule.

    Example:

    >>> learning_rate_callbacks([keras.callbacks.ReduceLROnPlateau(), keras.callbacks.EarlyStopping()])
    ('ReduceLROnPlateau',)
    """
    return tuple(type(callback).__name__ for callback in callbacks if _sets_learning_rate(callback))


# An assignment to an optimizer's rate in a callback's code: `.learning_rate = `,
# `.learning_rate.assign(`, `keras.backend.set_value(....learning_rate, ...)` (or `.lr`);
# read from the code's syntax tree (`_RateSetting`), or from its text where that does not parse.
_RATE_NAMES = ("learning_rate", "lr")
_SETS_RATE = re.compile(r"\.(?:learning_rate|lr)\s*=(?!=)|\.(?:learning_rate|lr)\.assign\(|"
                        r"set_value\([^,)]*\.(?:learning_rate|lr)\b|setattr\([^,)]*,\s*[\"'](?:learning_rate|lr)[\"']")


def _sets_learning_rate(callback) -> bool:
    if isinstance(callback, LEARNING_RATE_CALLBACKS):
        return True
    return any(_sets_rate_in(source) for source in map(_source, _code_of(callback)))


def _sets_rate_in(source: str) -> bool:
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        try:  # an indented class whose strings hold unindented lines, which dedent leaves as they are
            tree = ast.parse("if True:\n" + source)
        except SyntaxError:  # a lambda's line, cut out of a call
            return bool(_SETS_RATE.search(source))
    finder = _RateSetting()
    finder.visit(tree)
    return finder.found


class _RateSetting(ast.NodeVisitor):
    """Finds code that sets an optimizer's rate. A method's own attributes
    (`self.lr = ...`: the callback's, whatever its first parameter is called)
    are not an optimizer's."""

    def __init__(self):
        self.found = False
        self._selves: list = []

    def visit_ClassDef(self, node):
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                parameters = item.args.posonlyargs + item.args.args
                static = any(getattr(d, "id", None) == "staticmethod" for d in item.decorator_list)
                self._selves.append(parameters[0].arg if parameters and not static else None)
                self.generic_visit(item)
                self._selves.pop()
            else:
                self.visit(item)

    def _optimizers_rate(self, node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr in _RATE_NAMES
                and not (isinstance(node.value, ast.Name) and node.value.id in self._selves))

    def _assigned(self, targets) -> None:
        for target in targets:
            if isinstance(target, (ast.Tuple, ast.List)):
                self._assigned(target.elts)
            elif self._optimizers_rate(target):
                self.found = True

    def visit_Assign(self, node):
        self._assigned(node.targets)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._assigned([node.target])
        self.generic_visit(node)

    visit_AnnAssign = visit_AugAssign

    def visit_Call(self, node):
        function, arguments = node.func, node.args
        name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
        if name in ("assign", "assign_add", "assign_sub"):
            # `self.lr.assign(...)` too: an attribute holding the optimizer's variable.
            self.found |= isinstance(function.value, ast.Attribute) and function.value.attr in _RATE_NAMES
        elif name == "set_value" and arguments:
            self.found |= isinstance(arguments[0], ast.Attribute) and arguments[0].attr in _RATE_NAMES
        elif name == "setattr" and len(arguments) >= 2 and isinstance(arguments[1], ast.Constant):
            self.found |= arguments[1].value in _RATE_NAMES and not (
                isinstance(arguments[0], ast.Name) and arguments[0].id in self._selves)
        self.generic_visit(node)


def _code_of(callback) -> list:
    """The user's code a callback runs: its classes (not Keras's or
    kerasfast's own), functions set on it (LambdaCallback's hooks), and the
    module-level functions either calls by name (a `set_lr(...)` helper)."""
    own = [kind for kind in type(callback).__mro__
           if kind is not object and not (_keras_own(kind) or kind.__module__.startswith("kerasfast."))]
    own += [value for value in vars(callback).values() if inspect.isfunction(value)]
    functions = [value for part in own for value in vars(part).values() if inspect.isfunction(value)]
    functions += [part for part in own if inspect.isfunction(part)]
    called = []
    for function in functions:
        for name in function.__code__.co_names:
            target = function.__globals__.get(name)
            if inspect.isfunction(target) and not target.__module__.startswith(("keras", "kerasfast")):
                called.append(target)
    return own + called


def _source(code) -> str:
    try:
        return inspect.getsource(code)
    except (OSError, TypeError):  # defined where its source cannot be read (a REPL): not known
        return ""


def _per_batch(callback) -> str | None:
    name = type(callback).__name__
    own = [hook for hook in BATCH_HOOKS if hook in vars(callback)]  # set on the instance: LambdaCallback
    if own:
        return f"{name}({', '.join(own)})"
    if isinstance(callback, (keras.callbacks.ModelCheckpoint, keras.callbacks.BackupAndRestore)):
        return f"{name}(save_freq={callback.save_freq})" if _counts_batches(callback.save_freq) else None
    if isinstance(callback, keras.callbacks.TensorBoard):
        return f"{name}(update_freq={callback.update_freq})" if _tensorboard_per_batch(callback) else None
    if isinstance(callback, DISPLAY_ONLY) and _keras_own(type(callback)):
        return None
    overridden = _overridden_hooks(type(callback))
    return f"{name}({', '.join(overridden)})" if overridden else None


def _counts_batches(save_freq) -> bool:
    return save_freq not in ("epoch", False, None)


def _tensorboard_per_batch(callback) -> bool:
    """TensorBoard counts its calls as batches when it writes or profiles them."""
    return (callback.update_freq != "epoch" or bool(callback.write_steps_per_second)
            or bool(getattr(callback, "_should_trace", False)))


def _keras_own(kind) -> bool:
    return kind.__module__.startswith("keras.")


def _overridden_hooks(kind) -> list[str]:
    """The batch hooks a class defines beyond `keras.callbacks.Callback`'s
    empty ones: Keras's own (TerminateOnNaN) and the user's alike."""
    base = keras.callbacks.Callback
    return [hook for hook in BATCH_HOOKS if getattr(kind, hook) is not getattr(base, hook)]


class RealBatchesProgbar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar counting the batches that really trained.

    Keras numbers an execution of `steps_per_execution` steps as that many
    batches, so over data of unknown length (a `filter()`ed dataset, a
    generator) its bar counts the last, shorter execution as a whole one: 5
    batches under 64 steps per execution show as "64/64", and the time per
    step is divided by 64. This bar counts the steps `steps_done` reports
    instead: "5/5", as `model.fit` shows with one step per execution.

    Args:
        steps_done: `f()` giving the train steps run so far (e.g.
            `StepFunctions.micro_steps`); only its increase within an epoch
            is read.
    """

    def __init__(self, steps_done):
        super().__init__()
        self._steps_done = steps_done
        self._epoch_start = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._steps_done()
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        # Keras's `batch` is the execution's last step as if it were whole.
        super().on_train_batch_end(self._steps_done() - self._epoch_start - 1, logs)


def progress_bars(plan, callbacks, verbose, steps_done) -> list:
    """The progress bar to add to a run's callbacks: `[RealBatchesProgbar]`
    when Keras's own would count whole executions (epochs of unknown length,
    several steps per execution, shown), else `[]` (Keras's own is right, or
    the user gave one).

    Args:
        plan: The run's `Plan`.
        callbacks: The user's callbacks.
        verbose: The `verbose` Keras's `fit` gets.
        steps_done: `f()` giving the train steps run so far, or None (Keras's
            own steps run: their count is Keras's).
    """
    if steps_done is None or verbose == 0 or plan.steps_per_epoch is not None or plan.steps_per_execution <= 1:
        return []
    if any(isinstance(callback, keras.callbacks.ProgbarLogger) for callback in callbacks):
        return []
    return [RealBatchesProgbar(steps_done)]


@contextlib.contextmanager
def rate_setting_errors(plan, backup=None):
    """Keras's TypeError for a callback setting a rate that is a schedule, as
    a `PlanError` naming the callback and the fix: a callback whose code
    `learning_rate_callbacks` could not read (or reach) sets it. A `backup`
    (given for a run that did not resume one) is cleared: the fix changes
    what training computes, so the backup of the epochs this call trained
    could only refuse it."""
    try:
        yield
    except TypeError as error:
        if "not settable" not in str(error):
            raise
        cleared = ""
        if backup is not None and backup.path.is_file():
            backup.clear()
            cleared = (f" The backup in {backup.directory} of the steps trained with the schedule was removed, so "
                       "that the run starts again with it.")
        who = _callback_in(error.__traceback__) or "a callback"
        if plan.lr_schedule == "optimizer's own":
            fix = "your optimizer's learning rate is a schedule, which Keras cannot set: compile with a constant rate"
        else:
            fix = (f"the run's learning rate is the planned schedule lr_schedule={plan.lr_schedule!r}, which sets it "
                   "every step and which Keras cannot set: pass lr_schedule='constant' to leave the rate to it")
        raise PlanError(f"{who} set optimizer.learning_rate, but {fix}.{cleared}") from error


def _callback_in(traceback) -> str | None:
    """The class name of the innermost callback among a traceback's frames."""
    found = None
    while traceback is not None:
        code = traceback.tb_frame.f_code
        # The method's own object, whatever its first parameter is called (`self`, `s`, ...).
        owner = traceback.tb_frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
        if isinstance(owner, keras.callbacks.Callback) and not type(owner).__module__.startswith("kerasfast."):
            found = type(owner).__name__
        traceback = traceback.tb_next
    return found
