#!/usr/bin/env bash
# One command runs every check: format, lints, all tests, and short fuzz runs.
#   bash scripts/check.sh            everything
#   FUZZ_SECONDS=0 bash scripts/check.sh   skip the fuzzers
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS=${FUZZ_SECONDS:-20}

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo nextest run (unit, property, conformance and multi-process tests)"
cargo nextest run --workspace --no-fail-fast

if [ "$FUZZ_SECONDS" -gt 0 ]; then
  if cargo fuzz --version >/dev/null 2>&1; then
    for target in frame_decode control_messages; do
      step "fuzz transport/$target for ${FUZZ_SECONDS}s"
      corpus=$(mktemp -d)
      seeds=transport/fuzz/seeds/$target
      [ -d "$seeds" ] || seeds=
      # cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP lets the stable toolchain accept them.
      (cd transport && RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" "$corpus" ${seeds:+"../$seeds"} -- \
        -max_total_time="$FUZZ_SECONDS" -print_final_stats=0 2>&1 | grep -E '^(Done|INFO: -max_total_time)|ERROR|panicked|SUMMARY' || true)
      # cargo fuzz exits non-zero on a crash; check for crash artifacts explicitly too.
      if compgen -G "transport/fuzz/artifacts/$target/crash-*" >/dev/null; then
        echo "fuzzer found a crash: transport/fuzz/artifacts/$target" >&2
        exit 1
      fi
      rm -rf "$corpus"
    done
  else
    echo "SKIP fuzz: cargo-fuzz is not installed (cargo install cargo-fuzz --locked)"
  fi
fi

step "all checks passed"
