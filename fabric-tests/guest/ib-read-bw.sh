#!/usr/bin/env bash
# The soft-RoCE baseline: perftest's ib_read_bw from rxe1 to rxe0 inside the guest rig.
#
#   fabric-tests/guest/run.sh --rdma -- fabric-tests/guest/ib-read-bw.sh [SECONDS]
#
# Runs the server on $SHINGLE_RDMA_DEV0 and the client on $SHINGLE_RDMA_DEV1 (RoCEv2 GID index
# $SHINGLE_RDMA_GID_INDEX), exchanging QP details over TCP to 127.0.0.1, for SECONDS (default 5)
# of 64 KiB RDMA READs. Prints perftest's result table and one line
# `ib_read_bw_gbit_s_avg=<average Gb/s>` to compare Shingle's remote read against.
set -euo pipefail

seconds=${1:-5}
for var in SHINGLE_RDMA_DEV0 SHINGLE_RDMA_DEV1 SHINGLE_RDMA_GID_INDEX; do
    if [[ -z ${!var:-} ]]; then
        echo "ib-read-bw: $var is not set: run this under fabric-tests/guest/run.sh --rdma" >&2
        exit 2
    fi
done
command -v ib_read_bw >/dev/null || { echo "ib-read-bw: ib_read_bw not found (apt-get install perftest)" >&2; exit 2; }

out=$(mktemp -d)
server_pid=
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null || true; fi
    rm -rf "$out"
}
trap cleanup EXIT

common=(-x "$SHINGLE_RDMA_GID_INDEX" -F --report_gbits -D "$seconds")
ib_read_bw -d "$SHINGLE_RDMA_DEV0" "${common[@]}" >"$out/server" 2>&1 &
server_pid=$!
# The server listens on TCP port 18515 once its device is open; retry the client until then.
for _ in $(seq 20); do
    if ib_read_bw -d "$SHINGLE_RDMA_DEV1" "${common[@]}" 127.0.0.1 >"$out/client" 2>&1; then
        break
    fi
    grep -q 'Couldn.t connect' "$out/client" || { cat "$out/client" >&2; exit 1; }
    sleep 0.5
done
wait "$server_pid" || { cat "$out/server" >&2; exit 1; }
server_pid=
cat "$out/client"
avg=$(awk '/#bytes/ { getline; print $4; exit }' "$out/client")
[[ -n $avg ]] || { echo "ib-read-bw: no result in the client's output" >&2; exit 1; }
echo "ib_read_bw_gbit_s_avg=$avg"
