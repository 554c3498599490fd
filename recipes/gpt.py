"""A GPT-style language model on the Python standard library, the fast way.

**Model:** a decoder-only transformer over bytes: token + position
embeddings, pre-norm blocks (LayerNorm -> causal self-attention -> residual,
LayerNorm -> MLP -> residual), a final LayerNorm and a projection to the 256
byte values, whose logits are kept in float32 under mixed precision.

**Data:** the `.py` files of the running interpreter's standard library
(every machine with Python has them; `--data GLOB` takes your own text
files). The bytes of the files are cut into sequences of `seq_len + 1`
bytes: the first `seq_len` are the inputs, the last `seq_len` the targets,
i.e. every position predicts the next byte. The files are shuffled and the
last 5% of their bytes (held-out files) are the validation set. Both splits
are written as TFRecord shards with `kerasfast.data.write_tfrecords`, and
`kerasfast.fit` trains from the folder with its tuned input pipeline.

**Training:** `kerasfast.fit` with the auto plan: mixed precision where the
hardware has fast low-precision math, AdamW with linear warm-up + cosine
decay, global-norm gradient clipping (`--clipnorm`), and on request gradient
accumulation (`--grad-accum`) and activation recomputation (`--remat`).
`--prune S` fine-tunes one more epoch while pruning every kernel to sparsity
S; `--export` writes `.keras`, SavedModel, float32, dynamic-range int8 and
full-integer int8 TFLite files (the attention layers int8 breaks kept in
float, named in the report), each verified (TFLite in LiteRT) and evaluated.

**Results:** validation perplexity (exp of the mean cross-entropy per byte;
uniform guessing over bytes is 256), a generated sample continuing a prompt,
training tokens/s and the model FLOPs utilisation (MFU): the FLOP/s the
training step achieved over the peak FLOP/s of a dense matmul measured on
this machine in the plan's compute dtype. The FLOPs per training sequence
are TensorFlow's profiler count of a forward pass times 3, cross-checked
against the analytic 6*N*T + attention estimate; both are reported.

Run it:

    python recipes/gpt.py                       # ~2.5 minutes on 2 CPU cores
    python recipes/gpt.py --smoke               # seconds
    python recipes/gpt.py --data "notes/**/*.txt" --seq-len 256 --layers 6 --d-model 256 --heads 8
    kerasfast launch -n 2 -- python recipes/gpt.py --smoke --strategy multi_worker
"""

from __future__ import annotations

import glob
import math
import os
import pathlib
import sys
import sysconfig
import time

import kerasfast  # before Keras: TensorFlow then loads with oneDNN's CPU kernels (kerasfast/onednn.py)
import keras
import numpy as np
from keras import ops

from kerasfast import costs, recipes
from kerasfast.plan import compute_dtype, resolve_precision

VOCAB_SIZE = 256  # byte-level tokens
# Defaults sized for a 2-core CPU; `--smoke` shrinks everything further.
DEFAULTS = dict(seq_len=128, layers=4, d_model=128, heads=4, corpus_mb=1.5, sample_bytes=200)
SMOKE = dict(seq_len=64, layers=2, d_model=64, heads=2, corpus_mb=0.25, sample_bytes=64)


# ---------------------------------------------------------------------------
# The corpus: bytes of text files -> (inputs, targets) sequences -> TFRecords
# ---------------------------------------------------------------------------

def corpus_files(pattern: str | None = None) -> list[str]:
    """The text files of the corpus.

    Args:
        pattern: A glob (`**` recurses), a folder (every file under it) or a
            file. None: the standard library's `.py` files, without tests
            and site-packages.
    """
    if pattern is None:
        stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
        skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
        return sorted(str(path) for path in stdlib.rglob("*.py")
                      if not skip.intersection(path.relative_to(stdlib).parts[:-1]))
    if os.path.isdir(pattern):
        files = [os.path.join(root, name) for root, _, names in os.walk(pattern) for name in names
                 if not name.startswith(".")]
    else:
        files = glob.glob(pattern, recursive=True)
    files = sorted(f for f in files if os.path.isfile(f))
    if not files:
        raise kerasfast.DataError(f"--data {pattern!r} matches no files (working directory {os.getcwd()}).")
    return files


