#!/bin/sh
# shellcheck shell=sh
# /init of the guest rig's initramfs (busybox sh, PID 1). Built in by setup.sh.
#
# Loads the modules, mounts the host root (9p, read-only) under an overlay with a tmpfs upper
# layer at /newroot, mounts the writable results share at /newroot/run/shingle-io, and runs
# inner.sh from that share in a chroot; then powers off. Kernel command line flags:
# shingle.zoned=1 and shingle.rdma=1 load those module sets. Whatever happens, the guest powers
# off (and a kernel panic reboots, which -no-reboot turns into QEMU exiting).
set -eu

PATH=/bin
export PATH
/bin/busybox --install -s /bin

say() {
    read -r up _ </proc/uptime
    echo "shingle-init: [$up] $*"
}

off() {
    sync
    poweroff -f
    # Not reached, but if it is: leaving PID 1 panics the kernel, which ends QEMU.
    exit 1
}

trap 'say "FATAL: init failed (see above)"; off' EXIT

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

zoned=0
rdma=0
read -r cmdline </proc/cmdline
for word in $cmdline; do
    case $word in
    shingle.zoned=1) zoned=1 ;;
    shingle.rdma=1) rdma=1 ;;
    esac
done

load_set() {
    while read -r name file params; do
        [ -d "/sys/module/$name" ] && continue
        # shellcheck disable=SC2086 # params is a list of name=value words
        insmod "/modules/$file" $params || { say "insmod $file failed"; return 1; }
    done <"/modules/$1.order"
}

load_set base
[ "$zoned" = 1 ] && load_set zoned
[ "$rdma" = 1 ] && load_set rdma
say "modules loaded"

# The virtio devices are probed when virtio_pci loads; give the 9p channels a moment if needed.
mount_9p() { # tag dir options
    tries=0
    until mount -t 9p -o "trans=virtio,version=9p2000.L,msize=512000,$3" "$1" "$2"; do
        tries=$((tries + 1))
        [ "$tries" -lt 50 ] || { say "cannot mount 9p share $1"; return 1; }
        sleep 0.1
    done
}

mount_9p hostroot /lower ro,cache=loose
mount -t tmpfs -o mode=0755 tmpfs /upper
mkdir -p /upper/data /upper/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work /newroot
say "host root mounted"

r=/newroot
mount -t proc proc "$r/proc"
mount -t sysfs sysfs "$r/sys"
mount -t devtmpfs devtmpfs "$r/dev"
mkdir -p "$r/dev/pts" "$r/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$r/dev/pts"
mount -t tmpfs -o mode=1777 tmpfs "$r/dev/shm"
# /tmp stays the overlay's: the host's files there are visible (scripts, binaries built there)
# and what the guest writes lands in the tmpfs upper layer.
mount -t tmpfs -o mode=0755 tmpfs "$r/run"
if [ -d /sys/module/configfs ]; then
    mount -t configfs configfs "$r/sys/kernel/config"
fi
mkdir -p "$r/run/shingle-io"
mount_9p shingleio "$r/run/shingle-io" cache=none

ip link set lo up
hostname shingle-guest

trap - EXIT
set +e
say "starting inner.sh"
chroot "$r" /bin/bash /run/shingle-io/inner.sh
rc=$?
[ "$rc" = 0 ] || say "inner.sh exited with $rc"
umount "$r/run/shingle-io" 2>/dev/null
off
