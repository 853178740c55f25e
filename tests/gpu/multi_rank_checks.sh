#!/usr/bin/env bash
# Several ranks on one GPU (issue 40): pretrain_gpt under mpirun with --distributed-backend gloo
# (the collectives staged through host memory over Open MPI, so ranks may share the GPU;
# docs/parallelism.md "Collectives and memory") for DP=2, DP=4, the distributed optimizer,
# ZeRO-3, TP=2 with sequence parallelism, PP=2, PP=2 interleaved (its transfers overlapped) and
# TP=2 x PP=2 in bf16, TP=2 in fp16 (its loss scaling), DP=2 and ZeRO-1 with --grad-reduce-in-bf16, and TP=2 and PP=2 in fp32, each
# against one rank's losses in the same precision; where NCCL runs two ranks, DP=2 and PP=2
# interleaved over it, each also captured in CUDA graphs (the eager run's bits)
# (16-bit TP sums its partial outputs in bf16 over the ranks: Open MPI's sums of 16-bit floats
# are taken in fp32 and rounded once); then DP=2 over NCCL, started by mpirun
# and torchrun-style (no MPI: the TCP rendezvous), which NCCL refuses when the ranks share one
# GPU: that refusal is recorded, not failed, and the losses are checked where this machine's
# NCCL lets them share it.
#   tests/gpu/multi_rank_checks.sh BIN_DIR MPIRUN OUT_DIR [DEVICE]
# DEVICE (cuda) may be cpu: the same runs on CPU ranks, where the losses must agree to 1e-6 as
# in CI, which is how this script is checked without a GPU. On the GPU the tolerance is looser
# than CI's: the ranks sum fp32 gradients in another order than one rank's accumulation, and
# bf16 steps amplify a last-bit difference (1e-2 relative in bf16, 1e-4 in fp32).
# Exit status: 0 when every run that should train trained and followed its reference.
set -uo pipefail
bin=$1 mpirun=$2 out=$3 device=${4:-cuda}
mkdir -p "$out"
status=0
# NCCL's own reason for a refusal (a shared GPU: "Duplicate GPU detected") reaches the logs.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
if [ "$device" = cpu ]; then bf16_tolerance=1e-6 fp32_tolerance=1e-6; else bf16_tolerance=1e-2 fp32_tolerance=1e-4; fi

# The tensor-parallel e2e tests' Llama-style model (tests/e2e/mpi_runs.hpp), 20 iterations.
model=(--num-layers 2 --hidden-size 64 --num-attention-heads 8 --group-query-attention
  --num-query-groups 2 --swiglu --ffn-hidden-size 96 --position-embedding-type rope
  --normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights
  --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 8
  --train-iters 20 --lr 2e-3 --lr-warmup-iters 2 --lr-decay-style cosine --clip-grad 1.0
  --vocab-size 299 --tokenizer-type NullTokenizer --mock-data --log-interval 1
  --eval-interval 100 --eval-iters 0 --attention-dropout 0 --hidden-dropout 0
  --device "$device")

# "iteration lm-loss" per line, from the last rank's iteration lines.
losses() { sed -n 's/.* iteration *\([0-9]*\)\/.*lm loss: \([-+0-9.eE]*\).*/\1 \2/p' "$1"; }

run() {  # run NAME RANKS FLAGS...: the log in $out/NAME.log; the exit status
  local name=$1 ranks=$2
  shift 2
  # The padded vocabulary (a multiple of this × tp) the same at every tensor-parallel size.
  local divisible=64
  [[ " $* " == *" --tensor-model-parallel-size 2 "* ]] && divisible=32
  local command=("$bin/pretrain_gpt" "${model[@]}" --make-vocab-size-divisible-by "$divisible" "$@")
  [ "$ranks" -gt 1 ] && command=("$mpirun" -np "$ranks" --oversubscribe "${command[@]}")
  timeout 300 "${command[@]}" >"$out/$name.log" 2>&1
}

compare() {  # compare NAME REFERENCE TOLERANCE: every iteration's loss within TOLERANCE relative
  local name=$1 reference=$2 tolerance=$3
  if ! join <(losses "$out/$reference.log") <(losses "$out/$name.log") |
    awk -v tolerance="$tolerance" -v name="$name" '
      { n++; d = $2 - $3; d = d < 0 ? -d : d; r = d / ($2 < 0 ? -$2 : $2); if (r > worst) worst = r }
      END { printf "%s: %d iterations, worst relative difference %.3g (tolerance %s)\n", name, n, worst, tolerance;
            exit !(n == 20 && worst <= tolerance) }'; then
    echo "$name: FAILED against $reference (log: $out/$name.log)"
    tail -n 5 "$out/$name.log"
    status=1
  fi
}

check() {  # check NAME RANKS REFERENCE TOLERANCE FLAGS...: run, then compare
  local name=$1 ranks=$2 reference=$3 tolerance=$4
  shift 4
  run "$name" "$ranks" "$@"
  local exit_status=$?
  if [ $exit_status -ne 0 ]; then
    echo "$name: FAILED (exit status $exit_status; log: $out/$name.log)"
    tail -n 5 "$out/$name.log"
    status=1
    return
  fi
  compare "$name" "$reference" "$tolerance"
}

