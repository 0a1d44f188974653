#!/usr/bin/env python3
"""Render hora-bench JSON into the PNG figures of docs/benchmarks.md and docs/scaling.md.

usage: plot.py DATA_DIR [OUT_DIR]        (OUT_DIR defaults to this folder, docs/figures)

DATA_DIR holds what tests/multinode/bench.sh writes (LAYOUT_small.json and LAYOUT_large.json for
the layouts 1x2, 2x2 and 3x1: NODESxRANKS_PER_NODE; LAYOUT.txt with the link rate) and,
optionally, ckpt_*.json from `hora-bench ckpt --json`. Figures:

  allreduce_1x2.png   one node, 2 ranks: shm vs MPI_Allreduce, busbw against size
  allreduce_2x2.png   2 nodes x 2 ranks, and allreduce_3x1.png, 3 nodes x 1 rank: ring, hier,
                      auto and MPI_Allreduce; the y axis is the link busbw, algbw * 2(k-1)/k for
                      k nodes (the bytes each node's link must carry per second), drawn against
                      the link rate and TCP's ceiling on it (1448 / 1514 of the rate)
  ckpt_stall.png      hora_ckpt_save's stall against a synchronous write + fsync, per state size
  scaling.png         written by scaling.py (the model's projection), not here

and prints, per layout, the Markdown table of docs/benchmarks.md: time per call and link busbw
of every algorithm per size, auto / MPI_Allreduce, and hier's link busbw as a share of the rate.

Needs matplotlib (a venv: python3 -m venv v && v/bin/pip install matplotlib)."""
import glob
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {"ring": ("tab:blue", "o"), "hier": ("tab:green", "s"), "auto": ("tab:red", "^"),
         "mpi": ("black", "x"), "shm": ("tab:purple", "D")}
TCP_PAYLOAD = 1448 / 1514  # TCP payload per Ethernet frame at MTU 1500 (timestamps on)


def load_rows(data, layout):
    rows = []
    for part in ("small", "large"):
        path = os.path.join(data, f"{layout}_{part}.json")
        if os.path.exists(path):
            with open(path) as f:
                rows += [json.loads(line) for line in f if line.strip()]
    return rows


def link_rate_gbs(data, layout):
    """The link rate in GB/s from the nodes.sh line in LAYOUT.txt, or None (one node)."""
    path = os.path.join(data, f"{layout}.txt")
    if not os.path.exists(path):
        return None
    m = re.search(r"links (\d+(?:\.\d+)?)(k|m|g)?bit", open(path).read())
    if not m:
        return None
    return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9, None: 1}[m.group(2)] / 8 / 1e9


def algbw(r):
    """GB/s from the exact time (the JSON's algbw_gbs is rounded to 4 decimals)."""
    return r["bytes"] / r["time_us"] / 1e3


def size_label(b):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b // div} {unit}"
    return f"{b} B"


