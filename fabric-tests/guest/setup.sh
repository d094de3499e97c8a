#!/usr/bin/env bash
# Prepare the QEMU guest rig (soft-RoCE and null_blk zoned device) in a private cache folder.
#
# Idempotent: when the cache is complete and was built from the current scripts, this only checks
# the host packages and exits. `--force` rebuilds (and so picks up a newer Debian kernel).
#
# What it does (see fabric-tests/README.md, "Guest rig"):
#   - installs small host userland packages with apt (kmod for depmod, libibverbs with the rxe
#     provider, ibverbs-utils, perftest, and the shared libraries QEMU needs) and refuses to go on
#     if apt would remove anything;
#   - `apt-get download`s Debian 12's kernel (the one linux-image-amd64 depends on), QEMU
#     (qemu-system-x86/-common/-data, seabios, ipxe-qemu: NOT installed, qemu-utils stays) and
#     busybox-static, and unpacks them with `dpkg -x` into $CACHE/root;
#   - runs depmod, extracts an uncompressed vmlinux for PVH boot and builds an initramfs (newc
#     cpio) with busybox, fabric-tests/guest/init.sh as /init, and the needed modules in
#     dependency order.
#
# Environment: SHINGLE_GUEST_CACHE (default /var/tmp/shingle-guest).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=$(realpath -m "${SHINGLE_GUEST_CACHE:-/var/tmp/shingle-guest}")
force=0

usage() {
    echo "usage: $0 [--force]" >&2
    echo "  prepares the guest rig in \$SHINGLE_GUEST_CACHE (default /var/tmp/shingle-guest)" >&2
}

for arg in "$@"; do
    case $arg in
    --force) force=1 ;;
    -h | --help) usage; exit 0 ;;
    *) usage; exit 2 ;;
    esac
done

log() { printf 'shingle-guest setup: %s\n' "$*" >&2; }
die() { printf 'shingle-guest setup: error: %s\n' "$*" >&2; exit 1; }

# Host packages: small userland only. rdma-core is deliberately absent: on Debian 12 it pulls in
# udev and upgrades systemd, and the guest needs none of it (the `rdma` tool is in iproute2).
host_packages=(kmod iproute2 xz-utils binutils libibverbs1 ibverbs-providers ibverbs-utils
    librdmacm1 perftest)

# Packages unpacked into the cache, never installed.
guest_packages=(qemu-system-x86 qemu-system-common qemu-system-data seabios ipxe-qemu busybox-static)

# Guest kernel modules, by set; each set is loaded in dependency order by init.sh, skipping any
# already loaded.
modules_base=(virtio_pci 9pnet_virtio 9p overlay virtio_rng)
modules_zoned=(configfs null_blk zonefs)
modules_rdma=(veth udp_tunnel ip6_udp_tunnel crc32_generic ib_core ib_uverbs rdma_rxe rdma_ucm)
# Parameters for insmod. null_blk creates no device at load: run.sh's guest side makes one
# through configfs with the zoned geometry it wants.
declare -A module_params=([null_blk]="nr_devices=0")

# Everything the cache's content depends on besides the Debian package versions.
inputs_hash() {
    cat "$here/setup.sh" "$here/init.sh" | sha256sum | cut -d' ' -f1
}

missing_packages() {
    local pkg status
    declare -A installed=()
    while read -r pkg status; do
        if [[ $status == "install ok installed" ]]; then installed[${pkg%%:*}]=1; fi
    done < <(dpkg-query -W -f='${Package} ${Status}\n' "$@" 2>/dev/null || true)
    for pkg in "$@"; do
        [[ -n ${installed[$pkg]:-} ]] || printf '%s\n' "$pkg"
    done
}

apt_updated=0
apt_update_once() {
    if [[ $apt_updated == 0 ]]; then
        log "apt-get update"
        apt-get update -qq >&2 || die "apt-get update failed"
        apt_updated=1
    fi
}