reference() {  # reference NAME FLAGS...: the one-rank run checks compare with; none, no checks
  local name=$1
  shift
  run "$name" 1 "$@" || { echo "$name: FAILED"; tail -n 5 "$out/$name.log"; exit 1; }
}

reference one_rank_bf16 --bf16
reference one_rank_fp32
reference one_rank_fp16 --fp16
gloo=(--distributed-backend gloo)
check dp2_bf16_gloo 2 one_rank_bf16 "$bf16_tolerance" --bf16 "${gloo[@]}"
check dp4_bf16_gloo 4 one_rank_bf16 "$bf16_tolerance" --bf16 "${gloo[@]}"
check zero1_dp2_bf16_gloo 2 one_rank_bf16 "$bf16_tolerance" --bf16 --use-distributed-optimizer "${gloo[@]}"
echo '{"zero_optimization": {"stage": 3}}' >"$out/zero3.json"
check zero3_dp2_bf16_gloo 2 one_rank_bf16 "$bf16_tolerance" --bf16 --deepspeed \
  --deepspeed_config "$out/zero3.json" "${gloo[@]}"
check tp2_sp_bf16_gloo 2 one_rank_bf16 "$bf16_tolerance" --bf16 --tensor-model-parallel-size 2 \
  --sequence-parallel "${gloo[@]}"
check pp2_bf16_gloo 2 one_rank_bf16 "$bf16_tolerance" --bf16 --pipeline-model-parallel-size 2 \
  "${gloo[@]}"
check tp2_pp2_bf16_gloo 4 one_rank_bf16 "$bf16_tolerance" --bf16 --tensor-model-parallel-size 2 \
  --pipeline-model-parallel-size 2 "${gloo[@]}"
check tp2_fp16_gloo 2 one_rank_fp16 "$bf16_tolerance" --fp16 --tensor-model-parallel-size 2 \
  "${gloo[@]}"
# The interleaved schedule (two chunks of one layer per stage, so four layers) at PP=2, which
# only its overlapped transfers (the default) allow, against one rank of four layers.
reference one_rank_bf16_4_layers --bf16 --num-layers 4
check pp2_interleaved_bf16_gloo 2 one_rank_bf16_4_layers "$bf16_tolerance" --bf16 --num-layers 4 \
  --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 "${gloo[@]}"
# --overlap-grad-reduce with every layer its own bucket: the same sums, started during the
# backward (the staged route runs each at once, so this checks the buckets, not overlap).
check dp2_bf16_overlap_gloo 2 one_rank_bf16 "$bf16_tolerance" --bf16 --overlap-grad-reduce \
  --ddp-bucket-size 1 "${gloo[@]}"
# The distributed optimizer with both overlaps in small buckets: the shards reduce-scattered
# during the backward, the parameters gathered in buckets that each layer's first use waits for
# (its part of the bf16 working copy made then).
check zero1_dp2_bf16_overlap_gloo 2 one_rank_bf16 "$bf16_tolerance" --bf16 \
  --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 1 \
  "${gloo[@]}"
# The same at TP=2 x DP=2 with sequence parallelism: the norms' tensor-parallel sums on the shards.
check tp2_sp_zero1_dp2_bf16_overlap_gloo 4 one_rank_bf16 "$bf16_tolerance" --bf16 \
  --tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer \
  --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 1 "${gloo[@]}"
# A pipeline's stages start their buckets as each chunk's last backward finishes them.
check pp2_dp2_bf16_overlap_gloo 4 one_rank_bf16 "$bf16_tolerance" --bf16 \
  --pipeline-model-parallel-size 2 --overlap-grad-reduce --ddp-bucket-size 1 "${gloo[@]}"
# The step times side by side (the mean over iterations 3-20, ms), for the record: one rank's
# four micro batches against two ranks' two each, without and with the buckets.
step_ms() { sed -n 's/.* iteration *\([0-9]*\)\/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1 \2/p' "$1" |
  awk '$1 > 2 { sum += $2; n++ } END { if (n) printf "%.2f", sum / n; else printf "?" }'; }
echo "step time (ms): one rank $(step_ms "$out/one_rank_bf16.log"), DP=2 $(step_ms "$out/dp2_bf16_gloo.log"), DP=2 with --overlap-grad-reduce $(step_ms "$out/dp2_bf16_overlap_gloo.log")"
# --grad-reduce-in-bf16: the data-parallel gradient sums in bf16 (plain DP and ZeRO-1).
check dp2_bf16_reduce_bf16_gloo 2 one_rank_bf16 "$bf16_tolerance" --bf16 --grad-reduce-in-bf16 \
  "${gloo[@]}"
check zero1_dp2_bf16_reduce_bf16_gloo 2 one_rank_bf16 "$bf16_tolerance" --bf16 \
  --grad-reduce-in-bf16 --use-distributed-optimizer "${gloo[@]}"
