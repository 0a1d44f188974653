"""hora.Checkpoint over libhora's two-phase checkpoints: save/restore of NumPy arrays and torch
tensors, metadata, versions kept, restore from the persistent copy, errors, preemption flag."""
import glob
import os
import shutil
import signal
import tempfile
import threading

import numpy as np
import pytest

import hora
from conftest import ml_dtypes, rank_input, rank_size

if not hasattr(hora, "Checkpoint"):
    pytest.skip("libhora was built without checkpoints", allow_module_level=True)


def shared_dir(tag):
    """A folder that rank 0 creates and every rank learns (same machine)."""
    r, n = rank_size()
    name = np.zeros(256, dtype=np.uint8)
    if r == 0:
        b = tempfile.mkdtemp(prefix=f"hora-ckpt-{tag}-").encode()
        name[:len(b)] = np.frombuffer(b, dtype=np.uint8)
    hora.broadcast_(name, 0)
    return bytes(name).rstrip(b"\0").decode()


def state(step, r):
    s = {"w": rank_input(np.float32, (3, 4), r, step), "n": np.array(step * 10 + r),
         "u8": rank_input(np.uint8, (5,), r, step)}
    if ml_dtypes is not None:
        s["bf"] = rank_input(ml_dtypes.bfloat16, (2, 2), r, step)
    return s


def zeros_like(st):
    return {k: np.zeros_like(v) for k, v in st.items()}


