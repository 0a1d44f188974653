#!/usr/bin/env python3
"""The alpha-beta scaling model of docs/scaling.md: fit, check against the measured rows, project.

usage: scaling.py DATA_DIR [OUT_DIR]     (DATA_DIR: what tests/multinode/bench.sh wrote)

Prints the Markdown tables of docs/scaling.md and writes OUT_DIR/scaling.png (default: this
folder). Every constant that is not fitted is named below with where it comes from.

Model (N bytes per rank, float32):
  one level, k members, ring:      t = 2(k-1) a + 2(k-1)/k N b
  shared memory, one node:         t = a_s + N b_s                    (fit: 1x2 shm rows)
  emulated link, one rank a node:  t = 2(k-1) a_n + 2(k-1)/k N b_n    (fit: 3x1 ring rows)
  predicted, not fitted:
    2x2 hier  = shm part (a_s + N b_s) + per shm piece (HORA_SHM_CHUNK_BYTES, 1 MiB) one ring
                across the k = 2 leaders: 2(k-1) a_n P + 2(k-1)/k N b_n (the node's link carries
                the L local rings' slices, N in all)
    2x2 ring  = flat ring of n = 4: 2(n-1) a_n + 2(n-1)/n N b_n (ranks 1->2 and 3->0 cross the
                links, each carrying 2(n-1)/n N)
The fits minimize the relative error of every row (least squares on t_model / t_measured - 1),
over sizes >= 64 KiB (below, a loaded 2-core machine's scheduling dominates)."""
import json
import math
import os
import sys

import numpy as np

CHUNK = 1 << 20  # HORA_SHM_CHUNK_BYTES default (1 MiB) on nodes with no more ranks than CPUs
MIN_FIT = 64 << 10

# ---- projection constants (docs/scaling.md, "Assumptions") ----
# Gradients: parameters x 4 bytes (float32); torchvision parameter counts.
MODELS = {"ResNet-50": 25_557_032, "ResNet-101": 44_549_160}
# Compute per step and GPU. Horovod's own figure (docs/benchmarks.md of Horovod: ResNet-101,
# batch 64 per GPU, 16 Pascal GPUs, 1656.82 images/s in total) gives 103.6 images/s per P100.
# For current GPUs, NVIDIA's DeepLearningExamples ResNet-50 v1.5 (PyTorch, mixed precision,
# batch 256): about 2,700 images/s on an A100 80GB; H100 taken as 1.6x A100; ResNet-101 costs
# 7.8 / 4.1 GFLOPs per image the compute of ResNet-50.
R101_OVER_R50 = 7.8 / 4.1
GPUS = {  # name: (ResNet-50 images/s per GPU, batch per GPU)
    "P100": (103.6 * R101_OVER_R50, 64),
    "A100": (2700.0, 256),
    "H100": (2700.0 * 1.6, 256),
}
# Links, as nccl-tests reports them (busbw, GB/s) and per-step latency (s):
#   NVLink 3 (A100, NVSwitch, 8 GPUs): all_reduce busbw ~230 GB/s; NVLink 4 (H100): ~480 GB/s.
#   InfiniBand HDR 200 Gbit/s: ~24 GB/s busbw per NIC; NDR 400 Gbit/s: ~48 GB/s per NIC.
#   Horovod's 2018 cluster: PCIe within the node (~10 GB/s) and 25 Gbit/s RoCE (~2.9 GB/s).
CLUSTERS = [  # name, GPU, GPUs per node, intra busbw, NICs x inter busbw per NIC, a_intra, a_inter
    ("Horovod 2018: 4 P100/node, 25G RoCE", "P100", 4, 10.0, 1 * 2.9, 10e-6, 10e-6),
    ("8 A100/node NVLink3, 1x HDR 200G", "A100", 8, 230.0, 1 * 24.0, 5e-6, 6e-6),
    ("8 H100/node NVLink4, 1x NDR 400G", "H100", 8, 480.0, 1 * 48.0, 5e-6, 6e-6),
    ("8 H100/node NVLink4, 8x NDR 400G", "H100", 8, 480.0, 8 * 48.0, 5e-6, 6e-6),
]
SCALES = [8, 16, 32, 64, 128, 256, 512]
FWD_SHARE = 1 / 3  # forward pass share of compute; the allreduce overlaps the backward pass
# ... except for the gradients that become ready last (the first layers: conv1, layer1 and
# layer2 hold about 6% of ResNet-50's parameters): their allreduce always follows the backward pass.
TAIL_SHARE = 0.10


def load(data, layout):
    rows = []
    for part in ("small", "large"):
        p = os.path.join(data, f"{layout}_{part}.json")
        if os.path.exists(p):
            rows += [json.loads(line) for line in open(p) if line.strip()]
    return rows


def pick(rows, algo):
    return sorted((r["bytes"], r["time_us"] * 1e-6) for r in rows if r["algo"] == algo)


def fit_rel(rows, basis):
    """Least squares on relative error: t ~ sum_j c_j basis_j(N); returns c (non-negative)."""
    use = [(n, t) for n, t in rows if n >= MIN_FIT]
    a = np.array([[f(n) / t for f in basis] for n, t in use])
    c, *_ = np.linalg.lstsq(a, np.ones(len(use)), rcond=None)
    return np.maximum(c, 0.0)


def table(title, rows, model):
    out = [f"\n{title}\n", "| size | measured ms | model ms | error |", "|---|---|---|---|"]
    errs = []
    for n, t in rows:
        m = model(n)
        e = m / t - 1
        if n >= MIN_FIT:
            errs.append(abs(e))
        out.append(f"| {size_label(n)} | {t * 1e3:.2f} | {m * 1e3:.2f} | {e * 100:+.0f}% |")
    if errs:
        out.append(f"\nmedian |error| over sizes >= 64 KiB: {np.median(errs) * 100:.0f}%, "
                   f"max {max(errs) * 100:.0f}%")
    return "\n".join(out)


