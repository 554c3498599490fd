"""Borrowing the user's model for one `kerasfast.fit`, and giving it back as Keras left it.

During a run kerasfast installs its own train / test functions on the
model, sets the plan's steps per execution, detaches the model from the
strategy it was created under (Keras 3.15's symbolic build fails under
MultiWorkerMirroredStrategy, keras issue 20585), may set a learning rate or
clipping on the optimizer (`borrowed()`), and gives the layers the plan's
precision only while a step is traced or, eagerly, runs
(`step_functions.computing_while`). Each makes its changes inside one block and
undoes them when the block ends, successfully or not, so that afterwards
`compile`, `fit`, `evaluate` and `predict` behave exactly as if kerasfast
had never run. What training changes on purpose stays: the weights and the
optimizer's state.

One exception: a model created under MultiWorkerMirroredStrategy stays
detached from it, because with the strategy attached Keras 3.15's own
`evaluate`, `predict` and `fit` fail on their first batch (keras issue
20585). Detached, `model.evaluate(...)` runs on each worker's local devices
(the same figures on every worker), and inside `strategy.scope()` it is
distributed.
"""

from __future__ import annotations

import contextlib
import math

import keras

from kerasfast import _compat
from kerasfast.training.schedules import ScaledSchedule

# Set by `StepFunctions.install()` (the functions) and read by Keras's fit.
_INSTALLED = ("train_function", "test_function", "make_train_function", "make_test_function")


@contextlib.contextmanager
def model_attributes_restored(model):
    """Restores kerasfast's installed functions, steps per execution and the
    creation strategy on leaving the block. `stop_training` stays as training
    left it (True after a callback stopped the run), as Keras leaves it."""
    saved = {name: model.__dict__[name] for name in _INSTALLED if name in model.__dict__}
    steps_per_execution = model.steps_per_execution
    strategy = _compat.creation_strategy(model)
    try:
        yield
    finally:
        for name in _INSTALLED:
            if name in saved:
                object.__setattr__(model, name, saved[name])
            elif name in model.__dict__:
                del model.__dict__[name]
        model.steps_per_execution = steps_per_execution
        if not _compat.is_multi_worker(strategy):
            _compat.attach_strategy(model, strategy)


class LearningRateControl:
    """Lowers an optimizer's learning rate during a run, whatever its form
    (a variable, or a schedule wrapped in a `ScaledSchedule`)."""

    def __init__(self, inner):
        self._inner = inner
        self.factor = 1.0  # all lowering so far
        self._lowered_to = None  # the value the last lowering left
        self._factor_since_set = 1.0  # the lowering since something else (a callback) last set the rate

    def _target(self):
        rate = _compat.learning_rate_store(self._inner)
        return rate.scale if isinstance(rate, ScaledSchedule) else rate

    def lower(self, factor: float) -> None:
        target = self._target()
        if not self._left_as_lowered(target):
            self._factor_since_set = 1.0
        target.assign(target * factor)
        self._lowered_to = float(keras.ops.convert_to_numpy(target))
        self.factor *= factor
        self._factor_since_set *= factor

    def _left_as_lowered(self, target) -> bool:
        return self._lowered_to is not None and math.isclose(float(keras.ops.convert_to_numpy(target)),
                                                             self._lowered_to, rel_tol=1e-6)

    def lowering_in_force(self) -> float:
        """The lowering the rate holds now: none once a callback set it after the last lowering (a
        `LearningRateScheduler`'s next epoch), else what was lowered since one last set it."""
        return self._factor_since_set if self._left_as_lowered(self._target()) else 1.0

    @contextlib.contextmanager
    def kept(self):
        """Keeps the rate through a block that puts the optimizer's variables back (a rollback)."""
        target = self._target()
        value = target.numpy() if isinstance(target, keras.Variable) else None
        yield
        if value is not None:
            target.assign(value)

    def current(self) -> float:
        return float(keras.ops.convert_to_numpy(self._inner.learning_rate))

    @property
    def trained(self) -> bool:
        """Whether the optimizer has trained (is built): a model whose own train_step uses optimizers of its
        own leaves the `model.optimizer` compile made unused."""
        return self._inner.built


class LearningRates:
    """The learning rates of every optimizer a run may train with, lowered together after a divergence:
    `model.optimizer`'s and those of the model's own (`optimizers.own_optimizers`), which a train_step such as
    keras.io's GAN uses instead.

    Args:
        controls: `{name: LearningRateControl}`, `model.optimizer`'s named "optimizer".
    """

    def __init__(self, controls: dict):
        self._controls = controls

    def lower(self, factor: float) -> None:
        for control in self._controls.values():
            control.lower(factor)

    @contextlib.contextmanager
    def kept(self):
        """Keeps every rate through a block that puts the optimizers' variables back (a rollback)."""
        with contextlib.ExitStack() as stack:
            for control in self._controls.values():
                stack.enter_context(control.kept())
            yield

    def current(self) -> dict:
        """`{name: rate}` of the optimizers that trained (all of them when none has yet)."""
        trained = {name: control for name, control in self._controls.items() if control.trained}
        return {name: control.current() for name, control in (trained or self._controls).items()}


