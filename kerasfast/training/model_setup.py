"""The model phase: the model that trains (the user's own, or its copy
rebuilt in a strategy's scope), compiled as Keras would compile it, its
state built once, and the facts the plan reads from it."""

from __future__ import annotations

import keras
import tensorflow as tf

from kerasfast import _compat
from kerasfast.distribute.strategy import scope_of
from kerasfast.errors import PlanError
from kerasfast.training import facts, feed, optimizers
from kerasfast.training.inputs import check_inputs_match, check_sparse_labels, check_targets, check_validation_data
from kerasfast.training.models import copy_optimizer_state, own_settings, prepare_model
from kerasfast.training.run import Run


def prepare(run: Run) -> None:
    """`run.prepared` (checked against the data) and `run.model_facts`; the
    model is compiled later (`compile_once`), so that a plan refused before
    training leaves it as it was."""
    model, sample_inputs = run.model, run.train_data.sample_inputs
    own_steps = isinstance(model, keras.Model) and _compat.overridden_step(model, "train_step") is not None
    if isinstance(model, keras.Model) and not own_steps:
        check_inputs_match(model, sample_inputs)
    prepared = run.prepared = prepare_model(model, sample_inputs, strategy=run.strategy, own_steps=own_steps)
    if not isinstance(model, keras.Model):
        feed.add_builders_preprocessing(run)
    kept = own_settings(prepared.user_model)
    if kept:
        prepared.how = f"{prepared.how}; {kept}"
    if _compat.overridden_step(prepared.train_model, "train_step") is None:
        check_inputs_match(prepared.train_model, run.train_data.sample_inputs)
    if not isinstance(model, keras.Model) and run.validation:
        # Built by the user's function only now: its validation inputs are checked as a model's are in `feed`.
        check_validation_data(run.validation.get("validation_data"), prepared.train_model)
    # A rebuilt copy is compiled like the user's model: the facts (compile settings included) are the user's.
    run.model_facts = facts.model_facts(prepared.user_model if prepared.rebuilt else prepared.train_model,
                                        run.train_data, run.args.optimizer)
    facts.check_mixed_precision(run)


def compile_once(run: Run) -> None:
    """Compiles the model as Keras would (only what needs compiling) and
    builds its variables in the strategy's scope; once per run."""
    if run.compiled:
        return
    _compile(run)
    with scope_of(run.strategy):
        _build_state(run)
        if run.prepared.rebuilt:
            _continue_users_optimizer(run.prepared)
    run.compiled = True


def _continue_users_optimizer(prepared) -> None:
    """A rebuilt copy's optimizer starts from the state the user's holds (an
    earlier fit's step count and moments), as `model.fit` would go on."""
    user, copy = prepared.user_model.optimizer, prepared.train_model.optimizer
    if user is None or copy is None or not user.built or not int(keras.ops.convert_to_numpy(user.iterations)):
        return
    if not copy.built:
        copy.build(prepared.train_model.trainable_variables)
    copy_optimizer_state(user, copy)


def kerasfasts_own_step(model_facts) -> bool:
    """Whether kerasfast's own train step runs (not the model's, nor Keras's eager one)."""
    return model_facts.custom_train_step is None and not model_facts.run_eagerly


def _compile(run: Run) -> None:
    args, prepared = run.args, run.prepared
    given = {name: value for name, value in (("loss", args.loss), ("optimizer", args.optimizer),
                                             ("metrics", args.metrics)) if value is not None}
    needs_loss = kerasfasts_own_step(run.model_facts)
    if prepared.rebuilt:
        run.uses_default_optimizer = _compile_copy(prepared.train_model, prepared.user_model, run.strategy, given,
                                                   needs_loss)
    else:
        with scope_of(run.strategy):
            run.uses_default_optimizer = _compile_in_place(prepared.train_model, given, needs_loss)


