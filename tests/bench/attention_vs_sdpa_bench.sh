#!/usr/bin/env bash
# Attention alone, side by side on one GPU in one call: attention_bench (ours: the backends
# asked for, default auto and flash) against PyTorch's scaled_dot_product_attention
# (attention_sdpa_reference.py), causal, bf16, the GPU benchmark's three shapes. Writes
# attention_table.md: forward and backward milliseconds and TFLOP/s per shape and backend, and
# each of ours as a ratio of PyTorch's forward+backward time (issue 39: within 10 %).
# Usage: tests/bench/attention_vs_sdpa_bench.sh [build-dir] [repetitions] [backend ...]
#   $OUT, when set, receives the logs and the table.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
repetitions=${2:-20}
shift $(( $# > 2 ? 2 : $# ))
backends=("$@")
[ ${#backends[@]} -gt 0 ] || backends=(auto flash)
python=${PYTHON:-python3}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
"$build/bin/attention_bench" "$repetitions" "${backends[@]}" >"$out/attention.ours.jsonl" \
  2>"$out/attention.ours.log"
"$python" "$root/tests/bench/attention_sdpa_reference.py" "$repetitions" \
  >"$out/attention.torch.jsonl" 2>"$out/attention.torch.log"
"$python" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(line) for name in ("ours", "torch")
        for line in open(f"{out}/attention.{name}.jsonl") if line.strip()]
torch = {row["shape"]: row for row in rows if row["backend"] == "pytorch-sdpa"}
lines = ["| shape | attention | forward ms | backward ms | forward TFLOP/s | backward TFLOP/s | fwd+bwd time vs PyTorch SDPA |",
         "|---|---|---|---|---|---|---|"]
for row in rows:
    reference = torch.get(row["shape"])
    ratio = ""
    if reference:
        ratio = "%.2fx" % ((row["forward_ms"] + row["backward_ms"]) /
                           (reference["forward_ms"] + reference["backward_ms"]))
    name = row["backend"] if row["backend"] == "pytorch-sdpa" else "ours, " + row["backend"]
    lines.append(f"| {row['shape']} | {name} | {row['forward_ms']:.3f} | {row['backward_ms']:.3f} | "
                 f"{row['forward_tflops']:.1f} | {row['backward_tflops']:.1f} | {ratio} |")
open(f"{out}/attention_table.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
