"""Record files (TFRecord framing, docs/data.md): RecordWriter and RecordReader.

The reading, sharding, shuffling and checksums are libhora's (hora_records_*); this module only
wraps them. Records come back as `bytes` (one copy out of the reader's buffer, since the C
pointer is valid only until the next record).
"""
import os

from ._errors import check, invalid
from ._hora_cffi import ffi, lib


class RecordWriter:
    """Write a record file that appears under `path` only when close() succeeds (temporary file,
    fsync, rename). Use as a context manager: an exception inside the `with` discards the file.

        with hora.RecordWriter("train-00000.tfrecord") as w:
            w.write(b"...")
    """

    def __init__(self, path):
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise invalid(f"RecordWriter(path): expected a path, got {type(path).__name__}")
        self._path = os.fsencode(path)
        out = ffi.new("hora_records_writer_t **")
        check(lib.hora_records_writer_open(self._path, out), "RecordWriter")
        self._w = out[0]

    def _live(self):
        if self._w is None:
            raise invalid("RecordWriter: the writer is closed")
        return self._w

    def write(self, record):
        """Append one record (bytes-like; b"" allowed)."""
        w = self._live()
        try:
            buf = ffi.from_buffer(record)
        except TypeError:
            raise invalid(f"RecordWriter.write: expected bytes-like data, got "
                          f"{type(record).__name__}") from None
        check(lib.hora_records_writer_write(w, buf, len(buf)), "RecordWriter.write")

    def close(self):
        """Commit the file under its final name (flush, fsync, rename, directory fsync). The
        writer is closed afterwards even on error. Closing twice is a no-op."""
        w, self._w = self._w, None
        if w is not None:
            check(lib.hora_records_writer_close(w), "RecordWriter.close")

    def abort(self):
        """Discard everything written; nothing appears under the final path."""
        w, self._w = self._w, None
        if w is not None:
            lib.hora_records_writer_abort(w)

    def __enter__(self):
        return self

    def __exit__(self, tp, value, tb):
        if tp is None:
            self.close()
        else:
            self.abort()
        return False

    def __del__(self):
        # A writer dropped without close() is discarded: a half-written file never appears.
        if getattr(self, "_w", None) is not None:
            self.abort()


def count_records(path):
    """Number of records in one file (reads the headers, checks the length checksums)."""
    n = ffi.new("uint64_t *")
    check(lib.hora_records_count(os.fsencode(path), n), "count_records")
    return int(n[0])


class RecordReader:
    """Iterate over the records (bytes) of the files matching `patterns` (a glob string, or a
    list of globs or names), read ahead by a background thread in the C library.

    shard: True takes this rank's share using hora's rank and size (hora.init() must have run),
      False reads everything; or a tuple (rank, world_size) to shard without hora.init().
    shuffle: shuffle-buffer size in records (0/1: file order); seed: its seed (same on every rank);
    epochs: passes over the data; start_epoch, skip_records: resume where position() said;
    prefetch: records read ahead (0: 256); skip_corrupt: skip records with bad checksums instead
    of raising DataError (count them with .corrupt).
    """

    def __init__(self, patterns, shard=True, shuffle=0, seed=0, epochs=1, start_epoch=0,
                 skip_records=0, prefetch=0, skip_corrupt=False):
        if isinstance(patterns, (str, bytes, os.PathLike)):
            patterns = [patterns]
        try:
            pats = [os.fsencode(p) for p in patterns]
        except TypeError:
            raise invalid(f"RecordReader(patterns): expected a glob or a list of globs, got "
                          f"{patterns!r}") from None
        if not pats:
            raise invalid("RecordReader(patterns): the list of patterns is empty")
        self._keep = [ffi.new("char[]", p) for p in pats]
        arr = ffi.new("const char *[]", self._keep)
        self._keep.append(arr)
        o = ffi.new("hora_records_reader_opts_t *")
        o.size = ffi.sizeof("hora_records_reader_opts_t")
        o.patterns = arr
        o.pattern_count = len(pats)
        if shard is True:
            from ._core import _ctx

            o.ctx = _ctx()
        elif shard is False or shard is None:
            o.world_size = 1
            o.rank = 0
        else:
            try:
                r, n = shard
                o.rank, o.world_size = int(r), int(n)
            except (TypeError, ValueError, OverflowError):
                raise invalid(f"RecordReader(shard=...): expected True, False or (rank, "
                              f"world_size), got {shard!r}") from None
        for field, v in (("prefetch", prefetch), ("shuffle_buffer", shuffle), ("seed", seed),
                         ("epochs", epochs), ("start_epoch", start_epoch),
                         ("skip_records", skip_records)):
            try:
                setattr(o, field, int(v))
            except (TypeError, ValueError, OverflowError):
                raise invalid(f"RecordReader({field}={v!r}): expected a non-negative int") \
                    from None
        o.skip_corrupt = 1 if skip_corrupt else 0
        out = ffi.new("hora_records_reader_t **")
        check(lib.hora_records_reader_open(o, out), "RecordReader")
        self._r = out[0]
        self._data = ffi.new("const void **")
        self._len = ffi.new("size_t *")
        self._eof = ffi.new("int *")

    def _live(self):
        if self._r is None:
            raise invalid("RecordReader: the reader is closed")
        return self._r

    def __iter__(self):
        return self

    def __next__(self):
        r = self._live()
        check(lib.hora_records_next(r, self._data, self._len, self._eof), "RecordReader")
        if self._eof[0]:
            raise StopIteration
        return ffi.buffer(self._data[0], self._len[0])[:]

    def position(self):
        """(epoch, records of that epoch delivered so far): pass them as start_epoch and
        skip_records to resume exactly after the last record returned."""
        e, n = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        check(lib.hora_records_reader_position(self._live(), e, n), "RecordReader.position")
        return int(e[0]), int(n[0])

    @property
    def corrupt(self):
        """Corrupt records skipped so far (with skip_corrupt=True)."""
        n = ffi.new("uint64_t *")
        check(lib.hora_records_reader_corrupt(self._live(), n), "RecordReader.corrupt")
        return int(n[0])

    def close(self):
        r, self._r = self._r, None
        if r is not None:
            lib.hora_records_reader_close(r)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        if getattr(self, "_r", None) is not None:
            self.close()
