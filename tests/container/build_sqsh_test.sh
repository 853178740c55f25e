#!/usr/bin/env bash
# Tests of container/build-sqsh.sh, run by CTest (tests/CMakeLists.txt):
#   build_sqsh_test.sh refusals BUILD_DIR  bad arguments are refused, each with a message that
#                                          names the flag, and nothing is written
#   build_sqsh_test.sh image BUILD_DIR     builds the .sqsh from BUILD_DIR's executables, unpacks
#                                          it with unsquashfs and, inside it (chroot, with its own
#                                          /proc in a private mount namespace, as enroot gives a
#                                          container), runs every executable, a launcher --dry-run
#                                          for Slurm with a container, and a 3-iteration CPU
#                                          pretrain_gpt through the launcher's local cluster
# The image case keeps the root file system with the runtime packages in BUILD_DIR/
# container-base-bookworm (build-sqsh.sh --save-base), so that only the first run in a build
# directory pays for debootstrap and apt (about 2 minutes); CONTAINER_BASE_CACHE=DIR keeps it
# elsewhere, e.g. across CI runs. Needs root, as build-sqsh.sh does.
set -euo pipefail

mode=${1:?usage: build_sqsh_test.sh refusals|image BUILD_DIR}
build_dir=$(cd -- "${2:?usage: build_sqsh_test.sh refusals|image BUILD_DIR}" && pwd)
source_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
script=$source_dir/container/build-sqsh.sh

failures=0
check() {  # check DESCRIPTION COMMAND...: runs COMMAND, counts a failure when it fails
  local description=$1
  shift
  if "$@"; then
    echo "ok: $description"
  else
    echo "FAILED: $description" >&2
    failures=$((failures + 1))
  fi
}

temporary=$(mktemp -d "${TMPDIR:-/tmp}/build_sqsh_test.XXXXXX")
trap 'rm -rf -- "$temporary"' EXIT

# expect_refusal DESCRIPTION EXPECTED_TEXT ARGUMENTS...: build-sqsh.sh exits 2 and says EXPECTED_TEXT.
expect_refusal() {
  local description=$1 expected=$2
  shift 2
  local status=0
  "$script" "$@" >"$temporary/out" 2>&1 || status=$?
  if [[ $status -eq 2 ]] && grep -qF -- "$expected" "$temporary/out"; then
    echo "ok: refuses $description"
  else
    echo "FAILED: refuses $description: exit $status, expected 2 and '$expected' in:" >&2
    cat "$temporary/out" >&2
    failures=$((failures + 1))
  fi
}

refusals() {
  local out=$temporary/image.sqsh
  mkdir -p "$temporary/empty_build/bin" "$temporary/not_a_rootfs"
  expect_refusal "no arguments" "--build-dir is required"
  expect_refusal "an unknown option" "unknown argument '--outptu'" --outptu x.sqsh
  expect_refusal "an option without its value" "--output needs a value" --build-dir "$build_dir" --output
  expect_refusal "an empty value" "--build-dir: the value is empty" --build-dir "" --output "$out"
  expect_refusal "a missing --output" "--output is required" --build-dir "$build_dir"
  expect_refusal "a build directory without bin/" "no bin/ directory there" \
    --build-dir "$temporary/nowhere" --output "$out"
  expect_refusal "a build without the executables" "bin/launcher is missing" \
    --build-dir "$temporary/empty_build" --output "$out"
  expect_refusal "an image name without .sqsh" "must end in .sqsh" \
    --build-dir "$build_dir" --output "$temporary/image.tar"
  expect_refusal "an output directory that does not exist" "$temporary/missing does not exist" \
    --build-dir "$build_dir" --output "$temporary/missing/image.sqsh"
  expect_refusal "a --base that is no Debian root file system" "not a Debian root file system" \
    --build-dir "$build_dir" --output "$out" --base "$temporary/not_a_rootfs"
  expect_refusal "a --save-base that exists" "already exists" \
    --build-dir "$build_dir" --output "$out" --save-base "$temporary/not_a_rootfs"
  expect_refusal "a mirror that is no URL" "expected an http://, https:// or file:// URL" \
    --build-dir "$build_dir" --output "$out" --mirror "deb.debian.org; rm -rf /"
  expect_refusal "an unknown compression" "valid values are enroot, zstd" \
    --build-dir "$build_dir" --output "$out" --compression brotli
  check "a refusal writes nothing" test -z "$(find "$temporary" -name '*.sqsh*')"
  check "--help exits 0 and lists the options" bash -c '"$1" --help | grep -q -- --save-base' _ "$script"
}

# in_image ROOT COMMAND...: runs COMMAND inside the unpacked image, in the environment enroot
# gives it (/etc/environment), with /proc mounted in a mount namespace of its own so nothing
# stays mounted afterwards.
in_image() {
  local root=$1
  shift
  unshare --mount --fork -- bash -c '
    root=$1; shift
    mount -t proc proc "$root/proc"
    exec chroot "$root" /usr/bin/env -i HOME=/root bash -c "set -a; . /etc/environment; set +a; exec \"\$@\"" bash "$@"
  ' bash "$root" "$@"
}

