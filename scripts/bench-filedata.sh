#!/usr/bin/env bash
# File-data benchmarks through the FUSE mount of a `shingle dev` cluster (6 nodes,
# ec(4,2)), each against a local directory on the same disk in the same run:
#   - random 8 KiB preads in a 1 GiB file, 16 jobs (how indexed training datasets are
#     read): cold (page cache dropped) and warm (the file read once, then reopened: the
#     kernel keeps its pages across opens of an unchanged file);
#   - sequential write of a file with 1 MiB writes and an fsync at the end, and of a
#     smaller one with 64 KiB writes (a buffered writer's size: the kernel asks the
#     filesystem for security.capability before every write(2)).
# Needs root (drop_caches, the mount) and fio (apt-get install fio).
#
#   bash scripts/bench-filedata.sh                 build the release binary, run, print
#   SIZE_WRITE_MIB=4096 SECONDS_RR=20 bash scripts/bench-filedata.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE_RR_MIB=${SIZE_RR_MIB:-1024}
SIZE_WRITE_MIB=${SIZE_WRITE_MIB:-4096}
SIZE_SMALL_WRITE_MIB=${SIZE_SMALL_WRITE_MIB:-1024}
SECONDS_RR=${SECONDS_RR:-20}
JOBS=${JOBS:-16}

command -v fio >/dev/null || { echo "bench-filedata: fio is not installed (apt-get install fio)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "bench-filedata: needs root (drop_caches, FUSE mount)" >&2; exit 1; }

if [ -z "${SHINGLE_MNT:-}" ]; then
  cargo build --release -p shingle
  exec bash scripts/with-dev-mount.sh bash "$0" "$@"
fi

LOCAL=$(mktemp -d /var/tmp/shingle-bench-local.XXXXXX)
trap 'rm -rf "$LOCAL"' EXIT
OUT=$(mktemp -d /tmp/shingle-bench-fio.XXXXXX)

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# fio's JSON -> one number.
iops() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); r=j["jobs"][0]["read"]; print(int(r["iops"]), int(r["clat_ns"]["percentile"]["50.000000"]/1000), int(r["clat_ns"]["percentile"]["99.000000"]/1000))' "$1"; }
wbw() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); w=j["jobs"][0]["write"]; s=j["jobs"][0]["job_runtime"]/1000.0; print(int(w["io_bytes"]/s/1e6) if s else 0)' "$1"; }

randread() { # dir label mode: cold (page cache dropped first; it fills as the run goes),
  # warm (file read once first), direct (O_DIRECT: every read misses the page cache)
  local dir=$1 label=$2 mode=$3 file=$1/rr.dat direct=0 invalidate=1
  case $mode in
    warm) cat "$file" > /dev/null; invalidate=0 ;;
    direct) drop; direct=1 ;;
    *) drop ;;
  esac
  fio --name=rr --filename="$file" --rw=randread --bs=8k --size=${SIZE_RR_MIB}M --numjobs="$JOBS" \
    --ioengine=psync --time_based --runtime="$SECONDS_RR" --group_reporting --mem=mmap --direct=$direct \
    --invalidate=$invalidate --output-format=json --output="$OUT/rr-$label.json" >/dev/null
  iops "$OUT/rr-$label.json"
}

seqwrite() { # dir label [bs size_mib]
  local file=$1/sw.dat bs=${3:-1M} size=${4:-$SIZE_WRITE_MIB}
  drop
  fio --name=sw --filename="$file" --rw=write --bs="$bs" --size="${size}M" --numjobs=1 \
    --ioengine=psync --end_fsync=1 --mem=mmap --output-format=json --output="$OUT/sw-$2.json" >/dev/null
  wbw "$OUT/sw-$2.json"
  rm -f "$file"
}

echo "# file-data benchmarks: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r)"
echo "# mount: $SHINGLE_MNT (shingle dev: 6 nodes, ec(4,2)); local: $LOCAL"
for d in "$LOCAL" "$SHINGLE_MNT"; do
  fio --name=prep --filename="$d/rr.dat" --rw=write --bs=1M --size=${SIZE_RR_MIB}M --ioengine=psync \
    --end_fsync=1 --output="$OUT/prep.txt" >/dev/null
done
read -r l_dir l_dir50 l_dir99 <<<"$(randread "$LOCAL" local-direct direct)"
read -r s_dir s_dir50 s_dir99 <<<"$(randread "$SHINGLE_MNT" shingle-direct direct)"
read -r l_cold l_cold50 l_cold99 <<<"$(randread "$LOCAL" local-cold cold)"
read -r s_cold s_cold50 s_cold99 <<<"$(randread "$SHINGLE_MNT" shingle-cold cold)"
read -r l_warm l_warm50 l_warm99 <<<"$(randread "$LOCAL" local-warm warm)"
read -r s_warm s_warm50 s_warm99 <<<"$(randread "$SHINGLE_MNT" shingle-warm warm)"
rm -f "$LOCAL/rr.dat" "$SHINGLE_MNT/rr.dat"
l_sw=$(seqwrite "$LOCAL" local)
s_sw=$(seqwrite "$SHINGLE_MNT" shingle)
l_sw64=$(seqwrite "$LOCAL" local-64k 64k "$SIZE_SMALL_WRITE_MIB")
s_sw64=$(seqwrite "$SHINGLE_MNT" shingle-64k 64k "$SIZE_SMALL_WRITE_MIB")

ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{a/b:.2f}' if b else '-')" "$1" "$2"; }
printf '%-44s %12s %12s %7s\n' "" local shingle ratio
printf '%-44s %12s %12s %7s\n' "random 8 KiB pread, ${JOBS} jobs, O_DIRECT: IOPS" "$l_dir" "$s_dir" "$(ratio "$s_dir" "$l_dir")"
printf '%-44s %12s %12s\n' "  p50 / p99 latency (us)" "$l_dir50/$l_dir99" "$s_dir50/$s_dir99"
printf '%-44s %12s %12s %7s\n' "random 8 KiB pread, ${JOBS} jobs, cold: IOPS" "$l_cold" "$s_cold" "$(ratio "$s_cold" "$l_cold")"
printf '%-44s %12s %12s\n' "  p50 / p99 latency (us)" "$l_cold50/$l_cold99" "$s_cold50/$s_cold99"
printf '%-44s %12s %12s %7s\n' "random 8 KiB pread, ${JOBS} jobs, warm: IOPS" "$l_warm" "$s_warm" "$(ratio "$s_warm" "$l_warm")"
printf '%-44s %12s %12s\n' "  p50 / p99 latency (us)" "$l_warm50/$l_warm99" "$s_warm50/$s_warm99"
printf '%-44s %12s %12s %7s\n' "sequential write ${SIZE_WRITE_MIB} MiB + fsync: MB/s" "$l_sw" "$s_sw" "$(ratio "$s_sw" "$l_sw")"
printf '%-44s %12s %12s %7s\n' "  the same with 64 KiB writes, ${SIZE_SMALL_WRITE_MIB} MiB: MB/s" "$l_sw64" "$s_sw64" "$(ratio "$s_sw64" "$l_sw64")"
echo "# fio JSON in $OUT"
