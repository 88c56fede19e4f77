# per-call cost of an 8 B all_reduce through each layer (2 ranks, torchrun)
import os, sys, time, torch, torch.distributed as dist
import dpkit.distributed  # registers "dpkit"
rank = int(os.environ["RANK"])
os.sched_setaffinity(0, {rank % os.cpu_count()})
torch.set_num_threads(1)
be_name = sys.argv[1] if len(sys.argv) > 1 else "dpkit"
dist.init_process_group(be_name)
t = torch.zeros(2)
pg = dist.group.WORLD
backend = pg._get_backend(torch.device("cpu"))
opts = dist.AllreduceOptions()
N = int(os.environ.get("N", "20000"))
def timeit(f):
    for _ in range(2000): f()
    dist.barrier()
    best = []
    for r in range(5):
        t0 = time.perf_counter()
        for _ in range(N): f()
        best.append((time.perf_counter() - t0) / N * 1e6)
    return sorted(best)[2]
res = {
  "dist.all_reduce": timeit(lambda: dist.all_reduce(t)),
  "pg.allreduce.wait": timeit(lambda: pg.allreduce([t]).wait()),
  "backend.allreduce.wait": timeit(lambda: backend.allreduce([t], opts).wait()),
}
if rank == 0:
    for k, v in res.items(): print(f"{be_name} {k:28s} {v:7.2f} us")
dist.destroy_process_group()
