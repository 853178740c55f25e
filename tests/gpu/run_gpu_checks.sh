#!/usr/bin/env bash
# The GPU checks in one command, for a session on a GPU machine (from the repository root):
#   tests/gpu/run_gpu_checks.sh
#   PREBUILT=1 tests/gpu/run_gpu_checks.sh   (the carried .gpu-bundle.tar.xz, no CMake build)
#   BENCH=1 ...                               (then the op profile, under nsys where it is
#                                              installed, tests/bench/gpu_vs_pytorch_bench.sh,
#                                              attention_vs_sdpa_bench.sh and serving_bench.sh)
# Configures the release preset if needed, builds test_gpu, pretrain_gpt and checkpoint_util
# (-j16), prints nvidia-smi, runs `ctest -L gpu`, then tests/gpu/torch_dist_with_pytorch.sh
# (Megatron core's torch_dist format both ways under the machine's PyTorch 2.x),
# tests/gpu/multi_rank_checks.sh (several ranks sharing the GPU, under mpirun), then
# compute-sanitizer memcheck and racecheck (when installed) on a small subset of test_gpu.
# With $OUT set, the logs, a summary (gpu_summary.txt) and an archive of both
# (gpu_checks.tar.gz) go there.
# PREBUILT=1 runs the executables tests/gpu/bundle_prebuilt.sh packed on the build machine
# (a CUDA image has CUDA but not spdlog, fmt or OpenBLAS; building there would need them):
# carry .gpu-bundle.tar.xz with the call. Where the machine has no mpirun, the bundle's Open MPI
# runtime (openmpi/) is set up for multi-rank runs on this one machine; $MPIRUN holds the mpirun
# used (empty when none), and the summary says which. BENCH_ITERATIONS (default 20) and
# BENCH_SHAPES (default all three) size the training benchmark, SERVING_TOKENS (16) and
# SERVING_REQUESTS (100) the serving one (serving_bench.sh with DEVICE=cuda). TEST_TIMEOUT (test_gpu, default
# 900 s), SANITIZER_TIMEOUT (each compute-sanitizer step, default 300 s) and BENCH_RUN_TIMEOUT
# (each benchmark run) bound the steps, so a hang still leaves the other steps' results;
# MULTI_RANK_TIMEOUT (default 600 s) the multi-rank checks as a whole.
# SKIP lists steps to leave out, so that the checks can be split over two calls of a lent
# machine's budget: any of test_gpu, torch_dist, multi_rank, sanitizer, op_profile, bench,
# attention, serving (e.g. SKIP="torch_dist multi_rank serving" for issue 39's call, then
# SKIP="sanitizer" without BENCH for issue 40's). An unknown name is refused.
# Exit status: 0 when every step passed. Steps keep going after a failure so one run reports
# everything.
set -u
cd "$(dirname "$0")/../.." || exit 1
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
summary="$out/gpu_summary.txt"
: >"$summary"
status=0
note() { echo "$*" | tee -a "$summary"; }
step() {  # step NAME COMMAND...: runs it with its output in $out/NAME.log, notes the result
  local name="$1"
  shift
  local start=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  note "$name: $([ $rc -eq 0 ] && echo passed || echo "FAILED (exit $rc)") in $((SECONDS - start)) s"
  [ $rc -eq 0 ] || status=1
  return $rc
}

known_steps=" test_gpu torch_dist multi_rank sanitizer op_profile bench attention serving "
for skipped in ${SKIP:-}; do
  if [[ "$known_steps" != *" $skipped "* ]]; then
    echo "SKIP names '$skipped', which is no step; the steps are:$known_steps" >&2
    exit 2
  fi
done
wanted() { [[ " ${SKIP:-} " != *" $1 "* ]] || { note "$1: skipped (SKIP)"; return 1; }; }

note "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if command -v nvidia-smi >/dev/null; then
  note "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
  nvidia-smi | tee "$out/nvidia-smi.log"
