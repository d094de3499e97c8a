#!/usr/bin/env bash
# Run a host-built command inside the QEMU guest rig (Debian 6.1 kernel, TCG) and bring back its
# output and exit code.
#
#   fabric-tests/guest/run.sh [--zoned] [--rdma] -- COMMAND [ARG...]
#
#   --zoned  make a null_blk zoned device and export SHINGLE_ZBD_DEV=/dev/nullb0 (memory backed;
#            by default 512 MB, 4096-byte blocks, 128 sequential zones of 4 MiB, no open limit)
#   --rdma   set up soft-RoCE: rxe0 on vethA and rxe1 on vethB, exported as SHINGLE_RDMA_DEV0/1,
#            SHINGLE_RDMA_NETDEV0/1, SHINGLE_RDMA_ADDR0/1 and SHINGLE_RDMA_GID_INDEX (1)
#
# The guest sees the host root read-only (writes land in a tmpfs overlay and are lost), runs
# COMMAND in the current directory, stdin /dev/null, with PATH, HOME, RUST_BACKTRACE, RUST_LOG,
# REQUIRE_RDMA, every SHINGLE_* variable and those named in SHINGLE_GUEST_ENV, and powers off.
# COMMAND's stdout and stderr are printed on ours (after it ends) and its exit code is ours.
#
# Exit codes of the rig itself: 124 the guest timed out, 125 the rig failed (boot, setup, QEMU).
#
# Environment:
#   SHINGLE_GUEST_TIMEOUT  seconds before QEMU is killed (default 600)
#   SHINGLE_GUEST_CACHE    the cache setup.sh fills (default /var/tmp/shingle-guest)
#   SHINGLE_GUEST_NULLB    extra null_blk configfs attributes, e.g. "zone_size=8 zone_capacity=6"
#   SHINGLE_GUEST_ENV      more variable names to pass into the guest, space separated
#   SHINGLE_GUEST_CONSOLE  1: print the guest's serial console on stderr afterwards
#   SHINGLE_GUEST_APPEND   more kernel command line words (e.g. loglevel=7 to see boot messages)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=$(realpath -m "${SHINGLE_GUEST_CACHE:-/var/tmp/shingle-guest}")
timeout_s=${SHINGLE_GUEST_TIMEOUT:-600}

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
}

zoned=0
rdma=0
while [[ $# -gt 0 ]]; do
    case $1 in
    --zoned) zoned=1 ;;
    --rdma) rdma=1 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) usage; exit 2 ;;
    esac
    shift
