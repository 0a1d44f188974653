"""Horovod's environment variables (HOROVOD_*), read by hora.init() as Horovod 0.28 reads them.

A Horovod job script sets its tuning through the environment (`HOROVOD_FUSION_THRESHOLD=...
horovodrun ...`, `mpirun -x HOROVOD_TIMELINE=...`, or `horovodrun --fusion-threshold-mb`, which
sets the same variables). Before hora_init reads its own settings, each HOROVOD_* variable that
hora has a counterpart for is translated into that HORA_* variable in this process's
environment, in the units hora uses:

    HOROVOD_FUSION_THRESHOLD              bytes         -> HORA_FUSION_THRESHOLD
    HOROVOD_CYCLE_TIME                    ms            -> HORA_CYCLE_TIME_MS
    HOROVOD_CACHE_CAPACITY                entries       -> HORA_CACHE_CAPACITY
    HOROVOD_TIMELINE                      path          -> HORA_TIMELINE (DYNAMIC: none; start_timeline works anyway)
    HOROVOD_TIMELINE_MARK_CYCLES          0/1           -> HORA_TIMELINE_MARK_CYCLES (Horovod's default: 0)
    HOROVOD_STALL_CHECK_TIME_SECONDS      s             -> HORA_STALL_WARNING_S
    HOROVOD_STALL_SHUTDOWN_TIME_SECONDS   s             -> HORA_STALL_SHUTDOWN_S
    HOROVOD_STALL_CHECK_DISABLE           >0            -> HORA_STALL_WARNING_S=0, HORA_STALL_SHUTDOWN_S=0
    HOROVOD_LOG_LEVEL                     trace..fatal  -> HORA_LOG

The few whose request hora cannot honour, and whose absence a user would notice, raise a warning
on rank 0 (HOROVOD_AUTOTUNE, HOROVOD_MPI_THREADS_DISABLE, HOROVOD_CPU_OPERATIONS or
HOROVOD_CONTROLLER other than MPI); the rest are performance switches of Horovod's own
transports and are ignored (docs/horovod.md lists them all).

Horovod parses with strtol/strtof and takes garbage as 0 (HOROVOD_FUSION_THRESHOLD=64MB would
turn fusion off); hora refuses a malformed or negative value with InvalidArgumentError naming the
variable, and a HORA_* variable set beside its HOROVOD_* counterpart to a different value is
refused the same way, naming both. Written here, not in libhora, because these names belong to
the Python API that replaces horovod.torch; C programs use the HORA_* names.
"""
import math
import os
import warnings

from ._errors import InvalidArgumentError
from ._hora_cffi import lib

# HORA_* variables this module set, with the value, so that a second init() (after shutdown)
# may translate again without taking its own earlier result for a user's setting.
_set_by_us = {}

_LOG_LEVELS = {"trace": "TRACE", "debug": "TRACE", "info": "INFO", "warning": "WARN",
               "error": "WARN", "fatal": "WARN"}

# Set by horovodrun or Horovod's own tests, or performance switches of Horovod's transports
# (NCCL streams, Gloo, oneCCL, XLA, NVTX, batched copies): no effect on what hora computes.
IGNORED = (
    "HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLGATHER", "HOROVOD_TORUS_ALLREDUCE",
    "HOROVOD_BATCH_D2D_MEMCOPIES", "HOROVOD_DISABLE_GROUP_FUSION",
    "HOROVOD_ENABLE_ASYNC_COMPLETION", "HOROVOD_NUM_NCCL_STREAMS", "HOROVOD_THREAD_AFFINITY",
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE", "HOROVOD_ENABLE_XLA_OPS", "HOROVOD_DISABLE_NVTX_RANGES",
    "HOROVOD_DYNAMIC_PROCESS_SETS", "HOROVOD_ELASTIC", "HOROVOD_AUTOTUNE_LOG",
)


def _bad(var, value, want):
    return InvalidArgumentError(f"{var}={value!r}: {want}", lib.HORA_ERR_INVALID_ARGUMENT)


def _int(env, var, lo=0):
    v = env[var].strip()
    try:
        n = int(v, 10)
    except ValueError:
        raise _bad(var, env[var], "expected a whole number (Horovod's unit, no suffix)") from None
    if n < lo:
        raise _bad(var, env[var], f"expected a number >= {lo}")
    return n


def _float(env, var):
    try:
        x = float(env[var].strip())
    except ValueError:
        raise _bad(var, env[var], "expected a number (Horovod's unit, no suffix)") from None
    if not math.isfinite(x) or x < 0:
        raise _bad(var, env[var], "expected a finite number >= 0")
    return x


def _flag(env, var):
    """Horovod's SetBoolFromEnv: set when the value is a whole number > 0."""
    return var in env and _int(env, var, lo=-(1 << 62)) > 0


def _num(s):
    """A HORA_* number as libhora reads it (K/M/G: powers of 1024), or None if it is not one."""
    s = s.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    try:
        return float(s[:-1] if mult != 1 else s) * mult
    except ValueError:
        return None


