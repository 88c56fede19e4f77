#!/usr/bin/env python3
"""Memory of a torch DataLoader with many workers reading a huge JSONL file:
dpkit.JsonlDataset (the mapped index, lines read with pread) against the
seed's approach (the Dataset holds a Python list of the lines: each forked
worker's reference counting touches the list's pages, so copy-on-write copies
them into every worker).

    python3 dataloader_memory.py --mode dpkit --path lines-2e8.jsonl --workers 8 --seconds 60
    python3 dataloader_memory.py --mode list  --path lines-2e8.jsonl --lines 20000000 ...

Every --interval seconds it prints the samples read so far and the memory of
the main process plus its workers: the sum of their RSS (shared pages counted
once per process, what `ps` and RSS limits see) and of their PSS (shared pages
divided among the processes sharing them: the memory the job really uses),
from /proc/PID/smaps_rollup. Samples come from a dpkit.DistributedSampler in
Feistel mode (one rank), so the sampler itself takes no memory (torch's
RandomSampler would hold an 8-byte permutation of every line).
"""
import argparse
import json
import os
import sys
import threading
import time

import torch

import dpkit


class ListDataset(torch.utils.data.Dataset):
    """The seed's approach: every line in a Python list, parsed on access."""

    def __init__(self, path, n):
        self.lines = []
        with open(path, "r") as f:
            for i, line in enumerate(f):
                if i == n:
                    break
                self.lines.append(line)

    def __len__(self):
        return len(self.lines)

    def __getitem__(self, i):
        return json.loads(self.lines[i])


def count(batch):
    return len(batch)


def memory(pid):
    """(rss, pss) of pid in bytes, from smaps_rollup."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, pss


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["dpkit", "list"], required=True)
    ap.add_argument("--path", required=True)
    ap.add_argument("--lines", type=int, default=0, help="list mode: read only the first N lines (0: all)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--interval", type=float, default=5)
    args = ap.parse_args()

    t0 = time.monotonic()
    if args.mode == "dpkit":
        ds = dpkit.JsonlDataset(args.path, progress=True, verify_checksum=False)
    else:
        ds = ListDataset(args.path, args.lines or -1)
    setup_s = time.monotonic() - t0
    sampler = dpkit.DistributedSampler(len(ds), 1, 0, engine="feistel", seed=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=args.workers,
                                         collate_fn=count, persistent_workers=False, prefetch_factor=2)
    me = os.getpid()
    print(f"# mode {args.mode}: {len(ds)} lines of {args.path}, opened in {setup_s:.1f} s; "
          f"{args.workers} workers, batch {args.batch}; memory of the main process + its workers")
    print(f"# {'t (s)':>7} {'samples':>12} {'samples/s':>10} {'procs':>5} {'RSS sum (MiB)':>14} {'PSS sum (MiB)':>14} {'main RSS':>9}")
    done = [0]
    stop = threading.Event()

    def report():
        start = time.monotonic()
        last_n, last_t = 0, start
        while not stop.wait(args.interval):
            pids = [me] + children(me)
            mem = [memory(p) for p in pids]
            now = time.monotonic()
            n = done[0]
            print(f"  {now - start:7.1f} {n:12d} {(n - last_n) / (now - last_t):10.0f} {len(pids):5d} "
                  f"{sum(r for r, _ in mem) / 2**20:14.1f} {sum(p for _, p in mem) / 2**20:14.1f} {mem[0][0] / 2**20:9.1f}",
                  flush=True)
            last_n, last_t = n, now

    th = threading.Thread(target=report, daemon=True)
    th.start()
    end = time.monotonic() + args.seconds
    for k in loader:
        done[0] += k
        if time.monotonic() >= end:
            break
    stop.set()
    th.join()


if __name__ == "__main__":
    sys.exit(main())