def _compile_in_place(model, given: dict, needs_loss: bool) -> bool:
    """Compiles only what Keras would need compiled: an uncompiled model, or
    the compile arguments given to fit (merged into the model's own).

    Returns:
        Whether the model got kerasfast's default optimizer.
    """
    if model.compiled and not given and (model.optimizer is not None or not needs_loss):
        # Compiled with `optimizer=None`, kerasfast's step gets the default, as an uncompiled model; an
        # optimizer an earlier kerasfast.fit made keeps its state and takes this run's plan.
        return optimizers.is_kerasfasts_own(model.optimizer)
    own_compile = _compat.overridden_step(model, "compile")
    if own_compile is not None:
        if model.compiled:
            raise PlanError(
                f"{own_compile} takes its own arguments, so kerasfast cannot add {', '.join(given)}= to it: pass "
                "them to your compile() and call kerasfast.fit without them."
            )
        raise PlanError(f"{own_compile} must be called before kerasfast.fit (as before model.fit).")
    settings = _compat.compile_config(model)
    given_optimizer = given.get("optimizer")
    if isinstance(given_optimizer, keras.optimizers.Optimizer) and not given_optimizer.built \
            and tf.distribute.has_strategy() \
            and _compat.optimizer_strategy(given_optimizer) is not tf.distribute.get_strategy():
        # An optimizer object made outside the strategy's scope cannot create
        # its variables there; unbuilt, it has no state to lose in a copy.
        given = {**given, "optimizer": optimizers.copy_of(given_optimizer)}
    settings.update(given)
    _check_loss(settings, needs_loss and not _has_added_losses(model))
    default = settings.get("optimizer") is None or optimizers.is_kerasfasts_own(settings["optimizer"])
    if settings.get("optimizer") is None:
        settings["optimizer"] = optimizers.default_optimizer()
    settings.setdefault("jit_compile", "auto")
    model.compile(**settings)
    return default


def _compile_copy(clone, user_model, strategy, given: dict, needs_loss: bool) -> bool:
    """Compiles the copy rebuilt in the strategy's scope like the user's own model.

    The user's model, which gets the trained state back, is compiled outside
    the scope: Keras creates an optimizer's variables under the strategy in
    scope when the optimizer is made, and one made under the strategy
    cannot build later, outside its scope, for the user's plain variables.

    Returns:
        Whether the models got kerasfast's default optimizer.
    """
    settings = {**_compat.compile_config(user_model), **given}
    _check_loss(settings, needs_loss)
    default = settings.get("optimizer") is None or optimizers.is_kerasfasts_own(settings["optimizer"])
    if settings.get("optimizer") is None:
        settings["optimizer"] = optimizers.default_optimizer()
    if not user_model.compiled or given:
        user_model.compile(**{**settings, "optimizer": _optimizer_for_user_model(settings["optimizer"], user_model)})
    copy = optimizers.copier(settings["optimizer"])  # read here: the optimizer may be another strategy's
    with scope_of(strategy):
        clone.compile(**{**settings, "optimizer": copy()})
    return default


def _check_loss(settings: dict, needs_loss: bool) -> None:
    if settings.get("loss") is None and needs_loss:
        raise PlanError(
            "no loss: the model is not compiled with one and fit got no loss=. Pass loss= (e.g. "
            "loss='sparse_categorical_crossentropy') or compile the model first."
        )


def _optimizer_for_user_model(optimizer, user_model):
    """The optimizer object itself, as Keras's compile keeps it, when it can
    hold the user's model's state (made outside any strategy, and unbuilt or
    already the model's); else a fresh copy. A name is made by compile."""
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer
    outside = _compat.optimizer_strategy(optimizer) in (None, tf.distribute.get_strategy())
    if outside and (not optimizer.built or optimizer is user_model.optimizer):
        return optimizer
    return optimizers.copy_of(optimizer)


def _has_added_losses(model) -> bool:
    return _compat.layers_add_losses(model) or bool(getattr(model, "losses", []))


