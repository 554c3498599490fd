"""Silences TensorFlow's start-up chatter before TensorFlow is first imported.

A fresh `import kerasfast` (and so every `kerasfast` command) would
otherwise print, before kerasfast's own output, lines such as

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 ... port.cc:153] oneDNN custom operations are on. ...
    I0000 ... cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
    E0000 ... cuda_platform.cc:52] failed call to cuInit: ... UNKNOWN ERROR (303)

Two mechanisms are needed, measured with TensorFlow 2.21:

- The oneDNN and cudart lines are logged by static initialisers while the
  shared libraries load, before TensorFlow reads `TF_CPP_MIN_LOG_LEVEL`, so
  no environment variable hides them (TF_CPP_MIN_LOG_LEVEL=3 still shows
  them). While `import tensorflow` runs, file descriptor 2 is sent to a
  temporary file; afterwards the known chatter lines are dropped and
  everything else (Python warnings, unexpected errors) is written back to
  stderr unchanged. If the import fails, everything is written back.
- Later lines (cuInit when the device list is first built, grappler
  notices) obey `TF_CPP_MIN_LOG_LEVEL`: set to "2" (info and warnings
  hidden, errors kept) where an NVIDIA driver is installed, so that real
  GPU problems (a cuDNN version mismatch) still show, and to "3" where none
  is, since the only error TensorFlow logs there is the failed cuInit probe.
  A value the user already set is kept.

Python-side `absl` warnings ("WARNING:absl:Compiled the loaded model, but
the compiled metrics have yet to be built") are raised to ERROR unless the
user already set an absl verbosity. kerasfast's own warnings (Python
`warnings`) are untouched.

`KERASFAST_VERBOSE_TF=1` turns all of this off. Nothing can be done when
TensorFlow was imported before kerasfast: its start-up lines are printed by
then.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import re
import sys
import tempfile

VERBOSE_ENV = "KERASFAST_VERBOSE_TF"

# glog/absl-formatted lines ("I0000 00:00:1796145201.747797   21032 port.cc:153] ...").
_LOG_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ([\w.+-]+):\d+\] (.*)$")
# Error-level lines that are start-up chatter, not problems.
_CHATTER_ERRORS = re.compile(
    r"failed call to cuInit|Unable to register cu(DNN|FFT|BLAS) factory|"
    r"computation placer already registered|Could not find cuda drivers"
)
_CHATTER_PLAIN = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "To enable the following instructions:",
    # TFLite's converter (once per quantising conversion) and interpreter
    # (once per process) print these with printf, not the logger.
    "fully_quantize: ",
    "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",
)
# printf'd by TensorFlow's (v1) profiler for a graph with unknown shapes, which
# kerasfast's FLOP count (a cost estimate, not the user's to act on) meets.
_CHATTER_LINES = re.compile(r"\d+ ops no flops stats due to incomplete shapes\.")
# Python-side `tensorflow` logger notices that are not the user's to act on:
# kerasfast's own eager calls under a multi-worker strategy (the training
# steps themselves run in a tf.function) log this once per call site.
_PYTHON_CHATTER = ("eagerly has significant overhead currently",)
# tf.function's retracing warning counts the steps of every `fit` call as one
# function's traces (they share their code), so a process that calls `fit`
# more than four times is warned although each call traced its steps once;
# so are the hashed dropout's functions, one per rate, dtype and rank.
_OWN_RETRACING = re.compile(r"calls to <function (StepFunctions\.[\w.<>]+|_compiled\.<locals>\.apply_hashed_mask) "
                            r"at 0x[0-9a-f]+> triggered tf\.function retracing")


def verbose_requested() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _nvidia_driver_present() -> bool:
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")


def _is_chatter(line: str) -> bool:
    match = _LOG_LINE.match(line)
    if match:
        severity, _, message = match.groups()
        return severity in "IW" or (severity == "E" and bool(_CHATTER_ERRORS.search(message)))
    if line.startswith("WARNING:tensorflow:"):  # the Python logger's format, e.g. from a launched worker
        return any(text in line for text in _PYTHON_CHATTER)
    return line.startswith(_CHATTER_PLAIN) or bool(_CHATTER_LINES.fullmatch(line))


def filter_chatter(text: str) -> str:
    """`text` without TensorFlow's chatter lines (info and warning log
    lines, the known harmless error lines and notices)."""
    return "".join(line for line in text.splitlines(keepends=True) if not _is_chatter(line.rstrip("\n")))


@contextlib.contextmanager
def filtered_stderr(explained=lambda error: False):
    """Sends file descriptor 2 to a temporary file for the block, then writes
    back what it caught without TensorFlow's chatter; everything if the block
    raised, and nothing if `explained(error)` says the caller turns that
    error into one of its own, whose cause holds what was printed. A no-op
    with KERASFAST_VERBOSE_TF=1.

    Also used around conversions that start TensorFlow's graph optimiser,
    whose "Number of eligible GPUs" / "Starting new session" lines ignore
    TF_CPP_MIN_LOG_LEVEL.
    """
    if verbose_requested():
        yield
        return
    # TensorFlow's C++ code writes to file descriptor 2, whatever sys.stderr
    # is (a notebook's stream, pytest's capture file).
    stderr_fd = 2
    try:
        saved = os.dup(stderr_fd)
    except OSError:  # no stderr to redirect
        yield
        return
    failed, replaced = True, False
    with tempfile.TemporaryFile(mode="w+b") as capture:
        try:
            if sys.stderr is not None:
                sys.stderr.flush()
            os.dup2(capture.fileno(), stderr_fd)
            try:
                yield
                failed = False
            except BaseException as error:
                replaced = explained(error)
                raise
            finally:
                if sys.stderr is not None:
                    sys.stderr.flush()
                os.dup2(saved, stderr_fd)
        finally:
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode("utf-8", errors="replace")
            shown = "" if replaced else text if failed else filter_chatter(text)
            if shown:
                os.write(stderr_fd, shown.encode("utf-8", errors="replace"))


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` for whatever imports it first (kerasfast, keras or
    the user's script) and runs that import inside `filtered_stderr`: the
    oneDNN/cudart lines are printed while its shared libraries load. Leaves
    `sys.meta_path` once TensorFlow is imported; a mere look-up
    (`importlib.util.find_spec("tensorflow")`) keeps it in place."""

    def __init__(self):
        self._finding = False

    def find_spec(self, fullname, path, target=None):
        if fullname != "tensorflow" or self._finding:
            return None
        self._finding = True  # the look-up below passes through this finder again
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader, self)
        return spec


