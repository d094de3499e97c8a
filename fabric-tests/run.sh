#!/usr/bin/env bash
# The fabric rigs from one command.
#   fabric-tests/run.sh netns     partition / kill / rejoin scenarios on a network-namespace
#                                 cluster (9 hosts, 25 Gbit/s links): no acknowledged write
#                                 lost, nothing acknowledged by a partitioned host
#   fabric-tests/run.sh zoned     zoned block device tests in the QEMU guest
#   fabric-tests/run.sh all       both
# A rig this machine cannot run prints "SKIP <rig>: <reason>" and does not fail.
# Environment: SHINGLE_BIN (default: build target/release/shingle), NETNS_PHASE_SECS (6).
set -euo pipefail
cd "$(dirname "$0")/.."

netns() {
  local why
  if ! why=$(bash fabric-tests/netns/rig.sh check 2>&1); then
    echo "SKIP netns: $why"
    return 0
  fi
  local bin="${SHINGLE_BIN:-}"
  if [ -z "$bin" ]; then
    cargo build --release -q -p shingle
    bin=target/release/shingle
  fi
  bin=$(readlink -f "$bin")
  local out
  out=$(mktemp -d)
  # Everything the rig creates goes away, also when the scenario fails.
  trap 'bash fabric-tests/netns/rig.sh down >/dev/null 2>&1 || true; rm -rf "$out"' RETURN
  bash fabric-tests/netns/rig.sh up 9
  if ! bash fabric-tests/netns/rig.sh exec c "$bin" bench failover --netns shn- \
      --files 16 --file-kib 1024 --phase-secs "${NETNS_PHASE_SECS:-6}" --json "$out/report.json" \
      >"$out/stdout" 2>"$out/stderr"; then
    cat "$out/stdout"; tail -40 "$out/stderr"
    echo "netns rig: FAILED" >&2
    return 1
  fi
  grep -E '^(phase|healthy|one|two|restart|leader|longest|worst|three|add|read-back)' "$out/stdout" || true
  grep -E "partitioned host's writer" "$out/stderr" || true
  echo "netns rig: ok"
}

zoned() {
  local bin
  bin=$(cargo test -p shingle-data --test zbd_real --no-run --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*zbd_real[^"]*\)".*/\1/p' | tail -n 1)
  [ -n "$bin" ] || { echo "cannot find the zbd_real test binary" >&2; return 1; }
  SHINGLE_GUEST_SKIP_OK=1 bash fabric-tests/guest/run.sh --zoned -- "$bin" --test-threads=1
}

case "${1:-all}" in
  netns) netns ;;
  zoned) zoned ;;
  all) netns; zoned ;;
  *) sed -n '2,10p' "$0"; exit 2 ;;
esac
