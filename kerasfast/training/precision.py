"""Running a train step in the plan's precision.

A Keras mixed policy ("mixed_bfloat16", "mixed_float16") is applied when
the model is built (`kerasfast.training.models`). "onednn_bfloat16" is
applied when the step's graph is optimised instead: the model stays
float32, and TensorFlow's oneDNN auto-mixed-precision pass (a Grappler
rewrite) turns the graph's matmuls and convolutions into bfloat16 while
softmax, normalisation, reductions and the optimizer update stay in
float32. On CPUs it measures as fast as a mixed policy (within run-to-run
noise, benchmarks/precision_ablation.py), and the model is trained as built:
nothing is rebuilt or copied, and it predicts and exports in float32.
"""

from __future__ import annotations

import contextlib
import re

from kerasfast.plan import ONEDNN_BFLOAT16

GRAPPLER_OPTION = "auto_mixed_precision_onednn_bfloat16"


@contextlib.contextmanager
def graph_precision(precision: str):
    """Optimises the functions first run inside it for `precision`.

    TensorFlow applies Grappler options when a `tf.function` first runs, so
    the train and test steps must first run inside this block; the previous
    option is restored on leaving it, so later functions (predict, export)
    run in float32.

    Args:
        precision: A plan precision; only "onednn_bfloat16" changes anything.

    Example:

    >>> import tensorflow as tf
    >>> with graph_precision("onednn_bfloat16"):
    ...     tf.config.optimizer.get_experimental_options()["auto_mixed_precision_onednn_bfloat16"]
    True
    """
    if precision != ONEDNN_BFLOAT16:
        yield
        return
    import tensorflow as tf

    previous = tf.config.optimizer.get_experimental_options().get(GRAPPLER_OPTION, False)
    tf.config.optimizer.set_experimental_options({GRAPPLER_OPTION: True})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({GRAPPLER_OPTION: previous})


def runs_user_code(layer) -> bool:
    """Whether code of the user's runs in `layer`'s forward pass: a
    `keras.layers.Lambda`, or a layer whose `call` is not Keras's own (a
    custom layer, a subclassed model)."""
    import keras

    if isinstance(layer, keras.layers.Lambda):
        return True
    call = getattr(type(layer), "call", None)
    module = getattr(call, "__module__", None) or type(layer).__module__
    return not (module == "keras" or module.startswith("keras."))


def mixed_dtype_problem(model, sample_inputs, policy: str, suspects) -> str | None:
    """Traces `model`'s forward pass (training=True) on one batch's spec
    under a mixed `policy`, as the train step would, to find code that mixes
    float32 tensors into the policy's compute dtype (a `tf.constant(2.0)`, a
    `tf.cast(..., tf.float32)`), which TensorFlow refuses in the first step.

    Only traced: nothing runs, so no variable, statistic or counter changes
    (`keras.StatelessScope` also keeps the trace's `add_loss` tensors off the
    layers); the layers' policies are put back after.

    Args:
        model: A built Keras model.
        sample_inputs: One batch of the model's inputs (only its spec is used).
        policy: "mixed_bfloat16" or "mixed_float16".
        suspects: The model's layers that run user code (`runs_user_code`),
            the ones named when the failing layer cannot be told.

    Returns:
        None when the forward pass traces, or fails for a reason that is not
        the policy's (another error, or one float32 meets too: training
        meets it as model.fit would); else e.g. "ScaleF32 layer 'scale_f32'
        mixes float32 into bfloat16 (model.py, line 7: Input 'y' of 'Mul' Op
        has type float32 that does not match type bfloat16 of argument 'x')".
    """
    import keras
    import tensorflow as tf

    def spec(value):
        return tf.type_spec_from_value(value) if tf.is_tensor(value) or hasattr(value, "__array__") else value

    specs = tf.nest.map_structure(spec, sample_inputs)
    error = _trace_error(model, specs, policy)
    problem = _described(error, keras.DTypePolicy(policy).compute_dtype, suspects) if error is not None else None
    # A second trace, only for a model that failed: one failing in float32 too has a bug of its own.
    if problem is None or _trace_error(model, specs, "float32") is not None:
        return None
    return problem


def _trace_error(model, specs, policy: str) -> Exception | None:
    """The error tracing `model(inputs, training=True)` under `policy` raises, if any."""
    import keras
    import tensorflow as tf

    from kerasfast.training.models import computing_in

    def forward(inputs):
        return model(inputs, training=True)

    # Keras's traceback filtering drops its own frames, `Lambda.call`'s
    # among them: the frames are how the failing layer is found.
    filtering = keras.config.is_traceback_filtering_enabled()
    keras.config.disable_traceback_filtering()
    try:
        with computing_in(model, policy), keras.StatelessScope():
            # autograph=False as in kerasfast's own steps (and cheaper).
            tf.function(forward, autograph=False).get_concrete_function(specs)
    except Exception as error:  # noqa: BLE001 - which errors count is `_described`'s to say
        return error
    finally:
        if filtering:
            keras.config.enable_traceback_filtering()
    return None


_DTYPE = re.compile(r"\b(?:tf\.)?(bfloat16|float16|half|float32|float64|double|float)\b")
_DTYPE_NAMES = {"half": "float16", "float": "float32", "double": "float64"}


def _described(error: Exception, compute: str, suspects) -> str | None:
    """What `error` says about dtypes, and where; None for any other error."""
    import tensorflow as tf

    if not isinstance(error, (TypeError, ValueError, tf.errors.InvalidArgumentError)):
        return None
    text = str(error)
    line = next((line.strip() for line in text.splitlines() if _DTYPE.search(line)), "").rstrip(".")
    found = list(dict.fromkeys(_DTYPE_NAMES.get(name, name) for name in _DTYPE.findall(line)))
    others = [name for name in found if name != compute]
    if compute not in found or not others:
        return None
    layer, where = _failing_layer(error.__traceback__, suspects)
    who = _named(layer) if layer is not None else "one of " + ", ".join(_named(suspect) for suspect in suspects)
    return f"{who} mixes {others[0]} into {compute} ({where}{line})"


def _named(layer) -> str:
    import keras

    return f"{type(layer).__name__} {'model' if isinstance(layer, keras.Model) else 'layer'} '{layer.name}'"


def _failing_layer(trace, suspects):
    """`(layer, "file.py, line N: ")` where the error was raised: the
    innermost layer on the stack, preferring one that runs user code, and
    the innermost line outside TensorFlow, Keras, kerasfast and Python's
    own library (`""` where there is none)."""
    import pathlib
    import sysconfig

    import keras
    import tensorflow as tf

    import kerasfast

    own = {id(layer) for layer in suspects}
    libraries = tuple(str(pathlib.Path(module.__file__).parent) for module in (tf, keras, kerasfast))
    libraries += (sysconfig.get_paths()["stdlib"],)
    innermost, innermost_own, where = None, None, ""
    while trace is not None:
        frame = trace.tb_frame
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, keras.layers.Layer):
            innermost = candidate
            if id(candidate) in own:
                innermost_own = candidate
        filename = frame.f_code.co_filename
        if not filename.startswith(libraries) and not filename.startswith("<"):
            where = f"{pathlib.Path(filename).name}, line {trace.tb_lineno}: "
        trace = trace.tb_next
    return innermost_own if innermost_own is not None else innermost, where
