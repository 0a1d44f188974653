"""horovod.torch's API on hora: change `import horovod.torch as hvd` to `import hora.torch as hvd`.

    import hora.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in data:              # this rank's shard
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # each bucket's allreduce starts as soon as it is ready
        opt.step()                        # waits for them, then updates

Every collective has Horovod 0.28's signature, defaults and results, goes through hora's async
engine (matched across ranks by name) and returns torch tensors of the input's dtype and device.
docs/horovod.md lists what is identical and what differs (process sets, Adasum).
Only CPU tensors and, in a CUDA build, CUDA tensors of the rank's GPU are supported.
"""
import os
import sys

import hora
from . import _core
from ._compression import (  # noqa: F401  (horovod.torch.compression's names too)
    BF16Compressor, Compression, Compressor, FP16Compressor, NoneCompressor,
)
from ._errors import (  # noqa: F401
    HorovodInternalError, HoraError, InvalidArgumentError, MismatchError, NotInitializedError,
    NotSupportedError, RemoteError, ShutdownError, check,
)
from ._hora_cffi import ffi, lib

if not hasattr(lib, "hora_allreduce_async"):  # pragma: no cover - a libhora without the engine
    raise ImportError("hora.torch needs libhora's async engine (hora_allreduce_async), which "
                      "this build of libhora does not have")

import torch as _torch  # noqa: E402
# The oldest PyTorch hora.torch runs on: DistributedOptimizer's gradient hooks are
# Tensor.register_post_accumulate_grad_hook (PyTorch 2.1). An older one would fail only at the
# first DistributedOptimizer, with an AttributeError that names neither hora nor the version.
if not hasattr(_torch.Tensor, "register_post_accumulate_grad_hook"):
    raise ImportError(f"hora.torch needs PyTorch >= 2.1 (Tensor.register_post_accumulate_grad_hook"
                      f", which DistributedOptimizer uses); this is torch {_torch.__version__} "
                      f"from {os.path.dirname(_torch.__file__)}")

from ._core import (  # noqa: E402,F401
    Average, Max, Min, Product, Sum, cross_rank, cross_size, is_initialized, local_rank,
    local_size, rank, shutdown, size,
)
from ._torch_ops import (  # noqa: E402,F401
    Adasum, ProcessSet, TorchHandle, add_process_set, allreduce, allreduce_, allreduce_async,
    allreduce_async_, global_process_set, grouped_allreduce, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_, poll, remove_process_set, synchronize,
)
from ._torch_gather import (  # noqa: E402,F401
    allgather, allgather_async, alltoall, alltoall_async, barrier, broadcast, broadcast_,
    broadcast_async, broadcast_async_, grouped_allgather, grouped_allgather_async,
    grouped_reducescatter, grouped_reducescatter_async, join, reducescatter,
    reducescatter_async,
)
from ._torch_syncbn import SyncBatchNorm  # noqa: E402,F401
from ._torch_optim import (  # noqa: E402,F401
    DistributedOptimizer, allgather_object, broadcast_object, broadcast_optimizer_state,
    broadcast_parameters, sparse_allreduce_async,
)
from . import _torch_elastic as elastic  # noqa: E402  (hvd.elastic.run, TorchState, ...)
from . import _torch_psets  # noqa: E402

sys.modules[__name__ + ".elastic"] = elastic  # `from hora.torch.elastic import TorchState`


def init(comm=None, process_sets=None):
    """Start hora (collective). `comm`: None, or an mpi4py communicator (or a list of world
    ranks, as Horovod takes, which must then be every rank). `process_sets`: ProcessSet objects
    (lists of ranks, or mpi4py communicators as Horovod 0.28 takes them) to register at once, on
    every rank; see _torch_psets.register_init_sets for the rules and errors."""
    if isinstance(comm, (list, tuple)):
        hora.init()
        if sorted(comm) != list(range(size())):
            raise NotSupportedError(f"init(comm={list(comm)}): hora.torch runs on every rank of "
                                    "the job; a list of some ranks is not supported",
                                    lib.HORA_ERR_NOT_SUPPORTED)
    else:
        hora.init(comm)
    global_process_set.ranks = list(range(size()))
    if process_sets:
        _torch_psets.register_init_sets(process_sets, comm if not isinstance(comm, (list, tuple))
                                        else None, allgather_object)


