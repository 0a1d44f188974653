"""Checkpoints through libhora's two-phase pipeline (docs/checkpoint.md): save() snapshots rank
0's arrays and returns; a writer thread puts them on node-local disk (temporary file, fsync,
rename) and a copier thread copies them to the persistent folder in the background. restore()
finds the newest valid checkpoint (local, else persistent) and fills every rank's arrays.

    ck = hora.Checkpoint(local_dir=None, persist_dir="/project/me/run1", keep=2)
    step = ck.restore(state) or 0          # state: dict name -> array, filled in place
    ...
    ck.save(step, state, meta={"epoch": "3"})
    ck.close()                              # waits until the copy is durable
"""
from . import _buffers as B
from ._core import _add_finalizer, _ctx
from ._errors import check, invalid
from ._hora_cffi import ffi, lib


def _arrays(arrays, what, writable):
    if not isinstance(arrays, dict):
        raise invalid(f"{what}: expected a dict of name -> array, got {type(arrays).__name__}")
    items = sorted(arrays.items(), key=lambda kv: str(kv[0]))
    n = len(items)
    ts = ffi.new("hora_tensor_t[]", max(n, 1))
    keep = [ts]
    for i, (name, x) in enumerate(items):
        if not isinstance(name, str) or not name:
            raise invalid(f"{what}: names must be non-empty str, got {name!r}")
        if hasattr(x, "detach") and callable(x.detach):
            x = x.detach()  # a torch parameter: its memory, outside autograd
        b = B.as_buf(x, f"{what}[{name!r}]", writable=writable)
        cname = ffi.new("char[]", name.encode())
        shape = ffi.new("int64_t[]", [int(s) for s in b.shape] or [0])
        keep += [b, cname, shape]
        t = ts[i]
        t.name = cname
        t.data = b.ptr
        t.count = b.count
        t.dtype = b.dtype
        t.device = b.device
        t.ndim = len(b.shape)
        t.shape = shape if b.shape else ffi.NULL
        if not b.shape:  # a 0-d array: one element, stored as 1-D [1]
            t.ndim = 0
    return ts, n, keep


class Checkpoint:
    """Open the checkpoint pipeline (collective).

    local_dir: node-local folder (None: $SLURM_TMPDIR/hora-ckpt, else /tmp/hora-$SLURM_JOB_ID,
      else /tmp/hora-ckpt-<uid>); persist_dir: persistent folder that a background thread copies
      every checkpoint to (None: local only); keep: versions kept in each place (>= 2);
      copy_interval_s: None for the default (600 s), 0 to copy after every save.
    """

    def __init__(self, local_dir=None, persist_dir=None, keep=2, copy_interval_s=None):
        opts = ffi.new("hora_ckpt_opts_t *")
        check(lib.hora_ckpt_opts_init(opts), "Checkpoint")
        self._keep = []
        if local_dir is not None:
            s = ffi.new("char[]", str(local_dir).encode())
            self._keep.append(s)
            opts.local_dir = s
        if persist_dir is not None:
            s = ffi.new("char[]", str(persist_dir).encode())
            self._keep.append(s)
            opts.persist_dir = s
        try:
            opts.keep = int(keep)
            if copy_interval_s is not None:
                opts.copy_interval_s = float(copy_interval_s)
        except (TypeError, ValueError, OverflowError):
            raise invalid(f"Checkpoint(keep={keep!r}, copy_interval_s={copy_interval_s!r}): "
                          "expected numbers") from None
        out = ffi.new("hora_ckpt_t **")
        check(lib.hora_ckpt_open(_ctx(), opts, out), "Checkpoint")
        self._ck = out[0]
        _add_finalizer(self._close_at_shutdown)

    def _live(self):
        if self._ck is None:
            raise invalid("Checkpoint: the checkpoint is closed")
        _ctx()  # NotInitializedError after hora.shutdown()
        return self._ck

    def save(self, step, arrays, meta=None):
        """Save `arrays` (dict name -> NumPy array or tensor; rank 0's are written) as version
        `step`, with optional string metadata. Collective; returns once rank 0's arrays are
        copied into the snapshot buffer (the caller may change them right away)."""
        ck = self._live()
        ts, n, keep = _arrays(arrays, "Checkpoint.save", writable=False)
        meta = meta or {}
        if not isinstance(meta, dict):
            raise invalid("Checkpoint.save(meta=...): expected a dict of str -> str")
        kvs = ffi.new("hora_kv_t[]", max(len(meta), 1))
        for i, (k, v) in enumerate(sorted(meta.items())):
            ks, vs = ffi.new("char[]", str(k).encode()), ffi.new("char[]", str(v).encode())
            keep += [ks, vs]
            kvs[i].key, kvs[i].value = ks, vs
        try:
            step = int(step)
        except (TypeError, ValueError):
            raise invalid(f"Checkpoint.save: step must be an int, got {step!r}") from None
        check(lib.hora_ckpt_save(ck, step, ts, n, kvs, len(meta)), "Checkpoint.save")

    def restore(self, arrays):
        """Fill `arrays` (dict name -> writable array of the saved shape and dtype) from the
        newest valid checkpoint, on every rank. Returns its step, or None when there is no
        checkpoint (then nothing is written). Collective. Raises CorruptError when checkpoints
        exist but none is valid (never None then: starting over from step 0 would silently
        discard the run), IOError when a checkpoint directory fails the ownership and
        permission check (docs/checkpoint.md)."""
        ck = self._live()
        ts, n, keep = _arrays(arrays, "Checkpoint.restore", writable=True)
        step = ffi.new("int64_t *")
        rc = lib.hora_ckpt_restore(ck, step, ts, n)
        if rc == lib.HORA_ERR_NOT_FOUND:
            return None
        check(rc, "Checkpoint.restore")
        return int(step[0])

    def meta(self, key, default=None):
        """Metadata `key` of the last restore (a str), or `default`."""
        v = ffi.new("const char **")
        rc = lib.hora_ckpt_meta_get(self._live(), str(key).encode(), v)
        if rc == lib.HORA_ERR_NOT_FOUND:
            return default
        check(rc, "Checkpoint.meta")
        return ffi.string(v[0]).decode()

    def source(self):
        """The step directory the last successful restore read (local or persistent)."""
        v = ffi.new("const char **")
        check(lib.hora_ckpt_restore_source(self._live(), v), "Checkpoint.source")
        return ffi.string(v[0]).decode()

    def flush(self):
        """Wait until the last checkpoint is durable in persist_dir. Collective."""
        check(lib.hora_ckpt_flush(self._live()), "Checkpoint.flush")

    def close(self):
        """Flush and close (collective). Closing twice is a no-op."""
        ck, self._ck = self._ck, None
        if ck is not None:
            check(lib.hora_ckpt_close(ck), "Checkpoint.close")

    def _close_at_shutdown(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# Exit status after a preemption checkpoint: the sbatch script requeues the job when it sees it.
EXIT_REQUEUE = lib.HORA_EXIT_REQUEUE


def stop_on_signal():
    """Install hora's SIGUSR1/SIGTERM handlers (Slurm's preemption and time-limit signals): they
    only set a flag that should_stop() reads."""
    check(lib.hora_ckpt_on_signal(_ctx()), "hora.stop_on_signal")


def should_stop():
    """True on every rank once any rank got SIGUSR1/SIGTERM (after stop_on_signal()). Collective:
    call it at the same point of every step, then save, flush, hora.shutdown() and
    sys.exit(hora.EXIT_REQUEUE)."""
    s = ffi.new("int *")
    check(lib.hora_should_stop(_ctx(), s), "hora.should_stop")
    return bool(s[0])

