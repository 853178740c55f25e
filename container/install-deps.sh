#!/usr/bin/env bash
# Installs every system dependency of the project from Debian (bookworm) packages.
# This is the one place that does so: the README's quick start, .ci/run, container/Dockerfile
# and container/build-sqsh.sh all call it. Idempotent: packages already present are
# skipped quickly by apt. Needs root (or sudo).
#   install-deps.sh          what building and running need
#   install-deps.sh --tests  also the reference implementations the test suite runs against
#                            (a real Slurm cluster, OmegaConf, clang's fuzzer, spm_encode): CI uses this.
#   install-deps.sh --runtime  only the shared libraries the built executables load, for a
#                            container image that holds the binaries and no compiler
# The test packages stay optional because a Slurm client from Debian has no place on, say, a
# cluster login node with the site's own Slurm.
set -euo pipefail

mode=build
case "${1:-}" in
  "") ;;
  --tests) mode=tests ;;
  --runtime) mode=runtime ;;
  *) echo "install-deps.sh: unknown argument '$1' (valid: --tests, --runtime)" >&2; exit 2 ;;
esac

packages=(
  # build
  cmake g++ ninja-build pkg-config git
  # launcher: config, templates, CLI, logging
  libyaml-cpp-dev libkainjow-mustache-dev libcli11-dev libspdlog-dev libfmt-dev
  nlohmann-json3-dev
  # the data_preparation stage's `download` tool (http(s), ftp, file://); `xz` makes the test
  # shards (xz-utils is in Debian's base system, named here so a slim image gets it too)
  libcurl4-openssl-dev xz-utils
  # text_generation_server's HTTP server and text_generation_cli's client
  libcpp-httplib-dev
  # backend CPU path: the OpenMP build of OpenBLAS, so GEMMs and our OpenMP loops share one
  # thread pool (libgomp) instead of two pools spinning against each other
  libopenblas-openmp-dev
  # the GPT-2 tokenizer's Unicode letter/number classes; preprocess_data's .gz/.zst/.xz inputs
  libutf8proc-dev zlib1g-dev libzstd-dev liblzma-dev
  # the SentencePiece tokenizers (Llama2Tokenizer, GPTSentencePieceTokenizer, SentencePieceTokenizer)
  libsentencepiece-dev
  # distributed (optional at build time, detected by CMake)
  openmpi-bin libopenmpi-dev
  # the test framework (the release build compiles the tests too)
  doctest-dev
)

test_packages=(
  # python3-omegaconf is the oracle the config tests compare against
  python3-omegaconf
  # python3-numpy: the data tests compare our .npy files, numpy RandomState shuffles and the
  # GPT dataset indices against numpy (tests/backend/data/megatron_dataset_reference.py)
  python3-numpy
  # python3-torch (CPU) is the independent implementation the backend's model, gradients and
  # AdamW steps are compared against, and the reference of the CPU benchmark
  python3-torch
  # tests: a real Slurm cluster (slurmctld + two slurmd) on this machine. slurm-wlm is the
  # metapackage for slurmctld, slurmd and slurm-client (sbatch, srun, scontrol, sinfo);
  # munge is Slurm's authentication daemon (the package also creates /etc/munge/munge.key)
  slurm-wlm munge
  # tests/fuzz and the asan preset: clang, its fuzzer and sanitizer runtimes, and its OpenMP
  # (omp.h and libomp for clang; the backend's loops and the Hugging Face fuzz target use it)
  clang libclang-rt-14-dev libomp-14-dev
  # tests/e2e: the independent reader of pretrain_gpt's TensorBoard event files decodes them
  # with python3-protobuf from a .proto that protoc (protobuf-compiler) compiles at test time
  python3-protobuf protobuf-compiler
  # the SentencePiece tests compare our ids with spm_encode's and train models with spm_train
  sentencepiece
  # tests/bench/tokenizer_bench.sh's SentencePiece reference: the Python binding Megatron's
  # SentencePiece tokenizers call (for /usr/bin/python3)
  python3-sentencepiece
  # tests/e2e/text_generation_server_test.cpp's load test
  hey
  # tests/e2e/report_html_test.cpp loads `launcher report --html`'s page in headless chromium
  # (console errors, the DOM's SVG plots, a screenshot's pixels)
  chromium
  # tests/container: container/build-sqsh.sh makes the image's root file system with debootstrap
  # and packs it with mksquashfs; the test unpacks it with unsquashfs (squashfs-tools)
  debootstrap squashfs-tools
)
# The libraries the executables load, for the image's runtime (container/Dockerfile's runtime
# stage, container/build-sqsh.sh): the packages `dpkg -S` names for the libraries the built
# executables need (`readelf -d`'s NEEDED; their own dependencies follow from apt), less what
# Debian's minbase already holds (libc6, libstdc++6, libgcc-s1, zlib1g, libzstd1, liblzma5).
# build-sqsh.sh refuses an image in which `ldd` misses one, and tests/container runs every
# executable in such an image, so a missing entry fails there.
runtime_packages=(
  # launcher: the config tree and logging
  libyaml-cpp0.7 libspdlog1.10 libfmt9
  # the GEMMs (the OpenMP build: see libopenblas-openmp-dev above) and OpenMP's runtime
  libopenblas0-openmp libgomp1
  # tokenizers: Unicode classes, SentencePiece models
  libutf8proc2 libsentencepiece0
  # the download tool (https: its CA certificates)
  libcurl4 ca-certificates
  # text_generation_server's HTTP server and text_generation_cli's client
  libcpp-httplib0.11
  # multi-process runs: the MPI library and mpirun (the local cluster's job scripts call it)
  libopenmpi3 openmpi-bin
)

case $mode in
  tests)
    packages+=("${test_packages[@]}")
    # tests/container lints container/Dockerfile with dockerfile-utils from the npm registry
    # (hadolint is no Debian package). Debian's npm only where no npm is installed: a Node.js
    # from elsewhere (NodeSource's, say) brings its own npm, which Debian's would conflict with.
    command -v npm >/dev/null || packages+=(npm)
    ;;
  runtime) packages=("${runtime_packages[@]}") ;;
esac

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps.sh: run as root or install sudo" >&2; exit 1; }
  sudo_cmd=(sudo)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install-deps.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps.sh: all ${#packages[@]} packages present"
fi

if [[ $mode == tests ]]; then
  # The test tooling from the npm registry, at the versions tests/container/package-lock.json pins.
  tests_container_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../tests/container" && pwd)
  npm ci --prefix "$tests_container_dir" --no-audit --no-fund --loglevel=error
fi
