"""kerasfast's own train and test steps, for one device and for tf.distribute.

Every `kerasfast.fit` runs these steps (one device uses TensorFlow's default
strategy), so there is one code path to test. Under tf.distribute, Keras 3.15's step functions fail with XLA, with
`steps_per_execution` > 1 (a `tf.while_loop` over optionals around
`strategy.run`) and with the optimizer's gradient accumulation (a
`merge_call` inside a `tf.cond`). These steps avoid all three by
construction:

- one execution is a fixed sequence of micro-steps, with an optimizer
  update after every `grad_accum_steps`-th, run as a fixed-length loop over
  a block of micro-steps; the data is repeated and the epoch length made a
  multiple of the execution, so no step is conditional;
- gradients are accumulated in per-replica (sync-on-read) variables and
  applied by a separate `strategy.run`, so the cross-replica all-reduce
  never sits inside a conditional;
- only the forward and backward pass is compiled with XLA, never the
  collective, which XLA cannot run on CPUs; there causal self-attention
  runs in query blocks that skip its masked half (`kerasfast.training.attention`);
- with the plan's hashed dropout, dropout masks come from a counter hash in
  one XLA-compiled loop each (`kerasfast.training.dropout`), with or without
  XLA for the rest of the pass.

Each micro-step also times how long it waits for its batch: two
`tf.timestamp` ops around `next(iterator)`, chained by control
dependencies to the previous step's results and to the batch.
`input_wait_seconds()` tells how input-bound training was.

A model that overrides `train_step` / `test_step` has its own step run
per micro-step instead (gradient accumulation and clipping are then its
own business; the plan refuses them). Its first execution is a single
micro-step, outside any loop, so that optimizers which build lazily on their
first update create their variables where `tf.function` allows it.

An epoch ends exactly where Keras's would: the last execution of an epoch
runs only the steps left in it (a second, shorter trace).

The steps compute in the plan's precision (and rematerialisation) because
the model's layers take the plan's policies while the steps are traced,
and only then: a callback, a checkpoint saved mid-run or the user's own
`predict` sees the model as the user built it, as under `model.fit`.

Keras's `fit` loop, callbacks, History and progress bar are kept: the steps
are installed as the model's `train_function` / `test_function` for the
duration of `kerasfast.fit` (`kerasfast.training.session` removes them).
"""

from __future__ import annotations

import keras

from kerasfast import _compat
from kerasfast.plan import ATTENTION_BLOCKS, ATTENTION_KERAS, DROPOUT_HASHED, DROPOUT_KERAS, ONEDNN_BFLOAT16
from kerasfast.training.attention import with_causal_blocks
from kerasfast.training.dropout import with_hashed_dropout
from kerasfast.training.precision import graph_precision


def computing_while(function, model, precision: str, remat: str | None):
    """`function`, whose calls see `model`'s layers in the plan's `precision`
    and `remat`; between calls they hold their own. A tf.function runs its
    Python only while tracing, so its traces alone see them."""
    import functools

    from kerasfast.plan import keras_policy
    from kerasfast.training.models import computing_in

    policy = keras_policy(precision)

    @functools.wraps(function)
    def traced(*args):
        with computing_in(model, policy, remat):
            return function(*args)

    return traced


def _python_state(model, optimizer) -> list:
    """The plain Python values (numbers, strings, flags) a trace may have read from `model`'s layers and
    `optimizer`, what a tf.function holds as constants, and which weights train."""
    import numpy as np

    from kerasfast import _compat

    plain = (bool, int, float, str, np.generic)
    # `stop_training`: a stop asked for before the first batch, which no trace reads.
    owners = [*_compat.flatten_layers(model), model, optimizer]
    return [[id(variable) for variable in model.trainable_variables]] + [
        sorted((name, value) for name, value in vars(owner).items() if isinstance(value, plain)
               and name != "stop_training") for owner in owners if owner is not None]


def _unpack(data):
    return keras.utils.unpack_x_y_sample_weight(data)


def _batch_size(x):
    import tensorflow as tf

    return tf.shape(keras.tree.flatten(x)[0])[0]


def _reduce_logs(strategy, logs):
    import tensorflow as tf

    # A step's logs may nest: `{m.name: m.result() for m in self.metrics}` holds the compiled metrics' dict.
    return tf.nest.map_structure(lambda value: strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None), logs)


