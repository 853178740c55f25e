#!/usr/bin/env bash
# Builds an enroot/pyxis container image (.sqsh) of the project without Docker, the way HPC
# sites consume images: a Debian root file system (debootstrap --variant=minbase, or an unpacked
# one given with --base), the runtime libraries installed into it by install-deps.sh --runtime
# (the one list the Dockerfile's runtime stage uses too), the already-built executables with
# conf/ and templates/ under /opt/megatron_native, packed by mksquashfs.
#
# Format (enroot's doc/image-format.md): an image is a plain squashfs of the root file system;
# enroot reads the container's environment from /etc/environment. The default compression is
# what `enroot import` itself writes (ENROOT_SQUASH_OPTIONS' default, `-comp lzo -noD`: metadata
# compressed, data not, quick to pack and to read); --compression zstd makes a smaller file.
# The layout mirrors the source tree (build/bin beside conf/ and templates/) because the
# launcher looks for conf/ and templates/ two directories above its executable.
#
# The project is not rebuilt here: --build-dir names a finished build (cmake --workflow --preset
# release). The image appears whole or not at all: it is written under a temporary name beside
# --output and renamed. Needs root (chroot, apt inside the new root).
set -euo pipefail

program=build-sqsh.sh
prefix=/opt/megatron_native
tools=(launcher pretrain_gpt evaluate_gpt checkpoint_util preprocess_data download decompress
       text_generation_server text_generation_cli)
suite=bookworm  # install-deps.sh's package names are bookworm's

usage() {
  cat <<EOF
usage: $program --build-dir DIR --output IMAGE.sqsh [options]
  --build-dir DIR     a finished build of this project: DIR/bin holds ${tools[*]}
  --output FILE       the image to write; its name ends in .sqsh, its directory exists
  --base DIR          start from this unpacked Debian $suite root file system (copied, not
                      changed) instead of running debootstrap
  --save-base DIR     keep a copy of the root file system with the runtime packages installed
                      (before the project goes in) at DIR, a new path: a later --base DIR
                      skips debootstrap and apt
  --mirror URL        Debian mirror for debootstrap (http://, https:// or file://;
                      default http://deb.debian.org/debian)
  --compression NAME  enroot (default: lzo metadata, uncompressed data, as enroot import
                      writes) or zstd, gzip, xz, lz4, lzo (everything compressed)
  -h, --help          this text
EOF
}

fail() {  # a refused argument or an unmet requirement: the message, then the usage hint
  echo "$program: $*" >&2
  exit 2
}

build_dir="" output="" base="" save_base="" mirror=http://deb.debian.org/debian compression=enroot
while (($#)); do
  option=$1
  case $option in
    -h|--help) usage; exit 0 ;;
    --build-dir|--output|--base|--save-base|--mirror|--compression)
      (($# >= 2)) || fail "$option needs a value (see --help)"
      [[ -n $2 ]] || fail "$option: the value is empty (see --help)"
      case $option in
        --build-dir) build_dir=$2 ;;
        --output) output=$2 ;;
        --base) base=$2 ;;
        --save-base) save_base=$2 ;;
        --mirror) mirror=$2 ;;
        --compression) compression=$2 ;;
      esac
      shift 2 ;;
    *) fail "unknown argument '$option' (valid: --build-dir, --output, --base, --save-base, --mirror, --compression, --help)" ;;
  esac
done

[[ -n $build_dir ]] || fail "--build-dir is required: the build directory holding bin/launcher (e.g. build after cmake --workflow --preset release)"
[[ -n $output ]] || fail "--output is required: the .sqsh file to write"
[[ -d $build_dir/bin ]] || fail "--build-dir $build_dir: no bin/ directory there; build the project first (cmake --workflow --preset release), this script does not build it"
for tool in "${tools[@]}"; do
  [[ -x $build_dir/bin/$tool && -f $build_dir/bin/$tool ]] ||
    fail "--build-dir $build_dir: bin/$tool is missing or not executable; build every executable first (cmake --build --preset release)"
