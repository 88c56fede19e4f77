"""A training loop for torchrun --max-restarts 1 (test_store_faults.py):
20 steps of dist.all_reduce over the backend "dpkit" (env://, torch's
store), the state checkpointed by rank 0 after every step (atomically).
In the first attempt rank 1 SIGKILLs itself at step 10; torchrun restarts
the group, which resumes from the checkpoint. Each rank writes
done<rank>.json (attempt, final state) at the end."""
import json
import os
import pathlib
import signal
import sys

import torch
import torch.distributed as dist

import dpkit  # noqa: F401  (registers the backend)

out = pathlib.Path(sys.argv[1])
steps = 20
dist.init_process_group(os.environ.get("DPKIT_TEST_BACKEND", "dpkit"))
rank, world = dist.get_rank(), dist.get_world_size()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
ck = out / "ckpt.pt"
start, w = 0, torch.zeros(8)
if ck.exists():
    state = torch.load(ck)
    start, w = state["step"], state["w"]
for step in range(start, steps):
    if attempt == 0 and step == 10 and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    g = torch.full((8,), float(rank + 1))
    dist.all_reduce(g)
    w += g
    dist.barrier()  # every rank finished the step before rank 0 records it
    if rank == 0:
        tmp = out / f"ckpt.pt.tmp{os.getpid()}"
        torch.save({"step": step + 1, "w": w}, tmp)
        os.replace(tmp, ck)
(out / f"done{rank}.json").write_text(json.dumps({"attempt": attempt, "start": start, "w": w.tolist(),
                                                  "backend": dist.get_backend()}))
dist.destroy_process_group()