def corpus_arrays(files, seq_len: int, *, max_bytes: int | None = None, val_fraction: float = 0.05,
                  seed: int = 0):
    """Cuts the bytes of `files` into next-byte-prediction sequences.

    The files are shuffled (by `seed`) and concatenated, at most `max_bytes`
    of them; the last `val_fraction` of the bytes (whole held-out files, as
    far as possible) is the validation split. Each split is cut into
    non-overlapping windows: `x[i]` holds bytes `i*seq_len ... (i+1)*seq_len-1`
    and `y[i]` the same shifted by one byte.

    Returns:
        `((x_train, y_train), (x_val, y_val))`, uint8 arrays of shape
        `(sequences, seq_len)`.
    """
    order = np.random.default_rng(seed).permutation(len(files))
    chunks, total = [], 0
    for index in order:
        with open(files[index], "rb") as handle:
            chunks.append(handle.read() + b"\n")
        total += len(chunks[-1])
        if max_bytes and total >= max_bytes:
            break
    tokens = np.frombuffer(b"".join(chunks), dtype=np.uint8)[:max_bytes or None]
    split = int(len(tokens) * (1 - val_fraction))

    def windows(part):
        count = (len(part) - 1) // seq_len
        if count < 1:
            raise kerasfast.DataError(f"the corpus is too small: {len(part)} bytes of a split give no sequence of "
                                      f"{seq_len + 1} bytes; give more text or a smaller --seq-len.")
        return part[:count * seq_len].reshape(count, seq_len), part[1:count * seq_len + 1].reshape(count, seq_len)

    return windows(tokens[:split]), windows(tokens[split:])


def write_corpus(files, out_dir, seq_len: int, **options):
    """`corpus_arrays` written as TFRecord shards in `out_dir/train` and `out_dir/val`.

    Returns:
        The two `kerasfast.data.WriteResult`s (`.out_dir`, `.num_records`, ...).
    """
    train, val = corpus_arrays(files, seq_len, **options)
    out_dir = pathlib.Path(out_dir)
    return (kerasfast.data.write_tfrecords(train, out_dir / "train"),
            kerasfast.data.write_tfrecords(val, out_dir / "val"))


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------

