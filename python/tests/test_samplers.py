"""dpkit.DistributedSampler and dpkit.TokenBudgetBatchSampler against torch's
DistributedSampler, dpkit's committed reference vectors (made by torch:
scripts/gen_randperm_vectors.py) and the seed's sampler loop (FunASR's
CustomDistributedBufferDynamicBatchSampler, transcribed below)."""
import json
import math

import pytest
import torch

import dpkit
from conftest import REPO

VECTORS = REPO / "tests" / "data" / "vectors" / "torch_distributed_sampler.txt"


def test_reference_vectors():
    """Every `sampler N W rank seed epoch shuffle drop_last : indices` line of
    the committed vectors."""
    count = 0
    for line in open(VECTORS):
        if not line.startswith("sampler "):
            continue
        head, _, tail = line.partition(":")
        n, w, rank, seed, epoch, shuffle, drop_last = (int(x) for x in head.split()[1:])
        s = dpkit.DistributedSampler(n, w, rank, shuffle=bool(shuffle), seed=seed, drop_last=bool(drop_last))
        s.set_epoch(epoch)
        assert list(s) == [int(x) for x in tail.split()], line[:60]
        count += 1
    assert count > 1000


@pytest.mark.parametrize("n,w", [(0, 1), (1, 3), (10, 3), (17, 4), (100, 7), (1000, 16)])
@pytest.mark.parametrize("shuffle,drop_last", [(True, False), (False, False), (True, True)])
def test_equals_torch(n, w, shuffle, drop_last):
    data = list(range(n))
    for rank in range(w):
        for epoch in (0, 3):
            t = torch.utils.data.DistributedSampler(data, w, rank, shuffle=shuffle, seed=7, drop_last=drop_last)
            d = dpkit.DistributedSampler(data, w, rank, shuffle=shuffle, seed=7, drop_last=drop_last)
            t.set_epoch(epoch)
            d.set_epoch(epoch)
            assert len(d) == len(t)
            assert list(d) == list(t)


