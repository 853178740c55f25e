#!/usr/bin/env bash
# Lints container/Dockerfile with dockerfile-utils (npm; hadolint is no Debian package), run by
# CTest (tests/CMakeLists.txt): the Dockerfile passes, and a copy with a broken instruction does
# not (so the linter is really at work), and the runtime stage installs the one runtime list.
set -euo pipefail

source_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
linter=$source_dir/tests/container/node_modules/.bin/dockerfile-utils
dockerfile=$source_dir/container/Dockerfile
if [[ ! -x $linter ]]; then
  echo "FAILED: $linter is missing: run bash container/install-deps.sh --tests (npm ci in tests/container)" >&2
  exit 1
fi

failures=0
if output=$("$linter" lint "$dockerfile" 2>&1) && [[ -z $output ]]; then
  echo "ok: container/Dockerfile lints clean"
else
  echo "FAILED: dockerfile-utils lint container/Dockerfile:" >&2
  echo "$output" >&2
  failures=$((failures + 1))
fi

temporary=$(mktemp -d "${TMPDIR:-/tmp}/dockerfile_lint_test.XXXXXX")
trap 'rm -rf -- "$temporary"' EXIT
# A COPY without its destination, as a slip of editing would leave it.
sed 's|^COPY templates /opt/megatron_native/templates$|COPY|' "$dockerfile" >"$temporary/Dockerfile"
if ! cmp -s "$dockerfile" "$temporary/Dockerfile" && ! "$linter" lint "$temporary/Dockerfile" >"$temporary/out" 2>&1 &&
    grep -q "COPY requires at least two arguments" "$temporary/out"; then
  echo "ok: a COPY without arguments is reported"
else
  echo "FAILED: the broken Dockerfile was not reported:" >&2
  cat "$temporary/out" >&2
  failures=$((failures + 1))
fi

# The runtime stage gets its libraries from install-deps.sh --runtime, the list build-sqsh.sh uses.
if awk '/^FROM .* AS runtime$/ {runtime = 1} runtime && /install-deps\.sh --runtime/ {found = 1} END {exit !found}' "$dockerfile"; then
  echo "ok: the runtime stage runs install-deps.sh --runtime"
else
  echo "FAILED: the runtime stage does not run install-deps.sh --runtime" >&2
  failures=$((failures + 1))
fi
exit $((failures > 0))
