"""Training: precision, XLA, batching, accumulation, schedules and `fit`."""

from kerasfast.training.fit import FitResult, fit
from kerasfast.training.schedules import OneCycle, warmup_cosine
from kerasfast.training.throughput import Throughput, ThroughputMeter

__all__ = ["FitResult", "OneCycle", "Throughput", "ThroughputMeter", "fit", "warmup_cosine"]
