#!/usr/bin/env bash
# Builds one libFuzzer target (the launcher's config engine, the GPT-2 tokenizer, or a reader
# of a file format: safetensors, Hugging Face config.json, Megatron's .idx) with clang (ASan +
# UBSan, every report fatal) straight from the sources it needs, and runs it for SECONDS from
# the seed corpus in tests/fuzz/corpus/NAME/.
#
#   tests/fuzz/run_fuzzer.sh NAME SECONDS
#     NAME: override | compose | tokenizer | safetensors | hf_config | indexed_dataset
#
# Environment: FUZZ_BUILD_DIR (default ${TMPDIR:-/tmp}/launcher-fuzz): objects, binaries, the
# working corpus (grows across runs) and crash artifacts; FUZZ_JOBS (default 2): parallel
# compiles; CXX_FUZZ (default clang++). Exit status: 0 when the run found nothing, 1 on a
# finding or a build failure, 77 (CTest's "skipped") when clang or its fuzzer runtime is
# missing - unless CI is set, where that is a failure too.
set -euo pipefail

if [[ $# -ne 2 || ! $2 =~ ^[0-9]+$ ]]; then
  echo "usage: $0 NAME SECONDS   (NAME: override | compose | tokenizer | safetensors | hf_config | indexed_dataset)" >&2
  exit 1
fi
name=$1
seconds=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
target_source="$here/${name}_fuzzer.cpp"
[[ -f $target_source ]] || { echo "$0: no fuzz target $target_source" >&2; exit 1; }

build=${FUZZ_BUILD_DIR:-${TMPDIR:-/tmp}/launcher-fuzz}
jobs=${FUZZ_JOBS:-2}
cxx=${CXX_FUZZ:-clang++}

unavailable() {
  if [[ -n ${CI:-} ]]; then
    echo "fuzz/$name: FAILED: $1 (CI is set, so the fuzz tests must run; container/install-deps.sh installs clang and libclang-rt-14-dev)" >&2
    exit 1
  fi
  echo "fuzz/$name: SKIPPED: $1 (install clang and libclang-rt-14-dev, e.g. with container/install-deps.sh)" >&2
  exit 77
}

command -v "$cxx" >/dev/null || unavailable "$cxx not found"
mkdir -p "$build/obj" "$build/corpus/$name" "$build/artifacts"
flags=(-std=c++20 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -O1 -g
       -D_GLIBCXX_ASSERTIONS -I"$root")
# spdlog and fmt as the Debian packages build them (shared, external fmt).
flags+=($(pkg-config --cflags spdlog fmt yaml-cpp 2>/dev/null || echo -DSPDLOG_SHARED_LIB -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL))
libraries=($(pkg-config --libs spdlog fmt yaml-cpp 2>/dev/null || echo -lspdlog -lfmt -lyaml-cpp))

# Does this clang have libFuzzer and the sanitizer runtimes? (clang without libclang-rt-*-dev
# compiles but cannot link -fsanitize=fuzzer.)
probe="$build/obj/probe.cpp"
printf '%s\n' '#include <cstdint>' '#include <cstddef>' \
  'extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' >"$probe"
"$cxx" -fsanitize=fuzzer,address,undefined "$probe" -o "$build/obj/probe" 2>"$build/obj/probe.log" ||
  unavailable "$cxx cannot link -fsanitize=fuzzer,address,undefined: $(head -c 300 "$build/obj/probe.log")"

# The file readers get a malloc limit far below the RSS limit: their inputs are at most
# -max_len bytes, so a larger allocation means a size read from the input was trusted before
# being checked against the input's size.
malloc_limit_mb=2048
case $name in
  tokenizer)
    sources=("$root/backend/data/gpt2_bpe_tokenizer.cpp" "$root/backend/data/unicode_text.cpp"
             "$root/backend/common/utf8.cpp")
    flags+=(-DFUZZ_SOURCE_DIR="\"$root\"")
    libraries+=($(pkg-config --libs libutf8proc 2>/dev/null || echo -lutf8proc)) ;;
  safetensors)
    sources=("$root/backend/ckpt/safetensors.cpp")
    malloc_limit_mb=64 ;;
  hf_config)
    # hf_format.cpp also holds the import and export of whole models, hence the model and ops.
    sources=("$root/backend/ckpt/hf_format.cpp" "$root/backend/ckpt/safetensors.cpp"
             "$root"/backend/model/*.cpp "$root"/backend/ops/*_cpu.cpp)
    multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
    flags+=(-fopenmp -isystem "/usr/include/$multiarch/openblas-openmp")
    libraries+=(-L"/usr/lib/$multiarch/openblas-openmp" -Wl,-rpath,"/usr/lib/$multiarch/openblas-openmp"
                -lopenblas)
    malloc_limit_mb=64 ;;
  indexed_dataset)
    sources=("$root/backend/data/indexed_dataset.cpp")
    malloc_limit_mb=64 ;;
  *)
    sources=("$root"/launcher/config/*.cpp "$root/backend/common/logging.cpp"
             "$root/backend/common/suggest.cpp" "$root/backend/common/utf8.cpp") ;;
esac
sources+=("$target_source")
binary="$build/${name}_fuzzer"

# Rebuild when the flags changed or any source or header involved is newer than the binary.
stamp="$build/obj/$name.flags"
newest_input=$(find "$root/launcher/config" "$root/backend"/* "$here" -maxdepth 1 \
                 \( -name '*.cpp' -o -name '*.hpp' \) -newer "$binary" 2>/dev/null | head -1 || true)
if [[ ! -x $binary || -n $newest_input || ! -f $stamp || "$(cat "$stamp")" != "${flags[*]}" ]]; then
  echo "fuzz/$name: building $binary ($cxx, ${#sources[@]} sources, $jobs at a time)"
  objects=()
  running=0
  failed=0
  for source in "${sources[@]}"; do
    object="$build/obj/$name-$(basename "$(dirname "$source")")-$(basename "$source" .cpp).o"
    objects+=("$object")
    "$cxx" "${flags[@]}" -c "$source" -o "$object" &
    if (( ++running >= jobs )); then
      wait -n || failed=1
      running=$((running - 1))
    fi
  done
  while (( running > 0 )); do
    wait -n || failed=1
    running=$((running - 1))
  done
  (( failed == 0 )) || { echo "fuzz/$name: compiling failed" >&2; exit 1; }
  "$cxx" "${flags[@]}" "${objects[@]}" "${libraries[@]}" -o "$binary"
  echo "${flags[*]}" >"$stamp"
fi

seeds="$here/corpus/$name"
dictionary=()
[[ -f $here/$name.dict ]] && dictionary=(-dict="$here/$name.dict")
echo "fuzz/$name: running $binary for ${seconds}s (corpus $build/corpus/$name, seeds $seeds)"
# New inputs go to the working corpus, never into the source tree; findings to artifacts/.
set +e
"$binary" "$build/corpus/$name" "$seeds" "${dictionary[@]}" -max_total_time="$seconds" \
  -timeout=20 -rss_limit_mb=2048 -malloc_limit_mb="$malloc_limit_mb" -max_len=8192 -print_final_stats=1 \
  -artifact_prefix="$build/artifacts/$name-" 2>&1 | tee "$build/$name.log" |
  grep -E --line-buffered '^(#[0-9]+[[:space:]]+(INITED|DONE|pulse)|==[0-9]+==|SUMMARY|FINDING|stat::|artifact_prefix|Test unit written|.*ERROR|.*runtime error)'
status=${PIPESTATUS[0]}
set -e
if [[ $status -ne 0 ]]; then
  echo "fuzz/$name: FINDING (exit $status); full log $build/$name.log; reproduce with: $binary <artifact>" >&2
  tail -n 60 "$build/$name.log" >&2
  exit 1
fi
echo "fuzz/$name: no findings in ${seconds}s"