def _built(feature):
    out = ffi.new("int *")
    check(lib.hora_built(feature.encode(), out), "hora.torch")
    return bool(out[0])


def mpi_built():
    """True: hora always runs on MPI."""
    return _built("mpi")


def mpi_enabled():
    """True: hora's controller and host collectives are MPI (after init)."""
    return _built("mpi")


def mpi_threads_supported():
    """True: hora requires and checks MPI_THREAD_MULTIPLE at init. Needs init(), as in Horovod."""
    _core._ctx()
    return True


def gloo_built():
    return _built("gloo")


def gloo_enabled():
    return _built("gloo")


def nccl_built():
    """As Horovod: the version code of the NCCL libhora runs on (e.g. 22703 for 2.27.3) when it
    was built with NCCL (its GPU path), else 0. Horovod's tests compare it with 2700."""
    if not _built("nccl"):
        return 0
    import ctypes
    try:  # the libnccl that libhora is linked against, already loaded by it
        nccl = ctypes.CDLL("libnccl.so.2")
        ver = ctypes.c_int(0)
        if nccl.ncclGetVersion(ctypes.byref(ver)) == 0 and ver.value > 0:
            return int(ver.value)
    except (OSError, AttributeError):
        pass
    return 1


def ddl_built():
    return _built("ddl")


def ccl_built():
    return _built("ccl")


def cuda_built():
    """True when libhora was built with CUDA (device tensors are accepted)."""
    return _built("cuda")


def rocm_built():
    return _built("rocm")


def is_homogeneous():
    """True when every node runs the same number of ranks (the same answer on every rank)."""
    return bool(_core._layout(lib.hora_is_homogeneous))


def start_timeline(file_path, mark_cycles=False):
    """Horovod's: record hora's timeline (a Chrome trace, rank 0 writes it: docs/api.md,
    "Timeline") at `file_path` from now until stop_timeline(), another start_timeline() or
    shutdown(); one that is recording (HORA_TIMELINE, HOROVOD_TIMELINE, an earlier call) is saved
    under its own name first. `mark_cycles`: an instant event per engine cycle that ran a
    collective. Call it on every rank, as Horovod programs do (only rank 0 opens the file; it is
    not a collective). Raises ValueError before init() (NotInitializedError), and on rank 0
    IOError (an OSError) when file_path's directory does not exist or the file cannot be made;
    Horovod logs that instead. Unlike Horovod it needs no HOROVOD_TIMELINE=DYNAMIC."""
    c = _core._ctx()
    check(lib.hora_timeline_start(c, os.fsencode(os.fspath(file_path)), 1 if mark_cycles else 0),
          "start_timeline")


def stop_timeline():
    """Horovod's: end the recording and save the file (rank 0) before returning; nothing to do
    when no timeline is recording. Raises ValueError before init() (NotInitializedError), IOError
    when the file cannot be saved."""
    check(lib.hora_timeline_stop(_core._ctx()), "stop_timeline")


# Horovod's submodules, as programs import them (`from horovod.torch.mpi_ops import synchronize`,
# `from horovod.torch.compression import Compression`): each name is this module, which holds
# everything they export.
def _alias_submodules():
    import sys
    me = sys.modules[__name__]
    for sub in ("mpi_ops", "compression", "functions", "optimizer", "sync_batch_norm"):
        sys.modules[f"{__name__}.{sub}"] = me
        setattr(me, sub, me)


_alias_submodules()
