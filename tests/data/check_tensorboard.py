#!/usr/bin/env python3
"""Reads hora's TensorBoard event file back with the tensorboard package (EventAccumulator) and
checks tags, steps and values. Usage: check_tensorboard.py TB_WRITER FAKE_NVML_LIB.
Exits 77 (skipped) when the tensorboard package is not installed."""
import math
import os
import subprocess
import sys
import tempfile

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    print("tensorboard is not installed (pip install tensorboard): skipped")
    sys.exit(77)

errors = 0


def expect(cond, msg):
    global errors
    if not cond:
        errors += 1
        print("FAIL:", msg)


with tempfile.TemporaryDirectory(prefix="hora-tb-") as d:
    subprocess.run([sys.argv[1], d, sys.argv[2]], check=True)
    files = [f for f in os.listdir(d) if f.startswith("events.out.tfevents.")]
    expect(len(files) == 1, f"one event file expected, found {files}")
    acc = EventAccumulator(d, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    want_tags = {"train/loss", "train/lr", "big/step"}
    for g in (0, 1):
        for m in ("sm_util_pct", "mem_util_pct", "fb_used_mib", "power_w", "temp_c", "sm_clock_mhz"):
            want_tags.add(f"gpu{g}/{m}")
    expect(tags == want_tags, f"tags {sorted(tags)} != {sorted(want_tags)}")

    def close(a, b):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=0)  # float32 storage

    loss = acc.Scalars("train/loss")
    expect([e.step for e in loss] == list(range(50)), f"loss steps {[e.step for e in loss]}")
    for e in loss:
        expect(close(e.value, 1.0 / (e.step + 1)), f"loss at {e.step}: {e.value}")
    lr = acc.Scalars("train/lr")
    expect([e.step for e in lr] == [0, 10, 20, 30, 40], f"lr steps {[e.step for e in lr]}")
    for e in lr:
        expect(close(e.value, 0.1 * 0.5 ** (e.step // 10)), f"lr at {e.step}: {e.value}")
    big = acc.Scalars("big/step")
    expect([e.step for e in big] == [1 << 40, (1 << 40) + 1], f"big steps {[e.step for e in big]}")
    expect(all(close(e.value, float(e.step)) for e in big), f"big values {[e.value for e in big]}")
    for g in (0, 1):
        p = acc.Scalars(f"gpu{g}/power_w")
        expect(len(p) == 1 and p[0].step == 0 and close(p[0].value, 50.0 + g), f"gpu{g} power {p}")
        s = acc.Scalars(f"gpu{g}/sm_util_pct")
        expect(len(s) == 1 and close(s[0].value, 10 + 20 * g), f"gpu{g} sm {s}")
        f = acc.Scalars(f"gpu{g}/fb_used_mib")
        expect(len(f) == 1 and close(f[0].value, 1000 + 100 * g), f"gpu{g} fb {f}")
    wall = [e.wall_time for e in loss]
    import time
    expect(all(abs(w - time.time()) < 600 for w in wall), "wall_time is not the current time")

print("check_tensorboard:", "FAILED" if errors else "passed", f"({errors} errors)")
sys.exit(1 if errors else 0)
