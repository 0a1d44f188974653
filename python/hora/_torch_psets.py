"""hora.torch's process sets, with horovod.torch's (0.28) API: ProcessSet, global_process_set,
add_process_set, remove_process_set, process_set= on the collectives.

A registered ProcessSet holds a hora process set (hora_process_set_create: a context over a
sub-communicator with its own engine), so its collectives run beside other sets' and the global
set's. As in Horovod, roots (broadcast's root_rank) are global ranks, ProcessSet.rank() is the
rank within the set, results of allgather/alltoall are in the set's rank order, and registration
and removal are collective over every rank of the job, ranks outside the set included.
"""
import sys
import threading

from ._async import NameCounter
from ._core import _add_finalizer, _ctx
from ._core import rank as _rank
from ._core import size as _size
from ._errors import HoraError, check, invalid
from ._hora_cffi import ffi, lib


class ProcessSet:
    """A set of ranks that runs collectives together: ProcessSet([0, 2]), then
    hvd.add_process_set(ps) on every rank, then process_set=ps on the collectives."""

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        """ranks_or_comm: a list of global ranks, or an mpi4py communicator (registered only
        through init(process_sets=[...]), as in Horovod). ValueError for anything else."""
        self._hora = None  # hora_ctx_t * of the registered set (None: not registered / global)
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            if _is_mpi4py_comm(ranks_or_comm):
                self.mpi_comm = ranks_or_comm
                return
            raise ValueError("ProcessSet should be initialized with a list of process ranks or "
                             "an mpi4py Comm object") from None
        if any(isinstance(r, bool) or not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks or "
                             "an mpi4py Comm object")
        self.ranks = ranks

    def _invalidate(self):
        self.process_set_id = None
        self.ranks = None
        self._hora = None

    def size(self):
        """Number of ranks in the set, or None if it is not registered."""
        if self.process_set_id is None:
            return None
        return _size() if self.process_set_id == 0 else len(self.ranks)

    def rank(self):
        """This process's rank within the set, or None if it is not registered; ValueError if
        this process is not in the set (as Horovod)."""
        if self.process_set_id is None:
            return None
        if self.process_set_id == 0:
            return _rank()
        if not self.included():
            raise ValueError("Process is not part of provided process set.")
        return self.ranks.index(_rank())

    def included(self):
        """Whether this process is in the set, or None if it is not registered."""
        if self.process_set_id is None:
            return None
        return self.process_set_id == 0 or _rank() in self.ranks

    def __str__(self):
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")

    __repr__ = __str__


def _is_mpi4py_comm(obj):
    # An mpi4py communicator exists only where mpi4py.MPI was imported; importing it here would
    # start MPI as a side effect of a bad argument.
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and isinstance(obj, mpi.Comm)


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_lock = threading.Lock()
_by_id = {0: [global_process_set]}  # id -> the ProcessSet objects registered under it
# id -> the number of the set's next unnamed request. Each set numbers its own: a set's members
# make the same unnamed calls on it, but ranks outside it make none, so one job-wide number would
# drift apart between ranks (odd and even ranks in two sets of different sizes).
_noname_by_id = {}


def _next_id():
    i = 1
    while i in _by_id:
        i += 1
    return i


def _registered(ranks):
    """The first ProcessSet registered with these ranks (not the global set), or None. Under
    _lock."""
    return next((objs[0] for pid, objs in _by_id.items() if pid != 0 and objs[0].ranks == ranks),
                None)


