"""Non-finite values: found in the data before training, caught and recovered from during it.

Before training, `check_finite` scans array inputs (the cheap case: they are
in memory) and names the first sample and input holding a NaN or infinity.

During training, `DivergenceGuard` looks at every execution's loss (read
from Keras's loss tracker: two scalars per execution, no extra pass over
anything) and at every logged value. A loss that is not finite, or
above `loss_upper_bound`, is a divergence at once. A loss that jumps
`SPIKE_FACTOR` times above the recent executions' (TF Model Garden's blow-up
check, against their `SPIKE_REFERENCE_PERCENTILE`th percentile rather than
their median) and back above the loss of the run's first execution is one
when it stays there for `SPIKE_PERSISTENCE` executions in a row. (A converged
model going from 0.002 to 0.02, or a ResNet's Adam spike from 0.01 to 0.2 that
Keras trains through, were measured being rolled back with the rate halved:
a loss worse than the untrained model's is a blow-up, one below it is
training. A batch's loss is computed before its update, so one hard batch,
such as a regression target's outlier, spikes alone; weights that blew up
spike on every batch that follows. Outlier batches 15% of the time were
measured being rolled back until the run failed, against the median of one-step
executions.) No snapshot is taken while a jump is pending.
What happens then is `on_nan`:

- "recover": put back the last good state (weights, optimizer, metrics),
  halve the learning rate (of every optimizer the model holds: its own
  train_step, such as keras.io's GAN, may train with others than
  `model.optimizer`) and carry on with the next batches (the ones that
  diverged are skipped), at most `max_recoveries` times;
- "stop": put back the last good state and raise `TrainingError`;
- "ignore": what Keras does (train on).

The last good state is a copy in host memory taken every
`snapshot_every_steps` steps and at the end of every epoch, at an update
boundary, after an execution that was itself good, and after the first good
execution that made new variables (the optimizers a model's own train_step
uses build in its first step): a snapshot holds, and puts back, the
variables that existed when it was taken. A callback that changes
the model's small non-trainable variables between epochs (an auxiliary loss's
weight switched on, a schedule kept in a variable) changes what the loss
measures: the spike check then starts again from the new level, and the
state after the callback's change is the last good one, so a rollback never
undoes it. A rollback followed at once by another divergence, with no good
step in between, cannot get past what diverges (a bad batch in every pass,
weights that stay broken): the run stops with `TrainingError` rather than
return a model none of whose steps were kept, unless a callback stopped it
on the divergence it saw (Keras's `TerminateOnNaN`): that run returns as
`model.fit` would, its model in the state it was rolled back to.

A rollback past the start of the epoch leaves its metrics empty, and Keras
would log their 0.0 as the epoch's loss, which `EarlyStopping` and
`ModelCheckpoint(save_best_only=True)` then take for the best epoch. So the
epoch's logs hold the means over the batches trained after the rollback, or,
when none was, the values of the execution that diverged (NaN, infinity or
the blown-up loss: what Keras itself would log for that epoch).
"""

from __future__ import annotations

import collections
import contextlib
import math

import keras
import numpy as np

from kerasfast import _compat
from kerasfast.errors import DataError, TrainingError

ON_NAN = ("recover", "stop", "ignore")
# A loss this many times the recent executions' reference level is a jump.
SPIKE_FACTOR = 10.0
# The recent executions' reference level: this percentile of their losses (the
# median made regular outlier batches, ~15% of them, look like blow-ups).
SPIKE_REFERENCE_PERCENTILE = 90
# Consecutive executions a jump must last to be a blow-up (not one hard batch).
SPIKE_PERSISTENCE = 3
# Executions seen before the spike check starts (early losses fall fast).
SPIKE_WARMUP = 20
RECOVERY_LR_FACTOR = 0.5
# Callbacks steer training through small non-trainable variables (a loss
# term's weight, a temperature); larger ones are frozen weights (a
# pretrained base), not read at every epoch end.
STEERING_VARIABLE_MAX_SIZE = 4096