def plot_allreduce(data, out, layout):
    rows = load_rows(data, layout)
    if not rows:
        return None
    nodes = int(layout.split("x")[0])
    link = link_rate_gbs(data, layout) if nodes > 1 else None
    ranks = nodes * int(layout.split("x")[1])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for algo in ("ring", "hier", "shm", "auto", "mpi"):
        pts = sorted((r["bytes"], r) for r in rows if r["algo"] == algo)
        if not pts:
            continue
        x = [b for b, _ in pts]
        if link:  # per-node link traffic: an allreduce moves 2(k-1)/k x bytes through each link
            y = [algbw(r) * 2 * (nodes - 1) / nodes for _, r in pts]
        else:
            y = [algbw(r) * 2 * (ranks - 1) / ranks for _, r in pts]
        color, marker = STYLE[algo]
        ax.plot(x, y, marker=marker, color=color, label="MPI_Allreduce" if algo == "mpi" else f"hora {algo}")
    if link:
        ax.axhline(link, color="gray", linestyle="--", label=f"link rate {link:.3f} GB/s")
        ax.axhline(link * TCP_PAYLOAD, color="gray", linestyle=":", label="TCP payload ceiling")
        ax.set_ylabel("link busbw = algbw x 2(k-1)/k (GB/s)")
    else:
        ax.set_ylabel("busbw = algbw x 2(n-1)/n (GB/s)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [b for b in sorted({r["bytes"] for r in rows}) if (b.bit_length() - 1) % 2 == 0]
    ax.set_xticks(ticks)
    ax.set_xticklabels([size_label(b) for b in ticks], rotation=45, ha="right")
    ax.set_xlabel("message size")
    where = f"{nodes} emulated nodes x {ranks // nodes} rank(s)" if nodes > 1 else f"one node, {ranks} ranks"
    ax.set_title(f"hora-bench allreduce, float32 sum, {where}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, f"allreduce_{layout}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_table(data, layout):
    rows = load_rows(data, layout)
    if not rows:
        return
    nodes = int(layout.split("x")[0])
    link = link_rate_gbs(data, layout) if nodes > 1 else None
    algos = [a for a in ("ring", "hier", "shm", "auto", "mpi") if any(r["algo"] == a for r in rows)]
    by = {(r["bytes"], r["algo"]): r for r in rows}
    f = 2 * (nodes - 1) / nodes if link else None
    unit = "link busbw GB/s" if link else "busbw GB/s"
    best = "hier" if "hier" in algos else "ring" if "ring" in algos else "shm"
    head = ["size"] + [f"{a} ms / {unit}" for a in algos] + ["auto / mpi"]
    if link:
        head.append(f"{best} / link rate")
    print(f"\n{layout} ({nodes} node(s) x {layout.split('x')[1]} rank(s))\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for b in sorted({r["bytes"] for r in rows}):
        cells = [size_label(b)]
        for a in algos:
            r = by.get((b, a))
            bw = (algbw(r) * f if link else r["busbw_gbs"]) if r else None
            cells.append(f"{r['time_us'] / 1e3:.2f} / {bw:.3f}" if r else "")
        au, mp = by.get((b, "auto")), by.get((b, "mpi"))
        cells.append(f"{mp['time_us'] / au['time_us']:.2f}" if au and mp else "")
        if link:
            r = by.get((b, best))
            cells.append(f"{algbw(r) * f / link * 100:.0f}%" if r else "")
        print("| " + " | ".join(cells) + " |")


def plot_ckpt(data, out):
    rows = []
    for p in sorted(glob.glob(os.path.join(data, "ckpt_*.json"))):
        with open(p) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    if not rows:
        return None
    rows.sort(key=lambda r: r["state_mib"])
    labels = [f"{r['state_mib']} MiB" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    w = 0.38
    ax.bar([i - w / 2 for i in x], [r["sync_write_ms"] for r in rows], w, color="gray", label="write + fsync (sync save)")
    ax.bar([i + w / 2 for i in x], [r["async_stall_ms"] for r in rows], w, color="tab:green", label="hora_ckpt_save stall")
    for i, r in zip(x, rows):
        ax.text(i + w / 2, r["async_stall_ms"], f"{r['stall_ratio']:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels)
    ax.set_ylabel("time the training loop waits (ms)")
    ax.set_xlabel("checkpoint state")
    ax.set_title("Checkpoint stall (hora-bench ckpt), median of repetitions")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out, "ckpt_stall.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main():
    if len(sys.argv) not in (2, 3) or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) == 2 else 2
    data = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.dirname(os.path.abspath(__file__))
    if not os.path.isdir(data):
        print(f"plot.py: {data}: not a directory", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    made = [plot_allreduce(data, out, layout) for layout in ("1x2", "2x2", "3x1")] + [plot_ckpt(data, out)]
    made = [m for m in made if m]
    if not made:
        print(f"plot.py: no hora-bench JSON in {data}", file=sys.stderr)
        return 1
    for m in made:
        print(m)
    for layout in ("2x2", "3x1", "1x2"):
        print_table(data, layout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
