"""hora.RecordWriter / hora.RecordReader over libhora's record files (TFRecord framing)."""
import os
import struct
import tempfile

import numpy as np
import pytest

import hora
from conftest import rank_size


def shared_dir():
    """A temporary folder that rank 0 creates and every rank learns (same machine)."""
    r, n = rank_size()
    name = np.zeros(256, dtype=np.uint8)
    if r == 0:
        d = tempfile.mkdtemp(prefix="hora-pytest-")
        b = d.encode()
        name[:len(b)] = np.frombuffer(b, dtype=np.uint8)
    hora.broadcast_(name, 0)
    return bytes(name).rstrip(b"\0").decode()


def records_of(i):
    return [f"file{i}-record{j}".encode() * (j % 3) for j in range(10 + i)]


def test_write_then_read_sharded():
    r, n = rank_size()
    d = shared_dir()
    nfiles = 2 * n + 1
    if r == 0:
        for i in range(nfiles):
            with hora.RecordWriter(os.path.join(d, f"train-{i:05d}.tfrecord")) as w:
                for rec in records_of(i):
                    w.write(rec)
    hora.barrier()
    every = [rec for i in range(nfiles) for rec in records_of(i)]
    with hora.RecordReader(os.path.join(d, "train-*")) as rd:  # shard=True: this rank's files
        mine = list(rd)
        pos = rd.position()
    whole = list(hora.RecordReader(os.path.join(d, "train-*"), shard=False))
    shuffled = list(hora.RecordReader(os.path.join(d, "train-*"), shard=(0, 1), shuffle=16,
                                      seed=5, epochs=2))
    counts = hora.allgather(np.array([len(mine)], dtype=np.int64))
    hora.barrier()
    assert whole == every
    # File i goes to rank i % n (more files than ranks).
    assert mine == [rec for i in range(nfiles) if i % n == r for rec in records_of(i)]
    assert int(counts.sum()) == len(every)
    assert pos == (0, len(mine))
    assert len(shuffled) == 2 * len(every)
    assert sorted(shuffled[:len(every)]) == sorted(every) != shuffled[:len(every)]
    assert hora.count_records(os.path.join(d, "train-00000.tfrecord")) == len(records_of(0))


def test_writer_discards_on_exception_and_reports_errors():
    r, n = rank_size()
    d = tempfile.mkdtemp(prefix=f"hora-pytest-{r}-")
    path = os.path.join(d, "x.tfrecord")
    with pytest.raises(RuntimeError):
        with hora.RecordWriter(path) as w:
            w.write(b"abc")
            raise RuntimeError("boom")
    assert not os.path.exists(path) and os.listdir(d) == []
    w = hora.RecordWriter(path)
    with pytest.raises(hora.InvalidArgumentError, match="bytes-like"):
        w.write(12)
    w.write(memoryview(b"xyz"))
    w.close()
    w.close()  # a second close is a no-op
    with pytest.raises(hora.InvalidArgumentError, match="closed"):
        w.write(b"more")
    assert list(hora.RecordReader(path, shard=False)) == [b"xyz"]
    with pytest.raises(hora.IOError):
        hora.RecordWriter(os.path.join(d, "no", "such", "dir", "f"))
    with pytest.raises(hora.NotFoundError, match="nothing-matches"):
        hora.RecordReader(os.path.join(d, "nothing-matches-*"), shard=False)
    with pytest.raises(hora.InvalidArgumentError):
        hora.RecordReader(path, shard=(3, 2))
    with pytest.raises(hora.InvalidArgumentError):
        hora.RecordReader(path, shard=False, shuffle=-1)


def test_corrupt_record_is_a_data_error():
    r, n = rank_size()
    d = tempfile.mkdtemp(prefix=f"hora-pytest-{r}-")
    path = os.path.join(d, "c.tfrecord")
    with hora.RecordWriter(path) as w:
        for j in range(3):
            w.write(b"payload-%d" % j)
    raw = bytearray(open(path, "rb").read())
    # Flip one data byte of the second record: header 12 bytes, data, 4-byte data CRC.
    first = 12 + struct.unpack("<Q", raw[:8])[0] + 4
    raw[first + 12] ^= 0xFF
    open(path, "wb").write(raw)
    rd = hora.RecordReader(path, shard=False)
    assert next(rd) == b"payload-0"
    with pytest.raises(hora.DataError, match="c.tfrecord"):
        next(rd)
    rd.close()
    skipped = hora.RecordReader(path, shard=False, skip_corrupt=True)
    assert list(skipped) == [b"payload-0", b"payload-2"]
    assert skipped.corrupt == 1
