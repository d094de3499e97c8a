#!/usr/bin/env bash
# External filesystem exercisers against an already-mounted Shingle filesystem:
#   fsx        (cargo install fsx --locked)        random I/O with read-back verification
#   pjdfstest  (cargo install pjdfstest --locked)  POSIX syscall semantics; needs root
#
#   bash scripts/exercisers.sh [MOUNT]     MOUNT defaults to $SHINGLE_MNT, else /tmp/shingle
#   bash scripts/with-dev-mount.sh bash scripts/exercisers.sh   (starts a `shingle dev` cluster)
#
# Environment:
#   EXERCISERS=all|fsx|pjdfstest|sqlite   what to run (default all; sqlite: WAL and
#                                   rollback-journal transactions, scripts/sqlite-check.py)
#   FSX_OPS=N                       operations per fsx run (default 400)
#   FSX_SEEDS=N                     seeds per configuration (default 2: seeds 1..N)
#   FSX_SEED_LIST="s1 s2 ..."       explicit seeds instead of 1..FSX_SEEDS
#   FSX_CONFIGS="mixed aligned reopen mmap"   configurations to run (default all four)
#   FSX_FLEN / FSX_OPMAX            max file length / op size in bytes (32 MiB / 4 MiB)
#   FSX_TIMEOUT=SECS                per fsx run (default 300; a timeout is a failure)
#   FSX_TAIL=N                      log lines shown for a failed run (default 40)
#   PJDFSTEST_FEATURES="..."        opt-in features (default: utimensat utime_now rename_ctime)
#   PJDFSTEST_NAPTIME=SECS          sleep between timestamp changes (default 0.01)
#   PJDFSTEST_PATTERNS="..."        only tests whose names contain one of these
#   PJDFSTEST_EXPECTED_FAILURES="a::b c::d"   test names whose failure is not fatal
#   PJDFSTEST_TIMEOUT=SECS          whole pjdfstest run (default 900)
#   PJDFSTEST_SECONDARY="DIR ..."   where to make a directory on another filesystem for the
#                                   EXDEV tests (default: the first of /tmp /dev/shm /var/tmp
#                                   not on the filesystem under test)
#   EXERCISERS_LOG_DIR=DIR          logs and configs (default: a new /tmp/exercisers.XXXXXX)
#   EXERCISERS_ANY_FS=1             test MOUNT even if it is not a mount point (e.g. a local
#                                   filesystem, for comparison); without it that is refused
#
# Features the filesystem lacks are simply not enabled for pjdfstest (its features are
# opt-in): posix_fallocate, chflags, nfsv4_acls, stat_st_birthtime, chflags_sf_snapshot.
# fsx never issues posix_fallocate or punch_hole here (weights 0); copy_file_range runs in
# the reopen configuration (the kernel falls back to a page-cache copy); fsx-rs
# has no zero-range, insert-range or collapse-range operations at all.
# A missing tool, a non-root pjdfstest run, or any failure exits non-zero; nothing is skipped.
set -euo pipefail

MNT=${1:-${SHINGLE_MNT:-/tmp/shingle}}
EXERCISERS=${EXERCISERS:-all}
FSX_OPS=${FSX_OPS:-400}
FSX_SEEDS=${FSX_SEEDS:-2}
FSX_SEED_LIST=${FSX_SEED_LIST:-}
FSX_CONFIGS=${FSX_CONFIGS:-mixed aligned reopen mmap}
FSX_FLEN=${FSX_FLEN:-$((32 << 20))}
FSX_OPMAX=${FSX_OPMAX:-$((4 << 20))}
FSX_TIMEOUT=${FSX_TIMEOUT:-300}
FSX_TAIL=${FSX_TAIL:-40}
PJDFSTEST_FEATURES=${PJDFSTEST_FEATURES:-utimensat utime_now rename_ctime}
PJDFSTEST_NAPTIME=${PJDFSTEST_NAPTIME:-0.01}
PJDFSTEST_PATTERNS=${PJDFSTEST_PATTERNS:-}
PJDFSTEST_EXPECTED_FAILURES=${PJDFSTEST_EXPECTED_FAILURES:-}
PJDFSTEST_TIMEOUT=${PJDFSTEST_TIMEOUT:-900}

die() { echo "exercisers: $*" >&2; exit 1; }
step() { printf '\n==> %s\n' "$*"; }

# cargo install puts the tools here; a PATH without it is common under sudo.
PATH=$PATH:${CARGO_HOME:-$HOME/.cargo}/bin