@contextlib.contextmanager
def optimizer_settings(optimizer, *, learning_rate=None, clipnorm=None):
    """Gives `optimizer` the plan's learning rate (a float or a schedule) and
    global-norm clipping inside the block, and its own back afterwards.

    The optimizer's state (iterations, moments) is untouched: it keeps
    training and carries over to the next fit. A schedule runs wrapped in a
    `ScaledSchedule`, so that the run can lower it.

    Yields:
        A `LearningRateControl` (None without an optimizer).
    """
    if optimizer is None:
        yield None
        return
    from kerasfast.training.optimizers import unwrap

    inner = unwrap(optimizer)
    saved_rate = _compat.learning_rate_store(inner)
    saved_clip = (inner.clipnorm, inner.clipvalue, inner.global_clipnorm)
    saved_value = None
    control = LearningRateControl(inner)
    # A model saved inside the block (a checkpoint callback's) holds the
    # optimizer as the user made it: the run's rate and clipping are the run's.
    with _compat.configured_as_now(inner):
        try:
            if learning_rate is not None:
                if isinstance(learning_rate, (int, float)) and hasattr(saved_rate, "assign"):
                    saved_value = saved_rate.numpy()
                    saved_rate.assign(learning_rate)
                else:
                    _compat.set_learning_rate_store(inner, learning_rate)
            if isinstance(_compat.learning_rate_store(inner), keras.optimizers.schedules.LearningRateSchedule):
                _compat.set_learning_rate_store(inner, ScaledSchedule(_compat.learning_rate_store(inner)))
            if clipnorm is not None:
                inner.clipnorm, inner.clipvalue, inner.global_clipnorm = None, None, clipnorm
            yield control
        finally:
            planned_only = saved_value is not None and not _set_during_run(saved_rate, learning_rate * control.factor)
            if planned_only:  # the plan's rate was this run's: the optimizer's own comes back
                saved_rate.assign(saved_value)
            elif saved_value is not None or (control.factor != 1.0 and _compat.learning_rate_store(inner) is saved_rate):
                # The rate stays as training left it (a callback may have set
                # it, as in Keras) without the recoveries' halving since.
                saved_rate.assign(saved_rate / control.lowering_in_force())
            _compat.set_learning_rate_store(inner, saved_rate)
            inner.clipnorm, inner.clipvalue, inner.global_clipnorm = saved_clip


def _set_during_run(rate_variable, planned: float) -> bool:
    """Whether something other than kerasfast (a callback, as in Keras) set the
    rate during the run: it then stays as they left it, not the planned one."""
    return not math.isclose(float(rate_variable.numpy()), planned, rel_tol=1e-6)


@contextlib.contextmanager
def borrowed(model, plan):
    """Everything kerasfast changes on `model` for one run under `plan`,
    undone when the block ends: installed functions, steps per execution,
    the creation strategy, the learning rate and clipping, Adam's fused
    update (`optimizers.fused_update`).

    The plan's precision belongs to the steps, not the block: tuning
    measures several precisions in one run, and a function it compiled is
    trained with afterwards only if it read the same learning rate (the
    same schedule object) as training does, so both happen in one block.

    The model's own optimizers (`optimizers.own_optimizers`) keep their rates
    and clipping (the plan's are `model.optimizer`'s), but are borrowed too:
    their train_step may use them instead of `model.optimizer`, so a
    recovery lowers their rates as well, undone here as `model.optimizer`'s.

    Yields:
        The run's `LearningRates` (None without any optimizer).
    """
    from kerasfast.training import optimizers

    with contextlib.ExitStack() as stack:
        stack.enter_context(model_attributes_restored(model))
        stack.enter_context(optimizers.fused_update(model.optimizer))
        planned_rate = None
        if plan is not None and model.optimizer is not None:
            # A schedule spans this run: counted from the updates the optimizer made before it.
            done = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
            planned_rate = optimizers.planned_learning_rate(plan, start_step=done, optimizer=model.optimizer)
        # plan None: a search's measurement, the optimizer as it is.
        controls = {"optimizer": stack.enter_context(optimizer_settings(
            model.optimizer, learning_rate=planned_rate, clipnorm=plan.clipnorm if plan is not None else None))}
        for name, optimizer in optimizers.own_optimizers(model).items():
            controls[name] = stack.enter_context(optimizer_settings(optimizer))
        controls = {name: control for name, control in controls.items() if control is not None}
        yield LearningRates(controls) if controls else None


@contextlib.contextmanager
def eager_steps_in_precision(model, plan):
    """Keras's own steps of a model that runs eagerly (`run_eagerly=True`)
    in the plan's precision and remat, step by step: between steps, where
    callbacks read and save the model, its layers hold their own policies."""
    from kerasfast.training.step_functions import computing_while

    names = ("train_step", "test_step", "predict_step")
    own = {name: vars(model).get(name) for name in names}  # a step set on the instance is the user's
    for name in names:
        setattr(model, name, computing_while(getattr(model, name), model, plan.precision, plan.remat))
    try:
        yield
    finally:
        for name in names:
            if own[name] is None:
                delattr(model, name)
            else:
                setattr(model, name, own[name])
