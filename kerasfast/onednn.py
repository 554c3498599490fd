"""TensorFlow's oneDNN CPU kernels: on wherever kerasfast starts first.

TensorFlow reads `TF_ENABLE_ONEDNN_OPTS` once, while it loads, and when the
variable is unset it turns oneDNN's kernels (fused matmul + bias +
activation, convolutions, batch matmul) on only on x86 CPUs with
AVX512-VNNI, AVX512-BF16 or AMX. Elsewhere (AVX2-only CPUs: many AMD EPYC
and older Intel cloud machines) it falls back to its Eigen kernels, which on
an AVX2 AMD EPYC ran plain Keras 1.2-1.6x slower on eight of the nine models
of `benchmarks/tune.py` (an LSTM level: 0.95x and 1.11x in two runs;
docs/benchmarks.md, "oneDNN on CPUs where TensorFlow leaves it off").

`import kerasfast` before TensorFlow loads therefore sets the variable to
"1" on Linux x86-64 when it is unset; a value the user set, "0" included, is
kept. Once TensorFlow has loaded nothing can change, so the plan says which
kernels run and why (`Plan.onednn`), and how to get oneDNN when it is off.
Like `configure_threads()`, this is a decision for the top of a script.
"""

from __future__ import annotations

import os
import platform
import sys

ENV = "TF_ENABLE_ONEDNN_OPTS"

# Whether `import kerasfast` set ENV itself (so the plan can say whose choice it was).
_set_by_kerasfast = False


def _x86_64_linux() -> bool:
    return sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")


def turn_on_before_tensorflow() -> bool:
    """Sets `TF_ENABLE_ONEDNN_OPTS=1` if TensorFlow has not loaded, the
    variable is unset, and this is Linux on x86-64; called by `import
    kerasfast`.

    Returns:
        Whether it set the variable.
    """
    global _set_by_kerasfast
    if "tensorflow" in sys.modules or ENV in os.environ or not _x86_64_linux():
        return False
    os.environ[ENV] = "1"
    _set_by_kerasfast = True
    return True


def onednn_state() -> tuple[bool | None, str]:
    """Whether this process runs TensorFlow's oneDNN kernels, and why.

    Returns:
        `(on, reason)`; `on` is None where TensorFlow's build has no oneDNN
        switch to read (not x86-64 Linux) or does not report it.

    Example:

    >>> on, reason = onednn_state()
    >>> on in (True, False, None) and bool(reason)
    True
    """
    from kerasfast import _compat

    if not _x86_64_linux():
        return None, "not x86-64 Linux: TensorFlow's own default for this platform"
    on = _compat.onednn_enabled()
    value = os.environ.get(ENV)
    if _set_by_kerasfast:
        why = (f"{ENV}=1, set by `import kerasfast` before TensorFlow loaded (TensorFlow leaves oneDNN off on "
               "x86 CPUs without AVX512-VNNI/AVX512-BF16/AMX)")
    elif value is not None:
        why = f"your {ENV}={value}"
    elif on is None:
        why = "TensorFlow's default; this TensorFlow does not report whether oneDNN is on"
    elif on:
        why = "TensorFlow's default on this CPU"
    else:
        why = ("TensorFlow's default on this CPU, which has no AVX512-VNNI/AVX512-BF16/AMX; TensorFlow was imported "
               f"before kerasfast: import kerasfast first, or set {ENV}=1 before TensorFlow loads, for oneDNN's "
               "kernels (plain Keras ran 1.2-1.6x faster with them on an AVX2 CPU, docs/benchmarks.md)")
    return on, why

