#!/usr/bin/env bash
# Benchmark on one GPU, side by side in one run: pretrain_gpt --device cuda --bf16 against a
# nanoGPT-style PyTorch script of the same model on the same card (tests/bench/
# pytorch_gpu_reference.py: torch.compile, scaled_dot_product_attention, fused AdamW, bf16
# autocast), same hyperparameters (AdamW lr 6e-4, betas 0.9/0.95, weight decay 0.1, clipping
# at 1.0, no dropout), mock data. Shapes (issue 10):
#   gpt2-124m   12 layers, hidden 768, 12 heads, seq 1024, vocab 50304, micro batch 16
#   gpt2-350m   24 layers, hidden 1024, 16 heads, seq 1024, vocab 50304, micro batch 8
#   llama-1b    16 layers, hidden 2048, 32 heads, 8 KV heads, SwiGLU 8192, RoPE, seq 2048,
#               vocab 32000, micro batch 4
# Reports per shape: median step time after the warm-up iterations, tokens/s, model TFLOP/s by
# Megatron's formula (pretrain_gpt's benchmark.json; the same FLOPs for both columns), MFU over
# the bf16 GEMM peak measured on this card in this run (8192³, PyTorch), and peak GPU memory
# (nvidia-smi's memory.used, sampled every 0.2 s while each run lasts: the same measure for
# both, allocator caches included).
# pretrain_gpt runs with $ATTENTION_FLAGS (default --attention-backend auto: cuDNN's fused
# attention where it runs the call, else our tensor-core kernel; --attention-backend flash for
# ours alone, local for the CUDA-core kernel) and $GRAPH_FLAGS (default --cuda-graph-impl local:
# the step captured after three eager steps and replayed, docs/step_on_device.md; empty for
# eager steps). The precision cell says whether the graphs were captured.
# Usage: tests/bench/gpu_vs_pytorch_bench.sh [build-dir] [iterations] [shape ...]
#   $OUT, when set, receives the logs and the table (bench_table.md); BENCH_RUN_TIMEOUT (seconds,
#   default 1800) bounds each run.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
iterations=${2:-30}
shift $(( $# > 2 ? 2 : $# ))
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(gpt2-124m gpt2-350m llama-1b)
python=${PYTHON:-python3}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
warmup=5
attention_flags=${ATTENTION_FLAGS---attention-backend auto}
graph_flags=${GRAPH_FLAGS---cuda-graph-impl local}

# Peak memory.used (MiB) of GPU 0 while "$@" runs.
with_memory_peak() {
  local log=$1; shift
  local samples="$log.memory"
  : >"$samples"
  ( while true; do
      nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 >>"$samples" 2>/dev/null
      sleep 0.2
    done ) &
  local sampler=$!
  local status=0
  timeout "${BENCH_RUN_TIMEOUT:-1800}" "$@" >"$log" 2>&1 || status=$?
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  sort -n "$samples" | tail -1 >"$log.peak_mib"
  return $status
}

shape_flags() {  # pretrain_gpt's flags, then a tab, then the PyTorch script's
  case $1 in
    gpt2-124m) printf '%s\t%s\n' \
      "--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 16 --global-batch-size 16 --tokenizer-type GPT2BPETokenizer" \
      "--style gpt2 --layers 12 --hidden 768 --heads 12 --seq 1024 --mbs 16 --vocab 50304" ;;
    gpt2-350m) printf '%s\t%s\n' \
      "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 8 --global-batch-size 8 --tokenizer-type GPT2BPETokenizer" \
      "--style gpt2 --layers 24 --hidden 1024 --heads 16 --seq 1024 --mbs 8 --vocab 50304" ;;
    llama-1b) printf '%s\t%s\n' \
      "--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --ffn-hidden-size 8192 --swiglu --position-embedding-type rope --normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 4 --tokenizer-type NullTokenizer --vocab-size 31999" \
      "--style llama --layers 16 --hidden 2048 --heads 32 --groups 8 --ffn 8192 --seq 2048 --mbs 4 --vocab 32000" ;;
    *) echo "unknown shape '$1' (valid: gpt2-124m gpt2-350m llama-1b)" >&2; exit 2 ;;
  esac
}

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv | tee "$out/gpu.txt"
"$python" "$root/tests/bench/pytorch_gpu_reference.py" --measure-peak | tee "$out/peak.json"

