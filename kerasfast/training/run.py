"""One `kerasfast.fit` call's state, from its checked arguments to its result.

A run goes facts -> searches -> one plan -> one check -> tuning -> training
-> finish. Each phase is a function of its own module that reads the `Run`
and fills in what it decides, so no helper takes the run in pieces and a
later phase never redoes an earlier one:

| phase | module | fills in |
| --- | --- | --- |
| facts | `training.facts` | hardware, thread pools, strategy, backup, seed |
| data | `training.feed` | `train_data`, `validation` |
| model | `training.model_setup` | `prepared`, `model_facts`; compiled as Keras would, once |
| searches | `training.searches` | `findings` (batch size, learning rate) |
| plan | `training.planning` | `plan`: `resolve_plan`, once, and its check |
| tuning | `training.tuning` | the plan as it trains, `measured` steps |
| training | `training.trainer` | `history`, `meter`, `guard` |
| finish | `training.finish` | the run folder, the user's model |
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib

from kerasfast.plan import Findings, ModelFacts, Overrides, Plan, RunFacts


@dataclasses.dataclass(frozen=True)
class Arguments:
    """`fit`'s arguments, checked (`kerasfast.training.fit`), beside the data."""

    epochs: int
    initial_epoch: int
    verbose: object
    callbacks: list
    validation_split: float
    steps_per_epoch: int | None
    loss: object
    optimizer: object
    metrics: object
    seed: int | None
    strategy: object
    prune: object
    run_dir: object
    backup_dir: object
    backup_every: int
    resume: str
    on_nan: str
    max_recoveries: int
    loss_upper_bound: float | None
    tune: str
    tune_budget_s: float | None
    save_model_file: bool
    tensorboard: bool
    overrides: Overrides
    # The two choices made by measuring: `batch_size="auto"`, `learning_rate="find"`.
    auto_batch: bool
    find_rate: bool

    @property
    def divergence(self) -> dict:
        return {"on_nan": self.on_nan, "max_recoveries": self.max_recoveries,
                "loss_upper_bound": self.loss_upper_bound}


@dataclasses.dataclass
class Feed:
    """The training and validation data as the user passed them (after `validation_split`)."""

    x: object
    y: object
    sample_weight: object
    class_weight: object
    shuffle: object
    on_error: str
    validation_data: object
    validation_batch_size: int | None
    validation_steps: int | None
    validation_freq: object
    data_service: str | None


@dataclasses.dataclass
class Run:
    """The state of one run; each phase reads it and fills in its part."""

    model: object  # the user's model or builder, as passed
    args: Arguments
    feed: Feed
    # What the run holds until `fit` returns, however it ends (the backup folder's lock).
    held: contextlib.ExitStack = dataclasses.field(default_factory=contextlib.ExitStack)
    # facts
    hardware: object = None
    distribution: object = None
    backup: object = None
    progress: object = None  # what the backup recorded (a resumed run), or None
    seed: int | None = None
    run_facts: RunFacts | None = None
    train_data: object = None
    validation: dict | None = None
    prepared: object = None  # a `PreparedModel`
    model_facts: ModelFacts | None = None
    compiled: bool = False  # compiled and built for this run (`model_setup.compile_once`)
    uses_default_optimizer: bool = False
    # searches and plan
    findings: Findings = dataclasses.field(default_factory=Findings)
    rate_finding: object = None  # the range test's `LearningRateFinding`, for its plot
    plan: Plan | None = None
    # tuning, training, finish
    measured: object = None  # the `StepFunctions` tuning compiled for the plan
    folder: pathlib.Path | None = None
    pruned_layers: list | None = None
    history: object = None
    meter: object = None
    guard: object = None

    @property
    def strategy(self):
        """The `tf.distribute.Strategy`, or None on one device."""
        return self.distribution.strategy

    @property
    def is_chief(self) -> bool:
        return self.distribution.is_chief

    @property
    def train_model(self):
        return self.prepared.train_model

    @property
    def models(self) -> list:
        """The user's model and the one trained (a copy when rebuilt in a strategy's scope), each once."""
        return list({id(model): model for model in (self.prepared.user_model, self.prepared.train_model)}.values())

    @property
    def talks(self) -> bool:
        """Whether this process prints (the chief, unless `verbose=0`)."""
        return self.args.verbose != 0 and self.is_chief