class _QuietLoader(importlib.abc.Loader):
    """Runs `loader`'s module inside `filtered_stderr`, then hands the module
    its own loader back (importlib.resources and pickling look at it)."""

    def __init__(self, loader, finder):
        self._loader = loader
        self._finder = finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self._finder)
        try:
            with filtered_stderr():
                self._loader.exec_module(module)
        finally:
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
        _quiet_absl()

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _quiet_absl() -> None:
    try:
        from absl import logging as absl_logging
    except ImportError:  # pragma: no cover - absl comes with TensorFlow
        return
    if absl_logging.get_absl_logger().level == 0:  # NOTSET: nobody chose a verbosity
        absl_logging.set_verbosity(absl_logging.ERROR)


class _DropTensorFlowNotices(logging.Filter):
    def filter(self, record):
        message = record.getMessage()
        return not any(text in message for text in _PYTHON_CHATTER) and not _OWN_RETRACING.search(message)


def quiet_tensorflow() -> None:
    """Applies the settings above. Cheap: TensorFlow is not imported here,
    only silenced for when something first imports it."""
    if verbose_requested():
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2" if _nvidia_driver_present() else "3")
    tf_logger = logging.getLogger("tensorflow")
    if not any(isinstance(f, _DropTensorFlowNotices) for f in tf_logger.filters):
        tf_logger.addFilter(_DropTensorFlowNotices())
    if "tensorflow" in sys.modules:
        _quiet_absl()
    elif not any(isinstance(finder, _QuietTensorFlowImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowImport())
