import os, sys, time, torch, torch.distributed as dist, dpkit
secs=float(sys.argv[1]); size=int(sys.argv[2])
if not dpkit.distributed.launched_by_mpi(): dpkit.distributed.bind_to_cores()
if dpkit.distributed.launched_by_mpi(): dpkit.distributed.init_process_group("dpkit")
else: dist.init_process_group("dpkit")
g=dist.new_group(backend="gloo")
r=dist.get_rank(); x=torch.ones(size//4); T0=time.perf_counter(); out=[]
while True:
    t0=time.perf_counter()
    for _ in range(1000): dist.all_reduce(x)
    dt=torch.tensor([(time.perf_counter()-t0)/1000*1e6, t0-T0],dtype=torch.float64); dist.all_reduce(dt, dist.ReduceOp.MAX)
    out.append((dt[1].item(), dt[0].item()))
    if dt[1].item()>secs: break
if r==0: print(" ".join("%.1f:%.0f"%o for o in out))
dist.destroy_process_group()
