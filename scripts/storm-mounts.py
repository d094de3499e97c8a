#!/usr/bin/env python3
"""Create, then unlink, empty files from many processes: into ONE directory through
several mounts of a cluster, then into a directory per process through one mount.

    DEV_ARGS="--metrics-port 9400" bash scripts/with-dev-mount.sh \\
        python3 scripts/storm-mounts.py [--mounts 4] [--workers 16] [--files 150]

One Linux mount lets one create or unlink into a directory at a time (the directory's
lock in the VFS), so writers of one directory on several hosts are played by several
mounts. Prints creates/s and unlinks/s of each shape and, when the nodes serve metrics
on PORT+1..PORT+6 (`--metrics-port PORT`, `--metrics-port` below), how many writes
shared a partition's batch (decision 0033). The extra mounts are `shingle mount`
processes of $SHINGLE_BIN (default: target/release/shingle) with the cluster file and
secret in $SHINGLE_DATA; they are unmounted at the end.
"""
import argparse
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def work(d, tag, files, barrier):
    barrier.wait()
    for k in range(files):
        os.close(os.open(f"{d}/{tag}-{k}", os.O_CREAT | os.O_WRONLY, 0o644))
    barrier.wait()
    for k in range(files):
        os.unlink(f"{d}/{tag}-{k}")


def storm(dirs, files):
    """Runs one worker process per entry of `dirs`; returns (creates/s, unlinks/s)."""
    barrier = mp.Barrier(len(dirs) + 1)
    ps = [mp.Process(target=work, args=(d, f"w{i}", files, barrier)) for i, d in enumerate(dirs)]
    for p in ps:
        p.start()
    barrier.wait()
    t0 = time.time()
    barrier.wait()
    t1 = time.time()
    for p in ps:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"storm-mounts: a worker failed ({p.exitcode})")
    t2 = time.time()
    n = len(dirs) * files
    return n / (t1 - t0), n / (t2 - t1)


def batches(port):
    """Sums (batches, writes they carried) over the six nodes' metrics."""
    b = w = 0
    for i in range(1, 7):
        text = urllib.request.urlopen(f"http://127.0.0.1:{port + i}/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith("shingle_meta_batches_total "):
                b += int(float(line.split()[1]))
            elif line.startswith("shingle_meta_batch_writes_total "):
                w += int(float(line.split()[1]))
    return b, w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mounts", type=int, default=4)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--files", type=int, default=150)
    ap.add_argument("--metrics-port", type=int, default=None, help="the dev cluster's --metrics-port")
    a = ap.parse_args()
    mnt, data = os.environ["SHINGLE_MNT"], os.environ["SHINGLE_DATA"]
    binary = os.environ.get("SHINGLE_BIN", os.path.join(ROOT, "target/release/shingle"))
    tmp = tempfile.mkdtemp(prefix="shingle-mounts.")
    extra, procs = [], []
    try:
        for i in range(a.mounts):
            m = os.path.join(tmp, f"m{i}")
            os.mkdir(m)
            log = open(os.path.join(tmp, f"m{i}.log"), "w")
            procs.append(subprocess.Popen(
                [binary, "mount", "--cluster-file", f"{data}/cluster.toml", "--secret-file", f"{data}/secret", m],
                stdout=log, stderr=subprocess.STDOUT))
            extra.append(m)
        deadline = time.time() + 60
        while not all(mounted(m) for m in extra):
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                sys.exit(f"storm-mounts: the extra mounts did not come up (logs in {tmp})")
            time.sleep(0.2)
        shared = "storm-shared"
        os.mkdir(f"{mnt}/{shared}")
        time.sleep(1.5)  # the other mounts' negative entry for the name (1 s) runs out
        rows = []
        before = batches(a.metrics_port) if a.metrics_port else None
        dirs = [f"{extra[i % a.mounts]}/{shared}" for i in range(a.workers)]
        rows.append((f"one directory, {a.mounts} mounts", storm(dirs, a.files)))
        mid = batches(a.metrics_port) if a.metrics_port else None
        own = []
        for i in range(a.workers):
            os.mkdir(f"{mnt}/storm-own-{i}")
            own.append(f"{mnt}/storm-own-{i}")
        rows.append((f"{a.workers} directories, 1 mount", storm(own, a.files)))
        after = batches(a.metrics_port) if a.metrics_port else None
        print(f"# {a.workers} processes x {a.files} empty files: create all, then unlink all")
        for i, (name, (c, u)) in enumerate(rows):
            line = f"{name:28} creates/s {c:8.0f}   unlinks/s {u:8.0f}"
            if before:
                (b0, w0), (b1, w1) = [(before, mid), (mid, after)][i]
                line += f"   writes per batch {(w1 - w0) / max(1, b1 - b0):.2f}"
            print(line)
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
