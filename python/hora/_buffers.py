"""From Python arrays to (pointer, count, dtype, device) for the C calls, without copies.

Accepted: NumPy arrays of the eight hora dtypes (bfloat16 through ml_dtypes when it is
installed), and any object with __dlpack__ (PyTorch tensors on the CPU and, in a CUDA build, on the
GPU; CuPy; JAX). The memory must be C-contiguous and aligned to the element size: a strided or
misaligned view is an InvalidArgumentError that says so (no hidden copy is made, since an in-place
call on a copy would silently change nothing).
"""
import ctypes
import sys

import numpy as np

from ._errors import check, invalid
from ._hora_cffi import ffi, lib

try:  # bfloat16 for NumPy comes from ml_dtypes (the package JAX and TensorFlow use).
    import ml_dtypes as _ml_dtypes

    BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - exercised only without ml_dtypes
    BFLOAT16 = None

HOST = lib.HORA_DEVICE_HOST
CUDA = lib.HORA_DEVICE_CUDA

# NumPy dtype -> hora dtype. Native byte order only: np.dtype(">f4") is a different key, so a
# byte-swapped array is rejected instead of reduced as garbage.
NP_TO_HORA = {
    np.dtype(np.uint8): lib.HORA_UINT8,
    np.dtype(np.int8): lib.HORA_INT8,
    np.dtype(np.int32): lib.HORA_INT32,
    np.dtype(np.int64): lib.HORA_INT64,
    np.dtype(np.float16): lib.HORA_FLOAT16,
    np.dtype(np.float32): lib.HORA_FLOAT32,
    np.dtype(np.float64): lib.HORA_FLOAT64,
    np.dtype(np.int16): lib.HORA_INT16,
    np.dtype(np.bool_): lib.HORA_BOOL,
}
if BFLOAT16 is not None:
    NP_TO_HORA[BFLOAT16] = lib.HORA_BFLOAT16
HORA_TO_NP = {v: k for k, v in NP_TO_HORA.items()}
DTYPE_NAMES = {
    lib.HORA_UINT8: "uint8", lib.HORA_INT8: "int8", lib.HORA_INT32: "int32",
    lib.HORA_INT64: "int64", lib.HORA_FLOAT16: "float16", lib.HORA_BFLOAT16: "bfloat16",
    lib.HORA_FLOAT32: "float32", lib.HORA_FLOAT64: "float64", lib.HORA_INT16: "int16",
    lib.HORA_BOOL: "bool",
}
FLOAT_DTYPES = (lib.HORA_FLOAT16, lib.HORA_BFLOAT16, lib.HORA_FLOAT32, lib.HORA_FLOAT64)

# DLPack type codes (dlpack.h DLDataTypeCode) and device types (DLDeviceType).
_KDL_INT, _KDL_UINT, _KDL_FLOAT, _KDL_BFLOAT, _KDL_BOOL = 0, 1, 2, 4, 6
_DL_TO_HORA = {
    (_KDL_UINT, 8): lib.HORA_UINT8,
    (_KDL_INT, 8): lib.HORA_INT8,
    (_KDL_INT, 32): lib.HORA_INT32,
    (_KDL_INT, 64): lib.HORA_INT64,
    (_KDL_FLOAT, 16): lib.HORA_FLOAT16,
    (_KDL_BFLOAT, 16): lib.HORA_BFLOAT16,
    (_KDL_FLOAT, 32): lib.HORA_FLOAT32,
    (_KDL_FLOAT, 64): lib.HORA_FLOAT64,
    (_KDL_INT, 16): lib.HORA_INT16,
    (_KDL_BOOL, 8): lib.HORA_BOOL,
}
_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST, _KDL_CUDA_MANAGED = 1, 2, 3, 13
_DL_DEVICES = {_KDL_CPU: HOST, _KDL_CUDA_HOST: HOST, _KDL_CUDA: CUDA, _KDL_CUDA_MANAGED: CUDA}

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

NULL = ffi.NULL


class Buf:
    """A borrowed view of an array's memory. `keep` holds what keeps the memory alive (the array
    itself, or the DLPack capsule whose destructor releases the producer's reference)."""

    __slots__ = ("ptr", "count", "dtype", "device", "shape", "keep", "obj")

    def __init__(self, ptr, count, dtype, device, shape, keep, obj):
        self.ptr = ptr
        self.count = count
        self.dtype = dtype
        self.device = device
        self.shape = shape
        self.keep = keep
        self.obj = obj

    @property
    def itemsize(self):
        return 2 if self.dtype in (lib.HORA_FLOAT16, lib.HORA_BFLOAT16, lib.HORA_INT16) else \
            {lib.HORA_UINT8: 1, lib.HORA_INT8: 1, lib.HORA_INT32: 4, lib.HORA_INT64: 8,
             lib.HORA_FLOAT32: 4, lib.HORA_FLOAT64: 8, lib.HORA_BOOL: 1}[self.dtype]


def _typename(x):
    t = type(x)
    return f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__