def size_label(b):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b // div} {unit}"
    return f"{b} B"


def hier_time(g, n, per_node, b_intra, b_inter, a_intra, a_inter):
    """Hierarchical allreduce of g bytes on n GPUs, per_node GPUs a node: ring inside the node
    (NVLink busbw b_intra GB/s), ring across the nodes (busbw b_inter GB/s per node)."""
    nodes = max(1, n // per_node)
    local = min(n, per_node)
    t = 2 * (local - 1) / local * g / (b_intra * 1e9) + 2 * (local - 1) * a_intra
    if nodes > 1:
        t += 2 * (nodes - 1) / nodes * g / (b_inter * 1e9) + 2 * (nodes - 1) * a_inter
    return t


def project():
    lines = ["\n| cluster | model | t_compute ms | " + " | ".join(f"{n} GPUs" for n in SCALES) + " |",
             "|---|---|---|" + "---|" * len(SCALES)]
    curves = []
    for name, gpu, per_node, bi, bx, ai, ax in CLUSTERS:
        r50_ips, batch = GPUS[gpu]
        for model, params in MODELS.items():
            if gpu == "P100" and model != "ResNet-101":
                continue
            ips = r50_ips if model == "ResNet-50" else r50_ips / R101_OVER_R50
            tc = batch / ips
            g = params * 4
            cells, effs = [], []
            for n in SCALES:
                tm = hier_time(g, n, per_node, bi, bx, ai, ax)
                eff_serial = tc / (tc + tm)
                tb = tc * (1 - FWD_SHARE)
                exposed = max(0.0, tm * (1 - TAIL_SHARE) - tb) + tm * TAIL_SHARE
                eff_overlap = tc / (tc + exposed)
                effs.append((eff_serial, eff_overlap))
                cells.append(f"{eff_serial * 100:.0f}-{eff_overlap * 100:.0f}% ({tm * 1e3:.1f} ms)")
            lines.append(f"| {name} | {model} | {tc * 1e3:.0f} | " + " | ".join(cells) + " |")
            curves.append((f"{model}, {name}", effs))
    return "\n".join(lines), curves


def plot(curves, out):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("scaling.py: no matplotlib: scaling.png not written", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for i, (label, effs) in enumerate(curves):
        color = f"C{i}"
        ax.fill_between(SCALES, [e[0] * 100 for e in effs], [e[1] * 100 for e in effs], color=color, alpha=0.2)
        ax.plot(SCALES, [e[1] * 100 for e in effs], color=color, marker="o", label=label)
        ax.plot(SCALES, [e[0] * 100 for e in effs], color=color, linestyle="--")
    ax.plot([512], [90], marker="*", markersize=14, color="black", linestyle="none",
            label="Horovod published: ResNet-101, 512 P100, 90%")
    ax.set_xscale("log", base=2)
    ax.set_xticks(SCALES)
    ax.set_xticklabels([str(s) for s in SCALES])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_ylim(70, 101)
    ax.set_title("Projected scaling efficiency (solid: allreduce overlaps backward; dashed: no overlap)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scaling.png"), dpi=110)
    plt.close(fig)


def main():
    if len(sys.argv) not in (2, 3) or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) == 2 else 2
    data = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.dirname(os.path.abspath(__file__))
    shm = pick(load(data, "1x2"), "shm")
    ring3 = pick(load(data, "3x1"), "ring")
    rows22 = load(data, "2x2")
    if len(shm) < 2 or len(ring3) < 2 or not rows22:
        print(f"scaling.py: {data} lacks the 1x2 shm, 3x1 ring or 2x2 rows (run tests/multinode/bench.sh)",
              file=sys.stderr)
        return 1
    a_s, b_s = fit_rel(shm, [lambda n: 1.0, lambda n: float(n)])
    k = 3
    a_n, b_n = fit_rel(ring3, [lambda n: 2.0 * (k - 1), lambda n: 2.0 * (k - 1) / k * n])
    print("## Fitted terms\n")
    print("| level | fitted from | alpha (latency) | beta (per byte) | 1 / beta |")
    print("|---|---|---|---|---|")
    print(f"| shared memory, 2 ranks | 1x2 shm rows | {a_s * 1e6:.1f} us | {b_s * 1e12:.1f} ps/B | {1 / b_s / 1e9:.2f} GB/s |")
    print(f"| emulated link | 3x1 ring rows | {a_n * 1e6:.1f} us per step | {b_n * 1e12:.1f} ps/B | "
          f"{1 / b_n / 1e9:.3f} GB/s |")
    print(table("Fit, shared memory (1 node x 2 ranks, shm):", shm, lambda n: a_s + n * b_s))
    print(table("Fit, emulated link (3 nodes x 1 rank, ring):", ring3,
                lambda n: 2 * (k - 1) * a_n + 2 * (k - 1) / k * n * b_n))
    print(table("Predicted, not fitted (2 nodes x 2 ranks, hier):", pick(rows22, "hier"),
                lambda n: a_s + n * b_s + 2 * a_n * math.ceil(n / CHUNK) + n * b_n))
    print(table("Predicted, not fitted (2 nodes x 2 ranks, flat ring of 4):", pick(rows22, "ring"),
                lambda n: 6 * a_n + 1.5 * n * b_n))
    text, curves = project()
    print("\n## Projection (scaling efficiency without overlap - with overlap, and the allreduce time)")
    print(text)
    plot(curves, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
