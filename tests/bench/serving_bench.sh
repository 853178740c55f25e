#!/usr/bin/env bash
# Benchmark, side by side in one run: text_generation_server (continuous batching over a KV
# cache) against a PyTorch reference server (tests/bench/pytorch_generation_server.py:
# Megatron's one request at a time behind a lock, a PyTorch generation loop with a KV cache,
# Debian's python3-torch, fp32), both serving the same GPT-2 124M weights (12 layers, hidden
# 768, 12 heads, padded vocabulary 50304; random weights from one pretrain_gpt iteration, ours
# from the checkpoint, PyTorch's from its checkpoint_util --export-hf), on the CPU with the same
# thread count, on loopback.
#
# The load comes from `hey` (Debian's package): for 1, 8 and 64 concurrent clients, each sends
# PUT /api with the same prompt, greedy (top_k 1), TOKENS tokens to generate; REQUESTS requests
# in all, or 2 per client when that is more (hey gives the 99th percentile from 100 on). The weights are random, so greedy decoding never meets the end of
# document and every request generates exactly TOKENS tokens (checked once per server); tokens/s
# is requests/s × TOKENS. Latencies are per request (hey's 50 % and 99 %). Every response must be
# a 200 (checked from hey's status code distribution), else the benchmark fails.
#
# DEVICE=cuda serves from the first GPU on both sides (ours --device cuda, PyTorch's on cuda;
# both fp32); the default is the CPU. PYTHON is the interpreter with torch (Debian's
# /usr/bin/python3 by default; a GPU machine's python3 with CUDA torch), HEY the load tool
# (`hey` on PATH by default). $OUT, when set, receives the table (serving_table.md).
#
# Run it on a quiet machine. Usage:
#   [DEVICE=cuda] tests/bench/serving_bench.sh [build-dir] [tokens] [requests]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
tokens=${2:-16}
requests=${3:-100}
threads=$(nproc)
device=${DEVICE:-cpu}
[[ $device == cpu || $device == cuda ]] || { echo "serving_bench: DEVICE=$device (valid: cpu, cuda)" >&2; exit 2; }
python=${PYTHON:-/usr/bin/python3}  # Debian's interpreter, where python3-torch lives
hey=${HEY:-hey}
command -v "$hey" >/dev/null || { echo "serving_bench: $hey is missing (apt-get install hey)" >&2; exit 1; }
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
vocab=$root/tests/data/gpt2-vocab.json
merges=$root/tests/data/gpt2-merges.txt
model_flags=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 128
             --max-position-embeddings 1024 --tokenizer-type GPT2BPETokenizer
             --vocab-file "$vocab" --merge-file "$merges")

OMP_NUM_THREADS=$threads "$build/bin/pretrain_gpt" "${model_flags[@]}" --micro-batch-size 1 \
  --global-batch-size 1 --train-iters 1 --lr 1e-4 --mock-data --log-interval 1 --eval-iters 0 \
  --device cpu --save "$work/checkpoint" >"$work/train.log" 2>&1
"$build/bin/checkpoint_util" --load "$work/checkpoint" --export-hf "$work/hf" >"$work/export.log" 2>&1

ours_port=5931
torch_port=5932
OMP_NUM_THREADS=$threads "$build/bin/text_generation_server" "${model_flags[@]}" \
  --load "$work/checkpoint" --port "$ours_port" --max-batch-size 64 \
  --max-concurrent-requests 256 --device "$device" >"$work/ours.log" 2>&1 &
pids+=($!)
"$python" "$root/tests/bench/pytorch_generation_server.py" "$work/hf" "$vocab" "$merges" \
  --port "$torch_port" --threads "$threads" --device "$device" >"$work/torch.log" 2>&1 &
pids+=($!)

