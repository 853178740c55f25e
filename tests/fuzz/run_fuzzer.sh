#!/usr/bin/env bash
# Builds one libFuzzer target (the launcher's config engine, a tokenizer, a reader of a file
# format: safetensors, Hugging Face config.json, Megatron's .idx, .npy, our checkpoint file and
# the distributed optimizer's files beside it, evaluate_gpt's WikiText and LAMBADA files; a
# run's data sources and split; a command line; the text generation server's request) with
# clang (ASan + UBSan, every report fatal) straight from the sources it needs, and runs it for
# SECONDS from the seed corpus in tests/fuzz/corpus/NAME/.
#
#   tests/fuzz/run_fuzzer.sh NAME SECONDS     build NAME's target where it is not current, run it
#   tests/fuzz/run_fuzzer.sh --build NAME...  build the targets only, two at a time
#     NAME: the NAME of a tests/fuzz/NAME_fuzzer.cpp (override, compose, tokenizer, safetensors,
#           pretrain_gpt_args, restricted_pickle, ...)
#
# CTest's fuzz tests (the sanitized build's; tests/CMakeLists.txt) run the targets that build
# made, which share its objects: with FUZZ_BINARY set, NAME's target is that executable and
# nothing is built here. A target built here instruments every library it links, at -O1.
#
# Environment: FUZZ_BUILD_DIR (default ${TMPDIR:-/tmp}/launcher-fuzz): objects, binaries, the
# working corpus (grows across runs) and crash artifacts; FUZZ_JOBS (default 2): parallel
# compiles; CXX_FUZZ (default clang++); FUZZ_OPTIMIZATION (default -O1, libFuzzer's advice;
# -O0 builds the support archive in about half the time, for fewer executions per second).
# Exit status: 0 when the run found nothing, 1 on a finding or a build failure, 77 (CTest's
# "skipped") when clang or its fuzzer runtime is missing - unless CI is set, where that is a
# failure too.
set -euo pipefail

