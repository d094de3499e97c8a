#!/usr/bin/env bash
# The fabric rigs from one command.
#   fabric-tests/run.sh netns     partition / kill / rejoin scenarios on a network-namespace
#                                 cluster (9 hosts, 25 Gbit/s links): no acknowledged write
#                                 lost, nothing acknowledged by a partitioned host
#   fabric-tests/run.sh zoned     zoned block device tests in the QEMU guest
#   fabric-tests/run.sh rdma      the transport conformance suite and the RDMA path tests
#                                 over soft-RoCE in the QEMU guest (a missing device fails),
#                                 then end to end: 6 `shingle serve` processes, EC files read
#                                 over RDMA (checked), again with a node down
#   fabric-tests/run.sh rdma-bench  RDMA remote read against ib_read_bw and TCP, in the guest
#   fabric-tests/run.sh all       netns, zoned and rdma
# A rig this machine cannot run fails with the reason (no root, no network namespaces, no
# Debian mirror for the guest): nothing here skips.
# Environment: SHINGLE_BIN (default: build target/release/shingle), NETNS_PHASE_SECS (6).
set -euo pipefail
cd "$(dirname "$0")/.."

netns() {
  local why
  if ! why=$(bash fabric-tests/netns/rig.sh check 2>&1); then
    echo "netns rig: cannot run here: $why" >&2
    return 1
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
  # Without backtraces the failure's own message is what the tail below shows.
  if ! RUST_BACKTRACE=0 RUST_LIB_BACKTRACE=0 bash fabric-tests/netns/rig.sh exec c "$bin" bench failover --netns shn- \
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
  local bin out
  bin=$(cargo test -p shingle-data --test zbd_real --no-run --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*zbd_real[^"]*\)".*/\1/p' | tail -n 1)
  [ -n "$bin" ] || { echo "cannot find the zbd_real test binary" >&2; return 1; }
  # The tests are #[ignore]d on the host (no zoned device there); here they all run.
  out=$(bash fabric-tests/guest/run.sh --zoned -- "$bin" --test-threads=1 --include-ignored 2>&1) || {
    echo "$out"; echo "zoned rig: FAILED" >&2; return 1; }
  grep -E 'zoned:|test result' <<<"$out" || true
  grep -qE 'test result: ok\. [1-9][0-9]* passed; 0 failed; 0 ignored' <<<"$out" || {
    echo "$out"; echo "zoned rig: the zoned-device tests did not all run" >&2; return 1; }
  echo "zoned rig: ok"
}

# Test binaries of a cargo test build (features and filters as arguments).
test_bins() {
  cargo test "$@" --no-run --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p'
}

rdma() {
  local bins b out
  if ! out=$(cargo build -q -p shingle-transport --features rdma --tests 2>&1); then
    echo "$out" >&2
    echo "rdma: cannot build the transport with --features rdma (needs cmake and libclang-dev)" >&2
    return 1
  fi
  mapfile -t bins < <(test_bins -p shingle-transport --features rdma --test conformance_rdma --test rdma_paths)
  [ "${#bins[@]}" = 2 ] || { echo "rdma: expected two test binaries, got: ${bins[*]}" >&2; return 1; }
  cargo build -q --release -p shingle --features rdma
  local shingle
  shingle=$(readlink -f target/release/shingle)
  # One guest boot for everything; a missing device inside the guest is a failure. The
  # nodes must serve over RDMA (required) on rxe0; the bench's client reads on rxe1.
  # The RDMA tests are #[ignore]d outside the rig; here they all run.
  out=$(bash fabric-tests/guest/run.sh --rdma -- \
    bash -c 'shingle=$1; shift
      for b; do "$b" --test-threads=1 --include-ignored || exit 1; done
      SHINGLE_RDMA=required SHINGLE_RDMA_DEVICE=$SHINGLE_RDMA_DEV0 \
        "$shingle" bench fabric --files 6 --file-kib 4096 --client-device "$SHINGLE_RDMA_DEV1"' \
    rdma-tests "$shingle" "${bins[@]}" 2>&1) || {
    echo "$out"; echo "rdma rig: FAILED" >&2; return 1; }
  grep -E 'rdma: rxe|test result|^read over|^one node down|^wrote' <<<"$out" || true
  [ "$(grep -cE 'test result: ok\. [1-9][0-9]* passed; 0 failed; 0 ignored' <<<"$out")" = 2 ] || { echo "$out"; echo "rdma rig: FAILED" >&2; return 1; }
  grep -qE '"rdma": "[1-9][0-9]* reads over RDMA, [1-9][0-9]* calls over RDMA, [01] fallbacks"' <<<"$out" || {
    echo "$out"; echo "rdma rig: the end-to-end reads and calls did not go over RDMA" >&2; return 1; }
  echo "rdma rig: ok"
}

rdma_bench() {
  cargo build -q --release -p shingle-transport --features rdma --example remote_read_bench
  bash fabric-tests/guest/run.sh --rdma -- \
    fabric-tests/guest/rdma-bench.sh "$PWD/target/release/examples/remote_read_bench" "${RDMA_BENCH_SECS:-5}"
}

case "${1:-all}" in
  netns) netns ;;
  zoned) zoned ;;
  rdma) rdma ;;
  rdma-bench) rdma_bench ;;
  all) netns; zoned; rdma ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
