"""The elastic committed state of libhora (docs/elastic.md), for arrays of any framework.

    st = hora.elastic.CommittedState("/scratch/run1/elastic", checkpoint=ck, ckpt_every=10)
    commit_id, blob = st.sync(arrays)       # collective: newest commit of any rank, in place
    st.commit(arrays, blob=b"...")          # local copy (every ckpt_every-th: also a checkpoint)
    blob = st.restore(arrays)               # local: back to the last commit, bit for bit
    st.save()                               # after RemoteError: this rank's commit to a file

`arrays` is a dict name -> array (NumPy, torch CPU or CUDA tensor, DLPack), filled in place by
sync and restore. The torch layer (hora.torch.elastic) builds on this.
"""
import os
import sys

from ._core import _add_finalizer, _ctx, shutdown
from ._errors import check, invalid
from ._hora_cffi import ffi, lib
from .checkpoint import _arrays

EXIT_ELASTIC = lib.HORA_EXIT_ELASTIC
BLOB_MAX = lib.HORA_ELASTIC_BLOB_MAX


class CommittedState:
    """Open libhora's elastic state (collective). dir: where a survivor writes its commit (node-
    local disk is fine); None: libhora's default (HORA_ELASTIC_DIR, else $SLURM_TMPDIR/hora-elastic,
    else /tmp/hora-elastic-$SLURM_JOB_ID, else /tmp/hora-elastic-<uid>: docs/env.md), which is
    what a Horovod program's TorchState(model, optimizer) gets; checkpoint: a hora.Checkpoint that
    every ckpt_every-th commit also goes to (0: never)."""

    def __init__(self, dir, checkpoint=None, ckpt_every=0):
        if dir is not None and not os.fspath(dir):
            raise invalid("CommittedState: dir is empty: give a path, or None for the default "
                          "(HORA_ELASTIC_DIR)")
        cdir = ffi.NULL if dir is None else os.fsencode(dir)
        ck = ffi.NULL
        if checkpoint is not None:
            ck = checkpoint._live()
        out = ffi.new("hora_elastic_t **")
        check(lib.hora_elastic_open(_ctx(), cdir, ck, int(ckpt_every), out),
              "CommittedState")
        self._es = out[0]
        self._blob = ffi.new("char[]", BLOB_MAX)
        _add_finalizer(self.close)

    def _live(self):
        if self._es is None:
            raise invalid("CommittedState is closed")
        return self._es

    def commit(self, arrays, blob=b""):
        es = self._live()
        if len(blob) > BLOB_MAX:
            raise invalid(f"CommittedState.commit: blob of {len(blob)} bytes; at most {BLOB_MAX}")
        ts, n, keep = _arrays(arrays, "CommittedState.commit", writable=False)
        check(lib.hora_elastic_commit(es, ts, n, blob, len(blob)), "CommittedState.commit")
        del keep

    def restore(self, arrays):
        """Write the last commit into arrays; returns its blob (bytes)."""
        es = self._live()
        ts, n, keep = _arrays(arrays, "CommittedState.restore", writable=True)
        nb = ffi.new("size_t *")
        check(lib.hora_elastic_restore(es, ts, n, self._blob, BLOB_MAX, nb), "CommittedState.restore")
        del keep
        return bytes(ffi.buffer(self._blob, nb[0]))

    def sync(self, arrays):
        """Collective: every rank holds the newest commit any rank has (else the checkpoint's,
        else rank 0's arrays as commit 0). Returns (commit id, blob)."""
        es = self._live()
        ts, n, keep = _arrays(arrays, "CommittedState.sync", writable=True)
        nb = ffi.new("size_t *")
        cid = ffi.new("int64_t *")
        check(lib.hora_elastic_sync(es, ts, n, self._blob, BLOB_MAX, nb, cid), "CommittedState.sync")
        del keep
        return int(cid[0]), bytes(ffi.buffer(self._blob, nb[0]))

    def save(self):
        """Local, no MPI: write this rank's last commit to dir for the next step."""
        check(lib.hora_elastic_save(self._live()), "CommittedState.save")

    def hosts_changed(self):
        """Collective: True on every rank when launch --elastic has another node count."""
        c = ffi.new("int *")
        check(lib.hora_elastic_hosts_changed(self._live(), c), "CommittedState.hosts_changed")
        return bool(c[0])

    @property
    def commit_id(self):
        c = ffi.new("int64_t *")
        check(lib.hora_elastic_commit_id(self._live(), c), "CommittedState.commit_id")
        return int(c[0])

    def close(self):
        es, self._es = self._es, None
        if es is not None:
            check(lib.hora_elastic_close(es), "CommittedState.close")


def exit_for_restart(state=None):
    """End this rank so that launch --elastic re-forms the job: save this rank's commit (if a
    state is given), shut hora down and exit with EXIT_ELASTIC. Never returns."""
    try:
        if state is not None:
            state.save()
    finally:
        try:
            shutdown()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_ELASTIC)
