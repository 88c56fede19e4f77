#!/usr/bin/env python3
"""Writes tests/data/vectors/torch_distributed_sampler.txt: indices of
torch.utils.data.DistributedSampler and torch.randperm for many (N, world size,
rank, seed, epoch, shuffle, drop_last), for tests/data/test_samplers.cpp.

Usage (from the project root; Debian's torch): /usr/bin/python3 scripts/gen_randperm_vectors.py

Line formats:
  torch <version>
  sampler N W rank seed epoch shuffle drop_last : i0 i1 ...
  randperm N seed : p0 p1 ...                    (whole permutation)
  randperm_hash N seed weighted_sum : p0 .. p9   (sum((k+1)*p[k]) mod 2^64, first 10)
"""
import os

import torch
from torch.utils.data import DistributedSampler

OUT = os.path.join("tests", "data", "vectors", "torch_distributed_sampler.txt")


def main():
    lines = ["torch %s" % torch.__version__]
    small = [0, 1, 2, 3, 5, 7, 10, 13, 31, 64, 97, 100]
    large = [257, 1000]
    for n in small + large:
        ws = range(1, 9) if n in small else [1, 3, 8]
        se = [(0, 0), (0, 1), (42, 3), (2**32 + 5, 0)] if n in small else [(0, 0), (7, 2)]
        for w in ws:
            for seed, epoch in se:
                for shuffle in (True, False):
                    if not shuffle and (seed, epoch) != (0, 0):
                        continue
                    for drop_last in (False, True):
                        for rank in range(w):
                            s = DistributedSampler(list(range(n)), num_replicas=w, rank=rank, shuffle=shuffle,
                                                   seed=seed, drop_last=drop_last)
                            s.set_epoch(epoch)
                            idx = list(iter(s))
                            assert len(idx) == len(s)
                            lines.append("sampler %d %d %d %d %d %d %d : %s" % (
                                n, w, rank, seed, epoch, int(shuffle), int(drop_last), " ".join(map(str, idx))))
    for n in [1, 2, 3, 4, 5, 17, 1000]:
        for seed in [0, 1, 2**32 + 1, 2**63 + 12345]:
            g = torch.Generator().manual_seed(seed)
            p = torch.randperm(n, generator=g).tolist()
            lines.append("randperm %d %d : %s" % (n, seed, " ".join(map(str, p))))
    for n, seed in [(100000, 0), (1000003, 99), (5000000, 2024)]:
        g = torch.Generator().manual_seed(seed)
        p = torch.randperm(n, generator=g)
        wsum = sum((k + 1) * v for k, v in enumerate(p.tolist())) % (1 << 64)
        lines.append("randperm_hash %d %d %d : %s" % (n, seed, wsum, " ".join(map(str, p[:10].tolist()))))
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