done
[[ $output == *.sqsh ]] || fail "--output $output: the image's name must end in .sqsh (enroot and pyxis take IMAGE.sqsh)"
output_dir=$(dirname -- "$output")
[[ -d $output_dir ]] || fail "--output $output: the directory $output_dir does not exist"
[[ ! -d $output ]] || fail "--output $output is a directory; give the path of the .sqsh file"
if [[ -n $base ]]; then
  [[ -d $base ]] || fail "--base $base: not a directory (an unpacked Debian $suite root file system)"
  [[ -f $base/etc/debian_version && -x $base/usr/bin/apt-get ]] ||
    fail "--base $base: not a Debian root file system (no etc/debian_version or usr/bin/apt-get there)"
fi
if [[ -n $save_base ]]; then
  [[ ! -e $save_base ]] || fail "--save-base $save_base already exists; give a new path (or use it with --base)"
  [[ -d $(dirname -- "$save_base") ]] || fail "--save-base $save_base: the directory $(dirname -- "$save_base") does not exist"
fi
[[ $mirror =~ ^(https?|file)://[^[:space:]]+$ ]] || fail "--mirror $mirror: expected an http://, https:// or file:// URL"
case $compression in
  enroot) squash_compression=(-comp lzo -noD) ;;
  zstd|gzip|xz|lz4|lzo) squash_compression=(-comp "$compression") ;;
  *) fail "--compression $compression: valid values are enroot, zstd, gzip, xz, lz4, lzo" ;;
esac

[[ $(id -u) -eq 0 ]] || fail "needs root: it runs apt inside the new root file system with chroot"
for command in chroot mksquashfs unshare; do
  command -v "$command" >/dev/null || fail "$command not found (Debian: bash container/install-deps.sh --tests installs squashfs-tools and debootstrap)"
done
if [[ -z $base ]]; then
  command -v debootstrap >/dev/null || fail "debootstrap not found and no --base given (Debian: apt-get install debootstrap)"
fi