def _after_its_batch(step):
    """`step(data)` with every op it creates waiting for the batch.

    An op that does not read the batch (the optimizer's `iterations`
    increment, a dropout seed's advance) could otherwise run in an execution
    whose `next(iterator)` fails at the end of data of unknown length,
    counting an update that never happened.
    """
    import tensorflow as tf

    def guarded(data):
        with tf.control_dependencies(tf.nest.flatten(data, expand_composites=True)):
            return step(data)

    return guarded


def _repeating_block(apply_after: tuple[bool, ...]) -> tuple[tuple[bool, ...], int]:
    """Splits an execution's update pattern into `(block, repeats)`.

    Example:

    >>> _repeating_block((False, True, False, True))
    ((False, True), 2)
    >>> _repeating_block((True, False, True))  # not a repetition: one block
    ((True, False, True), 1)
    """
    for length in range(1, len(apply_after)):
        if len(apply_after) % length == 0 and apply_after == apply_after[:length] * (len(apply_after) // length):
            return apply_after[:length], len(apply_after) // length
    return apply_after, 1


class StepFunctions:
    """Builds and installs the train/test functions on a compiled model.

    Args:
        model: A compiled Keras model whose state was built under `strategy`.
        strategy: The `tf.distribute.Strategy`.
        steps_per_execution: Train (micro-)steps per call.
        grad_accum_steps: Micro-steps whose gradients are averaged per update.
        jit_compile: Compile the forward + backward pass with XLA (the whole
            step for a model's own `train_step`).
        micro_steps_done: Train steps already run (a resumed run).
        steps_per_epoch: Steps per epoch, when known: the last execution of
            an epoch runs only the steps left in it.
        optimizer: The optimizer that applies the gradients (default the
            model's; a `LossScaleOptimizer` around it for float16).
        own_train_step, own_test_step: Run the model's overridden
            `train_step` / `test_step` instead of kerasfast's.
        clipnorm: The plan's global gradient-norm clipping threshold, or
            None: with several replicas, applied to the summed gradient.
        attention: The plan's `attention`: "causal_blocks" traces the
            XLA-compiled pass with causal self-attention in query blocks.
        dropout: The plan's `dropout`: "hashed" traces the pass with
            dropout masks from a counter hash.
        stops_within_one_step: `steps_per_execution` is kerasfast's choice,
            not the user's: a stop a callback asks for before an execution
            makes it one step, as `model.fit` at its default of one step per
            execution runs one step more (at the user's count, it runs the
            whole execution, as `model.fit` at that count does).
    """

    def __init__(self, model, strategy, *, steps_per_execution: int, grad_accum_steps: int, jit_compile: bool,
                 micro_steps_done: int = 0, steps_per_epoch: int | None = None, optimizer=None,
                 own_train_step: bool = False, own_test_step: bool = False, precision: str = "float32",
                 remat: str | None = None, clipnorm: float | None = None, attention: str = ATTENTION_KERAS,
                 dropout: str = DROPOUT_KERAS, stops_within_one_step: bool = False):
        self.model = model
        self.stops_within_one_step = stops_within_one_step
        self.attention = attention
        self.dropout = dropout
        self.clipnorm = clipnorm
        self._precision = (precision, remat)
        self.strategy = strategy
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self.steps_per_epoch = steps_per_epoch
        self.own_train_step = own_train_step
        self.own_test_step = own_test_step
        # Whether a step's logs are the compiled metrics' results (read once
        # after an execution's loop) rather than values the step returns.
        self._logs_from_metrics = not own_train_step and _compat.overridden_step(model, "compute_metrics") is None
        self._first_logs = None
        self.steps_per_execution = steps_per_execution
        self.grad_accum_steps = grad_accum_steps
        self.jit_compile = jit_compile
        self._accumulators = None
        self._without_gradient = None  # per trainable weight: no gradient in the micro-step traced last
        self._compute_fn = None
        self._executions = {}  # update pattern -> its compiled execution
        self._traced_with = None  # the Python state the executions were made in (`install`, `restart`)
        self._input_wait = None
        self._batches_taken = None  # batches the train steps have read, ever
        # Micro-steps run so far (resumed runs start from their checkpoint).
        self.micro_steps = micro_steps_done

    # -- replica functions -------------------------------------------------

    def _forward_backward(self, x, y, sample_weight):
        import tensorflow as tf

        model = self.model
        with tf.GradientTape() as tape:
            if _compat.call_has_training_arg(model):
                y_pred = model(x, training=True)
            else:
                y_pred = model(x)
            # The loss is already divided by the number of replicas (Keras
            # scales it for distribution), so summed gradients are a mean.
            loss = _compat.compute_loss(model, x, y, y_pred, sample_weight, training=True)
            scaled = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, model.trainable_variables)
        if self.strategy.num_replicas_in_sync > 1:
            # Sparse (embedding) gradients differ in size between replicas,
            # which the packed all-reduce inside a loop cannot combine.
            gradients = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in gradients]
        # The outputs' masks (an Embedding's mask_zero) are returned beside them: the metrics, computed
        # outside an XLA-compiled forward pass, would otherwise count the padding.
        return loss, (y_pred, _compat.keras_masks(y_pred)), gradients

    def _track(self, x, y, y_pred, sample_weight, loss):
        _compat.loss_tracker(self.model).update_state(
            _compat.unscale_loss_for_distribution(loss), sample_weight=_batch_size(x)
        )
        return self.model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _compute(self):
        import tensorflow as tf

        compute = self.model.train_step if self.own_train_step else self._forward_backward
        if self.dropout == DROPOUT_HASHED:
            compute = with_hashed_dropout(compute)
        if self.jit_compile:
            if self.attention == ATTENTION_BLOCKS:
                compute = with_causal_blocks(compute)
            compute = tf.function(compute, jit_compile=True, reduce_retracing=True, autograph=self.own_train_step)
        return compute

    def _make_replica_train_step(self, compute):
        model = self.model
        if self.own_train_step:
            return compute  # the model's own train_step (compiled when planned)

        def step(data):
            x, y, sample_weight = _unpack(data)
            loss, (y_pred, masks), gradients = compute(x, y, sample_weight)
            _compat.put_keras_masks(y_pred, masks)
            self.optimizer.apply(self._clipped_globally(gradients), model.trainable_variables)
            return self._track(x, y, y_pred, sample_weight, loss)

        return step

    def _clipped_globally(self, gradients):
        """Each replica's share of the summed gradient, clipped to the plan's `clipnorm` as a whole.

        The optimizer clips (its `global_clipnorm`, which the plan sets)
        before it sums the replicas' gradients, as Keras orders it: the norm
        clipped would be each replica's share, and the threshold would grow
        with the replicas. So the step sums them first (one all-reduce more,
        only with clipping on several replicas), clips the sum and hands each
        replica 1/n of it, which the optimizer sums back, below its own
        threshold.
        """
        import tensorflow as tf

        replicas = self.strategy.num_replicas_in_sync
        if self.clipnorm is None or replicas == 1:
            return gradients
        present = [gradient for gradient in gradients if gradient is not None]  # a weight the loss never reaches
        summed = iter(tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, present))
        clipped, _ = tf.clip_by_global_norm([None if gradient is None else next(summed) for gradient in gradients],
                                            self.clipnorm)
        return [None if gradient is None else gradient / replicas for gradient in clipped]

    def _make_replica_micro_step(self, compute):
        def micro_step(data):
            x, y, sample_weight = _unpack(data)
            loss, (y_pred, masks), gradients = compute(x, y, sample_weight)
            _compat.put_keras_masks(y_pred, masks)
            # A weight the loss does not reach (an unused head) has no gradient: as in Keras's own
            # accumulation, the optimizer leaves it alone (read by _replica_apply, traced after this).
            self._without_gradient = [gradient is None for gradient in gradients]
            for accumulator, gradient in zip(self._accumulators, gradients, strict=True):
                if gradient is not None:
                    accumulator.assign_add(gradient)
            return self._track(x, y, y_pred, sample_weight, loss)

        return micro_step

    def _replica_apply(self):
        model = self.model
        gradients = [None if missing else accumulator / self.grad_accum_steps
                     for accumulator, missing in zip(self._accumulators, self._without_gradient, strict=True)]
        self.optimizer.apply(self._clipped_globally(gradients), model.trainable_variables)
        for accumulator in self._accumulators:
            accumulator.assign(keras.ops.zeros_like(accumulator))

    def _create_accumulators(self):
        import tensorflow as tf

        with self.strategy.scope():
            # Sync-on-read: every replica sums its own micro-batch gradients.
            self._accumulators = [
                tf.Variable(
                    tf.zeros(variable.shape, dtype=variable.dtype), trainable=False,
                    synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.SUM,
                    name=f"grad_accumulator_{index}",
                )
                for index, variable in enumerate(self.model.trainable_variables)
            ]

    # -- execution functions -------------------------------------------------

    def input_wait_seconds(self) -> float:
        """Seconds the training steps have waited for their input so far."""
        return float(self._input_wait.numpy()) if self._input_wait is not None else 0.0

    def _tensors(self, structure) -> list:
        """The local tensors of a (possibly per-replica) structure, sparse and
        ragged ones as their component tensors."""
        import tensorflow as tf

        tensors = []
        for value in keras.tree.flatten(structure):
            if value is not None:
                for local in self.strategy.experimental_local_results(value):
                    tensors.extend(tf.nest.flatten(local, expand_composites=True))
        return tensors

    def _next_batch(self, iterator, after):
        """`next(iterator)`, timed: from when the previous step's results
        (`after`) exist to when the batch does."""
        import tensorflow as tf

        with tf.control_dependencies(self._tensors(after)):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            batch = next(iterator)
        with tf.control_dependencies(self._tensors(batch)):
            self._input_wait.assign_add(tf.timestamp() - start)
            self._batches_taken.assign_add(1)
        return batch

    def _execution(self, apply_after: tuple[bool, ...]):
        """A compiled execution of `len(apply_after)` micro-steps, with an
        optimizer update after each micro-step marked True.

        The micro-steps are one block (up to an update) repeated in a
        `tf.while_loop` of fixed length, so the graph holds one block
        whatever the execution's length: an unrolled execution of 29 steps
        took 30 s to compile, and a second copy of the block outside the
        loop doubled the compilation of a large model (MobileNetV3-Small).
        A fixed-length loop around `strategy.run` is tf.distribute's own
        custom-training-loop pattern; Keras's failure is the loop over
        optionals, and a conditional update, which neither needs here.

        The logs come from the metrics after the loop (summed over
        replicas, as `evaluate` reads them). A step whose logs are its own
        (its own `train_step` or `compute_metrics`) carries them through the
        loop instead, shaped like those of the first, single-step execution.
        """
        import tensorflow as tf

        strategy = self.strategy
        accumulating = self.grad_accum_steps > 1
        step = (self._make_replica_micro_step if accumulating else self._make_replica_train_step)(self._compute_fn)
        step = _after_its_batch(step)
        block, repeats = _repeating_block(apply_after)

        def run_block(iterator, after):
            for apply in block:
                after = strategy.run(step, args=(self._next_batch(iterator, after),))
                if apply and accumulating:
                    with tf.control_dependencies(self._tensors(after)):
                        strategy.run(self._replica_apply)
            return after  # the last micro-step's logs

        def metrics_after(results):
            with tf.control_dependencies(self._tensors(results)):
                return self.model.get_metrics_result()

        def run(iterator):
            if repeats == 1:
                logs = run_block(iterator, None)
                return metrics_after(logs) if self._logs_from_metrics else _reduce_logs(strategy, logs)
            carried = {} if self._logs_from_metrics else self._first_logs

            def body(i, previous, logs):
                block_logs = run_block(iterator, previous)
                # The next block's input timing starts when this block's results exist.
                with tf.control_dependencies(self._tensors(block_logs)):
                    previous = tf.identity(previous)
                if not self._logs_from_metrics:
                    logs = _reduce_logs(strategy, block_logs)
                return i + 1, previous, logs

            initial = (tf.constant(0), tf.constant(0.0), dict(carried))
            invariants = (tf.TensorShape([]), tf.TensorShape([]),
                          tf.nest.map_structure(lambda _: tf.TensorShape(None), dict(carried)))
            _, done, logs = tf.while_loop(lambda i, *_: i < repeats, body, initial, shape_invariants=invariants,
                                          parallel_iterations=1)
            return metrics_after(done) if self._logs_from_metrics else logs

        return self._compiled(run, autograph=self.own_train_step)

    def _compiled(self, function, *, autograph: bool):
        """A `tf.function` of `function`, traced, and optimised for
        "onednn_bfloat16", in the plan's precision: callbacks' own functions
        (a `model.predict` during the run) stay in the user's.

        `autograph` only where a model's own `train_step` / `test_step` runs:
        kerasfast's steps are written as graphs (`tf.while_loop`, `tf.cond`),
        and Keras does not convert its own steps either; converting them cost
        about 2 s of a small transformer's first step."""
        import tensorflow as tf

        compiled = tf.function(computing_while(function, self.model, *self._precision), reduce_retracing=True,
                               autograph=autograph)
        precision = self._precision[0]
        if precision != ONEDNN_BFLOAT16:
            return compiled

        def optimised_in_precision(*args):
            # Grappler reads the option when a trace is first run: a retrace
            # (a new batch shape) must find it set too.
            with graph_precision(precision):
                return compiled(*args)

        return optimised_in_precision

    def train_function(self):
        """Keras's `train_function(iterator)`: one execution of
        `steps_per_execution` micro-steps.

        Where the updates fall inside an execution depends on how many
        micro-steps ran before it; the few distinct patterns (at most
        `grad_accum_steps`) are each traced once, so the decision to update
        is made in Python, never by a conditional around a collective.
        Every call returns a function sharing the same compiled executions.
        """
        import tensorflow as tf

        if self._compute_fn is None:
            self._compute_fn = self._compute()
        if self.grad_accum_steps > 1 and self._accumulators is None:
            self._create_accumulators()
        if self._traced_with is None and not self._executions:
            self._traced_with = _python_state(self.model, self.optimizer)
        if self._input_wait is None:
            self._input_wait = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="input_wait_seconds")
            self._batches_taken = tf.Variable(0, dtype=tf.int64, trainable=False, name="batches_taken")
        executions = self._executions

        def run(iterator, count: int):
            start = self.micro_steps
            pattern = tuple((start + i + 1) % self.grad_accum_steps == 0 for i in range(count))
            if pattern not in executions:
                executions[pattern] = self._execution(pattern)
            logs = executions[pattern](iterator)
            if self._first_logs is None and not self._logs_from_metrics:
                self._first_logs = logs
            self.micro_steps = start + count
            return logs

        def train(iterator):
            if self._traced_with is not None:
                self._retrace_if_changed()
            count = self.steps_per_execution
            if self.stops_within_one_step and getattr(self.model, "stop_training", False):
                # A callback asked to stop before this execution (in on_epoch_begin or on_train_begin).
                count = 1
            if self.steps_per_epoch:
                count = min(count, self.steps_per_epoch - self.micro_steps % self.steps_per_epoch)
            if not self._logs_from_metrics and not executions and count > 1:
                # Lazily built optimizers create their variables in this
                # first, loop-free execution, whose logs give the shape of
                # those the later executions carry through their loop.
                run(iterator, 1)
                count -= 1
            if self.steps_per_epoch:
                return run(iterator, count)
            return self._until_data_ends(run, iterator, count)

        return train

    def _until_data_ends(self, run, iterator, count: int):
        """One execution over data of unknown length, which may end inside it.

        The steps before the end have trained and updated the metrics, so
        their logs are returned, as Keras's own loop over optionals returns
        them (without them an epoch shorter than one execution would end
        with no logs at all); the next call, finding no batch, ends the epoch.
        """
        import tensorflow as tf

        before = int(self._batches_taken.numpy())
        try:
            return run(iterator, count)
        except tf.errors.OutOfRangeError:
            taken = int(self._batches_taken.numpy()) - before
            if not taken:
                raise
            self.micro_steps += taken
            return self.model.get_metrics_result()

    def test_function(self):
        import tensorflow as tf

        model = self.model
        strategy = self.strategy

        def replica_step(data):
            x, y, sample_weight = _unpack(data)
            y_pred = model(x, training=False) if _compat.call_has_training_arg(model) else model(x)
            loss = _compat.compute_loss(model, x, y, y_pred, sample_weight, training=False)
            return self._track(x, y, y_pred, sample_weight, loss)

        steps = self.steps_per_execution
        if self.own_test_step:
            return self._own_test_function()

        # Keras hands the test function one chunk of `steps_per_execution`
        # batches; validation data may end inside a chunk, so each step is
        # taken only if a batch is left. Evaluation has no cross-replica
        # update, so a loop around `strategy.run` is safe here. The logs are
        # read from the metrics afterwards, aggregated over replicas.
        def run(iterator):
            def body(taken, more):
                optional = iterator.get_next_as_optional()

                def take():
                    with tf.control_dependencies(self._tensors(strategy.run(replica_step,
                                                                            args=(optional.get_value(),)))):
                        return taken + 1

                found = optional.has_value()
                return tf.cond(found, take, lambda: taken), found

            taken, _ = tf.while_loop(lambda taken, more: more & (taken < steps), body,
                                     (tf.constant(0), tf.constant(True)), parallel_iterations=1)
            with tf.control_dependencies([taken]):
                return taken > 0, model.get_metrics_result()

        run = self._compiled(run, autograph=False)

        def test(iterator):
            ran, logs = run(iterator)
            if not bool(ran):
                raise StopIteration  # Keras's signal that the data has ended
            return logs

        return test

    def _own_test_function(self):
        """The model's own `test_step`, one compiled call per batch.

        Its logs are whatever the step returns (Keras then prefers the
        metrics' results where the names match); a Python loop over the
        chunk stops where the validation data ends.
        """
        model, strategy = self.model, self.strategy

        def one_step(data):
            return _reduce_logs(strategy, strategy.run(model.test_step, args=(data,)))

        one_step = self._compiled(one_step, autograph=True)

        def test(iterator):
            logs = None
            for _ in range(self.steps_per_execution):
                optional = iterator.get_next_as_optional()
                if not bool(optional.has_value()):
                    break
                logs = one_step(optional.get_value())
            if logs is None:
                raise StopIteration  # Keras's signal that the data has ended
            return logs

        return test

    @classmethod
    def prepare(cls, model, strategy, plan, micro_steps_done: int = 0, *, optimizer=None,
                own_test_step: bool = False, measured: "StepFunctions | None" = None) -> "StepFunctions":
        """Installs the steps on a compiled model whose state was built under
        `strategy` (`_compat.build_state`).

        Args:
            micro_steps_done: Train steps already run (a resumed run).
            optimizer: The optimizer to apply gradients with (default the
                model's).
            own_test_step: Run the model's overridden `test_step`.
            measured: The steps tuning measured `plan` with, on this model
                in this run (`tuning.tune_plan`): they train from here, and
                their compiled executions are not compiled a second time.
        """
        stops_within_one_step = "steps_per_execution" not in plan.overridden
        if measured is not None:
            steps = measured
            steps.restart(plan.steps_per_epoch, own_test_step=own_test_step)
            steps.stops_within_one_step = stops_within_one_step
        else:
            steps = cls(model, strategy, steps_per_execution=plan.steps_per_execution,
                        grad_accum_steps=plan.grad_accum_steps, jit_compile=plan.jit_compile,
                        micro_steps_done=micro_steps_done, steps_per_epoch=plan.steps_per_epoch, optimizer=optimizer,
                        own_train_step=plan.train_step == "yours", own_test_step=own_test_step,
                        precision=plan.precision, remat=plan.remat, clipnorm=plan.clipnorm,
                        attention=plan.attention, dropout=plan.dropout,
                        stops_within_one_step=stops_within_one_step)
        steps.install()
        return steps

    def restart(self, steps_per_epoch: int | None, *, own_test_step: bool = False) -> None:
        """Starts the counts again from a run's first step (after tuning ran
        these steps and put the model's state back), keeping what was compiled."""
        self.steps_per_epoch = steps_per_epoch
        self.own_test_step = own_test_step
        self.micro_steps = 0
        for variable in (self._input_wait, self._batches_taken, *(self._accumulators or ())):
            if variable is not None:
                variable.assign(keras.ops.zeros_like(variable))
        self._traced_with = _python_state(self.model, self.optimizer)

    def _retrace_if_changed(self) -> None:
        """At the run's first execution: the executions tuning compiled, and the gradient accumulators,
        were made for the model's Python state as it was then (a layer's `trainable`, a float a layer
        reads). A callback's `on_train_begin` or `on_epoch_begin` that changed it (freezing a layer)
        would go unseen, where `model.fit`, tracing at its first batch, sees it: then the executions are
        traced again, for accumulators of the weights that train now."""
        traced, self._traced_with = self._traced_with, None
        if _python_state(self.model, self.optimizer) != traced:
            self._executions.clear()
            self._first_logs = None
            self._compute_fn = self._compute()
            if self._accumulators is not None:
                self._without_gradient = None
                self._create_accumulators()

    def install(self) -> None:
        """Makes Keras's `fit` / `evaluate` use these steps."""
        model = self.model
        train = self.train_function()
        test = self.test_function()

        def make_train_function(force=False):
            model.train_function = train
            return train

        def make_test_function(force=False):
            model.test_function = test
            return test

        model.make_train_function = make_train_function
        model.make_test_function = make_test_function
        model.train_function = train
        model.test_function = test
