#!/usr/bin/env bash
# Checks that a rewriter (extract_cuda_ops.py, extract_flash_kernels.py) refuses an output that
# is a link rather than writing through it: runs COMMAND with the argument OUT replaced by a
# link to a file that does not exist, and passes when the command fails saying the target is
# not a regular file and the link's target is still absent.
# Usage: refuses_a_link.sh COMMAND ARGUMENT... (one of them the word OUT)
set -u
directory=$(mktemp -d) || exit 1
trap 'rm -rf "$directory"' EXIT
ln -s "$directory/elsewhere" "$directory/out.inc"
arguments=()
for argument in "$@"; do
  [ "$argument" = OUT ] && argument="$directory/out.inc"
  arguments+=("$argument")
done
if "${arguments[@]}" 2>"$directory/error"; then
  echo "the command wrote through a link to a regular file's place: ${arguments[*]}" >&2
  exit 1
fi
grep -q 'is not a regular file' "$directory/error" || { cat "$directory/error" >&2; exit 1; }
[ ! -e "$directory/elsewhere" ] || { echo "the link's target was created" >&2; exit 1; }
