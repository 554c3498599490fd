#!/usr/bin/env bash
# GPU check: the same side-by-side comparison as benchmarks/run_all.py, on a
# GPU machine, for the convnet and GPT recipe models under mixed_bfloat16
# and mixed_float16, XLA on and off; then benchmarks/tune.py's comparison
# (plain Keras, the rules, every grid candidate, tune="auto") on the GPU, and
# benchmarks/transformer.py (the GPT recipe's model against PyTorch) and
# benchmarks/attention.py (causal attention in query blocks against Keras's op).
# Finishes in about 10-15 minutes on one modern GPU; prints Markdown tables to
# paste into docs/benchmarks.md.
#
#   bash benchmarks/gpu_check.sh            # needs kerasfast installed with a GPU build of TensorFlow
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader
timeout 300 python - <<'PY'
import keras
import numpy as np

import kerasfast
from benchmarks.fit_vs_keras import cifar_like_cnn
from kerasfast.recipes import load_recipe
from kerasfast.training.throughput import ThroughputMeter, samples_counter

gpt = load_recipe("gpt")
rng = np.random.default_rng(0)
images, labels = rng.random((8192, 32, 32, 3), dtype=np.float32), rng.integers(0, 10, 8192)
(tokens, targets), _ = gpt.corpus_arrays(gpt.corpus_files(), 256, max_bytes=256 * 4096)
workloads = [
    ("6-conv CNN 32x32x3, batch 256", cifar_like_cnn, images, labels, 256, "sparse_categorical_crossentropy", 1),
    ("GPT d_model 512, 256 tokens, batch 64", lambda: gpt.build_gpt(seq_len=256, layers=6, d_model=512, heads=8),
     tokens.astype("int32"), targets.astype("int32"), 64,
     keras.losses.SparseCategoricalCrossentropy(from_logits=True), 256),
]
print("| workload | plain model.fit float32 | precision | jit | kerasfast | ratio |")
print("|---|---:|---|---|---:|---:|")
for name, build, x, y, batch, loss, scale in workloads:
    model = build()
    model.compile("adam", loss)
    meter = ThroughputMeter(samples_counter(batch, len(x)), -(-len(x) // batch))
    model.fit(x, y, batch_size=batch, epochs=2, verbose=0, callbacks=[meter])
    base = meter.result().samples_per_second * scale
    for precision in ("mixed_bfloat16", "mixed_float16"):
        for jit in (False, True):
            result = kerasfast.fit(build, (x, y), batch_size=batch, epochs=2, loss=loss, optimizer="adam",
                                   precision=precision, jit_compile=jit, run_dir=False, verbose=0)
            rate = result.throughput.samples_per_second * scale
            print(f"| {name} | {base:,.0f} | {precision} | {jit} | {rate:,.0f} | {rate / base:.2f}x |", flush=True)
PY
# Tuning on the GPU: whole calls on ~10 s runs, the grid on short ones.
timeout 300 python benchmarks/tune.py --quick --seconds 10 --only "CNN"
timeout 240 python benchmarks/tune.py --quick --seconds 10 --only "GPT"
# The GPT recipe's model against PyTorch (eager and torch.compile, when torch is installed: the benchmark extra).
timeout 300 python benchmarks/transformer.py --rounds 1
# Causal attention in query blocks against Keras's op (the plan keeps Keras's op on GPUs until this is measured).
timeout 240 python benchmarks/attention.py --rounds 3
# Hashed dropout masks against Keras's (the plan keeps Keras's masks on GPUs until this is measured).
timeout 240 python benchmarks/dropout.py --rounds 3