else
  note "gpu: nvidia-smi not found"
fi

# The tests pass by skipping where no GPU is visible: say loudly when that happened here.
probe() {
  build/bin/test_gpu -tc="*copies bytes*" -s >"$out/probe.log" 2>&1
  if grep -q "skipped: no CUDA GPU" "$out/probe.log"; then
    note "WARNING: the tests see no GPU and skip: $(grep -o 'skipped: no CUDA GPU.*' "$out/probe.log" | head -1)"
    status=1
  else
    note "device: $(grep -o 'device: .*' "$out/probe.log" | head -1)"
  fi
}

# mpirun for multi-rank runs: the machine's; with PREBUILT=1 and none here, the bundle's (below).
# The session runs as root, which Open MPI's mpirun refuses without these two.
MPIRUN=$(command -v mpirun || true)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bin=build/bin
if [ "${PREBUILT:-0}" = 1 ]; then
  # PREBUILT=1: the bundle's executables, with its libraries and this machine's CUDA 13.
  if [ -f .gpu-bundle.tar.xz ]; then
    tar -xJf .gpu-bundle.tar.xz
    bin=.gpu-bundle/bin
    cuda_lib=$(dirname "$( (ls /usr/local/cuda/lib64/libcublasLt.so.13 /usr/local/cuda/lib/libcublasLt.so.13 2>/dev/null;
                           find / -name 'libcublasLt.so.13' -not -path '/proc/*' 2>/dev/null) | head -1)")
    # NCCL is not in the bundle either (bundle_prebuilt.sh): the toolkit's, or PyTorch's wheel's.
    nccl_lib=$(dirname "$( (ls /usr/local/cuda/lib64/libnccl.so.2 /usr/local/cuda/lib/libnccl.so.2 2>/dev/null;
                           find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null) | head -1)")
    # cuDNN neither (loaded at run time, --attention-backend fused/auto): PyTorch's wheel ships it.
    cudnn_lib=$(dirname "$( (ls /usr/local/cuda/lib64/libcudnn.so.9 /usr/local/cuda/lib/libcudnn.so.9 2>/dev/null;
                            find / -name 'libcudnn.so.9' -not -path '/proc/*' 2>/dev/null) | head -1)")
    export LD_LIBRARY_PATH="$PWD/.gpu-bundle/lib:$cuda_lib:$nccl_lib:$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    note "build: the bundle of commit $(cat .gpu-bundle/commit) (cuBLASLt from $cuda_lib, NCCL from $nccl_lib, cuDNN from $cudnn_lib)"
    if ldd "$bin/test_gpu" | grep -q "not found"; then
      note "MISSING LIBRARIES: $(ldd "$bin/test_gpu" "$bin/pretrain_gpt" | grep "not found" | sort -u | tr '\n' ' ')"
    fi
    # The tests and scripts look in build/bin: the bundle's programs are linked there. A
    # checkout with its own build (this script run on the build machine) keeps it: refused.
    mkdir -p build/bin
    for program in "$bin"/*; do
      target="build/bin/$(basename "$program")"
      if [ -e "$target" ] && [ ! -L "$target" ]; then
        note "PREBUILT=1 would replace $target, a program this checkout built; run it where build/ is not (the GPU machine), or move build/ away"
        exit 1
      fi
      ln -sf "$PWD/$program" "$target"
    done
    export PATH="$PWD/$bin:$PATH"  # the bundle's hey
    # The GPU image has no Open MPI: the bundle's runtime (openmpi/, Debian's 4.1, whose libmpi
    # the programs link), moved by OPAL_PREFIX; Debian's libdir and sysconfdir are not under its
    # prefix (bundle_prebuilt.sh), so OPAL_LIBDIR and OPAL_SYSCONFDIR too, and PMIx has a prefix
    # of its own.
    if [ -z "$MPIRUN" ] && [ -x .gpu-bundle/openmpi/bin/mpirun ]; then
      export OPAL_PREFIX="$PWD/.gpu-bundle/openmpi"
      export OPAL_LIBDIR="$OPAL_PREFIX/lib" OPAL_SYSCONFDIR="$OPAL_PREFIX/etc"
      export PMIX_MCA_mca_base_component_path="$OPAL_PREFIX/lib/pmix" \
        PMIX_PKGDATADIR="$OPAL_PREFIX/share/pmix"
      export PATH="$OPAL_PREFIX/bin:$PATH" LD_LIBRARY_PATH="$OPAL_PREFIX/lib:$LD_LIBRARY_PATH"
      # One machine, in a container: ranks started here without ssh (which a CUDA image need not
      # have, and the rsh launcher fails without), over shared memory and ob1 (the bundle has no
      # UCX, libfabric or verbs plugins), copying through a buffer rather than CMA's
      # process_vm_readv, which a container's seccomp or Yama may forbid between ranks.
      export OMPI_MCA_plm=isolated OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp \
        OMPI_MCA_btl_vader_single_copy_mechanism=none
      MPIRUN="$OPAL_PREFIX/bin/mpirun"
    fi
  else
    note "build: skipped (PREBUILT=1, build/bin/test_gpu)"
  fi
  probe
  if wanted test_gpu; then
    step test_gpu timeout "${TEST_TIMEOUT:-900}" build/bin/test_gpu --duration=true
    grep -E "test cases:|assertions:|ERROR" "$out/test_gpu.log" | tee -a "$summary"
  fi
else
  if [ ! -f build/build.ninja ]; then
    step configure cmake --preset release || { tail -30 "$out/configure.log"; exit 1; }
  fi
  targets=(test_gpu pretrain_gpt checkpoint_util)
  [ "${BENCH:-0}" = 1 ] && targets+=(op_profile_bench attention_bench text_generation_server)
  step build cmake --build build -j16 --target "${targets[@]}" || { tail -60 "$out/build.log"; exit 1; }
  probe
  if wanted test_gpu; then
    step ctest ctest --test-dir build -L gpu --output-on-failure --timeout "${TEST_TIMEOUT:-600}"
    grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest.log" | tee -a "$summary"
  fi
fi

note "mpirun: ${MPIRUN:-none}$([ "$MPIRUN" = "$PWD/.gpu-bundle/openmpi/bin/mpirun" ] && echo " (the bundle's Open MPI)")"

# Megatron core's torch_dist both ways under this machine's PyTorch 2.x (issue 41; CI's is 1.13).
if wanted torch_dist; then
  PYTHON="${PYTHON:-python3}" step torch_dist tests/gpu/torch_dist_with_pytorch.sh build/bin
  grep -E "^PyTorch|passed$" "$out/torch_dist.log" | tee -a "$summary"
fi

# Several ranks sharing this GPU (issue 40): --distributed-backend gloo for DP, the distributed
# optimizer, TP + SP and PP against one rank's losses; DP=2 over NCCL (refused where NCCL
# refuses two ranks on one GPU, which is recorded).
if ! wanted multi_rank; then
  :
elif [ -n "$MPIRUN" ]; then
  step multi_rank timeout "${MULTI_RANK_TIMEOUT:-600}" tests/gpu/multi_rank_checks.sh build/bin \
    "$MPIRUN" "$out/multi_rank"
  grep -E "^[a-z0-9_]+: |^step time|multi-rank checks" "$out/multi_rank.log" | tee -a "$summary"
else
  note "multi-rank checks: skipped (no mpirun here and none in the bundle)"
fi

sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)"
if ! wanted sanitizer; then
  :
elif [ -n "$sanitizer" ]; then
  # A few cases each: the sanitizers slow kernels down by orders of magnitude (racecheck took
  # 154 s over the attention op test on an H100, 7 s over the tiny GPT-2 model, which runs the
  # same attention kernels); the tensor-core attention's small case has two tiles.
  step memcheck timeout "${SANITIZER_TIMEOUT:-300}" "$sanitizer" --tool memcheck --error-exitcode 9 \
    build/bin/test_gpu -tc="*copies bytes*,*sum*,*linear*,*attention on the CUDA device*,*key/value-cache attention*,*tensor cores*small*,*AdamW update*,*convert*,*fused classifier*,*frequent tokens*,*GPT-2 model on the GPU*" \
    -tce="*resumed*"
  step racecheck timeout "${SANITIZER_TIMEOUT:-300}" "$sanitizer" --tool racecheck --error-exitcode 9 \
    build/bin/test_gpu -tc="*sum*,*key/value-cache attention*,*tensor cores*small*,*convert*,*fused classifier*,*frequent tokens*,*GPT-2 model on the GPU*" \
    -tce="*resumed*"
  grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out/memcheck.log" "$out/racecheck.log" | tee -a "$summary"
else
  note "compute-sanitizer: not found, skipped"
fi

if [ "${BENCH:-0}" = 1 ]; then
  # Where a bf16 step of GPT-2 124M (the benchmark's first shape) spends its time, op by op
  # (CUDA events per op, the op profile's own), with the attention the benchmark runs
  # (--attention-backend auto: cuDNN's where it runs); under nsys where it is installed, whose
  # per-kernel summary (cuda_gpu_kern_sum) is the timeline's.
  profile=(build/bin/op_profile_bench 1024 16 3 cuda bf16 auto)
  nsys="$(command -v nsys || ls /usr/local/cuda/bin/nsys 2>/dev/null || true)"
  if [ -n "$nsys" ]; then
    profile=("$nsys" profile --stats=true --force-overwrite true -o "$out/op_profile_timeline" "${profile[@]}")
  else
    note "nsys: not found; the op profile's CUDA events per op stand for the timeline"
  fi
  if wanted op_profile; then
    step op_profile timeout "${BENCH_RUN_TIMEOUT:-600}" "${profile[@]}"
    grep -A 25 "cuda_gpu_kern_sum" "$out/op_profile.log" | head -30 >>"$summary" || true
    tail -n 40 "$out/op_profile.log" >>"$summary"
  fi
  if wanted bench; then
    # shellcheck disable=SC2086  # BENCH_SHAPES is a list of names
    OUT="$out/bench" step bench tests/bench/gpu_vs_pytorch_bench.sh build \
      "${BENCH_ITERATIONS:-20}" ${BENCH_SHAPES:-}
    tee -a "$summary" <"$out/bench/bench_table.md" 2>/dev/null
  fi
  # Attention alone (issue 39: within 10 % of PyTorch's SDPA): ours under auto and flash.
  if wanted attention; then
    OUT="$out/bench" step attention tests/bench/attention_vs_sdpa_bench.sh build \
      "${ATTENTION_REPETITIONS:-20}"
    tee -a "$summary" <"$out/bench/attention_table.md" 2>/dev/null
  fi
  # Serving (issue 13): text_generation_server against the PyTorch KV-cache server on the GPU.
  if wanted serving; then
    DEVICE=cuda PYTHON=python3 OUT="$out/bench" step serving timeout "${BENCH_RUN_TIMEOUT:-1800}" \
      tests/bench/serving_bench.sh build "${SERVING_TOKENS:-16}" "${SERVING_REQUESTS:-100}"
    tee -a "$summary" <"$out/bench/serving_table.md" 2>/dev/null
  fi
fi

note "overall: $([ $status -eq 0 ] && echo passed || echo FAILED) (logs in $out)"
# Everything in one archive beside the summary, for a session that can fetch one file.
tar --exclude=gpu_checks.tar.gz -czf "$out/gpu_checks.tar.gz" -C "$out" . 2>/dev/null || true
exit $status