def add_process_set(process_set):
    """Register a process set (a ProcessSet or a list of ranks); returns the ProcessSet. Every
    rank of the job calls it with the same ranks. ValueError for an invalid list (duplicates,
    ranks out of range, an empty list), ranks that pass different lists, a set already
    registered, or ranks already registered as a set."""
    ctx = _ctx()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    with _lock:
        reason = None
        if process_set.mpi_comm is not None and process_set.ranks is None:
            # Horovod 0.28 refuses this too (NotImplementedError, below): a set built from a
            # communicator is registered by init(process_sets=[...]) only.
            reason = ("adding a process set defined by an MPI communicator after init is not "
                      "implemented (as in Horovod); pass it to init(process_sets=[...]) or build "
                      "the process set from a list of ranks")
        elif process_set.process_set_id is not None:
            reason = f"{process_set} is already registered"
        elif process_set.ranks is None:
            reason = "the ProcessSet was removed; make a new one"
        elif _registered(process_set.ranks) is not None:
            reason = f"a process set with ranks {process_set.ranks} is already registered"
        ranks = process_set.ranks or []
        # Every rank enters the collective create, also one that found a reason to refuse
        # (it passes an empty list so that all fail together instead of some waiting).
        c_ranks = ffi.new("int[]", ranks if reason is None else [0])
        out = ffi.new("hora_ctx_t **")
        try:
            check(lib.hora_process_set_create(ctx, c_ranks, len(ranks) if reason is None else 0,
                                              out), "hora.torch.add_process_set")
        except HoraError as e:
            if process_set.mpi_comm is not None and process_set.ranks is None:
                raise NotImplementedError(f"add_process_set: {reason}") from None
            if e.code in (lib.HORA_ERR_INVALID_ARGUMENT, lib.HORA_ERR_MISMATCH):
                raise ValueError(f"add_process_set({ranks}): {reason or e}") from None
            raise
        process_set._hora = out[0]
        process_set.process_set_id = _next_id()
        _by_id[process_set.process_set_id] = [process_set]
        _noname_by_id[process_set.process_set_id] = NameCounter()
    return process_set


def _comm_members(comm, world):
    """(sorted hora ranks of comm's processes, None), or (None, why not) where comm is
    MPI.COMM_NULL or holds a process outside `world` (hora's communicator)."""
    from mpi4py import MPI
    if comm == MPI.COMM_NULL:
        return None, "its communicator is MPI.COMM_NULL on this rank"
    group, world_group = comm.Get_group(), world.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(comm.Get_size())), world_group)
    finally:
        group.Free()
        world_group.Free()
    if any(r == MPI.UNDEFINED for r in ranks):
        return None, "its communicator holds processes that are not among hora's ranks"
    return sorted(ranks), None


def _describe_init_sets(process_sets, comm):
    """This rank's view of the sets init(process_sets=...) registers, to be compared across
    ranks: one (kind, ranks, why not) per set; kind is "comm" or "ranks"."""
    world = None
    out = []
    for ps in process_sets:
        if isinstance(ps, ProcessSet) and ps.ranks is None and ps.mpi_comm is not None:
            if world is None:
                from mpi4py import MPI
                world = MPI.COMM_WORLD if comm is None else comm
            ranks, why = _comm_members(ps.mpi_comm, world)
            out.append(("comm", ranks, why))
            continue
        try:
            ranks = (ps if isinstance(ps, ProcessSet) else ProcessSet(ps)).ranks
            out.append(("ranks", ranks, None if ranks is not None else
                        "the ProcessSet was removed; make a new one"))
        except ValueError as e:
            out.append(("ranks", None, str(e)))
    return out


def register_init_sets(process_sets, comm, gather):
    """init(process_sets=...), collective over every rank of the job. Sets given as lists of
    ranks are registered as add_process_set does; a set given as an mpi4py communicator is
    registered as Horovod 0.28's horovod_init_multi_comm does: each rank passes the communicator
    it is in, every distinct group among the ranks' communicators becomes a set, and this rank's
    ProcessSet object refers to the one of its own communicator (an MPI_Comm_split into evens
    and odds gives two sets). Sets from communicators are registered first, in list order, as in
    Horovod; a communicator whose group is already registered leaves its ProcessSet unregistered
    (Horovod's rule for a clone). `gather` is allgather_object over the global set.

    ValueError on every rank when the ranks' lists differ in length or in kind at a position, or
    any rank's entry is invalid (a malformed list, MPI.COMM_NULL, processes outside hora's ranks);
    the message names the position and the rank."""
    # The global set, and sets registered by an earlier init() in this process, are skipped.
    todo = [ps for ps in process_sets
            if not (isinstance(ps, ProcessSet) and ps.process_set_id is not None)]
    mine = _describe_init_sets(todo, comm)
    views = gather(mine)
    for r, view in enumerate(views):
        if [k for k, _, _ in view] != [k for k, _, _ in mine]:
            raise ValueError(f"init(process_sets=...): the ranks pass different lists (rank {r}: "
                             f"{[k for k, _, _ in view]}, this rank: {[k for k, _, _ in mine]})")
        for i, (_, _, why) in enumerate(view):
            if why is not None:
                raise ValueError(f"init(process_sets=...): entry {i} on rank {r}: {why}")
    for i, ps in enumerate(todo):
        if mine[i][0] != "comm":
            continue
        own = None
        for ranks in sorted({tuple(view[i][1]) for view in views}):
            with _lock:
                known = _registered(list(ranks))
            reg = known if known is not None else add_process_set(list(ranks))
            if list(ranks) == mine[i][1]:
                own = None if known is not None else reg
        if own is not None:
            with _lock:
                ps.process_set_id, ps.ranks, ps._hora = own.process_set_id, own.ranks, own._hora
                _by_id[own.process_set_id].append(ps)
    for i, ps in enumerate(todo):
        if mine[i][0] == "ranks":
            add_process_set(ps)


