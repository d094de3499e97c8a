#!/usr/bin/env bash
# Guest side of run.sh: runs inside the guest, chrooted into the overlay over the host root,
# from the results share (/run/shingle-io), which run.sh fills with:
#   env   export lines (the variables passed through from the host)
#   cmd   the command, as a bash script (cd to the host's working directory, then exec)
# With shingle.zoned=1 on the kernel command line it makes a null_blk zoned device through
# configfs and exports SHINGLE_ZBD_DEV; with shingle.rdma=1 it sets up soft-RoCE (two rxe
# devices on a veth pair) and exports SHINGLE_RDMA_*. Then it runs the command and leaves in the
# share: stdout, stderr, rc (the exit code) and started (guest uptime at command start), or
# rig-error (why the rig could not be set up).
set -euo pipefail

io=/run/shingle-io
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# Every fork and exec is slow under TCG (and binaries come over 9p): the rig setup sticks to
# bash builtins where it can.
log() {
    local up line
    read -r up _ </proc/uptime
    printf -v line 'shingle-guest: [%s] %s' "$up" "$*"
    printf '%s\n' "$line" >&2
    printf '%s\n' "$line" >>"$io/rig.log"
}

# Waits up to 10 s for a test (a function name) to succeed.
wait_until() {
    local tries=0
    until "$@"; do
        tries=$((tries + 1))
        [[ $tries -lt 100 ]] || return 1
        sleep 0.1
    done
}
rig_error() {
    printf '%s\n' "$*" >"$io/rig-error"
    log "rig error: $*"
    exit 1
}

zoned=0
rdma=0
read -r -a words </proc/cmdline
for word in "${words[@]}"; do
    case $word in
    shingle.zoned=1) zoned=1 ;;
    shingle.rdma=1) rdma=1 ;;
    esac
done

# The variables from the host first: they may set SHINGLE_GUEST_NULLB, and PATH.
# shellcheck source=/dev/null
source "$io/env"

# --- zoned block device ---------------------------------------------------------------------
# null_blk attributes (configfs names; sizes in MB). SHINGLE_GUEST_NULLB adds or overrides
# name=value words, e.g. "zone_size=8 zone_capacity=6". The device is memory backed, in the
# guest's 1 GiB of RAM: 512 MB leaves room for the kernel, the tmpfs overlay and the test, so a
# test that fills the device runs into full zones rather than the OOM killer.
setup_zoned() {
    # Named like the device, since kernels differ in which one they use for the disk name: the
    # configfs item (Debian's 6.1.192) or nullb<index> (older ones).
    local cfg=/sys/kernel/config/nullb/nullb0 kv name value disk dev
    [[ -d /sys/kernel/config/nullb ]] || rig_error "no /sys/kernel/config/nullb (null_blk or configfs missing)"
    mkdir "$cfg"
    # shellcheck disable=SC2206 # word splitting of the attribute list is intended
    local attrs=(size=512 blocksize=4096 memory_backed=1 zoned=1 zone_size=4 zone_capacity=4
        zone_nr_conv=0 zone_max_open=0 zone_max_active=0 ${SHINGLE_GUEST_NULLB:-})
    for kv in "${attrs[@]}"; do
        name=${kv%%=*}
        value=${kv#*=}
        [[ -e $cfg/$name ]] || rig_error "null_blk has no configfs attribute $name"
        echo "$value" >"$cfg/$name" || rig_error "cannot set null_blk $name=$value"
    done
    echo 1 >"$cfg/power" || rig_error "cannot power on the null_blk device"
    disk=nullb$(<"$cfg/index")
    [[ -e /sys/block/$disk ]] || disk=${cfg##*/}
    dev=/dev/$disk
    wait_until test -b "$dev" || rig_error "$dev did not appear (block devices: $(echo /sys/block/*); $(echo /dev/nullb*)); dmesg: $(dmesg | tail -n 5 | tr '\n' ' ')"
    local q=/sys/block/$disk/queue
    log "zoned: $dev $(<"$q/zoned"), $(<"$q/nr_zones") zones of $(($(<"$q/chunk_sectors") / 2048)) MiB, block $(<"$q/logical_block_size") B (${attrs[*]})"
    export SHINGLE_ZBD_DEV=$dev
}

# --- soft-RoCE ------------------------------------------------------------------------------
# Both veth ends stay in the initial namespace (rxe on 6.1 listens only there). The addresses
# are private and exist only inside this guest, which has no NIC.
setup_rdma() {
    local addr0=10.200.0.1 addr1=10.200.0.2 i dev netdev addr want a b c d gid_type
    sysctl_set() { echo "$2" >"/proc/sys/$1" || rig_error "cannot set $1=$2"; }
    gid_is() { # device index wanted
        local gid=
        read -r gid 2>/dev/null <"/sys/class/infiniband/$1/ports/1/gids/$2" || true
        [[ $gid == "$3" ]]
    }
    ip link add vethA type veth peer name vethB || rig_error "cannot create the veth pair"
    sysctl_set net/core/netdev_max_backlog 100000
    for netdev in all default vethA vethB; do
        sysctl_set "net/ipv4/conf/$netdev/accept_local" 1
        sysctl_set "net/ipv4/conf/$netdev/rp_filter" 0
    done
    ip -batch - <<EOF_IP || rig_error "cannot configure the veth pair"
addr add $addr0/24 dev vethA
addr add $addr1/24 dev vethB
link set vethA up
link set vethB up
EOF_IP
    rdma link add rxe0 type rxe netdev vethA || rig_error "rdma link add rxe0 failed"
    rdma link add rxe1 type rxe netdev vethB || rig_error "rdma link add rxe1 failed"
    # RoCEv2 GID index 1 is the IPv4-mapped address; wait until it is populated.
    for i in 0 1; do
        dev=rxe$i
        if [[ $i == 0 ]]; then netdev=vethA addr=$addr0; else netdev=vethB addr=$addr1; fi
        IFS=. read -r a b c d <<<"$addr"
        printf -v want '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d"
        wait_until gid_is "$dev" 1 "$want" || rig_error "$dev GID index 1 is not $want"
        read -r gid_type <"/sys/class/infiniband/$dev/ports/1/gid_attrs/types/1"
        log "rdma: $dev on $netdev $addr, GID[1] $want ($gid_type)"
    done
    export SHINGLE_RDMA_DEV0=rxe0 SHINGLE_RDMA_DEV1=rxe1
    export SHINGLE_RDMA_NETDEV0=vethA SHINGLE_RDMA_NETDEV1=vethB
    export SHINGLE_RDMA_ADDR0=$addr0 SHINGLE_RDMA_ADDR1=$addr1
    export SHINGLE_RDMA_GID_INDEX=1
}

[[ $zoned == 1 ]] && setup_zoned
[[ $rdma == 1 ]] && setup_rdma
# Registered RDMA memory is pinned and counts against the memlock limit (8 MiB by
# default), as on a real host where the unit sets LimitMEMLOCK=infinity.
[[ $rdma == 1 ]] && ulimit -l unlimited

read -r up _ </proc/uptime
echo "$up" >"$io/started"
log "running the command"
set +e
# shellcheck source=/dev/null
(source "$io/cmd") </dev/null >"$io/stdout" 2>"$io/stderr"
rc=$?
set -e
echo "$rc" >"$io/rc"
