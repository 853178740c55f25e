#!/usr/bin/env bash
# Benchmark, side by side in one run: pretrain_gpt's CPU training step against a PyTorch
# reference GPT of the same shape and hyperparameters (tests/bench/pytorch_gpt_reference.py,
# Debian's python3-torch, CPU, same thread count). Shape: gpt3/126m (12 layers, hidden 768,
# 12 heads, padded vocab 50304), seq 256, micro batch = global batch 4, no dropout, AdamW with
# clipping. Reports median seconds per iteration after the first, tokens/s, model TFLOP/s by
# Megatron's formula (benchmark.json) and MFU against this machine's measured sgemm peak.
# Run it on a quiet machine: OpenMP threads spinning against other work distort both columns.
# Usage: tests/bench/cpu_vs_pytorch_bench.sh [build-dir] [iterations] [seq] [mbs]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
iterations=${2:-6}
seq=${3:-256}
mbs=${4:-4}
threads=$(nproc)
python=/usr/bin/python3  # Debian's interpreter, where python3-torch lives
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

OMP_NUM_THREADS=$threads "$build/bin/pretrain_gpt" --num-layers 12 --hidden-size 768 \
  --num-attention-heads 12 --seq-length "$seq" --max-position-embeddings 2048 \
  --micro-batch-size "$mbs" --global-batch-size "$mbs" --train-iters "$iterations" --lr 6e-4 \
  --mock-data --tokenizer-type GPT2BPETokenizer --hidden-dropout 0 --attention-dropout 0 \
  --log-interval 1 --eval-iters 0 --benchmark-output "$work/ours.json" >/dev/null 2>&1
"$python" "$root/tests/bench/pytorch_gpt_reference.py" --seq "$seq" --mbs "$mbs" \
  --iterations "$iterations" --threads "$threads" >"$work/torch.json"

"$python" - "$work/ours.json" "$work/torch.json" "$seq" "$mbs" <<'PY'
import json, sys
ours = json.load(open(sys.argv[1]))
torch = json.load(open(sys.argv[2]))
seq, mbs = int(sys.argv[3]), int(sys.argv[4])
flops = ours["tflops_per_device"] * ours["median_step_ms"] / 1000  # TFLOP per iteration
peak = ours["peak_tflops_measured"]
rows = [("pretrain_gpt (this project)", ours["median_step_ms"] / 1000, ours["tokens_per_second"]),
        (f"PyTorch {torch['torch']} reference, {torch['threads']} threads",
         torch["median_seconds_per_iteration"], torch["tokens_per_second"])]
print(f"| gpt3/126m, seq {seq}, mbs {mbs} | s / iteration (median) | tokens/s | model TFLOP/s | MFU (sgemm peak {peak * 1000:.0f} GFLOP/s) |")
print("|---|---|---|---|---|")
for name, seconds, tokens in rows:
    tflops = flops / seconds
    print(f"| {name} | {seconds:.2f} | {tokens:.1f} | {tflops:.3f} | {100 * tflops / peak:.0f} % |")
print(f"\nspeed-up: {ours['tokens_per_second'] / torch['tokens_per_second']:.2f}x PyTorch's tokens/s")
PY
