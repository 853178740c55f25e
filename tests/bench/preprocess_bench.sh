#!/usr/bin/env bash
# Benchmark: preprocess_data (JSONL → GPT-2 BPE → .bin/.idx) throughput per worker count and
# peak memory. The corpus is JSONL made from this machine's /usr/share/doc/*/copyright files,
# one document per paragraph block of about 4 kB, repeated until it reaches the requested size,
# so it is many times larger than the pipeline's in-flight buffers (2 × workers + 2 batches of
# 1 MB). Prints a markdown table for docs/benchmarks.md: MB/s of JSONL (whole process, start-up
# included), MB/s per worker, peak RSS (from preprocess_data's own summary line).
# Usage: tests/bench/preprocess_bench.sh [build-dir] [megabytes] [worker counts...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
megabytes=${2:-200}
shift $(( $# >= 2 ? 2 : $# ))
workers=("$@")
(( ${#workers[@]} )) || workers=(1 "$(nproc)")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cmake --build "$build" --target preprocess_data >/dev/null
python3 - "$out/corpus.jsonl" "$megabytes" <<'PY'
import glob, json, sys
path, megabytes = sys.argv[1], int(sys.argv[2])
documents = []
for name in sorted(glob.glob("/usr/share/doc/*/copyright")):
    try:
        text = open(name, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        continue
    for start in range(0, len(text), 4000):
        documents.append(json.dumps({"text": text[start:start + 4000], "source": name}) + "\n")
target = megabytes * 1000 * 1000
written = 0
with open(path, "w", encoding="utf-8") as f:
    while written < target:
        for line in documents:
            f.write(line)
            written += len(line.encode("utf-8"))
            if written >= target:
                break
PY
size=$(stat -c %s "$out/corpus.jsonl")
echo "| workers | corpus MB | seconds | MB/s | MB/s per worker | peak RSS MB |"
echo "|---|---|---|---|---|---|"
for w in "${workers[@]}"; do
  start=$(date +%s.%N)
  "$build/bin/preprocess_data" --input "$out/corpus.jsonl" \
    --output-prefix "$out/out" --tokenizer-type GPT2BPETokenizer \
    --vocab-file "$root/tests/data/gpt2-vocab.json" --merge-file "$root/tests/data/gpt2-merges.txt" \
    --append-eod --workers "$w" --log-interval 100000000 >/dev/null 2>"$out/log"
  end=$(date +%s.%N)
  # preprocess_data's summary line reports the process's peak RSS (getrusage)
  rss_mb=$(grep -o 'peak memory [0-9.]* MB' "$out/log" | awk '{print $3}')
  awk -v w="$w" -v size="$size" -v s="$start" -v e="$end" -v rss="$rss_mb" 'BEGIN {
    mb = size / 1048576; t = e - s
    printf "| %d | %.0f | %.2f | %.1f | %.1f | %.0f |\n", w, mb, t, mb / t, mb / t / w, rss }'
done