case $EXERCISERS in
  all) RUN_FSX=1 RUN_PJD=1 RUN_SQL=1 ;;
  fsx) RUN_FSX=1 RUN_PJD=0 RUN_SQL=0 ;;
  pjdfstest) RUN_FSX=0 RUN_PJD=1 RUN_SQL=0 ;;
  sqlite) RUN_FSX=0 RUN_PJD=0 RUN_SQL=1 ;;
  *) die "EXERCISERS must be all, fsx, pjdfstest or sqlite (got '$EXERCISERS')" ;;
esac

[ -d "$MNT" ] || die "$MNT is not a directory (mount a Shingle filesystem there first, or use scripts/with-dev-mount.sh)"
MNT=$(cd "$MNT" && pwd -P)
# A directory that is not a mount point (a mount that died, or was never made) would
# test the filesystem under it and pass: refuse, unless that is what is asked for
# (EXERCISERS_ANY_FS=1, e.g. to compare with a local filesystem).
if ! mountpoint -q "$MNT"; then
  [ "${EXERCISERS_ANY_FS:-0}" = 1 ] ||
    die "$MNT is not a mount point (the filesystem there is $(stat -f -c %T "$MNT")); mount Shingle there, use scripts/with-dev-mount.sh, or set EXERCISERS_ANY_FS=1 to test that filesystem"
  echo "exercisers: $MNT is not a mount point; testing the filesystem it is on ($(stat -f -c %T "$MNT")) as asked" >&2
fi

# Check every needed tool before running anything.
if [ "$RUN_FSX" = 1 ]; then
  command -v fsx >/dev/null || die "fsx is not installed: cargo install fsx --locked"
fi
if [ "$RUN_PJD" = 1 ]; then
  command -v pjdfstest >/dev/null || die "pjdfstest is not installed: cargo install pjdfstest --locked"
  [ "$(id -u)" = 0 ] || die "pjdfstest must run as root (it switches users and creates device nodes); run as root or EXERCISERS=fsx"
fi

LOG_DIR=${EXERCISERS_LOG_DIR:-$(mktemp -d /tmp/exercisers.XXXXXX)}
mkdir -p "$LOG_DIR"
echo "exercisers: testing $MNT ($(findmnt -n -o FSTYPE,SOURCE -T "$MNT" 2>/dev/null || stat -f -c %T "$MNT")); logs in $LOG_DIR"

# ---------------------------------------------------------------------------- fsx

# Writes the fsx.toml of configuration $1 to stdout. Every configuration uses pread/
# pwrite and mmap reads/writes, close/reopen, truncate and fsync; the operations the
# filesystem does not support are off.
fsx_config() {
  local name=$1
  cat <<EOF
# fsx configuration '$name' (generated by scripts/exercisers.sh)
flen = $FSX_FLEN
nomsyncafterwrite = false
nosizechecks = false
blockmode = false

[opsize]
max = $FSX_OPMAX
EOF
  case $name in
    mixed | aligned)   # every supported operation: unaligned, or with page-aligned
      # offsets and sizes (the kernel's writeback and mmap units)
      if [ "$name" = aligned ]; then printf 'min = 4096\nalign = 4096\n'; else printf 'min = 0\nalign = 1\n'; fi
      cat <<EOF

[weights]
read = 10
write = 10
mapread = 10
mapwrite = 10
truncate = 2
close_open = 2
invalidate = 1
fsync = 1
fdatasync = 1
EOF
      ;;
    reopen)  # many close/reopen and size changes; sendfile and fadvise reads
      cat <<EOF
min = 0
align = 1

[weights]
read = 5
write = 10
mapread = 5
mapwrite = 5
truncate = 5
close_open = 10
invalidate = 1
fsync = 2
fdatasync = 1
sendfile = 2
posix_fadvise = 1
copy_file_range = 2
EOF
      ;;
    mmap)    # mostly mmap reads/writes with msync and MS_INVALIDATE
      cat <<EOF
min = 0
align = 1

[weights]
read = 5
write = 5
mapread = 20
mapwrite = 20
truncate = 1
close_open = 2
invalidate = 3
fsync = 1
fdatasync = 0
EOF
      ;;
    *) die "unknown fsx configuration '$name' (known: mixed aligned reopen mmap)" ;;
  esac
  # Not supported by Shingle (EOPNOTSUPP): never issued. copy_file_range is (the
  # kernel copies through the page cache when the filesystem answers ENOSYS): see reopen.
  cat <<EOF
posix_fallocate = 0
punch_hole = 0
EOF
}

