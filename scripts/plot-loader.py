#!/usr/bin/python3
"""Plots the JSON of `shingle bench loader --json F` as a PNG: scan throughput and
metadata latencies, local directory vs the Shingle mount.

usage: python3 scripts/plot-loader.py bench-loader.json loader.png
(needs matplotlib: apt install python3-matplotlib, or pip install matplotlib)
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    r = json.load(open(src))
    loc, shi = r["local"], r["shingle"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    a.bar(["local dir", "shingle"], [loc["scan_mb_s"], shi["scan_mb_s"]], color=["#999", "#2a7"])
    a.set_ylabel("MB/s")
    a.set_title(f"scan: {r['files']} x {r['file_mib']} MiB, {r['workers']} workers "
                f"(ratio {r['scan_ratio']:.2f})")
    ops = ["stat_us", "list_us", "open_us"]
    labels = ["stat", "listdir", "open+close"]
    x = range(len(ops))
    w = 0.2
    for i, (side, name, col) in enumerate([(loc, "local", "#999"), (shi, "shingle", "#2a7")]):
        b.bar([j + (i * 2) * w for j in x], [side[o][0] for o in ops], w, label=f"{name} p50", color=col)
        b.bar([j + (i * 2 + 1) * w for j in x], [side[o][1] for o in ops], w, label=f"{name} p99",
              color=col, alpha=0.5)
    b.set_xticks([j + 1.5 * w for j in x])
    b.set_xticklabels(labels)
    b.set_ylabel("µs")
    b.set_yscale("log")
    b.set_title("metadata storm latency")
    b.legend(fontsize=8)
    fig.suptitle(r.get("machine", ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