image() {
  [[ $(id -u) -eq 0 ]] || { echo "FAILED: the image test needs root (chroot, apt in the image)" >&2; exit 1; }
  local base_cache=${CONTAINER_BASE_CACHE:-$build_dir/container-base-bookworm}
  local arguments=(--build-dir "$build_dir" --output "$temporary/image.sqsh")
  if [[ -d $base_cache ]]; then arguments+=(--base "$base_cache"); else arguments+=(--save-base "$base_cache"); fi
  local start=$SECONDS
  "$script" "${arguments[@]}"
  echo "build-sqsh.sh took $((SECONDS - start)) s"
  check "the image is a squashfs file" bash -c 'unsquashfs -s "$1" | grep -q "^Found a valid SQUASHFS 4:0"' _ "$temporary/image.sqsh"
  check "no temporary file is left beside the image" test "$(ls -A "$temporary")" = image.sqsh

  # An executable that needs a library the runtime packages do not bring (as a CUDA build's
  # libcudart would) is refused, naming it, and no image is written.
  mkdir -p "$temporary/foreign_build/bin"
  local tool
  for tool in launcher pretrain_gpt evaluate_gpt checkpoint_util preprocess_data download decompress \
      text_generation_server text_generation_cli; do
    cp "$(type -P true)" "$temporary/foreign_build/bin/$tool"
  done
  cp "$(type -P mksquashfs)" "$temporary/foreign_build/bin/pretrain_gpt"  # liblzo2, not in the image
  local status=0
  "$script" --build-dir "$temporary/foreign_build" --output "$temporary/foreign.sqsh" --base "$base_cache" \
    >"$temporary/foreign.log" 2>&1 || status=$?
  check "a build needing a library the image lacks is refused (exit $status)" test "$status" -eq 1
  check "the refusal names the executable and the library" grep -qF "pretrain_gpt needs liblzo2.so.2" "$temporary/foreign.log"
  check "neither the refused image nor a part of it is left" bash -c '! ls -A "$1" | grep -q foreign.sqsh' _ "$temporary"
  rm -rf "$temporary/foreign_build" "$temporary/foreign.log"

  local root=$temporary/root
  unsquashfs -no-progress -quiet -d "$root" "$temporary/image.sqsh" >/dev/null
  local prefix=/opt/megatron_native
  check "conf/ is in the image" test -f "$root$prefix/conf/config.yaml"
  check "templates/ is in the image" test -f "$root$prefix/templates/bcm.sbatch.mustache"
  check "/etc/environment puts the executables on PATH" \
    grep -qx "PATH=$prefix/build/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "$root/etc/environment"
  check "the base keeps no apt lists" test -z "$(find "$root/var/lib/apt/lists" -mindepth 1 -maxdepth 1 ! -name partial ! -name lock)"

  # Every executable starts (a missing shared library fails the dynamic loader) and ldd finds
  # every library it names.
  for tool in launcher pretrain_gpt evaluate_gpt checkpoint_util preprocess_data download decompress \
      text_generation_server text_generation_cli; do
    check "$tool --help runs in the image" in_image "$root" bash -c '"$1" --help >/dev/null' _ "$tool"
    check "ldd finds every library of $tool" in_image "$root" bash -c '! ldd "$(command -v "$1")" | grep "not found"' _ "$tool"
  done

  # A Slurm dry run with a container: the launcher finds conf/ and templates/ from where it is
  # installed (the source tree it was built from is not in the image) and renders the backend
  # at its place in the image.
  in_image "$root" launcher main training=gpt3/126m cluster_type=bcm container=/images/megatron-native.sqsh \
    container_mounts='[/lustre/data]' base_results_dir=/tmp/dry_results --dry-run >"$temporary/dry_run.log" 2>&1 ||
    { cat "$temporary/dry_run.log" >&2; echo "FAILED: launcher --dry-run in the image" >&2; exit 1; }
  local results=$root/tmp/dry_results/gpt3_126m
  local sbatch=$results/nemo-megatron-gpt3_126m_submission.sh
  check "the dry run wrote the sbatch script" test -f "$sbatch"
  check "the sbatch script is valid bash" bash -n "$sbatch"
  check "srun runs the image's pretrain_gpt through pyxis with the mounts" grep -qF -- \
    "--container-image /images/megatron-native.sqsh --container-mounts $prefix:$prefix,$prefix/data:$prefix/data,/tmp/dry_results:/tmp/dry_results,/lustre/data:/lustre/data --no-container-mount-home $prefix/build/bin/pretrain_gpt" "$sbatch"
  check "the sbatch script does not look for the backend outside the image" \
    bash -c '! grep -q "command -v" "$1"' _ "$sbatch"
  check "the configuration came from the image's conf/" grep -qx "launcher_scripts_path: $prefix" \
    "$results/gpt3_126m_launcher_config.yaml"

  # Three CPU iterations of pretrain_gpt (mock data) through the local cluster's job script.
  in_image "$root" launcher main training=gpt3/126m cluster_type=local base_results_dir=/tmp/results \
    training.trainer.max_steps=3 training.model.global_batch_size=4 training.model.micro_batch_size=2 \
    training.model.encoder_seq_length=32 training.model.num_layers=2 training.model.hidden_size=64 \
    training.model.num_attention_heads=4 training.trainer.limit_val_batches=1 >"$temporary/run.log" 2>&1 ||
    { cat "$temporary/run.log" >&2; echo "FAILED: the 3-iteration run in the image" >&2; exit 1; }
  local iterations
  iterations=$(grep -cE ' iteration +[0-9]+/ +3 \| consumed samples: .* \| lm loss: [0-9]\.[0-9]{6}E[-+][0-9]{2} \|' "$temporary/run.log" || true)
  check "pretrain_gpt ran 3 iterations in the image (saw $iterations)" test "$iterations" -eq 3
  check "pretrain_gpt validated" grep -qF "validation loss at iteration 3" "$temporary/run.log"
  check "the job log is in the results directory" \
    bash -c 'ls "$1"/tmp/results/gpt3_126m/log-gpt3_126m_* >/dev/null' _ "$root"
}

case $mode in
  refusals) refusals ;;
  image) image ;;
  *) echo "build_sqsh_test.sh: unknown mode '$mode' (valid: refusals, image)" >&2; exit 2 ;;
esac
if ((failures)); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all checks passed"