def remove_process_set(process_set):
    """Unregister a process set (collective over every rank of the job). Returns False for the
    global set or a set that is not registered, True once removed; the ProcessSet is then
    invalidated (its id and ranks become None)."""
    _ctx()
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"remove_process_set: expected a ProcessSet, got "
                         f"{type(process_set).__name__}")
    with _lock:
        pid = process_set.process_set_id
        if pid is None or pid == 0 or pid not in _by_id:
            return False
        objs = _by_id.pop(pid)
        _noname_by_id.pop(pid, None)
        handle = objs[0]._hora
        for ps in objs:
            ps._invalidate()
        check(lib.hora_process_set_destroy(handle), "hora.torch.remove_process_set")
    return True


def _forget_all():
    """shutdown(): hora_finalize destroys the sets; the objects become unregistered."""
    with _lock:
        for pid in [i for i in _by_id if i != 0]:
            _noname_by_id.pop(pid, None)
            for ps in _by_id.pop(pid):
                ps._invalidate()


_add_finalizer(_forget_all)


class _SetView:
    """What a collective needs of its process set: the hora context, the set's size and this
    rank's rank in it (None for the global set) and the mapping of global root ranks."""

    __slots__ = ("ctx", "n", "me", "ranks", "ps")

    def __init__(self, ctx, n, me, ranks, ps):
        self.ctx, self.n, self.me, self.ranks, self.ps = ctx, n, me, ranks, ps

    def root(self, root_rank, what):
        """The set rank of global rank root_rank (Horovod's roots are global ranks)."""
        if isinstance(root_rank, bool) or not isinstance(root_rank, int):
            try:
                import numpy as np
                if isinstance(root_rank, np.integer):
                    root_rank = int(root_rank)
            except ImportError:
                pass
        if isinstance(root_rank, bool) or not isinstance(root_rank, int):
            raise invalid(f"{what}: root_rank must be an int, got {type(root_rank).__name__}")
        if self.ranks is None:
            return root_rank
        if root_rank not in self.ranks:
            raise invalid(f"{what}: root_rank {root_rank} is not in the process set "
                          f"{self.ranks}")
        return self.ranks.index(root_rank)


def _check_set(process_set, what):
    """The _SetView of `process_set` (global_process_set: the root context). ValueError for an
    unregistered set, and InvalidArgumentError (a ValueError) on a rank outside the set."""
    if process_set is None or process_set is global_process_set or (
            isinstance(process_set, ProcessSet) and process_set.process_set_id == 0):
        ctx = _ctx()
        if not global_process_set.ranks:
            global_process_set.ranks = list(range(_size()))
        return _SetView(ctx, None, None, None, process_set)
    if not isinstance(process_set, ProcessSet):
        raise invalid(f"{what}: process_set must be a hora.torch.ProcessSet, got "
                      f"{type(process_set).__name__}")
    if process_set.process_set_id is None or process_set._hora is None:
        raise ValueError(f"{what}: {process_set} is not registered: call "
                         "hora.torch.add_process_set(process_set) on every rank first")
    ranks = process_set.ranks
    me = _rank()
    if me not in ranks:
        # Refused here, before the call takes a name: an unnamed call's generated name must not
        # advance on this rank alone (the next unnamed names would no longer match).
        raise invalid(f"{what}: this rank ({me}) is not in the process set of ranks {ranks}: "
                      "only its members may use it")
    return _SetView(process_set._hora, len(ranks), ranks.index(me), ranks, process_set)


def _set_noname(v):
    """The unnamed-request counter of view v's process set, or None for the global set."""
    if v is None or v.ranks is None:
        return None
    with _lock:
        return _noname_by_id.get(v.ps.process_set_id)


def _view_size(v):
    return _size() if v.n is None else v.n


def _view_rank(v):
    return _rank() if v.me is None else v.me