def check_finite(structure, what: str = "x") -> None:
    """Raises `DataError` naming the first NaN/infinity in float arrays.

    Args:
        structure: An array, or a dict / list / tuple of arrays.
        what: How the structure is named in the message ("x", "y", ...).

    Example:

    >>> check_finite({"age": np.array([[1.0], [np.nan]])}, "x")
    Traceback (most recent call last):
    ...
    kerasfast.errors.DataError: x['age'] holds NaN at sample 1, position (0,) ...
    """
    for path, array in _arrays(structure, what):
        if not np.issubdtype(array.dtype, np.floating):
            continue
        finite = np.isfinite(array)
        if finite.all():
            continue
        index = np.argwhere(~finite)[0]
        value = array[tuple(index)]
        kind = "NaN" if np.isnan(value) else "an infinite value"
        count = int((~finite).reshape(len(array), -1).any(axis=1).sum()) if array.ndim else 1
        position = f"sample {index[0]}" + (f", position {tuple(int(i) for i in index[1:])}" if len(index) > 1 else "")
        validating = what.startswith("validation_data")
        harm = "the validation loss and metrics" if validating else "the loss, and with it the weights,"
        raise DataError(
            f"{path} holds {kind} at {position} ({count} sample(s) in all hold non-finite values); in most models "
            f"that makes {harm} NaN. Drop or fill those samples (e.g. np.nan_to_num, or "
            "x[np.isfinite(x).all(axis=1)]) before fit; if your model handles missing values itself (e.g. a first "
            f"layer that fills NaN), pass on_nan='ignore' to {'validate' if validating else 'train'} on them as "
            "model.fit does."
        )


def _arrays(structure, path):
    if isinstance(structure, dict):
        for key, value in structure.items():
            yield from _arrays(value, f"{path}[{key!r}]")
    elif isinstance(structure, (list, tuple)):
        for index, value in enumerate(structure):
            yield from _arrays(value, f"{path}[{index}]")
    elif isinstance(structure, np.ndarray):
        yield path, structure
    elif hasattr(structure, "dtypes") and hasattr(structure, "columns"):  # a pandas DataFrame
        for column in structure.columns:
            yield path + f"[{column!r}]", structure[column].to_numpy()
    elif hasattr(structure, "dtype") and hasattr(structure, "to_numpy"):  # a pandas Series
        yield path, structure.to_numpy()


def blew_up(loss: float, recent_level: float, start_level: float) -> bool:
    """Whether `loss` jumped: `SPIKE_FACTOR` times the recent executions'
    reference level and back above `start_level`, the loss training started
    from. (A jump is a blow-up once it lasts `SPIKE_PERSISTENCE` executions.)

    Example:

    >>> blew_up(0.02, recent_level=0.002, start_level=2.3)  # a converged model's wobble
    False
    >>> blew_up(0.2, recent_level=0.01, start_level=2.3)  # a spike training recovers from
    False
    >>> blew_up(40.0, recent_level=0.5, start_level=2.3)
    True
    """
    return recent_level > 0 and loss > SPIKE_FACTOR * recent_level and loss > start_level


