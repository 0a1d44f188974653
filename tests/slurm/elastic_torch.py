"""A torch model trained with hora.torch.elastic under `launch --elastic` (test_elastic_slurm.py
torch): a linear classifier of 8 features into 4 classes on 512 samples from a fixed teacher,
SGD with momentum, ElasticSampler, TorchState, @hvd.elastic.run.

    python elastic_torch.py WORK_DIR EPOCHS STEP_MS

Lines (rank 0 unless said):
    ELASTIC_TORCH start world W t_start=T t_import=T t_init=T   (the interpreter up, torch and
        hora.torch imported, hvd.init() done: UNIX times for the recovery breakdown)
    ELASTIC_TORCH sync rank R world W commit C hash H t=T      (every rank, after the sync)
    ELASTIC_TORCH train world W epoch E t=REALTIME              (first batch after each sync)
    ELASTIC_TORCH commit C world W hash H
    ELASTIC_TORCH epoch E world W resumed R new N dup D missing M   (the samples of epoch E:
        R marked processed at the sync, N processed since by all ranks; D of those were already
        processed or seen twice, M of the dataset never: both must be 0)
    ELASTIC_TORCH done world W accuracy A
"""
import time

T_START = time.time()  # the interpreter is up (before any import)
import hashlib  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import hora.torch as hvd  # noqa: E402

T_IMPORT = time.time()

N, F, K, B = 512, 8, 4, 8


def data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, F, generator=g)
    teacher = torch.randn(F, K, generator=g)
    return x, (x @ teacher).argmax(1)


def phash(model):
    h = hashlib.sha1()
    for v in model.state_dict().values():
        h.update(v.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    work, epochs, step_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    hvd.init()
    r, w = hvd.rank(), hvd.size()
    if r == 0:
        print(f"ELASTIC_TORCH start world {w} t_start={T_START:.3f} t_import={T_IMPORT:.3f} t_init={time.time():.3f}",
              flush=True)
    with open(os.path.join(work, f"pid.{os.environ.get('SLURMD_NODENAME', 'local')}.{r}"), "w") as f:
        f.write(f"{os.getpid()}\n")
    torch.manual_seed(100 + r)  # every rank starts different: the first sync makes them equal
    model = torch.nn.Linear(F, K)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    x, y = data()
    sampler = hvd.elastic.ElasticSampler(list(range(N)), shuffle=True, seed=5)
    state = hvd.elastic.TorchState(model, opt, hora_dir=os.path.join(work, "elastic"),
                                   train_sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        print(f"ELASTIC_TORCH sync rank {r} world {w} commit {state.commit_id} hash {phash(model)} t={time.time():.3f}",
              flush=True)
        resumed = sampler.processed.copy()
        first = True
        for state.epoch in range(state.epoch, epochs):
            mine = []
            # The same number of batches on every rank (shards differ by at most one sample):
            # a rank out of samples contributes an empty batch (zero gradient).
            nb = int(hvd.allreduce(torch.tensor([len(sampler)]), op=hvd.Max).item() + B - 1) // B
            for b in range(nb):
                if first and r == 0:
                    print(f"ELASTIC_TORCH train world {w} epoch {state.epoch} t={time.time():.3f}", flush=True)
                first = False
                idx = sampler.get_indices(b, B)
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx], reduction="sum") / (B * w)
                loss.backward()
                for p in model.parameters():
                    hvd.allreduce_(p.grad, op=hvd.Sum)
                opt.step()
                sampler.record_batch(b, B)
                mine += idx
                time.sleep(step_ms / 1000)
                if (b + 1) % 4 == 0 and b + 1 < nb:
                    state.save()  # a commit without the host check: grow at epoch ends only
                    if r == 0:
                        print(f"ELASTIC_TORCH commit {state.commit_id} world {w} hash {phash(model)}", flush=True)
            seen = hvd.allgather_object(mine)
            if r == 0:
                allnew = [i for s in seen for i in s]
                dup = len(allnew) - len(set(allnew)) + int(resumed[allnew].sum())
                missing = N - int((resumed | np.isin(np.arange(N), allnew)).sum())
                print(f"ELASTIC_TORCH epoch {state.epoch} world {w} resumed {int(resumed.sum())} new {len(allnew)} "
                      f"dup {dup} missing {missing}", flush=True)
            resumed[:] = False
            sampler.set_epoch(state.epoch + 1)
            state.epoch += 1
            state.save()  # at the epoch's end: state.commit() is save() + check_host_updates()
            state.epoch -= 1
            if r == 0:
                print(f"ELASTIC_TORCH commit {state.commit_id} world {w} hash {phash(model)}", flush=True)
            state.check_host_updates()  # raises HostsUpdatedInterrupt: run() re-forms to grow
        state.epoch = epochs

    train(state)
    acc = (model(x).argmax(1) == y).float().mean().item()
    if r == 0:
        print(f"ELASTIC_TORCH done world {w} accuracy {acc:.3f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
