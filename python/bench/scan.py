"""The DataLoader shape through the Python package, the FUSE mount and a local folder,
one after the other in one run: N files of 2 MiB written, then read whole by T threads
(page cache dropped before each read pass), and opens of an unchanged file.

    bash scripts/bench-python.sh            # a fresh `shingle dev` cluster and mount
    python bench/scan.py --mount M --local D --cluster-file F --secret-file S

Prints a Markdown table (MB/s and per-operation p50 in µs)."""

import argparse
import concurrent.futures as cf
import os
import shutil
import statistics
import time

import numpy as np

import shingle


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def timed_pass(paths, threads, read_one):
    drop_caches()
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(threads) as ex:
        total = sum(ex.map(read_one, paths))
    return total / (time.perf_counter() - t0) / 1e6


def p50_us(fn, n):
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True)
    ap.add_argument("--local", required=True)
    ap.add_argument("--cluster-file", required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--files", type=int, default=256)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--file-mib", type=int, default=2)
    a = ap.parse_args()

    c = shingle.Client(a.cluster_file, a.secret_file)
    size = a.file_mib << 20
    blob = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8).tobytes()
    c.makedirs("/bench-scan", exist_ok=True)
    os.makedirs(a.local, exist_ok=True)
    names = [f"{i:05}.bin" for i in range(a.files)]
    rows = []

    # Writes: create + write + close (durable when close returns) of every file.
    t0 = time.perf_counter()
    for n in names:
        with open(os.path.join(a.local, n), "wb") as f:
            f.write(blob)
            os.fsync(f.fileno())
    local_w = a.files * size / (time.perf_counter() - t0) / 1e6
    t0 = time.perf_counter()
    for n in names:
        c.write_bytes(f"/bench-scan/{n}", blob)
    py_w = a.files * size / (time.perf_counter() - t0) / 1e6
    os.makedirs(os.path.join(a.mount, "bench-scan-fuse"), exist_ok=True)
    t0 = time.perf_counter()
    for n in names:
        with open(os.path.join(a.mount, "bench-scan-fuse", n), "wb") as f:
            f.write(blob)
    fuse_w = a.files * size / (time.perf_counter() - t0) / 1e6
    rows.append(("create + write + close, one thread, MB/s", local_w, fuse_w, py_w))

    def read_local(n):
        with open(os.path.join(a.local, n), "rb") as f:
            return len(f.read())

    def read_fuse(n):
        with open(os.path.join(a.mount, "bench-scan", n), "rb") as f:
            return len(f.read())

    def read_py(n):
        return len(c.read_buffer(f"/bench-scan/{n}"))

    buf = np.empty(size, dtype=np.uint8)

    def readinto_py(n):
        with c.open(f"/bench-scan/{n}", "rb") as f:
            return f.readinto(buf)

    rows.append((f"scan, {a.threads} threads, MB/s", *(timed_pass(names, a.threads, r) for r in (read_local, read_fuse, read_py))))
    rows.append(("scan, 1 thread, MB/s", *(timed_pass(names, 1, r) for r in (read_local, read_fuse, read_py))))
    drop_caches()
    t0 = time.perf_counter()
    for n in names:
        readinto_py(n)
    rows.append(("scan, 1 thread, `readinto` one numpy array, MB/s", float("nan"), float("nan"),
                 a.files * size / (time.perf_counter() - t0) / 1e6))

    # One thread reading in order while the next 8 files are prefetched.
    drop_caches()
    t0 = time.perf_counter()
    for i, n in enumerate(names):
        c.prefetch([f"/bench-scan/{m}" for m in names[i + 1 : i + 9]])
        read_py(n)
    rows.append(("scan, 1 thread + `prefetch` of the next 8, MB/s", float("nan"), float("nan"),
                 a.files * size / (time.perf_counter() - t0) / 1e6))

    n0 = names[0]
    lp = os.path.join(a.local, n0)
    fp = os.path.join(a.mount, "bench-scan", n0)
    rows.append(("open + close of an unchanged file, p50 µs",
                 p50_us(lambda: open(lp, "rb").close(), 300),
                 p50_us(lambda: open(fp, "rb").close(), 300),
                 p50_us(lambda: c.open(f"/bench-scan/{n0}", "rb").close(), 300)))
    rows.append(("stat, p50 µs",
                 p50_us(lambda: os.stat(lp), 300),
                 p50_us(lambda: os.stat(fp), 300),
                 p50_us(lambda: c.stat(f"/bench-scan/{n0}"), 300)))

    print(f"| {a.files} files × {a.file_mib} MiB | local folder | FUSE mount | Python package |")
    print("|---|---|---|---|")
    for what, *vals in rows:
        cells = ["—" if v != v else (f"{v:,.0f}" if v >= 10 else f"{v:.1f}") for v in vals]
        print(f"| {what} | " + " | ".join(cells) + " |")
    shutil.rmtree(a.local, ignore_errors=True)


if __name__ == "__main__":
    main()
