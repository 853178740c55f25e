#!/usr/bin/env bash
# Packs what a GPU session runs into one file that travels with the working tree to the lent
# GPU machine (the device tool's `carry`, 64 MiB with the tree): .gpu-bundle.tar.xz holding
# bin/ with test_gpu, pretrain_gpt, op_profile_bench, attention_bench, text_generation_server and
# checkpoint_util from the release build here and Debian's `hey` (a static binary: the serving
# benchmark's load; the GPU image has none), and lib/ with the shared
# libraries they load that a CUDA image need not have (spdlog, fmt, OpenBLAS and its Fortran
# runtime, utf8proc, libgomp). Left out on purpose: the C and C++ runtimes (the GPU machine's
# are newer and backward compatible), the CUDA runtime and cuBLASLt (CUDA 13 on both
# machines; cuBLASLt alone is 540 MB), NCCL (218 MB) and cuDNN (loaded at run time, about a
# GB): the GPU machine's PyTorch brings libnccl.so.2 and libcudnn.so.9, which
# run_gpu_checks.sh finds. On the GPU machine:
#   PREBUILT=1 tests/gpu/run_gpu_checks.sh        (unpacks it and runs the checks)
# Usage: tests/gpu/bundle_prebuilt.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
cd "$root"
[ -f "$build/build.ninja" ] || cmake --preset release
programs=(test_gpu pretrain_gpt op_profile_bench attention_bench text_generation_server checkpoint_util)
cmake --build "$build" -j2 --target "${programs[@]}"
bundle=$(mktemp -d)/.gpu-bundle
mkdir -p "$bundle/bin" "$bundle/lib"
for program in "${programs[@]}"; do cp "$build/bin/$program" "$bundle/bin/"; done
if command -v hey >/dev/null; then cp "$(command -v hey)" "$bundle/bin/"; fi
ldd "${programs[@]/#/$build/bin/}" | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcudart|libcublas|libcublasLt|libcuda|libnccl)\.so' |
  while read -r library; do cp -L "$library" "$bundle/lib/"; done
git describe --always --dirty >"$bundle/commit"
tar -C "$(dirname "$bundle")" -cJf "$root/.gpu-bundle.tar.xz" .gpu-bundle
rm -rf "$(dirname "$bundle")"
echo "$root/.gpu-bundle.tar.xz: $(du -h "$root/.gpu-bundle.tar.xz" | cut -f1) (bin: $(tar -tJf "$root/.gpu-bundle.tar.xz" | sed -n 's|^.gpu-bundle/bin/\(.\)|\1|p' | tr '\n' ' ')libraries: $(tar -tJf "$root/.gpu-bundle.tar.xz" | grep -c '/lib/.'))"