rows="$out/rows.jsonl"
: >"$rows"
for shape in "${shapes[@]}"; do
  IFS=$'\t' read -r ours_flags torch_flags < <(shape_flags "$shape")
  # shellcheck disable=SC2086  # the flag strings above are split on purpose
  with_memory_peak "$out/$shape.ours.log" "$build/bin/pretrain_gpt" $ours_flags $attention_flags $graph_flags --device cuda \
    --bf16 --train-iters $((warmup + iterations)) --lr 6e-4 --min-lr 6e-5 --adam-beta2 0.95 \
    --weight-decay 0.1 --clip-grad 1.0 --mock-data --hidden-dropout 0 --attention-dropout 0 \
    --log-interval 10 --eval-iters 0 --benchmark-output "$out/$shape.ours.json" ||
    echo "pretrain_gpt failed on $shape: see $out/$shape.ours.log" >&2
  # shellcheck disable=SC2086
  with_memory_peak "$out/$shape.torch.log" "$python" "$root/tests/bench/pytorch_gpu_reference.py" \
    $torch_flags --iterations "$iterations" --warmup "$warmup" ||
    echo "the PyTorch reference failed on $shape: see $out/$shape.torch.log" >&2
  "$python" - "$shape" "$out" "$rows" <<'PY'
import json, os, sys
shape, out, rows = sys.argv[1:]
def load(path, last_line=False):
    try:
        text = open(path).read()
        return json.loads(text.strip().splitlines()[-1] if last_line else text)
    except (OSError, ValueError, IndexError):
        return None
def peak(path):
    try:
        return int(open(path).read().strip()) / 1024
    except (OSError, ValueError):
        return None
ours = load(f"{out}/{shape}.ours.json")
torch = load(f"{out}/{shape}.torch.log", last_line=True)
log = open(f"{out}/{shape}.ours.log", errors="replace").read() if os.path.exists(f"{out}/{shape}.ours.log") else ""
computes = "bf16 (fp32 master weights)" if "--bf16: bf16 weights and activations" in log else "fp32"
if "cuDNN's fused attention runs" in log:
    computes += ", cuDNN attention"
elif "runs on our tensor-core kernels" in log or "our tensor-core kernel runs it" in log:
    computes += ", tensor-core attention"
if "step: graphs captured" in log:
    computes += ", CUDA graphs"
with open(rows, "a") as f:
    f.write(json.dumps({"shape": shape, "ours": ours, "torch": torch, "ours_computes": computes,
                        "ours_peak_gib": peak(f"{out}/{shape}.ours.log.peak_mib"),
                        "torch_peak_gib": peak(f"{out}/{shape}.torch.log.peak_mib")}) + "\n")
PY
done

"$python" - "$out/peak.json" "$rows" "$iterations" <<'PY' | tee "$out/bench_table.md"
import json, sys
peak = json.load(open(sys.argv[1]))
iterations = sys.argv[3]
peak_tflops = peak["bf16_gemm_tflops"]
print(f"{peak['device']}; bf16 GEMM peak measured in this run: {peak_tflops:.0f} TFLOP/s; "
      f"median of {iterations} iterations after 5 warm-up\n")
print("| shape | run | precision | ms / iteration | tokens/s | model TFLOP/s | MFU | peak GPU memory |")
print("|---|---|---|---|---|---|---|---|")
for line in open(sys.argv[2]):
    row = json.loads(line)
    ours, torch = row["ours"], row["torch"]
    flops = ours["tflops_per_device"] * ours["median_step_ms"] / 1000 if ours else None  # TFLOP/iteration
    def cells(name, precision, seconds, tokens, peak_gib):
        if seconds is None:
            return f"| {row['shape']} | {name} | {precision} | failed | | | | |"
        tflops = flops / seconds if flops else float("nan")
        memory = f"{peak_gib:.1f} GiB" if peak_gib is not None else "?"
        return (f"| {row['shape']} | {name} | {precision} | {1000 * seconds:.1f} | {tokens:,.0f} | "
                f"{tflops:.1f} | {100 * tflops / peak_tflops:.1f} % | {memory} |")
    print(cells("pretrain_gpt", row["ours_computes"], ours and ours["median_step_ms"] / 1000,
                ours and ours["tokens_per_second"], row["ours_peak_gib"]))
    print(cells(f"PyTorch {torch['torch'] if torch else '?'}", "bf16 autocast",
                torch and torch["median_seconds_per_iteration"], torch and torch["tokens_per_second"],
                row["torch_peak_gib"]))
    if ours and torch:
        print(f"| {row['shape']} | ratio | | | {ours['tokens_per_second'] / torch['tokens_per_second']:.2f}× | | | |")
PY
