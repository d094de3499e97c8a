#!/usr/bin/env python3
"""Writes through a Shingle mount while two nodes of its cluster are killed.

    bash scripts/with-dev-mount.sh python3 scripts/write-kills.py [SECONDS] [BYTES]

A writer creates files of BYTES (default 4,300,000: one full 4+2 stripe of 1 MiB units
and a bit) with write + fsync + close in a loop for SECONDS (default 30); nodes 5 and 3
of the `shingle dev` cluster (not the manager, node 1) are killed with SIGKILL 6 s and
14 s in. Prints writes, failures and the slowest writes (with where their time went:
open, write, fsync, close), then reads every acknowledged file back. Exits 1 if a
write failed or a file differs. Needs $SHINGLE_MNT and $SHINGLE_DATA (with-dev-mount.sh
sets them).
"""
import os
import signal
import sys
import threading
import time
import zlib

mnt, data = os.environ["SHINGLE_MNT"], os.environ["SHINGLE_DATA"]
secs = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
size = int(sys.argv[2]) if len(sys.argv) > 2 else 4_300_000
d = os.path.join(mnt, "write-kills")
os.makedirs(d, exist_ok=True)


def content(i, n):
    seed = ("%d-" % i).encode()
    return (seed * (n // len(seed) + 1))[:n]


def kill(node):
    want = os.path.join(data, "node%d" % node, "node.toml").encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and want in args:
            os.kill(int(pid), signal.SIGKILL)
            print("t=%.1fs killed node %d (pid %s)" % (time.time() - t0, node, pid), flush=True)
            return
    sys.exit("node %d not found" % node)


def killer():
    time.sleep(6)
    kill(5)
    time.sleep(8)
    kill(3)


t0 = time.time()
threading.Thread(target=killer, daemon=True).start()
res = []
i = 0
while time.time() - t0 < secs:
    n = size + (i * 4099) % 65536
    body = content(i, n)
    s = time.time()
    try:
        fd = os.open(os.path.join(d, "f%05d" % i), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        a = time.time()
        os.write(fd, body)
        b = time.time()
        os.fsync(fd)
        c = time.time()
        os.close(fd)
        e = time.time()
        res.append((i, n, s - t0, e - s, None, zlib.crc32(body), (a - s, b - a, c - b, e - c)))
    except OSError as err:
        res.append((i, n, s - t0, time.time() - s, err.strerror, 0, ()))
    i += 1

failed = [r for r in res if r[4]]
print("writes %d, failed %d, slowest %.0f ms" % (len(res), len(failed), 1000 * max(r[3] for r in res)))
for r in failed[:10]:
    print("  failed: file %d at t=%.1fs: %s" % (r[0], r[2], r[4]))
for r in sorted(res, key=lambda r: -r[3])[:5]:
    parts = " ".join("%s %.0f" % (k, 1000 * v) for k, v in zip(("open", "write", "fsync", "close"), r[6]))
    print("  slow: file %d at t=%.1fs took %.0f ms (%s)" % (r[0], r[2], 1000 * r[3], parts))
bad = 0
for r in res:
    if r[4] is None:
        got = open(os.path.join(d, "f%05d" % r[0]), "rb").read()
        bad += zlib.crc32(got) != r[5] or len(got) != r[1]
print("read back: %d of %d acknowledged files intact" % (len(res) - len(failed) - bad, len(res) - len(failed)))
sys.exit(1 if failed or bad else 0)
