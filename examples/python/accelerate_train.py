#!/usr/bin/env python3
"""Hugging Face accelerate over dpkit's torch.distributed backend.

accelerate (1.x) picks the CPU backend itself ("gloo", or "mpi") and refuses
any other name passed to ``InitProcessGroupKwargs(backend=...)``; what it does
honour is a process group that exists before ``Accelerator()`` is made: it
adopts it, and ``accelerator.prepare(model)`` wraps the model in torch's DDP
over it. So this script makes the "dpkit" group first (torch's env://
variables, which ``accelerate launch`` sets), then the Accelerator::

    xz -dk data/debian-descriptions.jsonl.xz
    accelerate launch --multi_gpu --num_processes 2 examples/python/accelerate_train.py \\
        --data data/debian-descriptions.jsonl --steps 50 --backend dpkit
    # the same with --backend gloo: the losses are equal bit for bit

(``--multi_gpu`` is accelerate's switch for "several processes through
torch's elastic launcher"; the script's ``Accelerator(cpu=True)`` keeps them
on the CPU. ``accelerate launch --cpu`` starts a single process.)

The model and data are train_sections.py's (predict a Debian package's
section from its description). Every rank prints the backend actually used
(``torch.distributed.get_backend()``) and, with --loss-log, writes each
step's loss in hex (exact) so two runs compare bit for bit.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import dpkit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_sections import BagOfBigrams, Sections, collate  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="the JSONL corpus (its index is built beside it if missing)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=4096, help="token budget of one rank's batch")
    ap.add_argument("--backend", default="dpkit", help="dpkit, or gloo to compare")
    ap.add_argument("--loss-log", default="", help="write 'step loss_hex' lines to PATH.rank<R>")
    args = ap.parse_args()

    # Before Accelerator(): accelerate adopts an existing default group.
    if not dist.is_initialized():
        dist.init_process_group(args.backend)  # env:// (accelerate launch sets RANK, MASTER_ADDR, ...)
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world}: torch.distributed.get_backend() = {dist.get_backend()}, "
          f"accelerate {accelerator.distributed_type}", flush=True)
    if dist.get_backend() != args.backend:
        raise SystemExit(f"asked for backend {args.backend}, the group runs {dist.get_backend()}")

    ds = dpkit.JsonlDataset(args.data, length_field="num_tokens")
    sections = Sections(ds)
    # dpkit's sampler shards the data (the loader is not given to prepare(),
    # which would shard it again)
    sampler = dpkit.TokenBudgetBatchSampler(ds, args.max_tokens, world, rank, max_sample_tokens=1024, seed=17)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=0,
                                         collate_fn=lambda b: collate(b, sections))
    torch.manual_seed(0)
    model = BagOfBigrams(len(sections.names))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, opt = accelerator.prepare(model, opt)  # DDP over the default group: dpkit's
    log = open(f"{args.loss_log}.rank{rank}", "w") if args.loss_log else None
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for flat, offsets, labels in loader:
            loss = F.cross_entropy(model(flat, offsets), labels)
            opt.zero_grad()
            accelerator.backward(loss)
            opt.step()
            step += 1
            if log:
                log.write(f"{step} {loss.item().hex()}\n")
            if rank == 0 and (step % 10 == 0 or step == args.steps):
                print(f"step {step} loss {loss.item():.6f}", flush=True)
            if step == args.steps:
                break
        epoch += 1
    if log:
        log.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