prompt="The quick brown fox jumps over the lazy dog. It"
body=$(printf '{"prompts": ["%s"], "tokens_to_generate": %d, "top_k": 1}' "$prompt" "$tokens")
wait_ready() {  # wait_ready PORT LOG: the first answer, within 5 minutes
  for _ in $(seq 300); do
    if "$python" - "$1" "$body" >"$work/first_$1.json" 2>/dev/null <<'PY'
import sys, urllib.request
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/api", data=sys.argv[2].encode(),
                                 method="PUT", headers={"Content-Type": "application/json"})
sys.stdout.write(urllib.request.urlopen(request, timeout=60).read().decode())
PY
    then
      return 0
    fi
    sleep 1
  done
  echo "serving_bench: the server on port $1 did not answer; its log:" >&2
  tail -20 "$2" >&2
  exit 1
}
wait_ready "$ours_port" "$work/ours.log"
wait_ready "$torch_port" "$work/torch.log"
"$python" - "$work/first_$ours_port.json" "$work/first_$torch_port.json" "$tokens" <<'PY'
import json, sys
ours, torch = (json.load(open(p)) for p in sys.argv[1:3])
tokens = int(sys.argv[3])
if ours["text"] != torch["text"]:
    print(f"note: the greedy texts differ (float rounding at a near tie?):\n  ours:    {ours['text'][0]!r}\n  pytorch: {torch['text'][0]!r}")
else:
    print("greedy texts equal on both servers")
prompt_tokens = len(torch["segments"][0]) - tokens
for name, r in (("ours", ours), ("pytorch", torch)):
    if len(r["segments"][0]) != prompt_tokens + tokens:
        sys.exit(f"{name} generated {len(r['segments'][0]) - prompt_tokens} tokens, not {tokens}: tokens/s would be wrong")
PY

run_load() {  # run_load PORT CLIENTS -> "requests/s p50 p99"
  local port=$1 clients=$2 out total
  total=$(( requests > 2 * clients ? requests : 2 * clients ))
  total=$(( (total + clients - 1) / clients * clients ))  # hey sends floor(n / c) per client
  out=$("$hey" -n "$total" -c "$clients" -t 0 -m PUT \
        -T application/json -d "$body" "http://127.0.0.1:$port/api")
  local ok
  ok=$(awk '/\[200\]/ {print $2}' <<<"$out")
  if [[ ${ok:-0} -ne $total ]]; then
    echo "serving_bench: port $port, $clients clients: $ok of $total responses were 200:" >&2
    echo "$out" >&2
    exit 1
  fi
  awk '/Requests\/sec:/ {rps=$2} /50% in/ {p50=$3} /99% in/ {p99=$3} END {print rps, p50, p99}' <<<"$out"
}

table=/dev/null
[[ -n ${OUT:-} ]] && mkdir -p "$OUT" && table=$OUT/serving_table.md
{
echo
echo "| clients | server | tokens/s | requests/s | p50 latency (s) | p99 latency (s) |"
echo "|---|---|---|---|---|---|"
declare -A ours_tps torch_tps
for clients in 1 8 64; do
  for side in ours torch; do
    port=$ours_port name="text_generation_server (this project)"
    if [[ $side == torch ]]; then
      port=$torch_port
      name="PyTorch reference ($([[ $device == cuda ]] && echo GPU || echo "$threads threads"))"
    fi
    read -r rps p50 p99 < <(run_load "$port" "$clients")
    tps=$(awk -v r="$rps" -v t="$tokens" 'BEGIN {printf "%.1f", r * t}')
    [[ $side == ours ]] && ours_tps[$clients]=$tps || torch_tps[$clients]=$tps
    echo "| $clients | $name | $tps | $rps | $p50 | $p99 |"
  done
done
echo
for clients in 1 8 64; do
  ratio=$(awk -v a="${ours_tps[$clients]}" -v b="${torch_tps[$clients]}" 'BEGIN {printf "%.2f", a / b}')
  echo "$clients clients: ${ratio}x PyTorch's tokens/s"
done
gpu=""
[[ $device == cuda ]] && gpu="; $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) (--device cuda, fp32)"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')$gpu; $tokens tokens per request, $requests requests per cell (at least 2 per client)"
} | tee "$table"
