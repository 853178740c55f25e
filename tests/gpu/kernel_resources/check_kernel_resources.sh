#!/usr/bin/env bash
# CTest's build/cuda_kernel_resources (CUDA builds): the registers, stack frame and spills of
# every kernel the build compiled, as record_kernel_resources.sh (the CUDA compiler launcher)
# recorded them, printed as one table and written to RECORD_DIR/summary.tsv; fails when a
# kernel spills to local memory, naming it. A spill in a hot kernel is a silent slowdown no
# test on the CPU can see (issue 39: attention, GEMM epilogues, norms, classifier).
# Exempt, and still listed: the CUDA-core attention (attention_cuda.cu), the fp32 reference and
# fallback kernel, which spills a few bytes by design of its launch bounds (docs/device.md).
# Usage: check_kernel_resources.sh RECORD_DIR
set -euo pipefail
record_dir=$1
exempt='^attention_cuda\.cu\.o$'
# The objects that must have a record (a build that bypassed the launcher has none).
required=(attention_flash_cuda.cu.o layernorm_cuda.cu.o rmsnorm_cuda.cu.o linear_cuda.cu.o
          cross_entropy_cuda.cu.o)
status=0
for object in "${required[@]}"; do
  if [ ! -s "$record_dir/$object.txt" ]; then
    echo "no record of $object in $record_dir: build with the CUDA compiler launcher" \
         "(CMAKE_CUDA_COMPILER_LAUNCHER, set by CMakeLists.txt)" >&2
    status=1
  fi
done
[ $status -eq 0 ] || exit $status
summary="$record_dir/summary.tsv"
printf 'object\tkernel\tarchitecture\tregisters\tstack bytes\tspill store bytes\tspill load bytes\n' >"$summary"
for record in "$record_dir"/*.txt; do
  object=$(basename "$record" .txt)
  while IFS=$'\t' read -r kernel arch registers stack stores loads; do
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$object" "$(c++filt "$kernel")" "$arch" "$registers" \
      "$stack" "$stores" "$loads"
  done <"$record"
done >>"$summary"
kernels=$(($(wc -l <"$summary") - 1))
echo "$kernels kernels (per architecture) in $(ls "$record_dir"/*.txt | wc -l) objects; the table: $summary"
# Registers per object, the most any of its kernels uses, and its spills.
awk -F'\t' 'NR > 1 { key = $1 " " $3; if ($4 > most[key]) most[key] = $4; spill[key] += $6 + $7 }
            END { for (key in most) printf "  %-40s %3d registers at most, %d bytes spilled\n", key, most[key], spill[key] }' \
  "$summary" | sort
spilled=$(awk -F'\t' -v exempt="$exempt" 'NR > 1 && ($6 > 0 || $7 > 0) && $1 !~ exempt' "$summary")
if [ -n "$spilled" ]; then
  echo "kernels that spill to local memory (registers, stack, spill stores, spill loads):" >&2
  printf '%s\n' "$spilled" | awk -F'\t' '{ printf "  %s %s: %s registers, %s, %s, %s\n", $1, $3, $4, $5, $6, $7; print "    " substr($2, 1, 200) }' >&2
  exit 1
fi
echo "no kernel spills outside the exempt CUDA-core attention"
