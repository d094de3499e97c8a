#!/usr/bin/env bash
# A multi-host rig from network namespaces: N hosts and a client, each in its own
# namespace, joined by veth pairs to a bridge that lives in a "switch" namespace, every
# host link shaped to 25 Gbit/s with tc tbf. Private addresses 10.77.0.0/24, only inside
# the namespaces this script creates; nothing touches the initial namespace's network.
#
#   rig.sh up N          create hosts h1..hN (10.77.0.1..N) and the client c (10.77.0.200)
#   rig.sh down          remove everything the rig created (safe to run twice)
#   rig.sh exec H CMD..  run CMD in host H (1..N, or c for the client)
#   rig.sh cut H         partition host H (its switch port goes down)
#   rig.sh heal H        bring it back
#   rig.sh check         exit 0 when this machine can run the rig, else print why
#
# Names start with $SHN_PREFIX (default "shn-"), so a rig can be found and removed.
set -euo pipefail
P="${SHN_PREFIX:-shn-}"
SW="${P}sw"
RATE="${SHN_RATE:-25gbit}"

ns_of() { if [ "$1" = c ]; then echo "${P}c"; else echo "${P}h$1"; fi; }
ip_of() { if [ "$1" = c ]; then echo "10.77.0.200"; else echo "10.77.0.$1"; fi; }

check() {
  [ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)"; return 1; }
  command -v ip >/dev/null || { echo "needs iproute2 (ip)"; return 1; }
  command -v tc >/dev/null || { echo "needs tc (iproute2)"; return 1; }
  local t="${P}probe$$"
  ip netns add "$t" 2>/dev/null || { echo "cannot create network namespaces"; return 1; }
  if ! ip -n "$t" link add probe0 type veth peer name probe1 2>/dev/null; then
    ip netns del "$t"; echo "cannot create veth pairs"; return 1
  fi
  if ! ip -n "$t" link add probebr type bridge 2>/dev/null; then
    ip netns del "$t"; echo "cannot create bridges"; return 1
  fi
  ip -n "$t" link set probe0 up 2>/dev/null || true
  if ! ip netns exec "$t" tc qdisc add dev probe0 root tbf rate "$RATE" burst 4mb latency 10ms 2>/dev/null; then
    ip netns del "$t"; echo "cannot shape links with tc tbf"; return 1
  fi
  ip netns del "$t"
}

add_host() {
  local h="$1" ns ipaddr
  ns=$(ns_of "$h"); ipaddr=$(ip_of "$h")
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  # veth: "eth0" in the host, "p<h>" on the switch.
  ip -n "$ns" link add eth0 type veth peer name "p$h" netns "$SW"
  ip -n "$ns" addr add "$ipaddr/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 4mb latency 10ms
  ip -n "$SW" link set "p$h" master br0
  ip -n "$SW" link set "p$h" up
}

up() {
  local n="$1"
  down >/dev/null 2>&1 || true
  ip netns add "$SW"
  ip -n "$SW" link set lo up
  ip -n "$SW" link add br0 type bridge
  ip -n "$SW" link set br0 up
  for h in $(seq 1 "$n"); do add_host "$h"; done
  add_host c
  # Bridge ports forward at once (no STP); give the links a moment anyway.
  sleep 0.2
  echo "rig: $n hosts up (10.77.0.1-$n), client 10.77.0.200, links shaped to $RATE"
}

down() {
  local found=0
  for ns in $(ip netns list | awk '{print $1}' | grep "^${P}" || true); do
    # Stop anything still running in it, then remove it.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    found=1
  done
  [ "$found" = 1 ] && echo "rig: removed" || true
}

cmd="${1:-}"; shift || true
case "$cmd" in
  up) up "${1:?rig.sh up N}" ;;
  down) down ;;
  exec) h="${1:?rig.sh exec HOST CMD...}"; shift; exec ip netns exec "$(ns_of "$h")" "$@" ;;
  cut) ip -n "$SW" link set "p${1:?rig.sh cut HOST}" down ;;
  heal) ip -n "$SW" link set "p${1:?rig.sh heal HOST}" up ;;
  check) check ;;
  *) sed -n '2,15p' "$0"; exit 2 ;;
esac
