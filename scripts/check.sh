#!/usr/bin/env bash
# One command runs every check: format, lints, all tests, and short fuzz runs.
#   bash scripts/check.sh            everything
#   FUZZ_SECONDS=0 bash scripts/check.sh   skip the fuzzers
#   GUEST_TESTS=0 bash scripts/check.sh    skip the QEMU guest rig
#   NETNS_TESTS=0 bash scripts/check.sh    skip the network-namespace rig
#   EXERCISERS=none bash scripts/check.sh  skip fsx and pjdfstest (refused in CI)
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS=${FUZZ_SECONDS:-20}

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo clippy --features rdma (the RDMA transport; its tests run in the guest rig)"
cargo clippy -p shingle-transport --features rdma --all-targets -- -D warnings

step "cargo nextest run (unit, property, conformance and multi-process tests)"
cargo nextest run --workspace --no-fail-fast

# fsx and pjdfstest (written by others) against a real FUSE mount of a `shingle dev`
# cluster. They never skip: a missing tool or no root fails the run.
if [ "${EXERCISERS:-all}" = none ] && [ -n "${CI:-}" ]; then
  echo "EXERCISERS=none is not allowed in CI: fsx and pjdfstest must run" >&2
  exit 1
fi
if [ "${EXERCISERS:-all}" != none ]; then
  step "fsx and pjdfstest on a shingle dev mount (scripts/exercisers.sh)"
  cargo build -p shingle
  SHINGLE_BIN=target/debug/shingle FSX_OPS=${FSX_OPS:-1000} bash scripts/with-dev-mount.sh bash scripts/exercisers.sh
fi

fuzz() { # crate target
  local crate=$1 target=$2 corpus seeds
  step "fuzz $crate/$target for ${FUZZ_SECONDS}s"
  corpus=$(mktemp -d)
  seeds=$crate/fuzz/seeds/$target
  [ -d "$seeds" ] || seeds=
  # cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP lets the stable toolchain accept them.
  (cd "$crate" && RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" "$corpus" ${seeds:+"../$seeds"} -- \
    -max_total_time="$FUZZ_SECONDS" -print_final_stats=0 2>&1 | grep -E '^Done|ERROR|panicked|SUMMARY' || true)
  rm -rf "$corpus"
  if compgen -G "$crate/fuzz/artifacts/$target/crash-*" >/dev/null; then
    echo "fuzzer found a crash: $crate/fuzz/artifacts/$target" >&2
    exit 1
  fi
}

if [ "$FUZZ_SECONDS" -gt 0 ]; then
  if cargo fuzz --version >/dev/null 2>&1; then
    fuzz transport frame_decode
    fuzz transport control_messages
    fuzz transport rdma_fragments
    fuzz data chunk_record
    fuzz data shard_messages
    fuzz meta meta_messages
  else
    echo "SKIP fuzz: cargo-fuzz is not installed (cargo install cargo-fuzz --locked)"
  fi
fi

# Real zoned block device (null_blk zoned=1) inside the QEMU guest rig.
if [ "${GUEST_TESTS:-1}" = 1 ]; then
  step "zoned block device tests in the QEMU guest (fabric-tests/guest)"
  if [ "$(id -u)" != 0 ]; then
    echo "SKIP guest: needs root (9p export of / and apt-get download)"
  else
    bin=$(cargo test -p shingle-data --test zbd_real --no-run --message-format=json 2>/dev/null \
      | sed -n 's/.*"executable":"\([^"]*zbd_real[^"]*\)".*/\1/p' | tail -n 1)
    [ -n "$bin" ] || { echo "cannot find the zbd_real test binary" >&2; exit 1; }
    out=$(SHINGLE_GUEST_SKIP_OK=1 bash fabric-tests/guest/run.sh --zoned -- "$bin" --test-threads=1 2>&1) || { echo "$out"; exit 1; }
    # Here-strings, not pipes: with pipefail, `echo | grep -q` fails when grep stops early.
    grep -E 'SKIP|zoned:|test result' <<<"$out" || true
    if ! grep -q '^SKIP' <<<"$out"; then
      if grep -q 'SKIP zbd_real' <<<"$out"; then
        echo "zbd_real skipped inside the guest: no zoned device" >&2
        exit 1
      fi
      grep -q 'test result: ok' <<<"$out" || { echo "$out"; exit 1; }
    fi
  fi
fi

# Transport conformance and RDMA path tests over soft-RoCE inside the QEMU guest rig.
if [ "${GUEST_TESTS:-1}" = 1 ]; then
  step "RDMA tests in the QEMU guest (fabric-tests/run.sh rdma)"
  if [ "$(id -u)" != 0 ]; then
    echo "SKIP rdma: needs root (9p export of / and apt-get download)"
  else
    bash fabric-tests/run.sh rdma
  fi
fi

# Partition / kill / rejoin on a cluster of network-namespace hosts.
if [ "${NETNS_TESTS:-1}" = 1 ]; then
  step "network-namespace rig (fabric-tests/netns)"
  bash fabric-tests/run.sh netns
fi

step "all checks passed"
