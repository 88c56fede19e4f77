import os, sys, time, statistics, datetime, torch, torch.distributed as dist, dpkit
sizes=[int(s) for s in sys.argv[1].split(",")]; iters=int(sys.argv[2]); batches=int(sys.argv[3])
if not dpkit.distributed.launched_by_mpi(): dpkit.distributed.bind_to_cores()
if dpkit.distributed.launched_by_mpi(): dpkit.distributed.init_process_group("dpkit")
else: dist.init_process_group("dpkit")
r=dist.get_rank()
w=torch.zeros(16)
for _ in range(200): dist.all_reduce(w)
for s in sizes:
    x=torch.ones(s//4); ts=[]
    for b in range(batches):
        dist.barrier(); t0=time.perf_counter()
        for _ in range(iters): dist.all_reduce(x)
        dt=torch.tensor([(time.perf_counter()-t0)/iters*1e6],dtype=torch.float64); dist.all_reduce(dt, dist.ReduceOp.MAX); ts.append(dt.item())
    if r==0: print(s, "med %.1f"%statistics.median(ts), " ".join("%.1f"%t for t in ts), flush=True)
dist.destroy_process_group()
