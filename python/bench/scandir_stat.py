"""Listing with attributes against a stat per entry, through the Python package.

Run against a `shingle dev` cluster (after `bash scripts/python-tests.sh` made the
virtual environment)::

    bash scripts/with-dev-mount.sh target/python-venv/bin/python python/bench/scandir_stat.py [files]

It writes `files` (default 2,000) files of 100 bytes into /scan, then times, on the
same directory, ``scandir`` + ``Client.stat`` of each entry against ``scandir`` with
each entry's own ``stat()`` (the attributes the listing carried), three rounds.
"""

import os
import sys
import time

import shingle

files = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
data = os.environ["SHINGLE_DATA"]
c = shingle.Client(f"{data}/cluster.toml", f"{data}/secret")
c.makedirs("/scan", exist_ok=True)
for i in range(files):
    c.write_bytes(f"/scan/f{i:05}", b"x" * 100)
time.sleep(1.5)  # past the settling of /scan's counts
for rnd in range(3):
    t = time.perf_counter()
    apart = [c.stat(e.path, follow_symlinks=False).st_size for e in c.scandir("/scan")]
    t_apart = time.perf_counter() - t
    t = time.perf_counter()
    listed = [e.stat(follow_symlinks=False).st_size for e in c.scandir("/scan")]
    t_listed = time.perf_counter() - t
    assert apart == listed
    print(f"round {rnd}: scandir + stat per entry {t_apart:.3f} s, "
          f"scandir with its attributes {t_listed:.3f} s ({len(listed)} entries)")