source_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/build-sqsh.XXXXXX")
partial_output=$(mktemp "$output_dir/.$(basename -- "$output").XXXXXX")
partial_base=""
cleanup() {
  rm -rf --one-file-system -- "$work" "$partial_output"
  [[ -z $partial_base ]] || rm -rf --one-file-system -- "$partial_base"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
root=$work/rootfs

if [[ -n $base ]]; then
  echo "$program: copying the base root file system $base"
  mkdir -- "$root"
  cp -a --reflink=auto -- "$base/." "$root/"
else
  echo "$program: debootstrap --variant=minbase $suite from $mirror"
  # In a mount namespace of its own: the /proc and /sys it mounts in the new root go away with
  # it, even when it is interrupted, and the cleanup never deletes through them.
  unshare --mount --fork -- debootstrap --variant=minbase "$suite" "$root" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || {
    tail -n 20 "$work/debootstrap.log" >&2
    echo "$program: debootstrap failed (log above)" >&2
    exit 1
  }
fi

# apt inside the new root needs the host's name resolution; the image keeps none of it (enroot
# and Docker put the host's resolv.conf in place at run time).
echo "$program: installing the runtime packages (install-deps.sh --runtime)"
cp -- "$source_dir/container/install-deps.sh" "$root/tmp/install-deps.sh"
had_resolv_conf=false
if [[ -e $root/etc/resolv.conf || -L $root/etc/resolv.conf ]]; then
  had_resolv_conf=true
  mv -- "$root/etc/resolv.conf" "$work/resolv.conf.image"
fi
cp -L -- /etc/resolv.conf "$root/etc/resolv.conf"
# dpkg's fsync after every file is what makes an install slow; a root file system that is
# thrown away when this script fails has no use for it (Debian's Docker images do the same).
echo force-unsafe-io >"$root/etc/dpkg/dpkg.cfg.d/build-sqsh-unsafe-io"
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
  bash -c 'bash /tmp/install-deps.sh --runtime && apt-get clean && rm -rf /var/lib/apt/lists/*'
rm -f -- "$root/etc/resolv.conf" "$root/tmp/install-deps.sh" "$root/etc/dpkg/dpkg.cfg.d/build-sqsh-unsafe-io"
if [[ $had_resolv_conf == true ]]; then mv -- "$work/resolv.conf.image" "$root/etc/resolv.conf"; fi

if [[ -n $save_base ]]; then
  echo "$program: saving the base root file system to $save_base"
  partial_base=$(mktemp -d "$(dirname -- "$save_base")/.$(basename -- "$save_base").XXXXXX")
  cp -a --reflink=auto -- "$root/." "$partial_base/"
  mv -T -- "$partial_base" "$save_base"
  partial_base=""
fi

echo "$program: installing the project into $prefix"
mkdir -p -- "$root$prefix/build/bin"
for tool in "${tools[@]}"; do
  install -m 0755 -- "$build_dir/bin/$tool" "$root$prefix/build/bin/$tool"
done
cp -a -- "$source_dir/conf" "$source_dir/templates" "$root$prefix/"
# The results of a run go to base_results_dir, which the job mounts; the image's own copy of the
# default (launcher_scripts_path/results) stays empty.
mkdir -p -- "$root$prefix/results"
# A CUDA build loads NVIDIA's runtime libraries (libcudart, libcublasLt, NCCL) from the toolkit
# it was built with, which no Debian package brings. Every library the executables load on this
# machine from a file no Debian package owns goes into the image at the same path (their run
# paths name that directory), with its directory in ld.so.conf. The GPU driver's own libraries
# (libcuda, libnvidia-*) never do: enroot's NVIDIA hook mounts the host's at run time, matching
# its kernel module. Libraries Debian packages own stay install-deps.sh --runtime's business.
host_library_dirs=()
while IFS= read -r library; do
  case ${library##*/} in libcuda.so*|libnvidia-*) continue ;; esac
  dpkg -S "$library" >/dev/null 2>&1 && continue
  dpkg -S "$(realpath -- "$library")" >/dev/null 2>&1 && continue
  echo "$program: copying $library (no Debian package owns it)"
  mkdir -p -- "$root$(dirname -- "$library")"
  cp -L -- "$library" "$root$library"
  host_library_dirs+=("$(dirname -- "$library")")
done < <({ for tool in "${tools[@]}"; do ldd "$build_dir/bin/$tool"; done |
            sed -n 's|^[[:space:]]*[^[:space:]]* => \(/[^[:space:]]*\) (0x[0-9a-f]*)$|\1|p'
          # cuBLASLt is loaded with dlopen when a GPU is used (ldd does not list it), from the
          # path the build recorded.
          sed -n 's|^CUBLASLT_LIBRARY_FILE:INTERNAL=||p' "$build_dir/CMakeCache.txt"; } | sort -u)
if ((${#host_library_dirs[@]})); then
  printf '%s\n' "${host_library_dirs[@]}" | sort -u >"$root/etc/ld.so.conf.d/megatron_native.conf"
  chroot "$root" /sbin/ldconfig
fi

# Every library the executables load must come from the image: a build linked against a
# Debian library install-deps.sh --runtime does not install would fail inside it at the first
# job.
missing_libraries=$(chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin bash -c '
  for tool in "$@"; do
    ldd "$tool" | sed -n "s|^[[:space:]]*\([^[:space:]]*\) => not found.*|  ${tool##*/} needs \1|p"
  done' bash "${tools[@]/#/$prefix/build/bin/}")
if [[ -n $missing_libraries ]]; then
  echo "$program: the image lacks shared libraries that the executables of --build-dir $build_dir load:" >&2
  echo "$missing_libraries" >&2
  echo "$program: add the Debian packages that hold them to install-deps.sh's runtime list (dpkg -S FILE names the package)" >&2
  exit 1
fi

# enroot (and so pyxis) reads the container's environment from /etc/environment.
cat >"$root/etc/environment" <<EOF
PATH=$prefix/build/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LANG=C.UTF-8
EOF

echo "$program: mksquashfs ${squash_compression[*]}"
mksquashfs "$root" "$partial_output" -noappend -no-progress -quiet "${squash_compression[@]}" >/dev/null
chmod 0644 -- "$partial_output"
sync -- "$partial_output"
mv -f -- "$partial_output" "$output"
sync -- "$output_dir"
echo "$program: wrote $output ($(du -h -- "$output" | cut -f1))"