def test_exactly_once_and_feistel():
    n, w = 1003, 4
    seen = []
    for r in range(w):
        s = dpkit.DistributedSampler(n, w, r, exactly_once=True, seed=3)
        seen += list(s)
    assert sorted(seen) == list(range(n))
    allf = []
    for r in range(w):
        s = dpkit.DistributedSampler(n, w, r, engine="feistel", drop_last=True)
        s.set_epoch(5)
        allf += list(s)
    assert len(set(allf)) == len(allf) == (n // w) * w
    with pytest.raises(ValueError, match="exclusive"):
        dpkit.DistributedSampler(n, w, 0, exactly_once=True, drop_last=True)
    with pytest.raises(ValueError, match="engine"):
        dpkit.DistributedSampler(n, w, 0, engine="mt")


def test_resume_on_another_world_size():
    """Read part of an epoch on 4 ranks, save, resume on 3: every sample of
    the epoch exactly once (exactly_once mode, no padding)."""
    n = 1000
    seen = []
    states = []
    for r in range(4):
        s = dpkit.DistributedSampler(n, 4, r, seed=11, exactly_once=True)
        s.set_epoch(2)
        it = iter(s)
        seen += [next(it) for _ in range(50)]
        states.append(s.state_dict())
    assert all(st == states[0] for st in states)  # the same offset on every rank
    assert states[0]["offset"] == 200
    for r in range(3):
        s = dpkit.DistributedSampler(n, 3, r, seed=11, exactly_once=True)
        s.load_state_dict(states[0])
        s.set_epoch(2)  # the usual loop: keeps the loaded offset
        seen += list(s)
    assert sorted(seen) == list(range(n))
    s = dpkit.DistributedSampler(n, 3, 0, seed=12, exactly_once=True)
    with pytest.raises(ValueError, match="seed"):
        s.load_state_dict(states[0])


def test_world_from_torch_distributed_required():
    with pytest.raises(RuntimeError, match="not initialized"):
        dpkit.DistributedSampler(10)


# ---- token budget: the seed's loop ----

def seed_plan(lengths, world, epoch, sort_size, max_tokens, max_len, max_count, batch_type="token"):
    """The seed's __iter__ up to the plan (buffer_batches), with torch.randperm
    seeded by the epoch (dpkit: seed + epoch with seed 0). The seed's count
    starts at 1, so it allows max_count - 1 samples: called with
    max_batch_size + 1 to compare with dpkit's max_batch_size."""
    g = torch.Generator()
    g.manual_seed(epoch)
    indices = torch.randperm(len(lengths), generator=g).tolist()
    buffer_batches = []
    size = sort_size * world
    for i in range(0, len(indices), size):
        buffer = sorted(indices[i:i + size], key=lambda idx: lengths[idx])
        batch, max_len_in_batch, count = [], 0, 1
        for idx in buffer:
            original = lengths[idx]
            if original > max_len:
                continue
            sample_length = 1 if batch_type == "example" else original
            potential = max(max_len_in_batch, sample_length) * (len(batch) + 1)
            if potential <= max_tokens and count < max_count:
                batch.append(idx)
                max_len_in_batch = max(max_len_in_batch, sample_length)
                count += 1
            else:
                buffer_batches.append(batch)
                batch, max_len_in_batch, count = [idx], sample_length, 1
        if batch:
            buffer_batches.append(batch)
    return buffer_batches


@pytest.mark.parametrize("world", [1, 3, 4])
def test_token_budget_equals_seed_plan(corpus, world):
    ds = dpkit.JsonlDataset(corpus, length_field="num_tokens")
    lengths = ds.lengths()
    for epoch in (0, 1):
        ref = seed_plan(lengths, world, epoch, sort_size=256, max_tokens=4096, max_len=2048, max_count=201)
        for source in (ds, lengths):
            s = dpkit.TokenBudgetBatchSampler(source, 4096, world, world - 1, sort_size=256, shuffle_batches=False,
                                              max_batch_size=200, max_sample_tokens=2048)
            s.set_epoch(epoch)
            assert s.total_batches == len(ref)
            assert [s.plan_batch(b) for b in range(len(ref))] == ref
            # the seed's deal: step k of rank r is plan batch k * world + r
            for k in range(len(s)):
                if not s.is_padding(k):
                    assert s.batch(k) == ref[k * world + world - 1]
            if source is ds:
                break  # one JsonlDataset and one list per epoch is enough


def test_token_budget_examples_and_resume():
    lengths = [(i * 7919) % 300 + 1 for i in range(5000)]
    ref = seed_plan(lengths, 2, 0, sort_size=64, max_tokens=32, max_len=2048, max_count=201, batch_type="example")
    s = dpkit.TokenBudgetBatchSampler(lengths, 32, 2, 0, batch_type="example", sort_size=64, shuffle_batches=False)
    assert [s.plan_batch(b) for b in range(s.total_batches)] == ref
    # elastic: resume a 4-rank epoch on 3 ranks; every plan batch exactly once
    w4 = [dpkit.TokenBudgetBatchSampler(lengths, 512, 4, r, elastic=True, balance="drop") for r in range(4)]
    seen = []
    for s4 in w4:
        it = iter(s4)
        seen += [tuple(next(it)) for _ in range(5)]
    state = w4[0].state_dict()
    assert state["offset"] == 20
    for r in range(3):
        s3 = dpkit.TokenBudgetBatchSampler(lengths, 512, 3, r, elastic=True, balance="drop")
        s3.load_state_dict(state)
        seen += [tuple(b) for b in s3]
    plan = [tuple(w4[0].plan_batch(b)) for b in range(w4[0].total_batches)]
    assert len(seen) == len(set(seen))  # no plan batch twice across the change
    assert set(seen) <= set(plan)
    assert len(set(plan) - set(seen)) < 3  # only the tail the 3-rank schedule drops
    with pytest.raises(ValueError, match="batch_type"):
        dpkit.TokenBudgetBatchSampler(lengths, 512, 1, 0, batch_type="words")
    with pytest.raises(ValueError, match="rank 5"):
        dpkit.TokenBudgetBatchSampler(lengths, 512, 2, 5)


def test_token_budget_in_a_dataloader(corpus):
    ds = dpkit.JsonlDataset(corpus, length_field="num_tokens")
    s = dpkit.TokenBudgetBatchSampler(ds, 4096, 2, 1)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=s, num_workers=2, collate_fn=lambda b: b)
    n = 0
    for step, batch in enumerate(loader):
        assert sum(1 for _ in batch) == len(s.batch(step))
        assert max(x["num_tokens"] for x in batch) * len(batch) <= 4096
        n += 1
        if n == 20:
            break
    assert n == 20
