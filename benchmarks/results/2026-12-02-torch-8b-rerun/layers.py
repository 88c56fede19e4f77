import os, sys, time, torch, torch.distributed as dist
import dpkit.distributed
rank = int(os.environ["RANK"]); ws = int(os.environ["WORLD_SIZE"])
os.sched_setaffinity(0, {rank % os.cpu_count()})
torch.set_num_threads(1)
dist.init_process_group(sys.argv[1])
pg = dist.group.WORLD
be = pg._get_backend(torch.device("cpu"))
t = torch.zeros(2); outs = [torch.zeros(2) for _ in range(ws)]
y = torch.zeros(2 * ws)
N = 5000
def timeit(f):
    for _ in range(500): f()
    be.barrier(dist.BarrierOptions()).wait()
    r = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(N): f()
        r.append((time.perf_counter() - t0) / N * 1e6)
    return sorted(r)[2]
go = dist.GatherOptions(); go.rootRank = 0
from torch._C._distributed_c10d import AllgatherOptions; ao = AllgatherOptions()
res = {
 "be.gather": timeit(lambda: be.gather([outs] if rank == 0 else [], [t], go).wait()),
 "pg.gather": timeit(lambda: pg.gather([outs] if rank == 0 else [], [t], go).wait()),
 "d.gather": timeit(lambda: dist.gather(t, outs if rank == 0 else None, dst=0)),
 "be.agbase": timeit(lambda: be._allgather_base(y, t, ao).wait()),
 "pg.agbase": timeit(lambda: pg._allgather_base(y, t, ao).wait()),
 "d.agit": timeit(lambda: dist.all_gather_into_tensor(y, t)),
}
if rank == 0: print(sys.argv[1], " ".join(f"{k} {v:.1f}" for k, v in res.items()))
dist.destroy_process_group()