# Install packages on the host, only if apt would remove nothing. Already-installed packages
# are not upgraded.
install_host_packages() {
    local missing
    mapfile -t missing < <(missing_packages "$@")
    [[ ${#missing[@]} -gt 0 ]] || return 0
    [[ $(id -u) == 0 ]] || die "host packages missing (${missing[*]}) and not root to install them"
    apt_update_once
    log "installing host packages: ${missing[*]}"
    local plan
    plan=$(apt-get install -s --no-install-recommends --no-upgrade "${missing[@]}" 2>&1) ||
        die "apt-get cannot install ${missing[*]}: $(tail -n 3 <<<"$plan")"
    if grep -q '^Remv ' <<<"$plan"; then
        die "installing ${missing[*]} would remove packages: $(grep '^Remv ' <<<"$plan" | tr '\n' ' ')"
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-upgrade \
        "${missing[@]}" >&2 || die "apt-get install ${missing[*]} failed"
}

# The run-time libraries qemu-system-x86 depends on (its Depends line minus the QEMU packages
# that are only unpacked).
qemu_library_packages() {
    local deb=$1 dep
    dpkg-deb -f "$deb" Depends | tr ',' '\n' | while read -r dep; do
        dep=${dep%%|*}
        dep=${dep%%(*}
        dep=${dep// /}
        case $dep in
        '' | qemu-system-* | seabios | ipxe-qemu) ;;
        *) printf '%s\n' "$dep" ;;
        esac
    done
}

# A file's single match in the cache, or die.
one_file() {
    local matches
    mapfile -t matches < <(compgen -G "$1" || true)
    [[ ${#matches[@]} == 1 ]] || die "expected one file matching $1, found ${#matches[@]}"
    printf '%s\n' "${matches[0]}"
}

# Uncompressed ELF vmlinux from a bzImage, as scripts/extract-vmlinux does: find each candidate
# compressed-payload magic, decompress from there, keep the first result that is an ELF file.
extract_vmlinux() {
    local img=$1 out=$2 tmp="$2.tmp" pos magic tool
    for spec in '\xfd7zXZ\x00:xz -dc' '\x28\xb5\x2f\xfd:zstd -dcq' '\x1f\x8b\x08:gzip -dc'; do
        magic=${spec%%:*}
        tool=${spec#*:}
        while IFS=: read -r pos _; do
            # The decompressor complains about the bytes after the payload; the ELF check decides.
            # shellcheck disable=SC2086 # $tool is a command with its options
            tail -c "+$((pos + 1))" "$img" | $tool >"$tmp" 2>/dev/null || true
            if readelf -h "$tmp" >/dev/null 2>&1; then
                mv "$tmp" "$out"
                return 0
            fi
        done < <(LC_ALL=C grep -obUaP "$magic" "$img" || true)
    done
    rm -f "$tmp"
    die "no compressed ELF kernel found in $img"
}

# Module names in dependency order (dependencies first) for the names given, from modules.dep.
declare -A mod_path=() mod_deps=() mod_builtin=()
load_module_index() {
    local moddir=$1 line path deps name dep_name dep
    while IFS= read -r line; do
        path=${line%%:*}
        deps=${line#*:}
        name=${path##*/}
        name=${name%.ko}
        name=${name//-/_}
        mod_path[$name]=$path
        mod_deps[$name]=""
        for dep in $deps; do
            dep_name=${dep##*/}
            dep_name=${dep_name%.ko}
            mod_deps[$name]+=" ${dep_name//-/_}"
        done
    done <"$moddir/modules.dep"
    while IFS= read -r path; do
        name=${path##*/}
        name=${name%.ko}
        mod_builtin[${name//-/_}]=1
    done <"$moddir/modules.builtin"
}

declare -A visited=()
ordered=()
visit_module() {
    local name=$1 dep
    [[ -z ${visited[$name]:-} ]] || return 0
    visited[$name]=1
    if [[ -n ${mod_builtin[$name]:-} ]]; then
        log "module $name is built into the kernel"
        return 0
    fi
    [[ -n ${mod_path[$name]:-} ]] || die "module $name not found in modules.dep"
    for dep in ${mod_deps[$name]}; do
        visit_module "$dep"
    done
    ordered+=("$name")
}

# Writes $stage/modules/<set>.order ("name file params" per line) and copies the modules.
write_module_set() {
    local set=$1 moddir=$2 stage=$3 name file
    shift 3
    visited=()
    ordered=()
    for name in "$@"; do
        visit_module "$name"
    done
    : >"$stage/modules/$set.order"
    for name in "${ordered[@]}"; do
        file="$name.ko"
        cp "$moddir/${mod_path[$name]}" "$stage/modules/$file"
        printf '%s %s %s\n' "$name" "$file" "${module_params[$name]:-}" >>"$stage/modules/$set.order"
    done
    log "module set $set: ${ordered[*]}"
}

build_initramfs() {
    local root=$1 kver=$2 out=$3 stage="$cache/initramfs.d"
    local moddir="$root/lib/modules/$kver"
    rm -rf "$stage"
    mkdir -p "$stage"/{bin,dev,proc,sys,lower,upper,newroot,modules}
    cp "$root/bin/busybox" "$stage/bin/busybox"
    ln -s busybox "$stage/bin/sh"
    install -m 0755 "$here/init.sh" "$stage/init"
    load_module_index "$moddir"
    write_module_set base "$moddir" "$stage" "${modules_base[@]}"
    write_module_set zoned "$moddir" "$stage" "${modules_zoned[@]}"
    write_module_set rdma "$moddir" "$stage" "${modules_rdma[@]}"
    (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | "$root/bin/busybox" cpio -o -H newc) \
        >"$out.tmp" 2>/dev/null
    mv "$out.tmp" "$out"
    rm -rf "$stage"
}

# ---------------------------------------------------------------------------------------------

mkdir -p "$cache" 2>/dev/null || die "cannot create the cache folder $cache"
exec 8>"$cache/setup.lock"
flock 8

stamp="$cache/ready"
if [[ $force == 0 && -f $stamp ]] && grep -qx "inputs=$(inputs_hash)" "$stamp"; then
    # Fast path: the cache is complete; make sure the host still has its packages.
    mapfile -t pkgs <"$cache/host-packages"
    install_host_packages "${pkgs[@]}"
    exit 0
fi
rm -f "$stamp"
root="$cache/root"
qemu="$root/usr/bin/qemu-system-x86_64"

# Stage 1, downloads and what is derived from them alone. Kept across changes of the scripts
# (only the initramfs depends on those); --force redoes it and so picks up newer packages.
root_stamp="$cache/root.ready"
root_key="packages=${guest_packages[*]} format=1"
if [[ $force == 1 || ! -f $root_stamp ]] || ! grep -qx "$root_key" "$root_stamp"; then
    log "downloading and unpacking the guest packages into $cache"
    rm -f "$root_stamp"
    apt_update_once
    kernel_pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
        sed -n 's/^ *Depends: \(linux-image-6\.1\.0-[0-9]*-amd64\)$/\1/p' | head -n 1)
    [[ -n $kernel_pkg ]] ||
        die "cannot find the linux-image-6.1.0-*-amd64 package that linux-image-amd64 depends on"
    kver=${kernel_pkg#linux-image-}

    debs="$cache/debs"
    rm -rf "$debs"
    mkdir -p "$debs"
    # apt drops privileges to _apt for downloads; let it write here.
    if id _apt >/dev/null 2>&1; then chown _apt "$debs"; fi
    log "apt-get download $kernel_pkg ${guest_packages[*]}"
    (cd "$debs" && apt-get download -qq "$kernel_pkg" "${guest_packages[@]}" >&2) ||
        die "apt-get download failed"

    qemu_deb=$(one_file "$debs/qemu-system-x86_*.deb")
    mapfile -t qemu_libs < <(qemu_library_packages "$qemu_deb")
    printf '%s\n' "${host_packages[@]}" "${qemu_libs[@]}" >"$cache/host-packages"

    rm -rf "$root"
    mkdir -p "$root"
    for deb in "$debs"/*.deb; do
        dpkg -x "$deb" "$root"
    done
    # The .debs are unpacked; keep only their names (for the record) to save 85 MB.
    (cd "$debs" && ls) >"$cache/debs.list"
    rm -rf "$debs"

    install_host_packages "${host_packages[@]}" "${qemu_libs[@]}"
    log "depmod $kver"
    depmod -b "$root" "$kver"

    log "extracting vmlinux"
    extract_vmlinux "$(one_file "$root/boot/vmlinuz-$kver")" "$cache/vmlinux"

    {
        printf '%s\n' "$root_key"
        printf 'kernel=%s\n' "$kver"
    } >"$root_stamp"
else
    mapfile -t pkgs <"$cache/host-packages"
    install_host_packages "${pkgs[@]}"
fi
kver=$(sed -n 's/^kernel=//p' "$root_stamp")

# Stage 2: the initramfs, from init.sh and the module lists above.
log "building the initramfs"
build_initramfs "$root" "$kver" "$cache/initramfs.cpio"

if ldd "$qemu" | grep -q 'not found'; then
    die "qemu-system-x86_64 misses libraries: $(ldd "$qemu" | grep 'not found' | tr -s ' \t' ' ')"
fi
qemu_version=$("$qemu" --version | head -n 1)

{
    printf 'inputs=%s\n' "$(inputs_hash)"
    printf 'kernel=%s\n' "$kver"
    printf 'qemu=%s\n' "$qemu_version"
} >"$stamp.tmp"
mv "$stamp.tmp" "$stamp"
log "ready: kernel $kver, $qemu_version"