run_fsx() {
  local seeds dir cfg name seed file log rc t0 failed=() passed=0
  if [ -n "$FSX_SEED_LIST" ]; then
    seeds=$FSX_SEED_LIST
  else
    seeds=$(seq 1 "$FSX_SEEDS")
  fi
  dir=$(mktemp -d "$MNT/fsx.XXXXXX") || die "cannot create a directory in $MNT"
  step "fsx: configurations [$FSX_CONFIGS] x seeds [$(echo $seeds)], $FSX_OPS ops each, files up to $FSX_FLEN bytes, ops up to $FSX_OPMAX bytes, in $dir"
  for name in $FSX_CONFIGS; do
    cfg=$LOG_DIR/fsx-$name.toml
    fsx_config "$name" >"$cfg"
    for seed in $seeds; do
      file=$dir/$name.$seed
      log=$LOG_DIR/fsx-$name-$seed.log
      mkdir -p "$LOG_DIR/fsx-$name-$seed.artifacts"
      t0=$SECONDS
      set +e
      timeout -k 10 "$FSX_TIMEOUT" fsx -f "$cfg" -N "$FSX_OPS" -S "$seed" \
        -P "$LOG_DIR/fsx-$name-$seed.artifacts" "$file" >"$log" 2>&1
      rc=$?
      set -e
      if [ "$rc" = 0 ] && grep -q 'All operations completed A-OK' "$log"; then
        printf 'fsx %-8s seed %-6s ok   (%ds)\n' "$name" "$seed" $((SECONDS - t0))
        passed=$((passed + 1))
        rm -f "$file"
        rm -rf "$LOG_DIR/fsx-$name-$seed.artifacts"
        continue
      fi
      [ "$rc" = 124 ] && echo "(timed out after ${FSX_TIMEOUT}s)" >>"$log"
      printf 'fsx %-8s seed %-6s FAILED (exit %s, %ds)\n' "$name" "$seed" "$rc" $((SECONDS - t0))
      if grep -q 'LOG DUMP' "$log"; then
        echo "---- what fsx found (before its LOG DUMP):"
        awk '/LOG DUMP/ { exit } { print "    " $0 }' "$log" | head -n 60
        echo "---- the last (up to $FSX_TAIL) operations, from $log:"
        awk 'd { print "    " $0 } /LOG DUMP/ { d = 1 }' "$log" | tail -n "$FSX_TAIL"
      else
        echo "---- last $FSX_TAIL lines of $log:"
        tail -n "$FSX_TAIL" "$log" | sed 's/^/    /'
      fi
      echo "---- reproduce: fsx -f $cfg -N $FSX_OPS -S $seed -P $LOG_DIR/fsx-$name-$seed.artifacts $file"
      echo "---- file under test kept: $file; expected contents: $LOG_DIR/fsx-$name-$seed.artifacts/$(basename "$file").fsxgood"
      failed+=("$name/seed=$seed")
    done
  done
  if [ ${#failed[@]} -eq 0 ]; then
    rmdir "$dir" 2>/dev/null || true
    echo "fsx: $passed runs passed"
    return 0
  fi
  echo "fsx: ${#failed[@]} of $((passed + ${#failed[@]})) runs FAILED: ${failed[*]}"
  return 1
}

# ---------------------------------------------------------------------- pjdfstest

run_pjdfstest() {
  local dir sec cfg log rc summary u2 g1 g2 f n
  dir=$(mktemp -d "$MNT/pjd.XXXXXX") || die "cannot create a directory in $MNT"
  chmod 0755 "$dir"   # the tests switch to unprivileged users, who must reach it
  # Socket tests bind(2) at DIR/.tmpXXXXXX/.tmpXXXXXX/<32 chars>/file, and sun_path
  # holds 107 bytes: a longer DIR fails them with ENAMETOOLONG, whatever the filesystem.
  if [ ${#dir} -gt 44 ]; then
    rm -rf "$dir"
    die "the mount path is too long for pjdfstest's socket tests ($dir: ${#dir} > 44 characters); mount somewhere shorter"
  fi
  # A directory on another filesystem, for the EXDEV tests of link and rename.
  local base
  for base in ${PJDFSTEST_SECONDARY:-/tmp /dev/shm /var/tmp}; do
    [ -d "$base" ] && [ "$(stat -c %d "$base")" != "$(stat -c %d "$dir")" ] && break
    base=
  done
  [ -n "$base" ] || die "no directory on another filesystem than $MNT for pjdfstest's EXDEV tests (set PJDFSTEST_SECONDARY)"
  sec=$(mktemp -d "$base/pjdfstest-secondary.XXXXXX")
  chmod 0755 "$sec"
  cfg=$LOG_DIR/pjdfstest.toml
  log=$LOG_DIR/pjdfstest.log

  # Two unprivileged users, each with its own primary group: nobody, and `tests` if it
  # exists (the suite's default) or else `daemon` (present on every Debian system).
  getent passwd nobody >/dev/null || die "pjdfstest needs the user nobody"
  g1=$(id -gn nobody)
  if getent passwd tests >/dev/null; then u2=tests; else u2=daemon; fi
  getent passwd "$u2" >/dev/null || die "pjdfstest needs a second unprivileged user (tests or daemon)"
  g2=$(id -gn "$u2")
  {
    echo "# generated by scripts/exercisers.sh"
    echo "[features]"
    for f in $PJDFSTEST_FEATURES; do echo "$f = {}"; done
    echo
    echo "[settings]"
    echo "naptime = $PJDFSTEST_NAPTIME"
    echo "allow_remount = false"
    printf 'expected_failures = ['
    n=0
    for f in $PJDFSTEST_EXPECTED_FAILURES; do
      [ $n = 0 ] || printf ', '
      printf '"%s"' "$f"
      n=1
    done
    echo "]"
    echo
    echo "[dummy_auth]"
    echo "entries = [[\"nobody\", \"$g1\"], [\"$u2\", \"$g2\"]]"
  } >"$cfg"

  step "pjdfstest: in $dir (secondary filesystem $sec), features [$PJDFSTEST_FEATURES], config $cfg"
  set +e
  # shellcheck disable=SC2086 # PJDFSTEST_PATTERNS is a list of patterns
  (cd "$dir" && NO_COLOR=1 CLICOLOR=0 RUST_BACKTRACE=0 RUST_LIB_BACKTRACE=0 timeout -k 10 "$PJDFSTEST_TIMEOUT" \
    pjdfstest -c "$cfg" -p "$dir" -s "$sec" $PJDFSTEST_PATTERNS) >"$log" 2>&1
  rc=$?
  set -e
  rm -rf "$sec"
  summary=$(grep -E '^Summary: ' "$log" | tail -n 1 || true)

  # Each failure is a "NAME   FAILED" line followed by its panic message (first line
  # tab-indented, then e.g. "  left: ..." / " right: ..."), up to the next test's line.
  if grep -qE ' (FAILED|PASSED UNEXPECTEDLY)$' "$log"; then
    echo "pjdfstest failures:"
    awk '/ (FAILED|PASSED UNEXPECTEDLY)$/ { show = 1; sub(/ +/, " "); print "  " $0; next }
         / (ok|skipped|failed as expected)$/ || /^Summary: / || /^Backtrace:/ { show = 0 }
         show && NF { sub(/^\t/, ""); print "      " $0 }' "$log"
  fi
  if [ "$rc" = 0 ] && [ -n "$summary" ] && ! grep -qE '^Summary: .* 0 passed' "$log"; then
    echo "pjdfstest: ok: $summary"
    rm -rf "$dir"
    return 0
  fi
  [ "$rc" = 124 ] && echo "pjdfstest: timed out after ${PJDFSTEST_TIMEOUT}s"
  if grep -qE '^Summary: .* 0 passed' "$log"; then
    echo "pjdfstest: no test passed (PJDFSTEST_PATTERNS='$PJDFSTEST_PATTERNS' matched nothing, or everything was skipped)"
  fi
  if [ -z "$summary" ]; then
    echo "pjdfstest: exited $rc without a summary; last lines of $log:"
    tail -n 30 "$log" | sed 's/^/    /'
  fi
  echo "pjdfstest: FAILED (exit $rc): ${summary:-no summary}; full log $log; test directory kept: $dir"
  return 1
}

status=0
if [ "$RUN_FSX" = 1 ]; then run_fsx || status=1; fi
if [ "$RUN_PJD" = 1 ]; then run_pjdfstest || status=1; fi
if [ "$RUN_SQL" = 1 ]; then
  step "sqlite: WAL and rollback journal, synchronous=FULL (scripts/sqlite-check.py)"
  command -v python3 >/dev/null || die "python3 is needed for the SQLite check"
  python3 "$(dirname "$0")/sqlite-check.py" "$MNT" "${SQLITE_TXNS:-300}" || status=1
fi
if [ "$status" = 0 ]; then
  echo "exercisers: all passed ($EXERCISERS); logs in $LOG_DIR"
else
  echo "exercisers: FAILED ($EXERCISERS); logs in $LOG_DIR" >&2
fi
exit "$status"
