#!/usr/bin/env python3
"""hora-records end to end. Usage: check_hora_records.py HORA_RECORDS synthetic|mnist [DATA_DIR]
synthetic: small IDX files (raw and gzip) made here -> convert-idx, count, verify, cat, and a
           corrupted shard that verify must name with its byte offset.
mnist:     the MNIST-digits subset under DATA_DIR/mnist-digits-10k (8000 train / 2000 test) and
           Fashion-MNIST from /usr/share/datasets/fashion-mnist when installed; exits 77 when
           neither is present."""
import gzip
import os
import struct
import subprocess
import sys
import tempfile

tool, mode = sys.argv[1], sys.argv[2]
errors = 0


def expect(cond, msg):
    global errors
    if not cond:
        errors += 1
        print("FAIL:", msg)


def run(*args, ok=True):
    p = subprocess.run([tool, *args], capture_output=True)
    if ok:
        expect(p.returncode == 0, f"{args}: exit {p.returncode}: {p.stderr.decode()}")
    return p


def write_idx(path, dims, data, gz):
    hdr = bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims)
    op = gzip.open if gz else open
    with op(path, "wb") as f:
        f.write(hdr + data)


def read_idx(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rb") as f:
        b = f.read()
    nd = b[3]
    dims = struct.unpack(">" + "I" * nd, b[4:4 + 4 * nd])
    return dims, b[4 + 4 * nd:]


def records_of(files):
    """Parse record files independently of hora (framing only; CRCs are hora-records' job)."""
    out = []
    for fn in files:
        b = open(fn, "rb").read()
        off = 0
        while off < len(b):
            (n,) = struct.unpack("<Q", b[off:off + 8])
            out.append(b[off + 12:off + 12 + n])
            off += 16 + n
    return out


def check_split(idx_dir, split, prefix, shards, out):
    imgs = [f for f in os.listdir(idx_dir) if f.startswith(prefix + "-images")]
    labs = [f for f in os.listdir(idx_dir) if f.startswith(prefix + "-labels")]
    (n, rows, cols), pix = read_idx(os.path.join(idx_dir, sorted(imgs)[0]))
    (nl,), lab = read_idx(os.path.join(idx_dir, sorted(labs)[0]))
    run("convert-idx", idx_dir, "--split", split, "--shards", str(shards), "--out", out)
    files = sorted(os.path.join(out, f) for f in os.listdir(out) if f.startswith(split + "-"))
    expect(len(files) == shards, f"{split}: {len(files)} shard files, want {shards}")
    expect(files and os.path.basename(files[0]) == f"{split}-00000-of-{shards:05d}.tfrecord", f"names {files[:1]}")
    c = run("count", *files)
    expect(c.stdout.decode().strip() == str(n), f"count {c.stdout!r}, want {n}")
    v = run("verify", *files)
    expect(v.stdout.decode().count("records OK") == shards, f"verify output {v.stdout!r}")
    recs = records_of(files)
    expect(len(recs) == n, f"{len(recs)} records, want {n}")
    bad = [i for i in range(min(n, len(recs))) if recs[i] != bytes([lab[i]]) + pix[i * rows * cols:(i + 1) * rows * cols]]
    expect(not bad, f"{split}: {len(bad)} records differ from the IDX files (first {bad[:3]})")
    raw = run("cat", "--raw", files[0]).stdout
    expect(raw == b"".join(recs[:len(records_of(files[:1]))]), "cat --raw differs")
    lines = run("cat", files[0]).stdout.decode().splitlines()
    expect(len(lines) == len(records_of(files[:1])) and lines[0].startswith(f"0 {rows * cols + 1} "), f"cat: {lines[:1]}")
    return files, n


with tempfile.TemporaryDirectory(prefix="hora-records-") as d:
    if mode == "synthetic":
        for gz in (False, True):
            idx = os.path.join(d, f"idx{int(gz)}")
            os.mkdir(idx)
            ext = ".gz" if gz else ""
            n, rows, cols = 11, 3, 4
            pix = bytes((i * 7 + 1) % 256 for i in range(n * rows * cols))
            write_idx(os.path.join(idx, "train-images-idx3-ubyte" + ext), [n, rows, cols], pix, gz)
            write_idx(os.path.join(idx, "train-labels-idx1-ubyte" + ext), [n], bytes(i % 10 for i in range(n)), gz)
            write_idx(os.path.join(idx, "t10k-images-idx3-ubyte" + ext), [2, rows, cols], pix[:24], gz)
            write_idx(os.path.join(idx, "t10k-labels-idx1-ubyte" + ext), [2], bytes([3, 4]), gz)
            out = os.path.join(d, f"out{int(gz)}")
            files, _ = check_split(idx, "train", "train", 3, out)
            check_split(idx, "test", "t10k", 1, out)
        # corrupt one pixel of record 2 of shard 1 (records: 16 + 13 bytes each)
        victim = files[1]
        b = bytearray(open(victim, "rb").read())
        off = 2 * (16 + 13)
        b[off + 12 + 5] ^= 0xFF
        open(victim, "wb").write(b)
        v = run("verify", *files, ok=False)
        err = v.stderr.decode()
        expect(v.returncode == 1, f"verify of a corrupt file exited {v.returncode}")
        expect(victim in err and f"byte offset {off}" in err and "checksum" in err, f"verify message: {err!r}")
        expect(f"{files[0]}: 3 records OK" in v.stdout.decode() and f"{files[2]}: 4 records OK" in v.stdout.decode(),
               f"other files still verified: {v.stdout!r}")
        c = run("cat", victim, ok=False)
        expect(c.returncode == 1 and f"byte offset {off}" in c.stderr.decode(), f"cat of a corrupt file: {c.stderr!r}")
        # truncated file: count and verify name it
        open(victim, "wb").write(b[:off + 20])
        c = run("count", victim, ok=False)
        expect(c.returncode == 1 and f"byte offset {off}" in c.stderr.decode(), f"count of a truncated file: {c.stderr!r}")
        u = run("convert-idx", d, "--split", "valid", "--shards", "2", "--out", d, ok=False)
        expect(u.returncode == 2, f"bad --split exited {u.returncode}")
        u = run("convert-idx", os.path.join(d, "nowhere"), "--split", "train", "--shards", "2", "--out", d, ok=False)
        expect(u.returncode == 1 and "no file matches" in u.stderr.decode(), f"missing IDX dir: {u.stderr!r}")
    else:
        found = 0
        data_dir = sys.argv[3] if len(sys.argv) > 3 else ""
        mn = os.path.join(data_dir, "mnist-digits-10k")
        if data_dir and os.path.isdir(mn):
            found += 1
            _, n = check_split(mn, "train", "train", 4, os.path.join(d, "mnist"))
            expect(n == 8000, f"mnist-digits-10k train has {n} images")
            _, n = check_split(mn, "test", "t10k", 2, os.path.join(d, "mnist"))
            expect(n == 2000, f"mnist-digits-10k test has {n} images")
        fm = "/usr/share/datasets/fashion-mnist"
        if os.path.isdir(fm):
            found += 1
            _, n = check_split(fm, "test", "t10k", 3, os.path.join(d, "fashion"))
            expect(n == 10000, f"fashion-mnist test has {n} images")
        if not found:
            print(f"no MNIST data in '{data_dir}' and no {fm}: skipped")
            sys.exit(77)

print("check_hora_records", mode + ":", "FAILED" if errors else "passed", f"({errors} errors)")
sys.exit(1 if errors else 0)
