#!/usr/bin/env bash
# Installs what the checks need on a Debian 12 machine, and only what is missing:
#   apt packages  fuse3 (the mount), pkg-config, cmake and libclang-dev (rdma-mummy-sys,
#                 the RDMA feature's libibverbs shim), prometheus (it scrapes a dev cluster in
#                 shingle/tests/prometheus_scrape.rs), python3 (the SQLite check),
#                 python3-venv (the Python package's tests: scripts/python-tests.sh)
#   cargo tools   cargo-nextest, cargo-fuzz, fsx and pjdfstest (the exercisers)
# scripts/check.sh runs it first; on a machine that has everything it only looks.
# Installing needs root (apt-get); without root it says what is missing and fails.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
export PATH="$PATH:${CARGO_HOME:-$HOME/.cargo}/bin"

apt_missing=()
for pkg in fuse3 pkg-config cmake libclang-dev prometheus python3 python3-venv; do
  dpkg -s "$pkg" >/dev/null 2>&1 || apt_missing+=("$pkg")
done
if [ ${#apt_missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing Debian packages: ${apt_missing[*]} (run as root, or: sudo apt-get install ${apt_missing[*]})" >&2
    exit 1
  fi
  echo "setup: installing ${apt_missing[*]}"
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${apt_missing[@]}"
fi

cargo_tool() { # probe-command crate
  if ! $1 >/dev/null 2>&1; then
    echo "setup: cargo install $2"
    cargo install "$2" --locked
  fi
}
cargo_tool "cargo nextest --version" cargo-nextest
cargo_tool "cargo fuzz --version" cargo-fuzz
cargo_tool "command -v fsx" fsx
cargo_tool "command -v pjdfstest" pjdfstest