def _check_validation_targets(run: Run) -> None:
    """`check_targets` for `validation_data` given as arrays or a `tf.data.Dataset` (its element spec; nothing is
    read), and `check_sparse_labels` for its array labels, against the compiled loss (`fit(loss=...)`
    included), which Keras's evaluation would fail on only after the first epoch has trained."""
    validation = (run.validation or {}).get("validation_data")
    if _compat.overridden_step(run.train_model, "test_step") is not None:
        return
    if isinstance(validation, tf.data.Dataset):
        check_targets(run.train_model, validation.element_spec, "validation_data")
    elif isinstance(validation, (tuple, list)):
        check_targets(run.train_model, tuple(validation), "validation_data")
        if len(validation) in (2, 3):  # arrays (x, y[, sample_weight]): labels against the compiled loss
            check_sparse_labels(run.train_model, validation[1], "validation_data's y")
    elif validation is not None and _compat.can_convert_arrays(validation):  # validation_data=x_val: no targets
        check_targets(run.train_model, (validation,), "validation_data")


def _build_state(run: Run) -> None:
    """Creates model, loss, metric and optimizer variables, once, before the first trace."""
    model = run.train_model
    if run.model_facts.run_eagerly and run.strategy is None:
        # As in Keras: an eager model builds in its first step, where its
        # layers may read tensors' values (a symbolic build gives them none);
        # a resumed one now, eagerly, for the backup's state to go to.
        if run.progress is not None:
            _compat.build_state_eagerly(model, run.train_data.sample_batch)
        return
    if run.model_facts.custom_train_step is None:
        check_targets(model, run.train_data.sample_batch)
        check_sparse_labels(model, run.feed.y)
        _check_validation_targets(run)
        _compat.build_state(model, run.train_data.sample_batch)
        return
    if run.strategy is None:
        # Never call a model with its own train_step (it may have no call()).
        # On one device its optimizers build lazily in the first, loop-free
        # execution; a strategy cannot create variables there, so they are
        # built now, as Keras's own symbolic build would.
        unbuilt = [layer for layer in _compat.flatten_layers(model) if not isinstance(layer, keras.Model)
                   and not layer.built]
        if run.progress is not None and unbuilt:
            _build_to_resume(model, run.train_data.sample_inputs, run.backup.path)
        return
    if model.optimizer is not None and not model.optimizer.built and model.trainable_variables:
        model.optimizer.build(model.trainable_variables)
    unbuilt = [name for name, optimizer in optimizers.own_optimizers(model).items() if not optimizer.built]
    if unbuilt:
        raise PlanError(
            f"under a {run.distribution.name} strategy the optimizers your train_step uses must exist before "
            f"training, but {', '.join(unbuilt)} is not built yet: build it in your builder, e.g. "
            f"model.{unbuilt[0]}.build(model.<sub_model>.trainable_variables)."
        )


def _build_to_resume(model, sample_inputs, backup_path) -> None:
    """Builds a model with its own train_step that its first step would build, so that a backup's weights have
    variables to go to: by calling it once on a batch's inputs, its forward pass only (a model without a call()
    of its own is refused, naming how to build it)."""
    try:
        model(sample_inputs)
    except NotImplementedError as error:
        raise PlanError(
            f"the backup {backup_path} cannot be restored into model {model.name!r}: its layers are made only in "
            "its train_step's first step, and it has no call() to make them earlier. Build them before fit (e.g. "
            "its sub-models with keras.Input, or model.build(input_shape) with a build() of its own), or pass "
            "resume='fresh' to start again.") from error


def take_plan(run: Run) -> None:
    """kerasfast's default optimizer (for a model compiled without one) takes the plan's learning rate."""
    if not run.uses_default_optimizer:
        return
    for model in run.models:
        optimizers.take_plans_rate(model.optimizer, run.plan)
