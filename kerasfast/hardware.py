"""What hardware this process can train on.

`detect_hardware()` looks once at the CPU, the GPUs and TPUs that TensorFlow
sees, and returns a plain, printable `Hardware` object. Every automatic choice
in the plan (`kerasfast.plan`) is derived from it, so a plan can be reproduced
for another machine by building a `Hardware` by hand.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import subprocess

# CPU flags that decide precision: bf16 matmuls run natively with these.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# Flags worth showing in `kerasfast info` because they change what is fast.
NOTABLE_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8", "amx_tile")


@dataclasses.dataclass(frozen=True)
class GPU:
    """One GPU as TensorFlow sees it.

    Attributes:
        name: Device name, e.g. "NVIDIA H100 80GB HBM3".
        compute_capability: `(major, minor)`, or None when unknown.
        memory_mib: Total memory in MiB, or None when unknown.
    """

    name: str
    compute_capability: tuple[int, int] | None = None
    memory_mib: int | None = None


@dataclasses.dataclass(frozen=True)
class Hardware:
    """The machine a plan is made for.

    Attributes:
        cpu_model: Human-readable CPU name.
        cpu_cores: Cores this process may use (affinity-aware).
        cpu_flags: The notable instruction-set flags the CPU has (lower case).
        gpus: The GPUs TensorFlow can use.
        tpu_cores: Number of TPU cores TensorFlow can use (0 when none).
    """

    cpu_model: str = "unknown"
    cpu_cores: int = 1
    cpu_flags: tuple[str, ...] = ()
    gpus: tuple[GPU, ...] = ()
    tpu_cores: int = 0

    @property
    def accelerator(self) -> str:
        """"tpu", "gpu" or "cpu": the device the model's math will run on."""
        if self.tpu_cores:
            return "tpu"
        if self.gpus:
            return "gpu"
        return "cpu"

    @property
    def cpu_has_bf16(self) -> bool:
        return any(flag in self.cpu_flags for flag in BF16_CPU_FLAGS)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _cpu_flags_and_model() -> tuple[tuple[str, ...], str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            text = handle.read()
        flags: set[str] = set()
        model = "unknown"
        for line in text.splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "flags" and not flags:
                flags = set(value.split())
            elif key == "model name" and model == "unknown":
                model = value.strip()
    except OSError:
        # Not Linux: py-cpuinfo knows how to ask the CPU on other systems.
        import cpuinfo

        info = cpuinfo.get_cpu_info()
        flags = set(info.get("flags", []))
        model = info.get("brand_raw", platform.processor() or "unknown")
    return tuple(f for f in NOTABLE_CPU_FLAGS if f in flags), model


def _cpu_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _gpu_memory_mib() -> list[int]:
    # TensorFlow reports a GPU's memory only after allocating on it, so ask
    # the driver instead; absent nvidia-smi, memory is simply unknown.
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
        return [int(line.strip()) for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return []


def _listed_devices(kind: str) -> list:
    """`tf.config.list_physical_devices(kind)`, without the lines TensorFlow logs when it first probes the
    devices (`failed call to cuInit` on a machine without a GPU): they print even when TensorFlow was
    imported before kerasfast, so they are filtered here (KERASFAST_VERBOSE_TF=1 shows them)."""
    import tensorflow as tf

    from kerasfast._quiet import filtered_stderr

    with filtered_stderr():
        return tf.config.list_physical_devices(kind)


def _gpus() -> tuple[GPU, ...]:
    import tensorflow as tf

    devices = _listed_devices("GPU")
    memories = _gpu_memory_mib()
    gpus = []
    for index, device in enumerate(devices):
        details = tf.config.experimental.get_device_details(device)
        gpus.append(GPU(
            name=details.get("device_name", device.name),
            compute_capability=details.get("compute_capability"),
            memory_mib=memories[index] if index < len(memories) else None,
        ))
    return tuple(gpus)


def _tpu_cores() -> int:
    return len(_listed_devices("TPU"))


def detect_hardware() -> Hardware:
    """Looks at this machine once and describes it.

    Listing devices does not initialise the TensorFlow runtime, so thread
    settings can still be applied afterwards.

    Returns:
        A `Hardware` object.

    Example:

    >>> hw = detect_hardware()
    >>> hw.accelerator in ("cpu", "gpu", "tpu")
    True
    """
    flags, model = _cpu_flags_and_model()
    return Hardware(
        cpu_model=model,
        cpu_cores=_cpu_cores(),
        cpu_flags=flags,
        gpus=_gpus(),
        tpu_cores=_tpu_cores(),
    )