check tp2_sp_fp32_gloo 2 one_rank_fp32 "$fp32_tolerance" --tensor-model-parallel-size 2 \
  --sequence-parallel "${gloo[@]}"
check pp2_fp32_gloo 2 one_rank_fp32 "$fp32_tolerance" --pipeline-model-parallel-size 2 "${gloo[@]}"
# Graphs over the staged route run eagerly (the host stages each collective), saying so.
check dp2_bf16_gloo_graphs 2 dp2_bf16_gloo 0 --bf16 --cuda-graph-impl local "${gloo[@]}"
if [ "$device" = cuda ]; then
  grep -q "step: eager at iteration 1 (the data parallel group's collectives are staged" \
    "$out/dp2_bf16_gloo_graphs.log" || { echo "dp2_bf16_gloo_graphs: no eager line"; status=1; }
fi
for name in dp2_bf16_gloo zero1_dp2_bf16_gloo; do
  grep -q -- "--distributed-backend gloo: " "$out/$name.log" || { echo "$name: no gloo line"; status=1; }
done

# NCCL with two ranks on one GPU: NCCL's own refusal ("Duplicate GPU") is what this machine can
# show unless its NCCL lets them share it.
if run dp2_bf16_nccl 2 --bf16 --distributed-backend nccl; then
  compare dp2_bf16_nccl one_rank_bf16 "$bf16_tolerance"
  # Where NCCL runs them: the step captured with its NCCL all-reduces (issue 39), the eager
  # run's bits.
  check dp2_bf16_nccl_graphs 2 dp2_bf16_nccl 0 --bf16 --distributed-backend nccl \
    --cuda-graph-impl local
  grep -q "step: graphs captured at iteration" "$out/dp2_bf16_nccl_graphs.log" ||
    { echo "dp2_bf16_nccl_graphs: no capture"; status=1; }
  # And a pipeline: PP=2 interleaved (overlapped transfers), eagerly and captured (NCCL's sends
  # and receives inside the graph).
  check pp2_interleaved_bf16_nccl 2 one_rank_bf16_4_layers "$bf16_tolerance" --bf16 \
    --num-layers 4 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 \
    --distributed-backend nccl
  check pp2_interleaved_bf16_nccl_graphs 2 pp2_interleaved_bf16_nccl 0 --bf16 --num-layers 4 \
    --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 \
    --distributed-backend nccl --cuda-graph-impl local
  grep -q "step: graphs captured at iteration" "$out/pp2_interleaved_bf16_nccl_graphs.log" ||
    { echo "pp2_interleaved_bf16_nccl_graphs: no capture"; status=1; }
elif [ "$device" = cuda ] && grep -qi "duplicate GPU\|--distributed-backend gloo runs" "$out/dp2_bf16_nccl.log"; then
  echo "dp2_bf16_nccl: refused by NCCL with the ranks sharing one GPU (recorded, not a failure):"
  grep -i -m 2 "nccl" "$out/dp2_bf16_nccl.log"
else
  echo "dp2_bf16_nccl: FAILED (log: $out/dp2_bf16_nccl.log)"
  tail -n 5 "$out/dp2_bf16_nccl.log"
  status=1
fi

# Two GPU ranks started torchrun-style, without MPI: NCCL's id through the TCP rendezvous
# (make_groups_without_mpi). On one GPU NCCL refuses them as above; on the CPU they are refused
# with the launch advice, as CPU ranks need MPI.
port=$((20000 + RANDOM % 20000))
for rank in 0 1; do
  RANK=$rank WORLD_SIZE=2 LOCAL_RANK=$rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 300 "$bin/pretrain_gpt" "${model[@]}" --make-vocab-size-divisible-by 64 --bf16 \
    >"$out/torchrun_rank$rank.log" 2>&1 &
  pids[rank]=$!
done
torchrun_status=0
for rank in 0 1; do wait "${pids[rank]}" || torchrun_status=$?; done
if [ $torchrun_status -eq 0 ]; then
  cp "$out/torchrun_rank1.log" "$out/torchrun_bf16_nccl.log"  # the last rank prints the losses
  compare torchrun_bf16_nccl one_rank_bf16 "$bf16_tolerance"
elif [ "$device" = cuda ] && grep -qi "duplicate GPU" "$out"/torchrun_rank*.log; then
  echo "torchrun_bf16_nccl: refused by NCCL with the ranks sharing one GPU (recorded, not a failure):"
  grep -hi -m 1 "duplicate GPU" "$out"/torchrun_rank*.log | head -n 1
elif [ "$device" = cpu ] && grep -q "CPU ranks are started by an MPI launcher" "$out/torchrun_rank0.log"; then
  echo "torchrun_cpu: refused with the launch advice, as CPU ranks need MPI"
else
  echo "torchrun_bf16_nccl: FAILED (logs: $out/torchrun_rank0.log, torchrun_rank1.log)"
  tail -n 5 "$out"/torchrun_rank*.log
  status=1
fi
echo "multi-rank checks: $([ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
