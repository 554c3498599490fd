"""TensorBoard logs for `fit(..., tensorboard=True)`, written by Keras's own callback.

The logs go to `<run_dir>/tensorboard`: per-epoch scalars (loss, metrics,
learning rate; training under `train/`, validation under `validation/`)
and a profile of a few steady-state executions (after the first, which
traces and compiles) under `train/plugins/profile/`. View them with
`tensorboard --logdir <run_dir>/tensorboard`; the profile needs the
`tensorboard-plugin-profile` package in TensorBoard's environment.

Writing the logs needs the `tensorboard` package (TensorFlow's summary ops
are only implemented by it), installed with `pip install "kerasfast[tensorboard]"`
and by the test extra; it is not a core dependency, since only runs with
`tensorboard=True` use it.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib

import keras

from kerasfast.errors import PlanError

# Executions left out before profiling (the first traces and compiles, the
# second may still warm caches), and how many are profiled.
PROFILE_SKIP, PROFILE_EXECUTIONS = 2, 3


def check_available() -> None:
    """Refuses `tensorboard=True` before training when `tensorboard` is not installed.

    Raises:
        PlanError: Saying how to install it.
    """
    if importlib.util.find_spec("tensorboard") is None:
        raise PlanError('tensorboard=True needs the tensorboard package, which writes the logs: pip install '
                        '"kerasfast[tensorboard]" (or pip install tensorboard), or drop tensorboard=True.')


def profile_range(executions: int | None) -> tuple[int, int]:
    """The 1-based (first, last) training executions to profile.

    Keras's `TensorBoard(profile_batch=)` counts the executions (calls of
    the train function, each `steps_per_execution` steps) of a run. The
    profiled ones skip the first `PROFILE_SKIP`; a run with fewer
    executions profiles its last one.

    Args:
        executions: Executions in the run, or None when unknown.

    Returns:
        `(first, last)`, e.g. `(3, 5)`.

    Example:

    >>> profile_range(100)
    (3, 5)
    >>> profile_range(2)
    (2, 2)
    """
    first = PROFILE_SKIP + 1
    last = PROFILE_SKIP + PROFILE_EXECUTIONS
    if executions is None or executions >= last:
        return first, last
    if executions >= first:
        return first, executions
    return max(1, executions), max(1, executions)


def tensorboard_callback(run_dir: str | pathlib.Path, plan) -> keras.callbacks.TensorBoard:
    """Keras's TensorBoard callback writing into `run_dir/tensorboard`.

    Args:
        run_dir: The run folder.
        plan: The run's `Plan` (its `total_steps`, `grad_accum_steps` and
            `steps_per_execution` place the profiled executions).

    Returns:
        A `keras.callbacks.TensorBoard` logging scalars once per epoch (no
        per-batch summaries that would slow training) and profiling
        `profile_range(...)` executions.

    Example:

    >>> plan = kerasfast.resolve_plan(kerasfast.detect_hardware(), batch_size=64)
    >>> callback = tensorboard_callback("runs/a", plan)
    >>> callback.log_dir
    'runs/a/tensorboard'
    """
    executions = None
    if plan.total_steps:
        batches = plan.total_steps * max(1, plan.grad_accum_steps or 1)
        executions = math.ceil(batches / max(1, plan.steps_per_execution or 1))
    return keras.callbacks.TensorBoard(
        log_dir=str(pathlib.Path(run_dir) / "tensorboard"), update_freq="epoch", write_graph=False,
        profile_batch=profile_range(executions),
    )
