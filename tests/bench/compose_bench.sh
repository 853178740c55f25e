#!/usr/bin/env bash
# Benchmark: `launcher main training=gpt3/126m --dry-run` (compose conf/, resolve, render the
# job script, write the results directory; whole process, start-up included) side by side
# with OmegaConf 2.2 composing and resolving the same files in Python (start-up included,
# Hydra's own work excluded). Prints a markdown table for docs/benchmarks.md.
# Usage: tests/bench/compose_bench.sh [build-dir] [runs]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
runs=${2:-30}
python=/usr/bin/python3  # Debian's python3-omegaconf lives in the system interpreter
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

for _ in $(seq "$runs"); do
  s=$(date +%s.%N)
  "$build/bin/launcher" main training=gpt3/126m cluster_type=local base_results_dir="$out" \
    --dry-run >/dev/null 2>&1
  e=$(date +%s.%N)
  awk -v s="$s" -v e="$e" 'BEGIN {print e - s}'
done | median > "$out/ours"

if "$python" -c "import omegaconf" 2>/dev/null; then
  for _ in $(seq "$runs"); do
    s=$(date +%s.%N)
    "$python" "$root/tests/bench/compose_reference.py" "$root/conf" >/dev/null
    e=$(date +%s.%N)
    awk -v s="$s" -v e="$e" 'BEGIN {print e - s}'
  done | median > "$out/reference"
  reference=$(awk '{printf "%.1f", $1 * 1000}' "$out/reference")
  omegaconf_version=$("$python" -c "import omegaconf; print(omegaconf.__version__)")
else
  reference="n/a (python3-omegaconf not installed)"
  omegaconf_version="-"
fi
ours=$(awk '{printf "%.1f", $1 * 1000}' "$out/ours")
echo "| what (median of $runs runs, whole process) | ms |"
echo "|---|---|"
echo "| launcher main training=gpt3/126m --dry-run (compose + resolve + render + write) | $ours |"
echo "| OmegaConf $omegaconf_version load + merge + resolve of the same files (python3) | $reference |"
