#!/usr/bin/env python3
"""hora checkpoints load with Python's `safetensors` package, with the same values.

    check_safetensors.py CKPT_WRITE_DTYPES

Runs the writer (tests/ckpt/ckpt_write_dtypes.c) into a temporary directory, then loads the
file with safetensors.safe_open(framework="numpy") (every dtype numpy has) and safetensors.deserialize (raw bytes, for
bfloat16), and checks values, shapes, dtypes and the metadata. Exits 77 without safetensors."""
import json
import os
import subprocess
import sys
import tempfile
import zlib

try:
    import numpy as np
    import safetensors
except ImportError as e:
    print(f"skipped: {e} (pip install -r tests/python/requirements.txt)")
    sys.exit(77)

ERRORS = []


def check(cond, msg):
    if not cond:
        ERRORS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


def main():
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([sys.argv[1], d], capture_output=True, text=True)
        check(out.returncode == 0, f"writer failed: {out.stderr}")
        path = out.stdout.strip()
        n = 1000
        i = np.arange(n, dtype=np.int64)
        want = {
            "u8": (i % 251).astype(np.uint8),
            "i8": (i % 256 - 128).astype(np.int8),
            "i32": (i * 7919 - 1000000).astype(np.int32),
            "i64": i * 1099511627791 - 5,
            "f16": (0x3C00 + i % 1024).astype(np.uint16).view(np.float16),
            "f32": i.astype(np.float32) * np.float32(0.25) - np.float32(100.0),
            "f64": i.astype(np.float64) * 0.5 - 1e6,
            "layer/w": np.arange(12, dtype=np.float32).reshape(3, 4),
        }
        got = {}
        with safetensors.safe_open(path, framework="numpy") as f:
            keys = list(f.keys())
            meta = f.metadata()
            for k in keys:
                if k != "bf16":  # numpy has no bfloat16
                    got[k] = f.get_tensor(k)
        check(sorted(keys) == sorted(list(want) + ["bf16"]), f"tensor names {sorted(keys)}")
        for name, w in want.items():
            g = got.get(name)
            check(g is not None and g.dtype == w.dtype and g.shape == w.shape, f"{name}: {None if g is None else (g.dtype, g.shape)}")
            if g is not None:
                check(np.array_equal(g.view(np.uint8), w.view(np.uint8)), f"{name}: values differ")
        # bfloat16 has no numpy dtype: read the raw bytes through safetensors' own parser.
        raw = dict(safetensors.deserialize(open(path, "rb").read()))
        bf = raw["bf16"]
        check(bf["dtype"] == "bfloat16" or bf["dtype"] == "BF16", f"bf16 dtype {bf['dtype']}")
        check(list(bf["shape"]) == [n], f"bf16 shape {bf['shape']}")
        bits = np.frombuffer(bytes(bf["data"]), dtype=np.uint16)
        check(np.array_equal(bits, (0x3F80 + i % 128).astype(np.uint16)), "bf16: values differ")
        as_f32 = (bits.astype(np.uint32) << 16).view(np.float32)
        check(as_f32[0] == 1.0 and as_f32[1] > 1.0, "bf16 as float32")
        check(meta.get("epoch") == "3" and meta.get("note") == 'hello "world"', f"user metadata {meta}")
        check(meta.get("hora.step") == "42" and meta.get("hora.format") == "hora-ckpt", f"hora metadata {meta}")
        # The CRC32C of f32 in __metadata__ is the tensor's (checked with a reference CRC32C).
        crc = crc32c(got["f32"].tobytes())
        check(meta.get("hora.crc32c.f32") == f"{crc:08x}", f"crc32c of f32: {meta.get('hora.crc32c.f32')} vs {crc:08x}")
        man = json.load(open(os.path.join(os.path.dirname(path), "manifest.json")))
        check(man["step"] == 42 and man["file_bytes"] == os.path.getsize(path), f"manifest {man}")
        check(man["file_crc32c"] == f"{crc32c(open(path, 'rb').read()):08x}", "manifest file_crc32c")
    print(f"test_ckpt_safetensors: {'FAILED' if ERRORS else 'passed'} ({len(ERRORS)} errors)")
    return 1 if ERRORS else 0


def crc32c(data):
    """Bitwise reference CRC32C (Castagnoli, reflected 0x82F63B78), independent of hora's."""
    tbl = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        tbl.append(c)
    c = 0xFFFFFFFF
    for b in data:
        c = tbl[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


if __name__ == "__main__":
    sys.exit(main())
