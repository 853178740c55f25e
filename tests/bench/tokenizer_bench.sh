#!/usr/bin/env bash
# Benchmark: single-thread GPT-2 BPE tokenization speed (MB/s) on a few MB of real English
# text with names and symbols: the copyright files of the Debian packages on this machine,
# concatenated and cut to the requested size, each line one document. Builds the
# tokenizer_bench target first. Prints a markdown table for docs/benchmarks.md.
# Usage: tests/bench/tokenizer_bench.sh [build-dir] [megabytes] [passes]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
megabytes=${2:-8}
passes=${3:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cmake --build "$build" --target tokenizer_bench >/dev/null
# head closes the pipe once it has enough: cat's SIGPIPE is expected
{ find /usr/share/doc -name copyright -type f -print0 | sort -z | xargs -0 cat 2>/dev/null || true; } |
  head -c "$((megabytes * 1000 * 1000))" > "$out/corpus.txt"
"$build/bin/tokenizer_bench" "$root/tests/data/gpt2-vocab.json" "$root/tests/data/gpt2-merges.txt" \
  "$passes" "$out/corpus.txt"
