#!/usr/bin/env bash
# Builds and installs the Python package (python/: pyo3 + maturin) into a virtual
# environment, then runs its tests (pytest) against a `shingle dev` cluster and mount.
#   SHINGLE_BIN    the shingle binary the tests start (default target/release/shingle)
#   SHINGLE_VENV   the virtual environment (default target/python-venv; made if missing)
# Needs root (the tests mount with /dev/fuse, as `shingle dev` does).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${SHINGLE_VENV:-$root/target/python-venv}
SHINGLE_BIN=${SHINGLE_BIN:-$root/target/release/shingle}
[ -x "$SHINGLE_BIN" ] || { echo "python-tests: $SHINGLE_BIN is missing (cargo build --release -p shingle)" >&2; exit 1; }
# Absolute: the tests run from their own folder.
SHINGLE_BIN=$(realpath "$SHINGLE_BIN")
export SHINGLE_BIN

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check maturin pytest numpy fsspec pandas pyarrow
# The extension shares this checkout's target directory: the dependencies a release
# build of `shingle` compiled are not compiled again.
PATH="$venv/bin:$PATH" CARGO_TARGET_DIR="$root/target" \
  "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python
# From the tests' own folder, so `import shingle` is the installed package and not
# the source folder beside them (which has no extension module).
cd python/tests
"$venv/bin/python" -m pytest -q -p no:cacheprovider .
