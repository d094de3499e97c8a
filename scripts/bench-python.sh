#!/usr/bin/env bash
# The Python package against the FUSE mount and a local folder on this machine (one
# run, one table): bash scripts/bench-python.sh [scan.py arguments, e.g. --files 512]
# Builds nothing but the package (scripts/python-tests.sh's environment); the binary
# is $SHINGLE_BIN (default target/release/shingle). Needs root (FUSE, drop_caches).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${SHINGLE_VENV:-$root/target/python-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check maturin numpy
PATH="$venv/bin:$PATH" CARGO_TARGET_DIR="$root/target" \
  "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python
local_dir=$(mktemp -d /var/tmp/shingle-bench-local.XXXXXX)
trap 'rm -rf "$local_dir"' EXIT
# shellcheck disable=SC2016
bash scripts/with-dev-mount.sh bash -c 'cd /tmp && "$0" "$1" --mount "$SHINGLE_MNT" --local "$2" \
  --cluster-file "$SHINGLE_DATA/cluster.toml" --secret-file "$SHINGLE_DATA/secret" "${@:3}"' \
  "$venv/bin/python" "$root/python/bench/scan.py" "$local_dir" "$@"
