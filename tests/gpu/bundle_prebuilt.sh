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
# run_gpu_checks.sh finds. The programs link Debian's Open MPI 4.1 (libmpi.so.40, in lib/ with
# the rest), and the GPU image has no Open MPI, so no mpirun for multi-rank runs: openmpi/ holds
# its runtime as a prefix that OPAL_PREFIX moves (run_gpu_checks.sh sets it): bin/ (orterun, as
# mpirun and mpiexec too, orted, ompi_info), lib/openmpi3/ the MCA plugins (Debian's pkglibdir
# is ${libdir}/openmpi3, and its libdir is not ${prefix}/lib: OPAL_LIBDIR), lib/ the libraries
# mpirun and the plugins load that lib/ above has not (PMIx, munge, the plugins' common
# libraries), lib/pmix/ and share/pmix/ PMIx's own plugins and help texts (PMIx has its own
# prefix: PMIX_MCA_mca_base_component_path, PMIX_PKGDATADIR), share/openmpi/ the help texts,
# etc/ Debian's openmpi-mca-params.conf (its sysconfdir, /etc/openmpi, is outside the prefix:
# OPAL_SYSCONFDIR); 1.5 MB more in all, compressed. Left out: the plugins that
# load UCX, libfabric, verbs, PSM or PSM2 (network transports between nodes, which Debian's
# configuration turns off or a one-node run does not use; libfabric alone brings verbs, rdmacm,
# EFA, PSM and netlink), netlink's (the reachable framework has its "weighted" one too),
# OpenSHMEM's (liboshmem) and hwloc's own plugins (PCI, OpenCL, GL and XML discovery, which the
# launcher does without). On the GPU machine:
#   PREBUILT=1 tests/gpu/run_gpu_checks.sh        (unpacks it and runs the checks)
# Usage: tests/gpu/bundle_prebuilt.sh [build-dir]
set -euo pipefail
case "${1:-}" in
  -h | --help) sed -n '2,/^# Usage/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "bundle_prebuilt.sh: unknown option $1 (usage: tests/gpu/bundle_prebuilt.sh [build-dir])" >&2; exit 2 ;;
esac
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
# The libraries a CUDA image with PyTorch has (or has newer) are not copied.
machine_libraries='/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcudart|libcublas|libcublasLt|libcuda|libnccl)\.so'
ldd "${programs[@]/#/$build/bin/}" | awk '$3 ~ /^\// {print $3}' | sort -u | grep -v -E "$machine_libraries" |
  while read -r library; do cp -L "$library" "$bundle/lib/"; done
if command -v ompi_info >/dev/null; then
  # Open MPI's runtime under openmpi/ (the header says what and why); where this machine has it.
  opal_path() { ompi_info --parsable --path "$1" | sed -n "s/^path:$1://p"; }
  mpi=$bundle/openmpi
  mkdir -p "$mpi/bin" "$mpi/lib/openmpi3" "$mpi/share/openmpi" "$mpi/etc"
  for program in orterun orted ompi_info; do cp "$(opal_path bindir)/$program" "$mpi/bin/"; done
  ln -s orterun "$mpi/bin/mpirun"
  ln -s orterun "$mpi/bin/mpiexec"
  left_out='/(liboshmem|libucp|libuct|libucs|libucm|libfabric|libibverbs|libpsm_infinipath|libpsm2|libnl-3)\.so'
  for plugin in "$(opal_path pkglibdir)"/*.so; do
    # (grep reads all of ldd's output: -q would end the pipe early, which pipefail counts.)
    ldd "$plugin" | grep -E "$left_out" >/dev/null || cp "$plugin" "$mpi/lib/openmpi3/"
  done
  runtime=("$mpi/bin/orterun" "$mpi/bin/orted" "$mpi/bin/ompi_info" "$mpi"/lib/openmpi3/*.so)
  # PMIx's own plugins (zlib compression, resource managers) and help texts, from its prefix
  # (Debian's is ${libdir}/pmix2, which pmix.pc names), into lib/pmix and share/pmix.
  pmix=$(pkg-config --variable=prefix pmix 2>/dev/null || true)
  if [ -n "$pmix" ] && [ -d "$pmix/lib/pmix" ]; then
    mkdir -p "$mpi/lib/pmix" "$mpi/share/pmix"
    cp "$pmix"/lib/pmix/*.so "$mpi/lib/pmix/"
    cp "$pmix"/share/pmix/help-*.txt "$mpi/share/pmix/"
    runtime+=("$mpi"/lib/pmix/*.so)
  fi
  ldd "${runtime[@]}" |
    awk '$3 ~ /^\// {print $3}' | sort -u | grep -v -E "$machine_libraries" |
    while read -r library; do
      [ -e "$bundle/lib/$(basename "$library")" ] || cp -L "$library" "$mpi/lib/"
    done
  cp "$(opal_path pkgdatadir)"/help-*.txt "$mpi/share/openmpi/"
  cp "$(opal_path sysconfdir)/openmpi-mca-params.conf" "$mpi/etc/"
fi
git describe --always --dirty >"$bundle/commit"
tar -C "$(dirname "$bundle")" -cJf "$root/.gpu-bundle.tar.xz" .gpu-bundle
rm -rf "$(dirname "$bundle")"
echo "$root/.gpu-bundle.tar.xz: $(du -h "$root/.gpu-bundle.tar.xz" | cut -f1) (bin: $(tar -tJf "$root/.gpu-bundle.tar.xz" | sed -n 's|^.gpu-bundle/bin/\(.\)|\1|p' | tr '\n' ' ')libraries: $(tar -tJf "$root/.gpu-bundle.tar.xz" | grep -c '^.gpu-bundle/lib/.'), Open MPI files: $(tar -tJf "$root/.gpu-bundle.tar.xz" | grep -c '^.gpu-bundle/openmpi/.*[^/]$'))"
