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

# Side by side, when a python3 with the `regex` module is on PATH: OpenAI's encoder algorithm
# in Python (tests/data/tools/gpt2_reference_encoder.py; the same algorithm as Megatron's
# GPT2BPETokenizer), on the first 2 MB of the same corpus, one thread, its word cache warm
# from the start of the run as in a long preprocessing job. Load time is excluded.
if python3 -c "import regex" 2>/dev/null; then
  head -c 2000000 "$out/corpus.txt" |
    python3 -c "import json, sys; json.dump(sys.stdin.read().split('\n'), sys.stdout)" > "$out/lines.json"
  python3 - "$root" "$out/lines.json" <<'PY'
import importlib.util, json, sys, time
root, lines_file = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("reference", root + "/tests/data/tools/gpt2_reference_encoder.py")
reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reference)
encoder = reference.Gpt2Reference(root + "/tests/data/gpt2-vocab.json", root + "/tests/data/gpt2-merges.txt")
lines = json.load(open(lines_file))
megabytes = sum(len(line.encode("utf-8")) + 1 for line in lines) / 1e6
start = time.perf_counter()
tokens = sum(len(encoder.encode(line)[1]) for line in lines)
seconds = time.perf_counter() - start
print(f"\nreference (OpenAI's encoder in Python, regex module): {megabytes:.1f} MB, {tokens} tokens, "
      f"{megabytes / seconds:.2f} MB/s")
PY
else
  echo "(no python3 with the regex module: the Python reference column is skipped)"
fi
