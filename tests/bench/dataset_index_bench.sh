#!/usr/bin/env bash
# Benchmark: building the GPT dataset indices of a large blend, the case users report as slow
# (Megatron-LM issue 795: 270 s on rank 0 for one corpus; argonne-lcf Megatron-DeepSpeed PR 18:
# about 1 s per file, 2,000 s for 2,419 Dolma files). FILES synthetic datasets totalling TOKENS
# tokens are written as .idx files of random sequence lengths with sparse .bin files (only the
# sizes exist: the disk holds the .idx files and the indices), then the training split of a
# blend of all of them, weighted by their token counts, is built as pretrain_gpt builds it
# (--split 969,30,1, sequence length SEQ, training samples = 95 % of the training tokens / SEQ,
# so each dataset needs one epoch), with the indices cached in a fresh directory; then built
# again, which loads the cache. Builds the dataset_index_bench target first. Needs about
# TOKENS / SEQ × 22 bytes of disk for the cache (10 GB for 2T tokens at 4096) and half of that
# in memory for the blend's arrays.
# Usage: tests/bench/dataset_index_bench.sh [build-dir] [work-dir] [files] [tokens] [sequences-per-file] [seq-length] [threads]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
work=${2:-$(mktemp -d)}
files=${3:-2419}
tokens=${4:-2e12}
sequences=${5:-20000}
seq_length=${6:-4096}
threads=${7:-$(nproc)}
train_samples=$(awk -v t="$tokens" -v s="$seq_length" 'BEGIN { printf "%d", 0.95 * 0.969 * t / s }')

cmake --build "$build" --target dataset_index_bench >/dev/null
bench=$build/bin/dataset_index_bench
rm -rf "$work/data" "$work/cache"
echo "== generate: $files datasets, $tokens tokens, $sequences sequences each"
/usr/bin/time -f "   %e s, peak RSS %M KB" "$bench" generate "$work/data" "$files" "$tokens" "$sequences" 1
echo "   .idx files: $(du -sh "$work/data" | cut -f1) on disk (the .bin files are sparse)"
echo "== build (cold cache): $train_samples training samples of $seq_length tokens, $threads threads"
/usr/bin/time -f "   %e s wall, %U s user, peak RSS %M KB" "$bench" build "$work/data" "$seq_length" "$train_samples" "$threads" "$work/cache"
echo "   cache: $(du -sh "$work/cache" | cut -f1)"
echo "== build again (the cache is memory-mapped)"
/usr/bin/time -f "   %e s wall, peak RSS %M KB" "$bench" build "$work/data" "$seq_length" "$train_samples" "$threads" "$work/cache"