def _numpy_buf(x, what, writable):
    dt = NP_TO_HORA.get(x.dtype)
    if dt is None:
        hint = ""
        if x.dtype.byteorder not in ("=", "|") and x.dtype.newbyteorder("=") in NP_TO_HORA:
            hint = " (non-native byte order: use x.astype(x.dtype.newbyteorder('=')))"
        elif x.dtype.name == "bfloat16" or BFLOAT16 is None and "bfloat16" in str(x.dtype):
            hint = " (install ml_dtypes for bfloat16)"
        raise invalid(f"{what}: dtype {x.dtype} is not supported by hora{hint}; supported: "
                      + ", ".join(DTYPE_NAMES[d] for d in sorted(DTYPE_NAMES)
                                  if d in HORA_TO_NP))
    if not x.flags.c_contiguous:
        raise invalid(f"{what}: the array is not C-contiguous (shape {x.shape}, strides "
                      f"{x.strides}); pass np.ascontiguousarray(x)")
    if not x.flags.aligned:
        raise invalid(f"{what}: the array is not aligned to its {x.dtype.itemsize}-byte elements (a view "
                      f"at an odd byte offset); pass np.require(x, requirements='A'), an aligned copy")
    if writable and not x.flags.writeable:
        raise invalid(f"{what}: the array is read-only and this call writes to it")
    # ffi.from_buffer is the cheapest way to the data pointer (about 0.2 us, against 1.5 us for
    # __array_interface__); writability was checked above through the flags.
    return Buf(ffi.from_buffer(x), x.size, dt, HOST, x.shape, x, x)


def _dlpack_buf(x, what, writable):
    try:
        capsule = x.__dlpack__()
    except Exception as e:  # the producer's own reason (e.g. a tensor that requires grad)
        raise invalid(f"{what}: {_typename(x)}.__dlpack__() failed: {e}") from e
    try:
        addr = _capsule_pointer(capsule, b"dltensor")
    except Exception as e:
        raise invalid(f"{what}: {_typename(x)}.__dlpack__() did not return a 'dltensor' "
                      f"capsule") from e
    t = ffi.cast("hora_py_dlmanaged_t *", addr).dl_tensor
    dev = _DL_DEVICES.get(t.device.device_type)
    if dev is None:
        raise invalid(f"{what}: DLPack device type {t.device.device_type} is not supported "
                      f"(host memory or CUDA device memory only)")
    if t.dtype.lanes != 1:
        raise invalid(f"{what}: vector DLPack dtypes (lanes={t.dtype.lanes}) are not supported")
    dt = _DL_TO_HORA.get((t.dtype.code, t.dtype.bits))
    if dt is None:
        raise invalid(f"{what}: DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits) of "
                      f"{_typename(x)} is not supported by hora (uint8, int8, int16, int32, int64, "
                      f"float16, bfloat16, float32, float64, bool)")
    ndim = t.ndim
    shape = tuple(t.shape[i] for i in range(ndim))
    count = 1
    for s in shape:
        count *= s
    if t.strides != NULL and count > 0:
        expect = 1
        for i in range(ndim - 1, -1, -1):
            if shape[i] != 1 and t.strides[i] != expect:
                strides = tuple(t.strides[j] for j in range(ndim))
                raise invalid(f"{what}: the tensor is not contiguous (shape {shape}, strides "
                              f"{strides} in elements); pass x.contiguous() or a copy")
            expect *= shape[i]
    ptr = NULL if count == 0 else ffi.cast("char *", t.data) + t.byte_offset
    if dev == HOST:
        ro = getattr(x, "flags", None)
        if writable and ro is not None and getattr(ro, "writeable", True) is False:
            raise invalid(f"{what}: the array is read-only and this call writes to it")
    return Buf(ptr, count, dt, dev, shape, (x, capsule), x)


_torch = [None, None, None]  # torch.Tensor, its dtype map and torch.strided, once imported

# Async submissions of CUDA tensors pass a ready event (set_ready) instead of synchronizing
# torch's stream. False restores the synchronization; python/bench/bench_gpu_fusion.py's
# `--ready sync` sets it to measure one against the other. Not a user setting.
READY_EVENTS = True


def _torch_tensor_class():
    mod = sys.modules.get("torch")
    if mod is None:
        return None
    t = mod
    _torch[1] = {t.uint8: lib.HORA_UINT8, t.int8: lib.HORA_INT8, t.int32: lib.HORA_INT32,
                 t.int64: lib.HORA_INT64, t.float16: lib.HORA_FLOAT16,
                 t.bfloat16: lib.HORA_BFLOAT16, t.float32: lib.HORA_FLOAT32,
                 t.float64: lib.HORA_FLOAT64, t.int16: lib.HORA_INT16, t.bool: lib.HORA_BOOL}
    _torch[2] = t.strided
    _torch[0] = t.Tensor
    return t.Tensor


