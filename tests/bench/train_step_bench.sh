#!/usr/bin/env bash
# Benchmark: pretrain_gpt's CPU step time for the GPT-3 126M shape (12 layers, hidden 768,
# 12 heads, vocab 50304) on the mock dataset, as Megatron's benchmark mode does (train only).
# Reports the median of Megatron's "elapsed time per iteration (ms)" over the iterations after
# the first, tokens/s, and model TFLOP/s by Megatron's formula. Prints a markdown table.
# Usage: tests/bench/train_step_bench.sh [build-dir] [iterations]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
iterations=${2:-6}

echo "| shape | seq | mbs | ms / iteration (median) | tokens/s | model GFLOP/s |"
echo "|---|---|---|---|---|---|"
for seq in 128 256; do
  mbs=4
  log=$("$build/bin/pretrain_gpt" --num-layers 12 --hidden-size 768 --num-attention-heads 12 \
    --seq-length "$seq" --max-position-embeddings 2048 --micro-batch-size "$mbs" \
    --global-batch-size "$mbs" --train-iters "$iterations" --lr 6e-4 --mock-data \
    --tokenizer-type GPT2BPETokenizer --hidden-dropout 0 --attention-dropout 0 \
    --log-interval 1 --eval-iters 0 2>/dev/null)
  median=$(echo "$log" | grep -o 'elapsed time per iteration (ms): [0-9.]*' | awk '{print $NF}' |
    tail -n +2 | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
  # Megatron's num_floating_point_operations for a dense GPT, forward + backward:
  #   12·B·s·L·h²·[(1 + g/a + s/(2h))·(kv·a/h) + ffn/h] + 6·B·s·h·V
  # which, with g = a (no GQA), kv·a = h and ffn = 4h, is 72·B·s·L·h²·(1 + s/(12h)) + 6·B·s·h·V.
  awk -v ms="$median" -v s="$seq" -v b="$mbs" 'BEGIN {
    L = 12; h = 768; V = 50304;
    flops = 72 * b * s * L * h * h * (1 + s / (12 * h)) + 6 * b * s * h * V;
    printf "| gpt3/126m | %d | %d | %.1f | %.1f | %.1f |\n", s, b, ms, b * s / (ms / 1000), flops / (ms / 1000) / 1e9
  }'
done
