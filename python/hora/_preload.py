"""Share PyTorch's CUDA runtime and NCCL with libhora.

One process holds only one libnccl.so.2 and one libcudart.so.13: the first one loaded serves
every later library that needs that name. A CUDA build of libhora links the copies of the CUDA
toolkit it was built with, while PyTorch's CUDA wheels bring newer copies as the nvidia-* Python
packages and need symbols the older ones lack (`import hora; import torch` would then fail with
"undefined symbol: ncclCommResume"). So when those packages are installed, hora loads their
libraries first, as torch itself does (torch._preload_cuda_deps); libhora then runs on the newer
NCCL and CUDA runtime, which stay backward compatible within their major versions. Without the
packages nothing is loaded here. It costs a few milliseconds.
"""
import ctypes
import importlib.util
import os

# (package, library inside its lib/ folder), in load order: the runtime before NCCL.
_LIBS = (("nvidia.cu13", "libcudart.so.13"), ("nvidia.cuda_runtime", "libcudart.so.13"),
         ("nvidia.nccl", "libnccl.so.2"))


def preload():
    for pkg, name in _LIBS:
        try:
            spec = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            continue
        for d in (spec.submodule_search_locations or []) if spec else []:
            path = os.path.join(d, "lib", name)
            if os.path.exists(path):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                except OSError:  # unusable copy: libhora falls back to its own
                    pass
                break
