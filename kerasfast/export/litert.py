"""Running .tflite files in LiteRT (`ai_edge_litert`), the runtime phones use."""

from __future__ import annotations

import re
import time

import numpy as np

from kerasfast._quiet import filtered_stderr
from kerasfast.errors import ExportError


def _interpreter_class():
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError as error:  # pragma: no cover - dependency missing
        raise ExportError(
            "Verifying .tflite files needs the LiteRT interpreter: pip install 'ai-edge-litert>=2.0'."
        ) from error
    return Interpreter


def utf8_strings(x) -> np.ndarray:
    """Text as an object array of bytes, str encoded as UTF-8 (as TensorFlow encodes it).

    NumPy's `astype(np.bytes_)` encodes ASCII only, so "héllo" would fail.
    """
    x = np.asarray(x)
    if x.dtype.kind == "S":
        return x.astype(object)
    encoded = [value.encode("utf-8") if isinstance(value, str) else value for value in x.ravel().tolist()]
    out = np.empty(len(encoded), dtype=object)
    out[:] = encoded
    return out.reshape(x.shape)


class LiteRTModel:
    """A .tflite model in the LiteRT interpreter, called like a Keras model.

    Float inputs are quantised and int8 outputs dequantised with the file's
    own quantisation parameters, so results compare with Keras directly.

    Args:
        model_content: the .tflite bytes.
        num_threads: interpreter threads (1 keeps latency comparable across
            runs on a shared machine).

    Attributes:
        fixed_batch: the file's batch size when its input fixes one (1 for
            recurrent models, whose graphs LiteRT cannot resize), else None;
            `predict` then feeds that many samples per call.
    """

    def __init__(self, model_content: bytes, num_threads: int = 1):
        Interpreter = _interpreter_class()
        self._content = model_content
        self._num_threads = num_threads
        try:
            # "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." is
            # printed to file descriptor 2 here; on failure all of it is shown.
            with filtered_stderr():
                self._interpreter = Interpreter(model_content=model_content, num_threads=num_threads)
                details = self.input_details
                self._signature = [int(d) for d in details.get("shape_signature", details["shape"])]
                try:
                    self._interpreter.allocate_tensors()
                except RuntimeError:
                    # A dimension the file leaves open besides the batch (a sequence length) is 1 until the
                    # input is sized (`_resize`): too short for a convolution with no padding, say.
                    if not any(d < 0 for d in self._signature[1:]):
                        raise
        except Exception as error:
            raise ExportError(f"LiteRT cannot load the .tflite file: {str(error).strip()[:500]}") from error
        self._shape = None
        # A file traced with a fixed batch (recurrent models: see
        # kerasfast.export.recurrent) cannot be resized to another one.
        self.fixed_batch = self._signature[0] if self._signature and self._signature[0] > 0 else None

    @property
    def input_details(self):
        return self._interpreter.get_input_details()[0]

    @property
    def output_details(self):
        return self._interpreter.get_output_details()[0]

    def holds_int8(self) -> bool:
        """Whether any of the file's tensors is int8 (a weight dynamic-range quantisation quantised, say)."""
        return any(np.dtype(details["dtype"]) == np.int8 for details in self._interpreter.get_tensor_details())

    def layers_with_op(self, op: str, known_layer_names) -> list[str]:
        """Layers (of `known_layer_names`) whose tensors name TFLite op `op` (e.g. "RESHAPE" -> ".../Reshape")."""
        from kerasfast.export.tflite import _layer_name

        wanted = op.replace("_", "").lower()
        layers = set()
        for details in self._interpreter.get_tensor_details():
            for name in details["name"].split(";"):
                parts = name.split("/")
                if len(parts) >= 3 and re.sub(r"_?\d+$", "", parts[-1]).lower() == wanted:
                    layer = _layer_name(parts[1], set(known_layer_names))
                    if layer in known_layer_names:
                        layers.add(layer)
        return sorted(layers)

    def _resize(self, sample_shape, batch):
        """Sizes the input for `batch` samples of `sample_shape`.

        Dimensions the file leaves open (-1 in its shape signature, e.g. a
        variable sequence length) take the sample's size; fixed ones keep
        the file's, so a wrong sample shape fails in set_tensor, named.
        """
        details = self.input_details
        shape = [batch] + [int(given) if fixed < 0 else int(fixed)
                           for fixed, given in zip(self._signature[1:], sample_shape, strict=False)]
        if shape != self._shape:
            try:
                self._interpreter.resize_tensor_input(details["index"], shape)
                self._interpreter.allocate_tensors()
            except (RuntimeError, ValueError) as error:
                raise ExportError(
                    f"LiteRT cannot run the .tflite file on inputs of shape {tuple(shape)}: "
                    f"{str(error).strip()[:500]}"
                ) from error
            self._shape = shape

    def _set_input(self, x):
        try:
            self._interpreter.set_tensor(self.input_details["index"], self._quantize_input(x))
        except ValueError as error:
            raise ExportError(
                f"LiteRT cannot take inputs of shape {x.shape} (the .tflite input is "
                f"{tuple(int(d) for d in self._signature)}, -1 open): {str(error).strip()[:300]}"
            ) from error

    def _quantize_input(self, x):
        details = self.input_details
        if details["dtype"] in (np.int8, np.uint8) and np.issubdtype(x.dtype, np.floating):
            scale, zero_point = details["quantization"]
            info = np.iinfo(details["dtype"])
            return np.clip(np.round(x / scale + zero_point), info.min, info.max).astype(details["dtype"])
        if np.dtype(details["dtype"]).kind in ("S", "O"):
            return utf8_strings(x)
        return x.astype(details["dtype"])

    def _dequantize_output(self, y):
        details = self.output_details
        if details["dtype"] in (np.int8, np.uint8):
            scale, zero_point = details["quantization"]
            return (y.astype(np.float32) - zero_point) * scale
        return y.astype(np.float32)

    def predict(self, x: np.ndarray, batch_size: int = 32) -> np.ndarray:
        """Outputs for all of `x`, in batches of `batch_size`.

        A file with a fixed batch size (`fixed_batch`, e.g. 1) is run that
        many samples at a time instead, the last batch padded with copies of
        its last sample (their outputs dropped).
        """
        step = self.fixed_batch or batch_size
        outputs = []
        for start in range(0, len(x), step):
            chunk = x[start : start + step]
            count = len(chunk)
            if self.fixed_batch and count < step:
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], step - count, axis=0)])
            self._resize(chunk.shape[1:], len(chunk))
            self._set_input(chunk)
            try:
                self._interpreter.invoke()
            except (RuntimeError, ValueError) as error:
                raise ExportError(f"LiteRT failed to run the .tflite file: {str(error).strip()[:500]}") from error
            output = self._interpreter.get_tensor(self.output_details["index"])
            outputs.append(self._dequantize_output(output[:count]))
        return np.concatenate(outputs)

    def latency_ms_per_sample(self, sample: np.ndarray, *, warmup: int = 5, min_runs: int = 30, budget_s: float = 0.5):
        """Median milliseconds of one batch-1 invocation (per sample of a larger fixed batch)."""
        batch = self.fixed_batch or 1
        sample = np.asarray(sample)  # one sample of a scalar string input is a bare str
        self._resize(sample.shape, batch)
        quantized = self._quantize_input(np.repeat(sample[None, ...], batch, axis=0))
        index = self.input_details["index"]
        for _ in range(warmup):
            self._interpreter.set_tensor(index, quantized)
            self._interpreter.invoke()
        timings, started = [], time.perf_counter()
        while len(timings) < min_runs or (time.perf_counter() - started < budget_s and len(timings) < 2000):
            tick = time.perf_counter()
            self._interpreter.set_tensor(index, quantized)
            self._interpreter.invoke()
            timings.append(time.perf_counter() - tick)
        return float(np.median(timings) * 1000.0) / batch