def translate(env):
    """The HORA_* settings that env's HOROVOD_* variables ask for, and the warnings to give:
    (dict HORA_NAME -> (value, source HOROVOD_NAME), [message, ...]). Pure: reads env only.
    Raises InvalidArgumentError for a malformed value."""
    out, notes = {}, []

    def put(hora_var, value, src, soft=False):
        """soft: Horovod's default where its variable is unset; a HORA_* setting then wins."""
        if not (soft and hora_var in env):
            out[hora_var] = (value, src)

    if "HOROVOD_FUSION_THRESHOLD" in env:
        put("HORA_FUSION_THRESHOLD", str(_int(env, "HOROVOD_FUSION_THRESHOLD")),
            "HOROVOD_FUSION_THRESHOLD")
    if "HOROVOD_CYCLE_TIME" in env:
        put("HORA_CYCLE_TIME_MS", repr(_float(env, "HOROVOD_CYCLE_TIME")), "HOROVOD_CYCLE_TIME")
    if "HOROVOD_CACHE_CAPACITY" in env:
        put("HORA_CACHE_CAPACITY", str(_int(env, "HOROVOD_CACHE_CAPACITY")),
            "HOROVOD_CACHE_CAPACITY")
    tl = env.get("HOROVOD_TIMELINE")
    if tl is not None and tl.strip() and tl.strip() not in ("DYNAMIC", "DISABLED"):
        put("HORA_TIMELINE", tl, "HOROVOD_TIMELINE")
        put("HORA_TIMELINE_MARK_CYCLES", "1" if _flag(env, "HOROVOD_TIMELINE_MARK_CYCLES") else "0",
            "HOROVOD_TIMELINE_MARK_CYCLES", soft="HOROVOD_TIMELINE_MARK_CYCLES" not in env)
    if _flag(env, "HOROVOD_STALL_CHECK_DISABLE"):
        put("HORA_STALL_WARNING_S", "0", "HOROVOD_STALL_CHECK_DISABLE")
        put("HORA_STALL_SHUTDOWN_S", "0", "HOROVOD_STALL_CHECK_DISABLE")
    else:
        if "HOROVOD_STALL_CHECK_TIME_SECONDS" in env:
            put("HORA_STALL_WARNING_S", str(_int(env, "HOROVOD_STALL_CHECK_TIME_SECONDS")),
                "HOROVOD_STALL_CHECK_TIME_SECONDS")
        if "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" in env:
            put("HORA_STALL_SHUTDOWN_S", str(_int(env, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")),
                "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    if "HOROVOD_LOG_LEVEL" in env:
        lv = _LOG_LEVELS.get(env["HOROVOD_LOG_LEVEL"].strip().lower())
        if lv is None:
            raise _bad("HOROVOD_LOG_LEVEL", env["HOROVOD_LOG_LEVEL"],
                       "expected one of " + ", ".join(_LOG_LEVELS))
        put("HORA_LOG", lv, "HOROVOD_LOG_LEVEL")

    if _flag(env, "HOROVOD_AUTOTUNE"):
        notes.append("HOROVOD_AUTOTUNE is set, but hora has no autotuner: the fusion threshold "
                     "and cycle time stay as set (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, "
                     "or hora's defaults)")
    if _flag(env, "HOROVOD_MPI_THREADS_DISABLE"):
        notes.append("HOROVOD_MPI_THREADS_DISABLE is set, but hora needs MPI_THREAD_MULTIPLE "
                     "(its engine and heartbeat threads call MPI) and requests it anyway")
    for var in ("HOROVOD_CPU_OPERATIONS", "HOROVOD_CONTROLLER"):
        v = env.get(var, "").strip()
        if v and v.lower() != "mpi":
            notes.append(f"{var}={v} is set, but hora's controller and host collectives always "
                         "run on MPI")
    return out, notes


def apply(environ=None):
    """Translate into `environ` (default os.environ) before hora_init; returns the warnings to
    give once the rank is known. Raises InvalidArgumentError for a malformed HOROVOD_* value or
    a HORA_* variable that contradicts its HOROVOD_* counterpart."""
    env = os.environ if environ is None else environ
    out, notes = translate(env)
    for hora_var, (value, src) in out.items():
        have = env.get(hora_var)
        if have is not None and _set_by_us.get(hora_var) != have and have != value:
            a, b = _num(have), _num(value)
            if a is None or b is None or a != b:
                raise InvalidArgumentError(
                    f"{src} asks for {hora_var}={value}, but {hora_var}={have} is set: unset "
                    "one of the two", lib.HORA_ERR_INVALID_ARGUMENT)
            continue  # the same setting, spelled differently: keep the user's spelling
        env[hora_var] = value
        _set_by_us[hora_var] = value
    return notes


def warn(notes, rank):
    """Rank 0 gives each warning once (every rank reads the same job environment)."""
    if rank != 0:
        return
    for n in notes:
        warnings.warn("hora: " + n, UserWarning, stacklevel=3)
