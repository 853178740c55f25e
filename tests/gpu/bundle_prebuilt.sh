#!/usr/bin/env bash
# Packs what a GPU session runs into one file that travels with the working tree to the lent
# GPU machine (the device tool's `carry`, 64 MiB with the tree): .gpu-bundle.tar.xz holding
# bin/test_gpu, bin/pretrain_gpt and bin/op_profile_bench from the release build here, and lib/ with the shared
# libraries they load that a CUDA image need not have (spdlog, fmt, OpenBLAS and its Fortran
# runtime, utf8proc, libgomp). Left out on purpose: the C and C++ runtimes (the GPU machine's
# are newer and backward compatible), the CUDA runtime and cuBLASLt (CUDA 13 on both
# machines; cuBLASLt alone is 540 MB) and NCCL (218 MB; the GPU machine's PyTorch brings its
# libnccl.so.2, which run_gpu_checks.sh finds). On the GPU machine:
#   PREBUILT=1 tests/gpu/run_gpu_checks.sh        (unpacks it and runs the checks)
# Usage: tests/gpu/bundle_prebuilt.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
cd "$root"
[ -f "$build/build.ninja" ] || cmake --preset release
cmake --build "$build" -j2 --target test_gpu pretrain_gpt op_profile_bench
bundle=$(mktemp -d)/.gpu-bundle
mkdir -p "$bundle/bin" "$bundle/lib"
cp "$build/bin/test_gpu" "$build/bin/pretrain_gpt" "$build/bin/op_profile_bench" "$bundle/bin/"
ldd "$build/bin/test_gpu" "$build/bin/pretrain_gpt" "$build/bin/op_profile_bench" | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcudart|libcublas|libcublasLt|libcuda|libnccl)\.so' |
  while read -r library; do cp -L "$library" "$bundle/lib/"; done
git describe --always --dirty >"$bundle/commit"
tar -C "$(dirname "$bundle")" -cJf "$root/.gpu-bundle.tar.xz" .gpu-bundle
rm -rf "$(dirname "$bundle")"
echo "$root/.gpu-bundle.tar.xz: $(du -h "$root/.gpu-bundle.tar.xz" | cut -f1) (test_gpu, pretrain_gpt, op_profile_bench; libraries: $(tar -tJf "$root/.gpu-bundle.tar.xz" | grep -c '/lib/.'))"
