"""Shared fixtures of the Python tests. They run under `mpirun -np N python3 -m pytest`: every
rank runs every test in the same order, so each test must make the same hora calls on every rank
(assertions come after the collectives, never between them)."""

import atexit
import functools
import os
import shutil
import tempfile

import numpy as np
import pytest

import hora

try:
    import ml_dtypes
except ImportError:  # bf16 tests are skipped without it
    ml_dtypes = None


def _private_tmp():
    """Every temporary folder of this process (tempfile.mkdtemp, TMPDIR of children, hora's
    checkpoint folders the tests make) goes into one folder that is removed when the session
    ends, also when a test fails, and at exit. Rank 0's folders are shared with the other ranks
    (test_records.shared_dir): it is removed after hora.shutdown, when every rank is done."""
    d = tempfile.mkdtemp(prefix="hora-pytest-")
    tempfile.tempdir = d
    os.environ["TMPDIR"] = d
    # libhora's default folder of an elastic state opened without one (a Horovod program's
    # TorchState), read at hora.init(): here, not /tmp/hora-elastic-<uid>.
    os.environ["HORA_ELASTIC_DIR"] = os.path.join(d, "elastic-default")
    atexit.register(shutil.rmtree, d, True)
    return d


@pytest.fixture(scope="session", autouse=True)
def hora_session(request):
    tmp = _private_tmp()
    try:
        # *_check.py files run alone (one ctest each) and manage init/shutdown themselves.
        if any(item.path.name.endswith("_check.py") for item in request.session.items):
            yield
            return
        hora.init()
        try:
            yield
        finally:
            hora.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def rank_size():
    return hora.rank(), hora.size()


def all_dtypes():
    d = [np.uint8, np.int8, np.int32, np.int64, np.float16, np.float32, np.float64]
    if ml_dtypes is not None:
        d.append(ml_dtypes.bfloat16)
    return [np.dtype(x) for x in d]


def rank_input(dtype, shape, r, seed, lo=None, hi=None):
    """Small integers, the same on every rank for a given (seed, r): every rank can compute any
    other rank's input, so the reference result is computed locally with NumPy. Small values keep
    sums and products exact in every dtype (bf16 holds integers up to 256 exactly)."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng([seed, r])
    if lo is None:
        lo = 0 if dtype == np.uint8 else -5
    if hi is None:
        hi = 9
    return rng.integers(lo, hi + 1, size=shape).astype(np.float64).astype(dtype)


def tol(dtype):
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return 1e-2
    if dtype == np.float16:
        return 1e-3
    if dtype == np.float32:
        return 1e-6
    return 1e-12



@functools.lru_cache(maxsize=None)
def _int_step_sgd_class():
    import torch  # only the torch tests call int_step_sgd

    class IntStepSGD(torch.optim.Optimizer):
        def __init__(self, params, lr, momentum):
            super().__init__(params, dict(lr=lr, momentum=momentum))

        @torch.no_grad()
        def step(self, closure=None):
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is None:
                        continue
                    st = self.state[p]
                    if not st:
                        st["step"], st["buf"] = 0, torch.zeros_like(p)
                    st["step"] += 1
                    st["buf"].mul_(g["momentum"]).add_(p.grad)
                    p.add_(st["buf"], alpha=-g["lr"])
    return IntStepSGD


def int_step_sgd(params, lr=0.1, momentum=0.9):
    """A momentum SGD that keeps its step count as a Python int, as many optimizers outside
    torch.optim do (and torch.optim's own Adadelta, Adagrad, Rprop ... before PyTorch 2.2): the
    non-tensor optimizer state that broadcast_optimizer_state and TorchState must carry too."""
    return _int_step_sgd_class()(params, lr, momentum)
