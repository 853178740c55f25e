#!/usr/bin/env bash
# The CUDA compiler launcher of CUDA builds (CMAKE_CUDA_COMPILER_LAUNCHER, tests/CMakeLists.txt):
# runs the nvcc command it is given with --resource-usage added, and writes ptxas's report of
# each kernel (registers, stack frame, spill stores and loads, per architecture) to
# RECORD_DIR/<object name>.txt as tab-separated lines instead of the build log:
#   kernel  architecture  registers  stack-bytes  spill-store-bytes  spill-load-bytes
# check_kernel_resources.sh reads them (CTest's build/cuda_kernel_resources). Everything else
# nvcc prints passes through; the exit status is nvcc's.
# Usage: record_kernel_resources.sh RECORD_DIR nvcc ARGS...
set -u
record_dir=$1
shift
object=""
previous=""
for argument in "$@"; do
  [ "$previous" = "-o" ] && object=$argument
  previous=$argument
done
output=$("$@" --resource-usage 2>&1)
status=$?
# ptxas's lines go to the record, the rest to stderr as nvcc printed it (stdout and stderr
# merged: nvcc prints diagnostics only on the latter).
printf '%s\n' "$output" | grep -v -E '^ptxas info|^ +[0-9]+ bytes stack frame' >&2
if [ $status -eq 0 ] && [ -n "$object" ]; then
  mkdir -p "$record_dir"
  record="$record_dir/$(basename "$object").txt"
  printf '%s\n' "$output" | awk '
    /Compiling entry function/ { kernel = $7; arch = $9; gsub(/\x27/, "", kernel); gsub(/\x27/, "", arch); entry = 1; next }
    /Function properties for/ { properties = ($7 == kernel) && entry; next }
    /bytes stack frame/ { if (properties) { stack = $1; stores = $5; loads = $9 } next }
    /Used [0-9]+ registers/ {
      if (entry) {
        for (i = 1; i <= NF; ++i) if ($i == "Used") registers = $(i + 1)
        printf "%s\t%s\t%s\t%s\t%s\t%s\n", kernel, arch, registers, stack, stores, loads
        entry = 0; properties = 0
      }
    }' >"$record.tmp" && mv "$record.tmp" "$record"
fi
exit $status
