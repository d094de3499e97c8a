#!/usr/bin/env bash
# Runs a command against a fresh `shingle dev` cluster and FUSE mount, then tears it down.
#
#   bash scripts/with-dev-mount.sh COMMAND [ARGS...]
#   bash scripts/with-dev-mount.sh bash scripts/exercisers.sh
#
# Builds nothing: the binary is $SHINGLE_BIN (default target/release/shingle of this
# repository; build it first with `cargo build --release -p shingle`). The cluster's data
# and the mount point are new temporary directories; the command runs with the mount
# point in $SHINGLE_MNT (the cluster data in $SHINGLE_DATA, the binary in $SHINGLE_BIN) and its exit code is this script's. Needs root (or fusermount3)
# and /dev/fuse, like `shingle dev`.
#
# Environment:
#   SHINGLE_BIN=PATH           the shingle binary
#   DEV_ARGS="..."             extra `shingle dev` arguments (e.g. "--nodes 8 --ec 6,2")
#   DEV_START_TIMEOUT=SECS     wait for "shingle: mounted at" (default 180)
#   DEV_STOP_TIMEOUT=SECS      wait for the cluster to stop after SIGINT (default 60)
#   KEEP_TMP=1                 keep the temporary directory (cluster data and logs)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHINGLE_BIN=${SHINGLE_BIN:-$ROOT/target/release/shingle}
DEV_ARGS=${DEV_ARGS:-}
DEV_START_TIMEOUT=${DEV_START_TIMEOUT:-180}
DEV_STOP_TIMEOUT=${DEV_STOP_TIMEOUT:-60}
KEEP_TMP=${KEEP_TMP:-0}

die() { echo "with-dev-mount: $*" >&2; exit 1; }