def test_save_restore_versions_and_persistent_copy():
    r, n = rank_size()
    base = shared_dir("a")
    local, persist = os.path.join(base, "local"), os.path.join(base, "persist")
    ck = hora.Checkpoint(local, persist, keep=2, copy_interval_s=0)
    empty = zeros_like(state(0, r))
    first = ck.restore(empty)  # nothing saved yet: None, nothing written
    for step in (1, 2, 3):
        ck.save(step, state(step, r), meta={"epoch": str(step // 2), "note": "x y"})
    ck.flush()
    got = zeros_like(state(0, r))
    step = ck.restore(got)
    meta = (ck.meta("epoch"), ck.meta("note"), ck.meta("missing", "default"))
    src = ck.source()
    ck.close()
    ck.close()  # no-op
    # A new run whose local disk is empty restores from the persistent copy.
    ck2 = hora.Checkpoint(os.path.join(base, "other-local"), persist)
    got2 = zeros_like(state(0, r))
    step2 = ck2.restore(got2)
    src2 = ck2.source()
    ck2.close()
    hora.barrier()

    assert first is None and all((v == 0).all() for v in empty.values())
    assert step == 3 and step2 == 3
    want = state(3, 0)  # rank 0's arrays are the ones saved
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
        np.testing.assert_array_equal(got2[k], want[k], err_msg=k)
    assert meta == ("1", "x y", "default")
    assert src.startswith(local) and src2.startswith(persist)
    if r == 0:
        # The copier copies the newest committed step when it wakes, so a step
        # committed while it was busy (here step 1 or 2) may never be copied; what
        # is copied is pruned to keep=2 with the newest always present.
        copied = sorted(os.path.basename(d) for d in glob.glob(os.path.join(persist, "step-*")))
        assert copied[-1] == "step-3" and len(copied) <= 2 \
            and set(copied) <= {"step-1", "step-2", "step-3"}, copied
        assert os.path.isdir(os.path.join(local, "step-3"))


def test_torch_state_dict_and_safetensors_interop():
    torch = pytest.importorskip("torch")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    r, n = rank_size()
    base = shared_dir("b")
    torch.manual_seed(r)
    model = torch.nn.Linear(4, 3)
    ck = hora.Checkpoint(os.path.join(base, "l"))
    ck.save(7, model.state_dict())
    ck.flush()
    other = torch.nn.Linear(4, 3)
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    sd = other.state_dict()
    step = ck.restore(sd)
    ck.close()
    rank0 = hora.broadcast(torch.cat([p.detach().reshape(-1) for p in model.parameters()]), 0)
    assert step == 7
    torch.testing.assert_close(torch.cat([p.detach().reshape(-1) for p in other.parameters()]),
                               rank0, rtol=0, atol=0)
    if r == 0:
        files = glob.glob(os.path.join(base, "l", "step-7", "*.safetensors"))
        assert len(files) == 1
        loaded = safetensors_numpy.load_file(files[0])
        np.testing.assert_array_equal(loaded["weight"], model.weight.detach().numpy())


def test_checkpoint_errors():
    r, n = rank_size()
    base = shared_dir("c")
    with pytest.raises(hora.InvalidArgumentError, match="keep"):
        hora.Checkpoint(os.path.join(base, "x"), keep=1)
    ck = hora.Checkpoint(os.path.join(base, "l"))
    with pytest.raises(hora.InvalidArgumentError, match="dict"):
        ck.save(1, [np.zeros(2)])
    with pytest.raises(hora.InvalidArgumentError, match="not C-contiguous"):
        ck.save(1, {"a": np.zeros((4, 4))[:, 1]})
    with pytest.raises(hora.InvalidArgumentError, match="step"):
        ck.save("one", {"a": np.zeros(2)})
    ck.save(1, {"a": np.arange(6, dtype=np.float64).reshape(2, 3)})
    ck.flush()  # restore reads committed checkpoints only
    with pytest.raises(hora.MismatchError):
        ck.restore({"a": np.zeros((3, 2))})  # same count, other shape
    with pytest.raises(hora.MismatchError):
        ck.restore({"a": np.zeros((2, 3), dtype=np.float32)})  # other dtype
    with pytest.raises(hora.MismatchError):
        ck.restore({"b": np.zeros(2)})  # no such tensor
    ro = np.zeros((2, 3))
    ro.flags.writeable = False
    with pytest.raises(hora.InvalidArgumentError, match="read-only"):
        ck.restore({"a": ro})
    ok = {"a": np.zeros((2, 3))}
    assert ck.restore(ok) == 1 and ok["a"].tolist() == [[0, 1, 2], [3, 4, 5]]
    ck.close()
    with pytest.raises(hora.InvalidArgumentError, match="closed"):
        ck.save(2, ok)


def test_restore_all_corrupt_raises_corrupt_error():
    """Checkpoints exist but none is valid: CorruptError on every rank (not None, which a resume
    loop would take for a fresh start), naming each file; a fresh directory gives None."""
    r, n = rank_size()
    base = shared_dir("corrupt")
    ck = hora.Checkpoint(os.path.join(base, "l"))
    st = {"a": np.zeros(4)}
    assert ck.restore(st) is None
    for step in (1, 2):
        ck.save(step, {"a": np.full(4, float(step))})
    ck.flush()
    if r == 0:  # only rank 0 reads the files; restore below is collective
        for step in (1, 2):
            path = os.path.join(base, "l", f"step-{step}", "state.safetensors")
            with open(path, "r+b") as f:
                f.seek(-3, os.SEEK_END)
                b = f.read(1)
                f.seek(-3, os.SEEK_END)
                f.write(bytes([b[0] ^ 0x5A]))
    with pytest.raises(hora.CorruptError) as e:
        ck.restore(st)
    assert "2 checkpoints" in str(e.value)
    for step in (1, 2):
        assert f"step-{step}" in str(e.value)
    assert st["a"].tolist() == [0, 0, 0, 0]
    assert e.value.name == "HORA_ERR_CORRUPT"
    ck.close()  # collective: every rank is done with the directory after it
    if r == 0:
        shutil.rmtree(base)


def test_should_stop_after_a_signal():
    r, n = rank_size()
    hora.stop_on_signal()
    before = hora.should_stop()
    if r == n - 1:
        # What `scancel -s USR1` does to one task. Directed at this thread, so that the handler
        # has run before pthread_kill returns (a process-directed signal may land on another
        # thread later).
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
    after = hora.should_stop()
    assert before is False and after is True
    assert hora.EXIT_REQUEUE == 3
