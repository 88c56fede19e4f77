"""torch DDP over "dpkit" (mpirun, 2 ranks): step time with DDP's default
all-reduce and with dpkit.distributed.registered_allreduce_hook (the
buckets registered), alternated in one process: per round, STEPS steps of
each on its own copy of the same model (4 x Linear(2048, 2048), 16.8M
parameters, 64 MiB of gradients: 3 buckets at DDP's default 25 MB cap).
Prints per round the median step (ms) of each and the time from the end of
the forward pass to the end of backward + the gradients' all-reduce
(what DDP overlaps), and the losses' equality.
    mpirun -np 2 build-python/venv/bin/python benchmarks/results/2026-12-05-registered-memory/ddp_hook.py
"""
import statistics
import sys
import time

import torch
import torch.distributed as dist

import dpkit

ROUNDS, STEPS = 3, 8


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)])


def run(model, steps, gen_seed):
    g = torch.Generator().manual_seed(gen_seed)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    step_ms, bwd_ms, losses = [], [], []
    for _ in range(steps):
        x = torch.randn(64, 2048, generator=g)
        t0 = time.perf_counter()
        loss = model(x).pow(2).mean()
        t1 = time.perf_counter()
        opt.zero_grad()
        loss.backward()  # returns once every bucket's all-reduce is done and written back
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        step_ms.append((t3 - t0) * 1e3)
        bwd_ms.append((t2 - t1) * 1e3)
        losses.append(loss.item())
    return statistics.median(step_ms), statistics.median(bwd_ms), losses


def main():
    dpkit.distributed.init_process_group()
    r = dist.get_rank()
    torch.set_num_threads(1)
    plain = torch.nn.parallel.DistributedDataParallel(make())
    hooked = torch.nn.parallel.DistributedDataParallel(make())
    state = dpkit.distributed.RegisteredAllreduce()
    hooked.register_comm_hook(state, dpkit.distributed.registered_allreduce_hook)
    run(plain, 2, 1)  # warm-up (DDP rebuilds its buckets after the first step)
    run(hooked, 2, 1)
    for k in range(ROUNDS):
        ps, pb, pl = run(plain, STEPS, 100 + k)
        hs, hb, hl = run(hooked, STEPS, 100 + k)
        if r == 0:
            print(f"round {k + 1}: default step {ps:.1f} ms, backward+all-reduce {pb:.1f} ms | "
                  f"registered step {hs:.1f} ms, backward+all-reduce {hb:.1f} ms | shared buckets "
                  f"{sum(state.shared.values())} of {len(state.shared)}", flush=True)
    state.release()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
