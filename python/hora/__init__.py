"""hora: distributed training for NumPy and PyTorch on Slurm clusters, in Horovod's shape.

    import hora
    hora.init()
    g = hora.allreduce(grad, op=hora.Average)
    hora.shutdown()

Run with `launch` (inside an sbatch script: `srun launch python train.py`) or `mpirun -np N
python train.py`. See docs/python.md.
"""
import importlib.util as _ilu
import os as _os
import sys as _sys

# libhora links the CUDA runtime and NCCL of the toolkit it was built with; PyTorch's CUDA wheels
# bring their own under the same sonames (libcudart.so.13, libnccl.so.2). The dynamic loader
# serves both from whichever copy is loaded first, and PyTorch needs symbols of its newer NCCL
# ("undefined symbol: ncclCommResume" when hora's copy came first). So when PyTorch is installed,
# it is imported before libhora is loaded, and hora runs on PyTorch's NCCL and CUDA runtime (both
# keep their ABI within a major version). HORA_PRELOAD_TORCH=0 turns this off.
if ("torch" not in _sys.modules and _os.environ.get("HORA_PRELOAD_TORCH", "1") != "0"
        and _ilu.find_spec("torch") is not None):
    try:
        import torch as _torch  # noqa: F401
    except ImportError:
        pass

from ._errors import (  # noqa: F401
    CUDAError, DataError, HoraError, InternalError, InvalidArgumentError, IOError, LayoutError,
    MismatchError, MPIError, NCCLError, NoMemoryError, NotFoundError, NotInitializedError,
    NotSupportedError, RemoteError, ShutdownError, TimeoutError,
)
from ._core import (  # noqa: F401
    Average, Max, Min, Product, Sum,
    allgather, allreduce, allreduce_, alltoall, barrier, broadcast, broadcast_, cross_rank,
    cross_size, init, is_initialized, local_rank, local_size, rank, reducescatter, shutdown, size,
)
from .records import RecordReader, RecordWriter, count_records  # noqa: F401

__version__ = "0.1.0"

# Parts that exist only when libhora was built with them (this package is compiled against the
# header of the libhora it links, so the two always agree).
from ._hora_cffi import lib as _lib  # noqa: E402

if hasattr(_lib, "hora_allreduce_async"):
    from ._async import (  # noqa: F401
        Handle, allreduce_async, allreduce_async_, broadcast_async_, grouped_allreduce,
        grouped_allreduce_,
        grouped_allreduce_async, grouped_allreduce_async_, join, poll, synchronize,
    )
if hasattr(_lib, "hora_ckpt_open"):
    from .checkpoint import EXIT_REQUEUE, Checkpoint, should_stop, stop_on_signal  # noqa: F401
