#!/usr/bin/env python3
"""Create, then unlink, files from several threads in ONE directory of a mount.

    bash scripts/with-dev-mount.sh python3 scripts/storm-one-dir.py [THREADS] [FILES_EACH]

Prints creates/s and unlinks/s. (`shingle bench mutate`'s storm gives each thread a
directory of its own; this is the shared-directory shape.)
"""
import os, sys, time, threading
mnt = os.environ["SHINGLE_MNT"]
threads = int(sys.argv[1]) if len(sys.argv) > 1 else 8
per = int(sys.argv[2]) if len(sys.argv) > 2 else 150
d = os.path.join(mnt, "storm")
os.mkdir(d)
def work(t, verb):
    for i in range(per):
        p = os.path.join(d, f"t{t}-{i}")
        if verb == "create":
            os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
        else:
            os.unlink(p)
for verb in ("create", "unlink"):
    ts = [threading.Thread(target=work, args=(t, verb)) for t in range(threads)]
    t0 = time.time()
    for t in ts: t.start()
    for t in ts: t.join()
    dt = time.time() - t0
    print(f"{verb}: {threads} threads x {per} in one directory: {threads*per/dt:.0f}/s")