def _torch_buf(x, what, writable, sync=True):
    """PyTorch tensors directly (data_ptr() and friends cost about 1 us; x.__dlpack__() costs
    3 us and refuses tensors that require grad). The memory is the same either way. sync=False:
    a CUDA tensor's stream is not synchronized here; the caller passes a ready event instead
    (ready_event)."""
    dt = _torch[1].get(x.dtype)
    if dt is None:
        raise invalid(f"{what}: torch dtype {x.dtype} is not supported by hora (uint8, int8, "
                      f"int16, int32, int64, float16, bfloat16, float32, float64, bool)")
    if x.layout is not _torch[2]:
        raise invalid(f"{what}: {x.layout} tensors are not supported (dense tensors only)")
    if not x.is_contiguous():
        raise invalid(f"{what}: the tensor is not contiguous (shape {tuple(x.shape)}, strides "
                      f"{x.stride()} in elements); pass x.contiguous()")
    if x.is_cuda:
        dev = CUDA
        # The kernels that produce x may still run on torch's current stream, and hora's C API
        # takes no stream: wait for them before hora reads or writes the memory (an async
        # submission records an event instead, which the engine thread waits for).
        if sync or not READY_EVENTS:
            sys.modules["torch"].cuda.current_stream(x.device).synchronize()
    elif x.is_cpu:
        dev = HOST
    else:
        raise invalid(f"{what}: tensors on {x.device} are not supported (CPU or CUDA only)")
    n = x.numel()
    ptr = ffi.cast("void *", x.data_ptr()) if n else NULL
    return Buf(ptr, n, dt, dev, tuple(x.shape), x, x)


def as_buf(x, what="tensor", writable=False, sync=True):
    """The memory of x as a Buf; InvalidArgumentError naming `what` when x cannot be used.
    sync=False (async submissions only): a CUDA torch tensor's stream is left running, and the
    caller must pass set_ready(ctx, bufs)'s event to the C call that follows."""
    if type(x) is np.ndarray or isinstance(x, np.ndarray):
        return _numpy_buf(x, what, writable)
    tcls = _torch[0] or _torch_tensor_class()
    if tcls is not None and isinstance(x, tcls):
        return _torch_buf(x, what, writable, sync)
    if isinstance(x, np.generic) and not writable:
        return _numpy_buf(np.asarray(x), what, writable)  # a NumPy scalar: a 0-d array
    if x is None:
        raise invalid(f"{what}: got None, expected a NumPy array or a tensor with __dlpack__")
    if hasattr(x, "__dlpack__"):
        return _dlpack_buf(x, what, writable)
    raise invalid(f"{what}: got {_typename(x)}, expected a NumPy array or an object with "
                  f"__dlpack__ (PyTorch tensor, CuPy array, ...)")


def set_ready(ctx, bufs):
    """Horovod's ready event: when any of bufs (all on one device) is a CUDA torch tensor taken
    with sync=False, record an event on torch's current stream of its device, after the work
    that writes the tensors and allocated the outputs, and tag this thread's next async call on
    ctx with it (hora_set_call_ready: the engine thread waits for it before the data moves, so
    the submitting thread, often autograd's, does not wait for the GPU). Returns the event,
    which the handle must keep alive until done, or None."""
    if not READY_EVENTS:
        return None
    for b in bufs:
        if b.device == CUDA and _torch[0] is not None and isinstance(b.obj, _torch[0]):
            torch = sys.modules["torch"]
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(b.obj.device))
            rc = lib.hora_set_call_ready(ctx, ffi.cast("void *", ev.cuda_event))
            if rc == lib.HORA_ERR_NOT_SUPPORTED:
                return None  # libhora without CUDA: the call itself names what is wrong
            check(rc, "hora_set_call_ready")
            return ev
    return None


def empty_like(x, shape=None):
    """A new, uninitialized array of x's kind (NumPy, torch, or the array API namespace of x) with
    x's dtype and device, and `shape` (default x's shape)."""
    if isinstance(x, np.ndarray):
        return np.empty(x.shape if shape is None else shape, dtype=x.dtype)
    tcls = _torch[0] or _torch_tensor_class()  # torch may not have been seen by as_buf yet
    if tcls is not None and isinstance(x, tcls):
        torch = sys.modules["torch"]
        if shape is None:
            return torch.empty_like(x, memory_format=torch.contiguous_format)
        return torch.empty(shape, dtype=x.dtype, device=x.device)
    ns = getattr(x, "__array_namespace__", None)
    if ns is not None:
        xp = ns()
        return xp.empty(x.shape if shape is None else shape, dtype=x.dtype,
                        device=getattr(x, "device", None))
    # A DLPack producer without an array namespace: the output is a NumPy array (host only).
    try:
        a = np.from_dlpack(x)
    except Exception as e:
        raise invalid(f"cannot make an output array like {_typename(x)} ({e}); use the in-place "
                      f"variant (allreduce_, broadcast_)") from e
    return np.empty(a.shape if shape is None else shape, dtype=a.dtype)


def copy_into(dst, src):
    """dst[...] = src for arrays of the same kind (used only where the op needs a copy)."""
    if isinstance(dst, np.ndarray):
        np.copyto(dst, src if isinstance(src, np.ndarray) else np.from_dlpack(src))
    elif _torch[0] is not None and isinstance(dst, _torch[0]):
        with sys.modules["torch"].no_grad():
            dst.copy_(src)
    else:
        dst[...] = src