[ $# -gt 0 ] || die "usage: $0 COMMAND [ARGS...]"
[ -x "$SHINGLE_BIN" ] || die "no shingle binary at $SHINGLE_BIN (build it: cargo build --release -p shingle; or set SHINGLE_BIN)"
SHINGLE_BIN=$(cd "$(dirname "$SHINGLE_BIN")" && pwd)/$(basename "$SHINGLE_BIN")

# Short: pjdfstest binds Unix sockets a few levels below the mount (sun_path is 108 bytes).
TMP=$(mktemp -d /tmp/shingle-dev.XXXXXX)
# Other users (pjdfstest switches to nobody) must be able to reach the mount point.
chmod 0755 "$TMP"
DATA=$TMP/data
MNT=$TMP/mnt
LOG=$TMP/dev.log
DEV_PID=

# From the mount table, not stat(2): a dead FUSE mount fails stat with ENOTCONN.
mounted() { awk -v m="$MNT" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; }

cleanup() {
  local rc=$? i
  trap - EXIT INT TERM
  set +e
  if [ -n "$DEV_PID" ] && kill -0 "$DEV_PID" 2>/dev/null; then
    echo "with-dev-mount: stopping shingle dev (pid $DEV_PID)"
    kill -INT "$DEV_PID" 2>/dev/null
    for ((i = 0; i < DEV_STOP_TIMEOUT * 10; i++)); do
      kill -0 "$DEV_PID" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$DEV_PID" 2>/dev/null; then
      echo "with-dev-mount: shingle dev did not stop within ${DEV_STOP_TIMEOUT}s; killing its process group" >&2
      kill -TERM -- "-$DEV_PID" 2>/dev/null
      sleep 3
      kill -KILL -- "-$DEV_PID" 2>/dev/null
    fi
    wait "$DEV_PID" 2>/dev/null
  fi
  # The dev process started in its own session (setsid), so its nodes are in its group:
  # make sure none outlives it.
  [ -n "$DEV_PID" ] && kill -KILL -- "-$DEV_PID" 2>/dev/null
  if mounted; then
    echo "with-dev-mount: $MNT is still mounted; detaching it (umount -l)" >&2
    umount -l "$MNT" 2>/dev/null || fusermount3 -uz "$MNT" 2>/dev/null
  fi
  if [ "$rc" != 0 ] && [ -f "$LOG" ]; then
    echo "with-dev-mount: last lines of the shingle dev output ($LOG), without backtraces:" >&2
    awk '/[Bb]acktrace:$/ { skip = 1; next } /^[^ ]/ { skip = 0 } !skip' "$LOG" | tail -n 20 | sed 's/^/    /' >&2
    # Each node's last warnings and errors: a node that stopped answering says why (or
    # goes quiet, which tells a hung process from a dead one).
    for f in "$DATA"/node*.log; do
      [ -s "$f" ] || continue
      echo "with-dev-mount: last warnings and errors of $(basename "$f") ($(wc -l <"$f") lines, last at $(tail -n 1 "$f" | cut -c1-27)):" >&2
      grep -E ' (WARN|ERROR) ' "$f" | tail -n 8 | cut -c1-400 | sed 's/^/    /' >&2
    done
    # A node answering "no space left" may mean the machine's disk, not the cluster's
    # accounting: say which.
    echo "with-dev-mount: free space where the nodes keep their data ($DATA):" >&2
    df -h "$DATA" 2>&1 | sed 's/^/    /' >&2
  fi
  if mounted; then
    echo "with-dev-mount: $MNT could not be unmounted; leaving $TMP in place" >&2
    rc=1
  elif [ "$KEEP_TMP" = 1 ]; then
    echo "with-dev-mount: kept $TMP (cluster data and logs in $DATA)"
  else
    rm -rf "$TMP"
    [ "$rc" = 0 ] || echo "with-dev-mount: removed $TMP (cluster data, logs, files left on the mount); KEEP_TMP=1 keeps it" >&2
  fi
  exit "$rc"
}
CMD_PID=
# On SIGINT/SIGTERM: stop the command (it runs in the background so that the signal is
# handled at once, not when the command ends), then clean up through the EXIT trap.
on_signal() {
  if [ -n "$CMD_PID" ]; then
    kill -TERM "$CMD_PID" 2>/dev/null
    wait "$CMD_PID" 2>/dev/null
  fi
  exit "$1"
}
trap cleanup EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

# Its own session and process group: our signals reach only it, and the group can be
# killed as a last resort.
# shellcheck disable=SC2086 # DEV_ARGS is a list of arguments
setsid "$SHINGLE_BIN" dev --data "$DATA" --mount "$MNT" $DEV_ARGS </dev/null >"$LOG" 2>&1 &
DEV_PID=$!
echo "with-dev-mount: started $SHINGLE_BIN dev --data $DATA --mount $MNT $DEV_ARGS (pid $DEV_PID); waiting for the mount"

deadline=$((SECONDS + DEV_START_TIMEOUT))
until grep -q "^shingle: mounted at " "$LOG" 2>/dev/null; do
  if ! kill -0 "$DEV_PID" 2>/dev/null; then
    wait "$DEV_PID" && st=0 || st=$?
    DEV_PID=
    die "shingle dev exited (status $st) before mounting"
  fi
  [ "$SECONDS" -lt "$deadline" ] || die "shingle dev did not print 'shingle: mounted at' within ${DEV_START_TIMEOUT}s"
  sleep 0.2
done
mounted || die "shingle dev said it mounted $MNT, but it is not a mount point"
echo "with-dev-mount: mounted at $MNT after ${SECONDS}s; running: $*"

set +e
SHINGLE_MNT=$MNT SHINGLE_DATA=$DATA SHINGLE_BIN=$SHINGLE_BIN "$@" <&0 &   # explicit stdin: a background command would get /dev/null
CMD_PID=$!
wait "$CMD_PID"
rc=$?
CMD_PID=
set -e
echo "with-dev-mount: command exited $rc"
exit "$rc"