usage() {
  echo "usage: $0 NAME SECONDS | $0 --build NAME...   (NAME: the name of a tests/fuzz/NAME_fuzzer.cpp)" >&2
  exit 1
}
if [[ ${1:-} == --build ]]; then
  shift
  (( $# > 0 )) || usage
  names=("$@")
  seconds=
else
  [[ $# -eq 2 && $2 =~ ^[0-9]+$ ]] || usage
  names=("$1")
  seconds=$2
fi
name=${names[0]}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
for target in "${names[@]}"; do
  [[ $target =~ ^[a-z0-9_]+$ && -f $here/${target}_fuzzer.cpp ]] ||
    { echo "$0: no fuzz target $here/${target}_fuzzer.cpp" >&2; exit 1; }
done

build=${FUZZ_BUILD_DIR:-${TMPDIR:-/tmp}/launcher-fuzz}
jobs=${FUZZ_JOBS:-2}
cxx=${CXX_FUZZ:-clang++}
optimization=${FUZZ_OPTIMIZATION:--O1}
[[ $optimization =~ ^-O[0-3s]$ ]] || { echo "$0: FUZZ_OPTIMIZATION=$optimization: expected -O0, -O1, -O2, -O3 or -Os" >&2; exit 1; }

unavailable() {
  if [[ -n ${CI:-} ]]; then
    echo "fuzz/$name: FAILED: $1 (CI is set, so the fuzz tests must run; container/install-deps.sh installs clang and libclang-rt-14-dev)" >&2
    exit 1
  fi
  echo "fuzz/$name: SKIPPED: $1 (install clang and libclang-rt-14-dev, e.g. with container/install-deps.sh)" >&2
  exit 77
}

# The file readers get a malloc limit far below the RSS limit: their inputs are at most
# -max_len bytes, so a larger allocation means a size read from the input was trusted before
# being checked against the input's size.
malloc_limit_mb=2048
case $name in
  safetensors | hf_config | indexed_dataset | npy_file | checkpoint_file | distributed_moments |\
    restricted_pickle | torch_checkpoint)
    malloc_limit_mb=64 ;;
esac

# The target from the sources (a run by hand, or --build): a support archive of the libraries
# and the target itself, each compiled where it is not current.
build_from_sources() {
  command -v "$cxx" >/dev/null || unavailable "$cxx not found"
  mkdir -p "$build/obj"
  flags=(-std=c++20 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all "$optimization" -gline-tables-only
         -DPROJECT_VERSION_STRING="\"fuzz\""
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

  # Every target links one support archive: the launcher's config engine and the backend's
  # libraries, compiled once per FUZZ_BUILD_DIR with the same flags (so a CTest run builds them
  # for the first target and the others only compile their own source and link).
  flags+=(-fopenmp -isystem "/usr/include/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)/openblas-openmp")
  # The one build constant the backend's sources see (backend/CMakeLists.txt): no CUDA here, so
  # the ops' GPU branches are discarded as in CMake's build without CUDA.
  flags+=(-DBACKEND_BUILT_WITH_CUDA=0)
  multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  libraries+=($(pkg-config --libs libutf8proc libzstd liblzma zlib libcurl sentencepiece 2>/dev/null ||
                echo -lutf8proc -lzstd -llzma -lz -lcurl -lsentencepiece)
              -L"/usr/lib/$multiarch/openblas-openmp" -Wl,-rpath,"/usr/lib/$multiarch/openblas-openmp"
              -lopenblas)
  # Without CUDA and without MPI, as CMake builds a configuration that has neither: the .cu files
  # are not .cpp, and of each *_mpi.cpp / *_nompi.cpp pair the refusal (*_nompi.cpp) is taken.
  # Compiled eight to a unit, one directory at a time, as CMake's unity builds compile them
  # (docs/architecture.md, Building): the headers are parsed once per unit, not once per file,
  # which takes the archive's build from about three minutes of CI to about one.
  support_dirs=("$root/launcher/config")
  for dir in common core device model ops optim data dist ckpt train train/log eval fetch serve; do
    support_dirs+=("$root/backend/$dir")
  done
  support_sources=()
  for dir in "${support_dirs[@]}"; do
    for source in "$dir"/*.cpp; do
      [[ $source == *_mpi.cpp ]] || support_sources+=("$source")
    done
  done

  support="$build/obj/libfuzz_support.a"

  # An object is current when it is newer than its unit, each source the unit includes, and the
  # headers stamp.
  object_is_current() {  # object_is_current OBJECT UNIT
    local object=$1 unit=$2 member
    [[ -f $object && $object -nt $unit && $object -nt "$build/obj/headers.stamp" ]] || return 1
    while IFS='"' read -r _ member _; do
      [[ $object -nt $member ]] || return 1
    done <"$unit"
  }

  # Each job is waited for by its pid, oldest first: bash 5.2's `wait -n` misses a job that
  # ended before it was called, which lost a failure or counted a success as one.
  each_in_parallel() {  # each_in_parallel FUNCTION ARG... : FUNCTION ARG for each ARG, $jobs at a time
    local function=$1 failed=0 argument pid
    local -a pids=()
    shift
    for argument in "$@"; do
      "$function" "$argument" &
      pids+=("$!")
      if (( ${#pids[@]} >= jobs )); then
        wait "${pids[0]}" || failed=1
        pids=("${pids[@]:1}")
      fi
    done
    for pid in "${pids[@]}"; do
      wait "$pid" || failed=1
    done
    return $failed
  }

  compile_unit() {  # compile_unit UNIT: into obj/support, unless current
    local object
    object="$build/obj/support/$(object_stem "$1").o"
    object_is_current "$object" "$1" || "$cxx" "${flags[@]}" -c "$1" -o "$object"
  }

  # One builder at a time (CTest may run fuzz tests side by side with -j).
  exec 9>"$build/obj/build.lock"
  flock 9
  # A changed header or changed flags rebuild every object; a changed source, its own.
  mkdir -p "$build/obj/support"
  newest_header=$(find "$root/launcher" "$root/backend" -name '*.hpp' -newer "$build/obj/headers.stamp" 2>/dev/null | head -1 || true)
  if [[ ! -f $build/obj/headers.stamp || -n $newest_header || "$(cat "$build/obj/flags" 2>/dev/null)" != "${flags[*]}" ]]; then
    rm -f "$build/obj/support"/*.o "$support"
    touch "$build/obj/headers.stamp"
    echo "${flags[*]}" >"$build/obj/flags"
  fi
  # Objects of files that no longer exist must not linger in the archive. (Parameter expansion,
  # not basename/dirname: a subshell per pair of object and source made this loop quadratic in
  # processes, minutes for every fuzz test.)
  object_stem() {  # object_stem SOURCE: the support object's name for SOURCE, without .o
    local directory=${1%/*} file=${1##*/}
    echo "${directory##*/}-${file%.cpp}"
  }
  # The units: <directory>-<n>.cpp in obj/units, each including up to eight of the directory's
  # sources; rewritten only when their list changes, so an unchanged unit keeps its object.
  mkdir -p "$build/obj/units"
  units=()
  for dir in "${support_dirs[@]}"; do
    members=()
    for source in "${support_sources[@]}"; do
      [[ ${source%/*} == "$dir" ]] && members+=("$source")
    done
    for ((first = 0; first < ${#members[@]}; first += 8)); do
      unit="$build/obj/units/${dir##*/}-$((first / 8)).cpp"
      text=$(printf '#include "%s"\n' "${members[@]:first:8}")
      [[ -f $unit && "$(cat "$unit")" == "$text" ]] || printf '%s\n' "$text" >"$unit"
      units+=("$unit")
    done
  done
  declare -A expected_objects=()
  for unit in "${units[@]}"; do expected_objects["$(object_stem "$unit")"]=1; done
  for object in "$build/obj/support"/*.o; do
    [[ -e $object ]] || continue
    stem=${object##*/}
    [[ -n ${expected_objects[${stem%.o}]:-} ]] || rm -f "$object" "$support"
  done
  echo "fuzz/${names[*]}: compiling the support archive (${#support_sources[@]} sources in ${#units[@]} units, $jobs at a time, only what changed)"
  each_in_parallel compile_unit "${units[@]}" || { echo "fuzz/$name: compiling failed" >&2; exit 1; }
  if [[ ! -f $support ]] || [[ -n $(find "$build/obj/support" -name '*.o' -newer "$support" | head -1) ]]; then
    rm -f "$support"
    ar rcs "$support" "$build/obj/support"/*.o
  fi
  # Each target: its object and binary, rebuilt where older than what they are made from, two at
  # a time (a --build of every target uses both cores; a run after it finds them current).
  build_target() {  # build_target NAME
    local object="$build/obj/$1_fuzzer.o" binary="$build/$1_fuzzer" source="$here/$1_fuzzer.cpp"
    local own_flags=()
    case $1 in
      tokenizer | sentencepiece_tokenizer | hf_tokenizer | zero_shot_tasks) own_flags+=(-DFUZZ_SOURCE_DIR="\"$root\"") ;;
    esac
    # (The targets' own headers, tests/fuzz/*.hpp, count too.)
    if [[ ! -f $object || $source -nt $object || $build/obj/headers.stamp -nt $object ||
          -n $(find "$here" -maxdepth 1 -name '*.hpp' -newer "$object" | head -1) ]]; then
      "$cxx" "${flags[@]}" "${own_flags[@]}" -c "$source" -o "$object" || return 1
    fi
    if [[ ! -f $binary || $object -nt $binary || $support -nt $binary ]]; then
      "$cxx" "${flags[@]}" "$object" "$support" "${libraries[@]}" -o "$binary" || return 1
    fi
  }
  each_in_parallel build_target "${names[@]}" || { echo "fuzz/${names[*]}: building failed" >&2; exit 1; }
  flock -u 9
  if [[ -z $seconds ]]; then
    echo "fuzz: built ${names[*]}"
    exit 0
  fi
}

mkdir -p "$build/corpus/$name" "$build/artifacts"
if [[ -n ${FUZZ_BINARY:-} ]]; then
  [[ -n $seconds && ${#names[@]} -eq 1 && -x $FUZZ_BINARY ]] ||
    { echo "$0: FUZZ_BINARY=${FUZZ_BINARY}: expected an executable, and one NAME with SECONDS" >&2; exit 1; }
  binary=$FUZZ_BINARY
else
  build_from_sources
  binary="$build/${name}_fuzzer"
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