class DivergenceGuard(keras.callbacks.Callback):
    """Detects a diverging run after each execution and acts per `on_nan`.

    Args:
        on_nan: "recover", "stop" or "ignore".
        max_recoveries: Recoveries allowed before the run stops.
        loss_upper_bound: A loss above this is a divergence (None: only the
            spike check and non-finite values).
        snapshot_every_steps: Steps between copies of the last good state.
        grad_accum_steps: Snapshots are taken only at update boundaries.
        learning_rate: The run's `session.LearningRates` (None: not lowered).
        variables: `f()` returning every variable training changes.
        is_chief: Only the chief prints.
    """

    def __init__(self, *, on_nan: str, max_recoveries: int, loss_upper_bound, snapshot_every_steps: int,
                 grad_accum_steps: int, learning_rate, variables, is_chief: bool = True):
        super().__init__()
        self.on_nan = on_nan
        self.max_recoveries = max_recoveries
        self.loss_upper_bound = loss_upper_bound
        self.snapshot_every_steps = max(1, snapshot_every_steps)
        self.grad_accum_steps = grad_accum_steps
        self.learning_rate = learning_rate
        self.variables = variables
        self.is_chief = is_chief
        self.recoveries = []  # (epoch, step, why) of each recovery
        self._snapshot = None  # (variable, value) pairs: the variables that existed when it was taken
        self._snapshot_ids = frozenset()
        # Until a good execution made no variables the snapshot lacks: a step function creates its variables
        # (the optimizers a model's own train_step uses) in its first execution only, as tf.function allows.
        self._variables_may_grow = True
        self._snapshot_at = None
        self._recent = collections.deque(maxlen=200)
        self._start_level = None
        self._jumps = []  # the losses of the executions in a row that jumped
        self._epoch = 0
        self._steps = 0  # steps of this epoch seen by this callback
        self._since_snapshot = 0
        self._tracked = None  # (total, count) of the loss tracker after the last execution
        # The logs of the execution that diverged, while its rollback has left
        # this epoch's metrics empty; then the values that replaced the
        # epoch's logs (Keras hands them again to on_train_end).
        self._undone_logs = None
        self._replaced_logs = None
        self._start_snapshot_at = None
        self._good_steps_since_rollback = None  # None: no rollback yet
        self._last_rollback = None  # where the last divergence was, for the message of the next one
        self._last_execution_good = True
        self._fixed_state = None  # the non-trainable variables' values at the end of the last epoch

    # -- state -------------------------------------------------------------

    def _take_snapshot(self):
        self._snapshot = [(v, np.array(keras.ops.convert_to_numpy(v))) for v in self.variables()]
        self._snapshot_ids = frozenset(id(v) for v, _ in self._snapshot)
        self._snapshot_at = (self._epoch, self._steps)
        self._since_snapshot = 0

    def _variables_grew(self) -> bool:
        """Whether training made variables the snapshot lacks: the optimizers a model's own train_step uses
        build in its first step, after the snapshot of on_train_begin. Asked after good executions until one
        made none (listing every variable at each execution would cost a large model a millisecond)."""
        if not self._variables_may_grow:
            return False
        grew = any(id(v) not in self._snapshot_ids for v in self.variables())
        self._variables_may_grow = grew
        return grew

    def _restore_snapshot(self) -> bool:
        """Puts the snapshot back; True when this epoch's metrics start again empty."""
        # The optimizer's variables hold its learning rate: the run's current one
        # stays (each recovery halves it further), not the snapshot's.
        with self.learning_rate.kept() if self.learning_rate is not None else contextlib.nullcontext():
            for variable, value in self._snapshot:
                variable.assign(value)
        emptied = self._snapshot_at[0] != self._epoch or self._snapshot_at[1] == 0
        if emptied:
            # The snapshot's metrics predate this epoch (an earlier epoch's,
            # or whatever the model held before fit, e.g. an evaluate's): this
            # epoch's means start again from the rollback.
            for metric in self.model.metrics:
                metric.reset_state()
        self._tracked = self._loss_tracker_state()
        return emptied

    def _loss_tracker_state(self):
        tracker = _compat.loss_tracker(self.model)
        if tracker is None or len(tracker.variables) != 2:
            return None
        total, count = (float(keras.ops.convert_to_numpy(v)) for v in tracker.variables)
        return total, count

    # -- Keras hooks -------------------------------------------------------

    def on_train_begin(self, logs=None):
        if self.on_nan != "ignore" and self._snapshot is None:
            self._take_snapshot()
        self._start_snapshot_at = self._snapshot_at

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._steps = epoch, 0
        self._tracked = None
        self._undone_logs = self._replaced_logs = None

    def on_train_batch_begin(self, batch, logs=None):
        # The epoch's first execution starts after every callback's
        # on_epoch_begin (this one may run before theirs).
        if self.on_nan == "ignore" or self._steps != 0 or self._fixed_state is None:
            return
        now = self._non_trainable_values()
        if now.keys() != self._fixed_state.keys() or not all(
                np.array_equal(before, now[key], equal_nan=True) for key, before in self._fixed_state.items()):
            # A callback changed what the loss measures (or froze or unfroze
            # layers): a new level, and a new last good state that keeps it.
            self._recent.clear()
            self._jumps, self._start_level = [], None
            self._take_snapshot()
        self._fixed_state = None

    def on_epoch_end(self, epoch, logs=None):
        # This callback runs first and Keras hands every callback (History
        # last) the same dict, so they all see the replaced values.
        if self._undone_logs is not None and logs is not None:
            self._replaced_logs = {name: value for name, value in self._undone_logs.items() if name in logs}
            logs.update(self._replaced_logs)
        self._undone_logs = None
        if self.on_nan == "ignore":
            return
        if (self._last_execution_good and self._since_snapshot and self._steps % self.grad_accum_steps == 0
                and not self._jumps):
            self._take_snapshot()
        self._fixed_state = self._non_trainable_values()

    def on_train_end(self, logs=None):
        # Keras passes the last epoch's logs again, as it computed them.
        if self._replaced_logs is not None and logs is not None:
            logs.update(self._replaced_logs)
        # A callback that stopped the run on the divergence it saw (Keras's TerminateOnNaN) ends it as in
        # model.fit, without an error: its model is the state it was rolled back to.
        stopped_by_a_callback = getattr(self.model, "stop_training", False)
        if stopped_by_a_callback and self.recoveries and self._good_steps_since_rollback == 0 and self.is_chief:
            print(f"kerasfast: a callback stopped the run right after that rollback (TerminateOnNaN does, at a "
                  f"divergence), so it does not train on from there; the model holds the state it was rolled back to "
                  f"(epoch {self._snapshot_at[0] + 1}, step {self._snapshot_at[1]}).")
        if (self._good_steps_since_rollback == 0 and self._snapshot_at == self._start_snapshot_at
                and not stopped_by_a_callback):
            raise TrainingError(
                f"training kept none of its steps: it diverged ({self.recoveries[-1]['problem']} at "
                f"{self._last_rollback}) and was rolled back to where it started, and no step trained after that. "
                "The model holds its state from before fit. Check the data for NaN, infinite or extreme values, "
                "lower the learning rate or add clipnorm=; on_nan='ignore' trains on as model.fit does."
            )

    def on_train_batch_end(self, batch, logs=None):
        if self.on_nan == "ignore":
            return
        steps = batch + 1 - self._steps
        self._steps = batch + 1
        problem = self._problem(logs or {})
        self._last_execution_good = problem is None
        if problem is None:
            self._undone_logs = None  # this execution's batches are in the metrics
            self._since_snapshot += steps
            if self._good_steps_since_rollback is not None:
                self._good_steps_since_rollback += steps
            # New variables (optimizers built in this execution) join the last good state at once: a rollback
            # to a snapshot without them would leave them as the diverged execution left them.
            if ((self._since_snapshot >= self.snapshot_every_steps or self._variables_grew())
                    and self._steps % self.grad_accum_steps == 0 and not self._jumps):
                self._take_snapshot()
            return
        self._diverged(problem, logs or {})

    def _non_trainable_values(self) -> dict:
        """`{id: value}` of the model's small non-trainable variables; by identity, since a callback that
        freezes or unfreezes a layer moves its variables between the trainable and the non-trainable ones."""
        return {id(v): np.array(keras.ops.convert_to_numpy(v)) for v in self.model.non_trainable_variables
                if math.prod(v.shape) <= STEERING_VARIABLE_MAX_SIZE}

    # -- detection and response ----------------------------------------------

    def _problem(self, logs) -> str | None:
        tracked = self._loss_tracker_state()
        loss = None
        if tracked is not None:
            previous = self._tracked or (0.0, 0.0)
            self._tracked = tracked
            if tracked[1] > previous[1]:
                loss = (tracked[0] - previous[0]) / (tracked[1] - previous[1])
        if loss is not None and not math.isfinite(loss):
            return f"the loss became {loss}"
        numbers = {name: float(value) for name, value in logs.items()
                   if isinstance(value, (int, float, np.floating))}
        # The losses only: a metric can be NaN on a sound model (PearsonCorrelation where the targets
        # do not vary), and Keras's TerminateOnNaN reads the loss alone too. Logs without one (a train_step
        # of the user's own naming its loss otherwise) are read whole.
        losses = {name: value for name, value in numbers.items() if name == "loss" or name.endswith("loss")}
        for name, value in (losses or numbers).items():
            if not math.isfinite(value):
                return f"{name} became {value}"
        if loss is None:
            return None
        if self.loss_upper_bound is not None and loss > self.loss_upper_bound:
            return f"the loss {loss:.4g} exceeded loss_upper_bound={self.loss_upper_bound}"
        if self._start_level is None:
            # The first execution's loss: the closest to the untrained
            # model's (a median of later ones can already be converged).
            self._start_level = loss
        problem = None
        if len(self._recent) >= SPIKE_WARMUP:
            level = float(np.percentile(self._recent, SPIKE_REFERENCE_PERCENTILE))
            self._jumps = [*self._jumps, loss] if blew_up(loss, level, self._start_level) else []
            if len(self._jumps) >= SPIKE_PERSISTENCE:
                problem = (f"the loss jumped to {self._jumps[0]:.4g}, {self._jumps[0] / level:.0f}x the level "
                           f"{level:.4g} of recent steps ({SPIKE_REFERENCE_PERCENTILE}th percentile), and stayed "
                           f"there for {len(self._jumps)} executions (training started near "
                           f"{self._start_level:.4g})")
                for _ in self._jumps[1:]:  # the blown-up weights' losses: rolled back, not a level to keep
                    self._recent.pop()
                self._jumps = []
                return problem
        self._recent.append(loss)
        return problem

    def _diverged(self, problem: str, logs: dict) -> None:
        where = f"epoch {self._epoch + 1}, step {self._steps}"
        back_to = f"epoch {self._snapshot_at[0] + 1}, step {self._snapshot_at[1]}"
        if self._good_steps_since_rollback == 0 and self.on_nan == "recover":
            self._restore_snapshot()
            raise TrainingError(
                f"training diverged at {where} ({problem}) right after the rollback for the divergence at "
                f"{self._last_rollback}, with no good step in between: rolling back cannot get past it. The model "
                f"holds the last good state ({back_to}). If the data holds a bad batch (NaN, infinite or extreme "
                "values) that every pass meets, filter or fix it (kerasfast.data.check_tfrecords for TFRecords); "
                "otherwise lower the learning rate or add clipnorm=. on_nan='ignore' trains on as model.fit does."
            )
        self._good_steps_since_rollback, self._last_rollback = 0, where
        emptied = self._restore_snapshot()
        self._undone_logs = {name: float(value) for name, value in logs.items()
                             if isinstance(value, (int, float, np.floating))} if emptied else None
        if self.on_nan == "stop":
            raise TrainingError(
                f"training diverged at {where}: {problem}. The model holds the last good state ({back_to}). "
                "Lower the learning rate, add clipnorm=, check the data, or pass on_nan='recover'."
            )
        self.recoveries.append({"epoch": self._epoch + 1, "step": self._steps, "problem": problem})
        if len(self.recoveries) > self.max_recoveries:
            raise TrainingError(
                f"training diverged {len(self.recoveries)} times (the last at {where}: {problem}), more than "
                f"max_recoveries={self.max_recoveries}, each time rolled back and the learning rate halved. The "
                f"model holds the last good state ({back_to}). Check the data for NaN or extreme values, lower "
                "the learning rate or add clipnorm=."
            )
        lowered = ""
        if self.learning_rate is not None:
            self.learning_rate.lower(RECOVERY_LR_FACTOR)
            rates = self.learning_rate.current()
            lowered = (f", learning rate now {next(iter(rates.values())):.3g}" if len(rates) == 1 else
                       ", learning rates now " + ", ".join(f"{name} {rate:.3g}" for name, rate in rates.items()))
        if self.is_chief:
            print(f"kerasfast: {problem} at {where}; rolled back to {back_to}{lowered}, skipping the batches in "
                  f"between (recovery {len(self.recoveries)} of at most {self.max_recoveries}).")
