#!/usr/bin/env bash
# Shingle's RDMA remote read against perftest's ib_read_bw, in one guest run:
#
#   fabric-tests/guest/run.sh --rdma -- fabric-tests/guest/rdma-bench.sh BENCH_BINARY [SECONDS]
#
# BENCH_BINARY is transport's remote_read_bench example (built with --features rdma). Runs
# ib_read_bw (64 KiB RDMA READs, rxe1 -> rxe0) for SECONDS (default 5), then the bench (RDMA
# and TCP remote reads of 64 KiB and 1 MiB, 4 KiB latency), and prints
# `ratio_rdma_64k_to_ib_read_bw=<x>`. Results are also written to $SHINGLE_BENCH_JSON when set
# (a path the host can read back is not available from the guest; the values are printed).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bench=${1:?usage: rdma-bench.sh BENCH_BINARY [SECONDS]}
secs=${2:-5}

base=$("$here/ib-read-bw.sh" "$secs" | tee /dev/stderr | sed -n 's/^ib_read_bw_gbit_s_avg=//p')
[[ -n $base ]] || { echo "rdma-bench: no ib_read_bw figure" >&2; exit 1; }
out=$("$bench" --secs "$secs")
echo "$out"
echo "ib_read_bw_gbit_s=$base"
ours=$(sed -n 's/^rdma_read_gbit_s_64k=//p' <<<"$out")
awk -v a="$ours" -v b="$base" 'BEGIN { printf "ratio_rdma_64k_to_ib_read_bw=%.3f\n", a / b }'
