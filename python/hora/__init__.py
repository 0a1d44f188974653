"""hora: distributed training for NumPy and PyTorch on Slurm clusters, in Horovod's shape.

    import hora
    hora.init()
    g = hora.allreduce(grad, op=hora.Average)
    hora.shutdown()

Run with `launch` (inside an sbatch script: `srun launch python train.py`) or `mpirun -np N
python train.py`. See docs/python.md.
"""
import sys as _sys

from ._preload import preload as _preload

_preload()  # before libhora is loaded: see _preload.py

from ._errors import (  # noqa: E402,F401
    CorruptError, CUDAError, DataError, HoraError, HorovodInternalError, InternalError, InvalidArgumentError,
    IOError, LayoutError,
    MismatchError, MPIError, NCCLError, NoMemoryError, NotFoundError, NotInitializedError,
    NotSupportedError, RemoteError, ShutdownError, TimeoutError,
)
from ._core import (  # noqa: E402,F401
    Adasum, Average, Max, Min, Product, Sum,
    allgather, allreduce, allreduce_, alltoall, barrier, broadcast, broadcast_, cross_rank,
    cross_size, init, is_initialized, local_rank, local_size, rank, reducescatter, shutdown, size,
)
from .records import RecordReader, RecordWriter, count_records  # noqa: E402,F401

# Parts that exist only when libhora was built with them (this package is compiled against the
# header of the libhora it links, so the two always agree).
from ._hora_cffi import lib as _lib  # noqa: E402

# The repository's VERSION file, through hora/version.h (the same number as libhora's and the
# wheel's, which pyproject.toml reads from that file too).
__version__ = "%d.%d.%d" % (_lib.HORA_VERSION_MAJOR, _lib.HORA_VERSION_MINOR, _lib.HORA_VERSION_PATCH)

if hasattr(_lib, "hora_allreduce_async"):
    from ._async import (  # noqa: F401
        Handle, allreduce_async, allreduce_async_, alltoall_async, broadcast_async,
        broadcast_async_, grouped_allreduce, grouped_allreduce_, reducescatter_async,
        grouped_allreduce_async, grouped_allreduce_async_, join, poll, synchronize,
    )
if hasattr(_lib, "hora_ckpt_open"):
    from .checkpoint import EXIT_REQUEUE, Checkpoint, should_stop, stop_on_signal  # noqa: F401
if hasattr(_lib, "hora_elastic_open"):
    from . import elastic  # noqa: F401

# `from hora.common.exceptions import HorovodInternalError` and the like (_horovod_common.py).
from . import _horovod_common  # noqa: E402

_horovod_common.install(_sys.modules[__name__])