@keras.saving.register_keras_serializable(package="kerasfast_gpt")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned vector per position to the token embeddings."""

    def __init__(self, seq_len, **kwargs):
        super().__init__(**kwargs)
        self.seq_len = seq_len

    def build(self, input_shape):
        self.positions = self.add_weight(shape=(self.seq_len, input_shape[-1]), name="positions",
                                         initializer=keras.initializers.RandomNormal(stddev=0.02))

    def call(self, x):
        return x + ops.cast(self.positions[: ops.shape(x)[1]], x.dtype)

    def get_config(self):
        return {**super().get_config(), "seq_len": self.seq_len}


@keras.saving.register_keras_serializable(package="kerasfast_gpt")
class CausalSelfAttention(keras.layers.Layer):
    """Multi-head self-attention where position t sees positions <= t only.

    The attention itself is `keras.ops.dot_product_attention(is_causal=True)`:
    one op that each backend runs its own best way (cuDNN's fused attention
    under JAX or PyTorch on a GPU; under TensorFlow, which has no fused
    kernel, an einsum, the mask and a float32 softmax that XLA fuses, or in
    `kerasfast.fit`'s XLA-compiled steps on a CPU query blocks that skip
    the masked half). Queries,
    keys and values stay in (batch, length, heads, head_dim), the layout it
    takes, so no transposes are traced.
    """

    def __init__(self, heads, **kwargs):
        super().__init__(**kwargs)
        self.heads = heads

    def build(self, input_shape):
        d_model = input_shape[-1]
        # Sub-layers follow this layer's precision policy, also when it is loaded from a file.
        self.qkv = keras.layers.Dense(3 * d_model, name="qkv", dtype=self.dtype_policy)
        self.qkv.build(input_shape)
        self.out = keras.layers.Dense(d_model, name="out", dtype=self.dtype_policy)
        self.out.build(input_shape)

    def call(self, x):
        batch, length, d_model = ops.shape(x)[0], ops.shape(x)[1], x.shape[-1]
        q, k, v = (ops.reshape(t, (batch, length, self.heads, d_model // self.heads))
                   for t in ops.split(self.qkv(x), 3, axis=-1))
        # Scores and softmax are computed in float32, also under mixed precision.
        attended = ops.dot_product_attention(q, k, v, is_causal=True)
        return self.out(ops.reshape(attended, (batch, length, d_model)))

    def get_config(self):
        return {**super().get_config(), "heads": self.heads}


def build_gpt(vocab_size: int = VOCAB_SIZE, seq_len: int = 128, layers: int = 4, d_model: int = 128,
              heads: int = 4, mlp_ratio: int = 4):
    """A decoder-only transformer: (batch, seq_len) token ids -> (batch, seq_len, vocab_size) float32 logits."""
    if d_model % heads:
        raise kerasfast.PlanError(f"d_model={d_model} (--d-model) must be a multiple of heads={heads} (--heads).")
    tokens = keras.Input((seq_len,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(vocab_size, d_model, name="token_embedding")(tokens)
    x = PositionEmbedding(seq_len, name="position_embedding")(x)
    for i in range(layers):
        h = keras.layers.LayerNormalization(epsilon=1e-5, name=f"block{i}_norm1")(x)
        x = keras.layers.Add(name=f"block{i}_attn_residual")([x, CausalSelfAttention(heads, name=f"block{i}_attn")(h)])
        h = keras.layers.LayerNormalization(epsilon=1e-5, name=f"block{i}_norm2")(x)
        h = keras.layers.Dense(mlp_ratio * d_model, activation="gelu", name=f"block{i}_mlp_in")(h)
        h = keras.layers.Dense(d_model, name=f"block{i}_mlp_out")(h)
        x = keras.layers.Add(name=f"block{i}_mlp_residual")([x, h])
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    x = keras.layers.Dense(vocab_size, name="vocab_projection")(x)
    # The softmax cross-entropy over 256 classes is computed in float32.
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(x)
    return keras.Model(tokens, logits, name="gpt")


def matmul_weights(model) -> int:
    """N: the weights used in matmuls (Dense kernels), i.e. all but embeddings, norms and biases."""
    return sum(int(np.prod(w.shape)) for w in model.weights if w.path.endswith("kernel") and len(w.shape) == 2)


def analytic_train_flops_per_sequence(model, seq_len: int, layers: int, d_model: int) -> int:
    """The usual estimate 6*N*T + attention, N = weights in matmuls (embedding lookups excluded).

    Forward: 2 FLOPs per matmul weight per token, plus the two attention
    matmuls (scores and weighted sum, 2*T*T*d each per layer, the masked half
    included because it is computed); training = 3x forward.
    """
    forward = 2 * matmul_weights(model) * seq_len + layers * 2 * 2 * seq_len * seq_len * d_model
    return costs.TRAIN_STEP_FLOPS_PER_FORWARD * forward


# ---------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------

def generate(model, prompt: str, length: int, *, temperature: float = 0.8, seed: int = 0) -> str:
    """Continues `prompt` by `length` bytes, one forward pass per byte.

    The context is the last `seq_len` bytes, placed at the start of the
    window; the padding after it is never seen by the causal attention.
    `temperature=0` is greedy decoding.
    """
    import tensorflow as tf

    seq_len = model.input_shape[1]

    @tf.function(input_signature=[tf.TensorSpec((1, seq_len), tf.int32), tf.TensorSpec((), tf.int32)])
    def next_logits(window, position):
        return model(window, training=False)[0, position]

    rng = np.random.default_rng(seed)
    data = list(prompt.encode("utf-8"))
    for _ in range(length):
        context = data[-seq_len:]
        window = np.zeros((1, seq_len), np.int32)
        window[0, :len(context)] = context
        logits = next_logits(window, len(context) - 1).numpy().astype("float64")
        if temperature <= 0:
            data.append(int(np.argmax(logits)))
        else:
            p = np.exp((logits - logits.max()) / temperature)
            data.append(int(rng.choice(VOCAB_SIZE, p=p / p.sum())))
    return bytes(data).decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------

def _parser():
    parser = recipes.parser("Train a byte-level GPT on the Python standard library (or --data GLOB of text files).",
                            epochs=1, batch_size=32, out="kerasfast_runs/gpt")
    parser.add_argument("--seq-len", type=recipes.positive_int, help=f"bytes per sequence (default {DEFAULTS['seq_len']}, smoke "
                                                    f"{SMOKE['seq_len']})")
    parser.add_argument("--layers", type=recipes.positive_int, help=f"transformer blocks (default {DEFAULTS['layers']})")
    parser.add_argument("--d-model", type=recipes.positive_int, help=f"width (default {DEFAULTS['d_model']})")
    parser.add_argument("--heads", type=recipes.positive_int, help=f"attention heads (default {DEFAULTS['heads']})")
    parser.add_argument("--corpus-mb", type=recipes.non_negative_float, help=f"use at most this many MB of text, 0 = all "
                                                        f"(default {DEFAULTS['corpus_mb']}, smoke {SMOKE['corpus_mb']})")
    parser.add_argument("--learning-rate", type=recipes.positive_float, help="peak learning rate (default: kerasfast's, 1e-3)")
    parser.add_argument("--clipnorm", type=recipes.non_negative_float, default=1.0, help="global gradient-norm clip (0 = off)")
    parser.add_argument("--grad-accum", type=recipes.positive_int, default=1, help="steps whose gradients make one update")
    parser.add_argument("--remat", action="store_true", help="recompute activations in the backward pass")
    parser.add_argument("--prompt", default="def ", help="start of the generated sample")
    parser.add_argument("--sample-bytes", type=recipes.positive_int, help="length of the generated sample")
    parser.add_argument("--temperature", type=recipes.non_negative_float, default=0.8, help="sampling temperature (0 = greedy)")
    return parser


def main(argv=None) -> dict:
    args = _parser().parse_args(argv)
    # Before any tensor exists: thread pools, and the strategy of a multi-worker
    # job. `--strategy mirrored` on a machine without GPUs splits the CPU into
    # two logical devices (one replica each).
    cluster = recipes.start(args)
    if args.strategy == "mirrored":
        _two_cpu_devices_without_gpus()
    keras.utils.set_random_seed(0)  # every worker builds the same initial weights
    sizes = {**(SMOKE if args.smoke else DEFAULTS),
             **{k: v for k, v in vars(args).items() if k in DEFAULTS and v is not None}}
    seq_len, layers, d_model, heads = (sizes[k] for k in ("seq_len", "layers", "d_model", "heads"))
    out = pathlib.Path(args.out)
    # The MFU's yardstick: the peak FLOP/s of a dense matmul in the compute
    # dtype the plan will pick, timed now and again after training (the best
    # counts: on a shared machine other jobs can only make it lower).
    precision, _ = resolve_precision(kerasfast.detect_hardware(), args.precision)
    peak_before = _peak_flops(compute_dtype(precision)) if cluster.is_chief else 0.0

    # 1. The corpus: byte sequences, written as TFRecords (into the run folder
    #    by the chief, into a temporary folder by other workers).
    files = corpus_files(args.data)
    started = time.perf_counter()
    (x_train, y_train), (x_val, y_val) = corpus_arrays(files, seq_len, max_bytes=int(sizes["corpus_mb"] * 1e6) or None)
    folder = recipes.data_dir(out, cluster)
    train = kerasfast.data.write_tfrecords((x_train, y_train), folder / "train")
    val = kerasfast.data.write_tfrecords((x_val, y_val), folder / "val")
    if cluster.is_chief:
        print(f"corpus: {(x_train.size + x_val.size) / 1e6:.2f} MB of the {len(files)} file(s) of "
              f"{args.data or 'the standard library'} -> {len(x_train)} training / {len(x_val)} validation "
              f"sequences of {seq_len} bytes in {folder} ({time.perf_counter() - started:.1f}s)")

    # 2. Train from the TFRecords. The builder runs under the plan's precision
    #    (and strategy); the plan adds AdamW with warm-up + cosine decay.
    compile_options = dict(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    common = dict(validation_data=val.out_dir, clipnorm=args.clipnorm or None,
                  grad_accum_steps=args.grad_accum, remat=True if args.remat else None, verbose=2,
                  **compile_options, **recipes.fit_options(args))
    then = recipes.next_phase_options(common, out / "train")  # what the pruning resumes depends on training's
    result = kerasfast.fit(lambda: build_gpt(VOCAB_SIZE, seq_len, layers, d_model, heads), train.out_dir,
                           epochs=args.epochs, learning_rate=args.learning_rate, run_dir=out / "train", **common)
    model = result.model

    def evaluate() -> dict:
        scores = recipes.evaluate(model, x_val, y_val, **compile_options)
        # Perplexity: exp of the mean cross-entropy per byte.
        return {"val_loss": scores["loss"], "val_perplexity": math.exp(scores["loss"]),
                "val_accuracy": scores["accuracy"]}

    metrics = evaluate()

    # 3. Optionally prune while fine-tuning for another epoch at a lower rate.
    if args.prune:
        dense = dict(metrics)
        kerasfast.fit(model, train.out_dir, epochs=1, learning_rate=(args.learning_rate or 1e-3) / 3,
                      prune=args.prune, run_dir=out / "prune", **then)
        metrics.update(evaluate(), sparsity=args.prune, **{f"dense_{k}": v for k, v in dense.items()})
    if not cluster.is_chief:
        return metrics  # the chief measures, samples, exports and writes the run folder

    # 4. FLOPs and MFU of the training run: FLOPs per training sequence (the
    #    profiler's count of a forward pass x 3) times sequences/s, over the
    #    peak FLOP/s of a dense matmul measured here in the plan's compute dtype.
    profiled = costs.forward_flops_per_sample(model, (seq_len,), "int32")
    profiled_train = profiled * costs.TRAIN_STEP_FLOPS_PER_FORWARD if profiled else None
    analytic_train = analytic_train_flops_per_sequence(model, seq_len, layers, d_model)
    if compute_dtype(result.plan.precision) != compute_dtype(precision):
        peak_before = 0.0
    peak = max(peak_before, _peak_flops(compute_dtype(result.plan.precision))) * result.plan.num_replicas
    sequences_per_s = result.throughput.samples_per_second
    achieved = sequences_per_s * (profiled_train or analytic_train) if sequences_per_s else None
    metrics.update({
        "parameters": model.count_params(),
        "matmul_weights": matmul_weights(model),
        "seq_len": seq_len, "layers": layers, "d_model": d_model, "heads": heads,
        "corpus_files": len(files), "train_sequences": len(x_train), "val_sequences": len(x_val),
        "train_flops_per_sequence_profiler": profiled_train,
        "train_flops_per_sequence_analytic": analytic_train,
        "achieved_flops_per_s": achieved,
        "peak_flops_per_s": peak,
        "peak_flops_source": (f"measured here: best of 6 timed {compute_dtype(result.plan.precision)} 2048x2048 matmuls before and after "
                              f"training (kerasfast.costs.measure_peak_flops) x {result.plan.num_replicas} "
                              f"replica(s)"),
        "mfu": achieved / peak if achieved else None,
    })

    # 5. A sample from the trained model.
    metrics["sample"] = generate(model, args.prompt, sizes["sample_bytes"], temperature=args.temperature)

    # 6. Optional export, then metrics.json and the plots.
    rates = {}
    if args.export:
        exported = _export(model, out / "export", (x_val, y_val), x_train)
        metrics["export"] = [row.to_dict() for row in exported.rows]
        for name, label in (("tflite_dynamic_int8", "dynamic int8"), ("tflite_int8", "int8")):
            quantised = [row for row in exported.rows if row.format == name and row.latency_ms]
            if quantised:
                rates[f"LiteRT {label}\n(batch 1)"] = seq_len * 1000.0 / quantised[0].latency_ms
    metrics = recipes.finish(out, result, metrics, unit="tokens/s", rate_scale=seq_len, rates=rates)

    print(f"\nvalidation: loss {metrics['val_loss']:.3f}, perplexity {metrics['val_perplexity']:.2f} per byte "
          f"(uniform guessing: 256), next-byte accuracy {metrics['val_accuracy']:.3f}")
    shown = f"{profiled_train / 1e6:,.1f} M" if profiled_train else "n/a"
    print(f"FLOPs per training sequence: {shown} (profiler: forward x 3), {analytic_train / 1e6:,.1f} M "
          f"(analytic: 6*N*T + attention, N = {metrics['matmul_weights']:,} matmul weights)")
    if achieved:
        print(f"speed: {metrics['tokens_per_s']:,.0f} tokens/s = {achieved / 1e9:,.2f} GFLOP/s; peak "
              f"{peak / 1e9:,.1f} GFLOP/s ({metrics['peak_flops_source']}); MFU {metrics['mfu']:.1%}")
    else:
        print("speed: the run was too short to measure (raise --corpus-mb or --epochs)")
    print(f"\nsample (prompt {args.prompt!r}, temperature {args.temperature}):\n{metrics['sample']}")
    print(f"\nrun folder: {out}")
    return metrics


def _peak_flops(dtype: str) -> float:
    return max(costs.measure_peak_flops(dtype, size=2048, repeats=5) for _ in range(3))


def _two_cpu_devices_without_gpus():
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        except RuntimeError:  # TensorFlow already started in this process: fit will say what to do
            pass


def _export(model, out_dir, eval_data, representative_data):
    """Exports and verifies every format, full-integer int8 TFLite included; prints the report.

    Full int8 everywhere moves this model's logits by up to 4 (its attention
    scores and softmax weights lose too much in int8), so `kerasfast.export`
    measures each layer's int8 error and keeps the worst layers in float
    until the file verifies; the report's notes name them and why.
    """
    x, y = (a[:256].astype("int32") for a in eval_data)
    formats = ("keras", "saved_model", "tflite_float32", "tflite_dynamic_int8", "tflite_int8")
    try:
        exported = kerasfast.export(model, out_dir, eval_data=(x, y), formats=formats,
                                    representative_data=representative_data[:200].astype("int32"))
    except kerasfast.ExportError as error:
        print(f"TFLite export failed ({error}); exporting .keras and SavedModel only")
        exported = kerasfast.export(model, out_dir, eval_data=(x, y), formats=("keras", "saved_model"))
    print(exported.table())
    return exported

if __name__ == "__main__":
    try:
        main()
    except kerasfast.KerasfastError as error:  # a refused plan or bad data: one line, not a traceback
        sys.exit(f"gpt.py: {type(error).__name__}: {error}")