done
[[ $# -gt 0 ]] || { usage; exit 2; }
[[ $timeout_s =~ ^[1-9][0-9]*$ ]] || { echo "SHINGLE_GUEST_TIMEOUT must be a number of seconds" >&2; exit 2; }

log() { printf 'shingle-guest: %s\n' "$*" >&2; }
rig_fail() { log "error: $*"; exit 125; }

work=$(mktemp -d "${TMPDIR:-/tmp}/shingle-guest.XXXXXX")
qemu_pid=
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    if [[ -n $qemu_pid ]] && kill -0 "$qemu_pid" 2>/dev/null; then
        kill "$qemu_pid" 2>/dev/null || true
        wait "$qemu_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ! "$here/setup.sh" 2>&1 | tee "$work/setup.log" >&2; then
    reason=$(grep -m 1 'error:' "$work/setup.log" | sed 's/^.*error: //' || true)
    rig_fail "the guest rig cannot be prepared: ${reason:-setup.sh failed}"
fi

qemu="$cache/root/usr/bin/qemu-system-x86_64"
for f in "$qemu" "$cache/vmlinux" "$cache/initramfs.cpio"; do
    [[ -e $f ]] || rig_fail "$f is missing after setup.sh"
done

io="$work/io"
mkdir -p "$io"
cp "$here/inner.sh" "$io/inner.sh"
{
    printf 'cd %q 2>/dev/null || cd /\n' "$PWD"
    printf 'exec'
    printf ' %q' "$@"
    printf '\n'
} >"$io/cmd"
{
    names=(PATH HOME RUST_BACKTRACE RUST_LOG REQUIRE_RDMA)
    read -r -a extra <<<"${SHINGLE_GUEST_ENV:-}"
    names+=("${extra[@]}")
    while IFS= read -r name; do
        names+=("$name")
    done < <(compgen -v SHINGLE_ || true)
    for name in "${names[@]}"; do
        if [[ -n ${!name+set} ]]; then printf 'export %s=%q\n' "$name" "${!name}"; fi
    done
} >"$io/env"

append="console=ttyS0 panic=-1 loglevel=4 mitigations=off rdinit=/init"
[[ $zoned == 1 ]] && append+=" shingle.zoned=1"
[[ $rdma == 1 ]] && append+=" shingle.rdma=1"
append+=" ${SHINGLE_GUEST_APPEND:-}"

# One guest at a time on this machine (2 cores); wait for another run to end.
exec 9>"$cache/qemu.lock"
if ! flock -n 9; then
    log "waiting for another guest to finish"
    flock -w "$timeout_s" 9 || rig_fail "another guest ran for more than ${timeout_s}s"
fi

console="$work/console.log"
start_s=$(date +%s.%N)
timeout -k 5 "$timeout_s" "$qemu" \
    -L "$cache/root/usr/share/qemu" -L "$cache/root/usr/share/seabios" \
    -L "$cache/root/usr/lib/ipxe/qemu" \
    -machine pc -accel tcg,thread=multi -cpu max -smp 2 -m 1024 -nodefaults -no-reboot \
    -display none -nic none -serial "file:$console" \
    -kernel "$cache/vmlinux" -initrd "$cache/initramfs.cpio" -append "$append" \
    -fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap \
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
    -fsdev "local,id=io,path=$io,security_model=none" \
    -device virtio-9p-pci,fsdev=io,mount_tag=shingleio \
    -device virtio-rng-pci \
    </dev/null >"$work/qemu.out" 2>&1 &
qemu_pid=$!
set +e
wait "$qemu_pid"
qemu_rc=$?
set -e
qemu_pid=
end_s=$(date +%s.%N)
exec 9>&-

show_console() {
    if [[ -s $work/qemu.out ]]; then
        log "QEMU said:"
        cat "$work/qemu.out" >&2
    fi
    if [[ ${SHINGLE_GUEST_CONSOLE:-0} == 1 ]]; then
        log "guest console:"
        cat "$console" >&2 2>/dev/null || true
    else
        log "last lines of the guest console:"
        tail -n "${1:-30}" "$console" >&2 2>/dev/null || true
    fi
}
emit_output() {
    [[ -f $io/stdout ]] && cat "$io/stdout"
    [[ -f $io/stderr ]] && cat "$io/stderr" >&2
    return 0
}

if [[ $qemu_rc == 124 || $qemu_rc == 137 ]]; then
    emit_output
    show_console
    log "error: timed out after ${timeout_s}s (SHINGLE_GUEST_TIMEOUT); QEMU killed"
    exit 124
fi
if [[ ! -f $io/rc ]]; then
    [[ -f $io/rig.log ]] && cat "$io/rig.log" >&2
    show_console 60
    if [[ -f $io/rig-error ]]; then
        rig_fail "the guest could not set up the rig: $(<"$io/rig-error")"
    fi
    rig_fail "the guest ended (QEMU exit $qemu_rc) without the command's exit code"
fi

rc=$(<"$io/rc")
[[ -f $io/rig.log ]] && cat "$io/rig.log" >&2
emit_output
[[ ${SHINGLE_GUEST_CONSOLE:-0} == 1 ]] && show_console
started=$(<"$io/started")
log "$(awk -v s="$start_s" -v e="$end_s" -v g="$started" -v rc="$rc" \
    'BEGIN { printf "command started %.1f s after kernel start; guest ran %.1f s in all; exit %d", g, e - s, rc }')"
exit "$rc"
