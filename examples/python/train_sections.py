#!/usr/bin/env python3
"""A complete data-parallel training loop with dpkit from Python
(docs/python.md): torch's DDP over the "dpkit" backend, a JsonlDataset over
the repository's corpus of Debian package descriptions, token-budget batches,
and a checkpoint that resumes mid-epoch on any number of ranks.

The task: predict a package's Debian section (libs, python, doc, ...) from
the bytes of its description, with a bag-of-byte-bigrams model. Run:

    xz -dk data/debian-descriptions.jsonl.xz
    torchrun --nproc-per-node 2 examples/python/train_sections.py --data data/debian-descriptions.jsonl --steps 200
    mpirun -np 2 python examples/python/train_sections.py --data data/debian-descriptions.jsonl --steps 200
    # again with --resume: continues from the checkpoint, where it stopped

Each rank logs its loss; rank 0 writes the checkpoint (model, optimizer,
sampler position) atomically (a temporary file, then a rename).
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import dpkit


class Sections:
    """Maps section names to class numbers (fixed list: every rank agrees)."""

    def __init__(self, ds):
        self.names = sorted({ds[i]["section"] for i in range(0, len(ds), 1)})
        self.index = {n: i for i, n in enumerate(self.names)}


def collate(batch, sections, max_bytes=512):
    """Byte bigrams of each description (its first max_bytes bytes) as an
    EmbeddingBag input, and the section as the label."""
    flat, offsets, labels = [], [], []
    for sample in batch:
        b = sample["text"].encode("utf-8")[:max_bytes]
        offsets.append(len(flat))
        flat.extend(b[i] << 8 | b[i + 1] for i in range(len(b) - 1))
        if len(b) < 2:
            flat.append(0)
        labels.append(sections.index[sample["section"]])
    return torch.tensor(flat, dtype=torch.long), torch.tensor(offsets), torch.tensor(labels)


class BagOfBigrams(torch.nn.Module):
    def __init__(self, classes, dim=64):
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(1 << 16, dim, mode="mean")
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 128), torch.nn.ReLU(), torch.nn.Linear(128, classes))

    def forward(self, flat, offsets):
        return self.mlp(self.emb(flat, offsets))


def save(path, state):
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)  # never a half-written checkpoint


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="the JSONL file (its index is built beside it if missing)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=8192, help="token budget of one rank's batch")
    ap.add_argument("--checkpoint", default="train_sections.pt")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--backend", default="dpkit", help="dpkit, or gloo to compare")
    ap.add_argument("--log-every", type=int, default=20)
    args = ap.parse_args()

    dpkit.distributed.init_process_group(args.backend)  # rank and world size from torchrun (env://) or mpirun
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))  # mpirun binds each rank to its cores

    ds = dpkit.JsonlDataset(args.data, length_field="num_tokens", progress=rank == 0)
    sections = Sections(ds)
    # elastic: the batch sequence does not depend on the world size, so a
    # checkpoint resumes on any number of ranks
    sampler = dpkit.TokenBudgetBatchSampler(ds, args.max_tokens, world, rank, max_sample_tokens=1024, elastic=True,
                                            seed=17)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(BagOfBigrams(len(sections.names)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = 0
    if args.resume and os.path.exists(args.checkpoint):
        ck = torch.load(args.checkpoint)
        model.module.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sampler.load_state_dict(ck["sampler"])
        step = ck["step"]
        if rank == 0:
            print(f"resumed at step {step}, epoch {ck['sampler']['epoch']}, offset {ck['sampler']['offset']}")
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=min(2, len(os.sched_getaffinity(0))),
                                         collate_fn=lambda b: collate(b, sections))
    epoch = sampler.epoch
    t0 = time.perf_counter()
    done_in_epoch = 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for flat, offsets, labels in loader:
            loss = F.cross_entropy(model(flat, offsets), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            done_in_epoch += 1
            if step % args.log_every == 0 or step == args.steps:
                mean = loss.detach().clone()
                dist.all_reduce(mean, dist.ReduceOp.AVG if args.backend == "dpkit" else dist.ReduceOp.SUM)
                if args.backend != "dpkit":
                    mean /= world
                if rank == 0:
                    ms = (time.perf_counter() - t0) / args.log_every * 1e3
                    print(f"step {step} epoch {epoch} loss {mean.item():.4f} ({ms:.1f} ms/step)", flush=True)
                t0 = time.perf_counter()
            if step == args.steps:
                break
        else:  # the epoch ended
            epoch += 1
            done_in_epoch = 0
            continue
        break
    state = sampler.state_dict(steps_done=done_in_epoch)
    if rank == 0:
        save(args.checkpoint, {"model": model.module.state_dict(), "optimizer": opt.state_dict(), "sampler": state,
                               "step": step, "sections": sections.names})
        print(f"checkpoint {args.checkpoint}: step {step}, sampler {json.dumps({k: state[k] for k in ('epoch', 'offset')})}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
