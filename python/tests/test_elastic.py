"""dpkit.elastic from Python (docs/python.md, "Elastic training"): members
of an ElasticTrainer over a file store end themselves at each failure point
(during a step's all-reduce, before a step, after one, while joining; the
member with the lowest id among them) and processes join (two at once, one
of them with the lowest id of all, which holds no state); scripts/torch_elastic_check.py
checks the logs against an independent account: equal state on every
member after every heal, the healed state is one logged after the last step
that counts, every sample of the epoch trained exactly once, a step applied
within seconds of each failure, and a process alone without the state ends
with an error."""
import pathlib
import subprocess
import sys

import pytest

import dpkit

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).with_name("elastic_worker.py")

pytestmark = pytest.mark.skipif(not dpkit.distributed.available(), reason="the backend was built without torch/Gloo")


def test_failure_points_heal_and_exactly_once(tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "torch_elastic_check.py"), "--python-worker", sys.executable,
           str(WORKER), "--workdir", str(tmp_path / "run"), "--timeout", "240"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "PASS" in p.stdout, p.stdout[-4000:] + p.stderr[-6000:]


def test_failure_points_with_the_distributed_sampler(tmp_path):
    """The same failure points with dpkit.DistributedSampler (4 samples per
    member per step, torch's order): after each heal the sampler is
    re-sharded at the healed sample offset over the new world size; every
    sample of the epoch trained exactly once (torch's padding duplicates
    not trained)."""
    cmd = [sys.executable, str(ROOT / "scripts" / "torch_elastic_check.py"), "--python-worker", sys.executable,
           str(WORKER), "--workdir", str(tmp_path / "run"), "--timeout", "240", "--sampler", "distributed",
           "--batch-size", "4"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "PASS" in p.stdout, p.stdout[-4000:] + p.stderr[-6000:]


def test_stuck_and_stopped_members_are_expelled_and_come_back(tmp_path):
    """Step deadline 2 s: a member whose main thread sleeps 8 s in a step
    (heartbeat alive) and one stopped with SIGSTOP (heartbeat too) for 4 s
    are expelled; the others apply a step within the deadline + 3 s (without
    the step deadline they waited 8 s); each comes back, is healed, and all
    three finish the epoch with equal state and every sample once."""
    cmd = [sys.executable, str(ROOT / "scripts" / "torch_elastic_check.py"), "--python-worker", sys.executable,
           str(WORKER), "--workdir", str(tmp_path / "run"), "--timeout", "240", "--scenario", "stuck",
           "--step-deadline", "2"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "PASS" in p.stdout, p.stdout[-4000:] + p.stderr[-6000:]


def test_group_arguments_are_checked(tmp_path):
    from dpkit.elastic import ElasticGroup
    with pytest.raises(dpkit.InvalidArgument, match="relative"):
        ElasticGroup("file://relative/dir", 0)
    with pytest.raises(dpkit.InvalidArgument, match="id must be >= 0, got -1"):
        ElasticGroup("file://" + str(tmp_path), -1)
    with pytest.raises(dpkit.InvalidArgument, match="step_timeout"):
        ElasticGroup("file://" + str(tmp_path), 0, step_timeout=0)


def test_one_member_trains_and_its_state_checksum_follows_the_parameters(tmp_path):
    import torch
    from dpkit.elastic import ElasticGroup, ElasticTrainer, state_checksum
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lengths = [3] * 10
    heals = []
    with ElasticGroup("file://" + str(tmp_path), 7, hostname="127.0.0.1") as g:
        assert (g.rank, g.size, g.members, g.first_generation) == (0, 1, [7], 0)
        t = ElasticTrainer(g, model, opt, lambda w, r: dpkit.TokenBudgetBatchSampler(lengths, 6, w, r, elastic=True),
                           on_heal=heals.append)
        assert len(heals) == 1 and heals[0].source == 0 and heals[0].checksum == state_checksum(model)
        before = state_checksum(model)
        seen = []
        while t.epoch < 1:
            b = t.next_batch()
            if t.epoch >= 1:
                break
            seen += b[0]
            loss = t.step(lambda idx: model(torch.ones(len(idx), 4)).pow(2).mean(), b)
            assert loss is not None
        assert sorted(seen) == list(range(10))  # 5 batches of 2, each sample once
        assert t.step_count == 5 and state_checksum(model) != before
        x = torch.arange(6, dtype=torch.float32)
        g.all_reduce(x, "sum")
        assert x.tolist() == list(range(6))
        with pytest.raises(dpkit.InvalidArgument, match="op 'mean'"):
            g.all_reduce(x, "mean")


@pytest.mark.parametrize("opts", [{}, {"exactly_once": True}, {"drop_last": True}, {"shuffle": False}])
def test_distributed_sampler_steps_reshard_exactly_once(opts):
    """ElasticTrainer's steps over a dpkit.DistributedSampler (_SampleSteps):
    3 members take 2 steps of 2 samples, the world shrinks to 2 at the offset
    the trainer would heal, then grows to 4, to the epoch's end. Reference:
    every sample id 0..N-1 trained exactly once (drop_last: each at most
    once, and only torch's dropped tail missing), every member the same
    number of steps in each phase, a padding step trains nothing."""
    from dpkit.elastic import _SampleSteps
    n, b = 23, 2
    seen, start = [], 0
    for world, steps in ((3, 2), (2, 1), (4, None)):
        members = []
        for r in range(world):
            s = _SampleSteps(dpkit.DistributedSampler(n, world, r, seed=3, **opts), b)
            s.load_state_dict({"epoch": 0, "offset": start})
            members.append(s)
        lens = {len(m) for m in members}
        assert len(lens) == 1, lens  # the same steps on every member
        k_end = lens.pop() if steps is None else steps
        for k in range(k_end):
            for m in members:
                if not m.is_padding(k):
                    seen += m.batch(k)
                else:
                    assert len(m.batch(k)) == 1
        offsets = {m.state_dict(steps_done=k_end)["offset"] for m in members}
        assert len(offsets) == 1
        start = offsets.pop()
    assert start == n or opts.get("drop_last")
    if opts.get("drop_last"):
        assert len(seen) == len(set(seen)) and n - len(seen) < 4  # the last world's tail is dropped, as torch
    else:
        assert sorted(seen) == list(range(n))


def test_trainer_checks_its_sampler(tmp_path):
    import torch
    from dpkit.elastic import ElasticGroup, ElasticTrainer
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ElasticGroup("file://" + str(tmp_path), 0, hostname="127.0.0.1") as g:
        with pytest.raises(dpkit.InvalidArgument, match="batch_size .* is required"):
            ElasticTrainer(g, model, opt, lambda w, r: dpkit.DistributedSampler(10, w, r))
        with pytest.raises(dpkit.InvalidArgument, match="returned a list"):
            ElasticTrainer(g, model, opt, lambda w, r: list(range(10)))
        with pytest.raises(dpkit.InvalidArgument, match="rank 0 of 2"):
            ElasticTrainer(g, model, opt, lambda w, r: dpkit.DistributedSampler(10, 2, 0), batch_size=2)
        with pytest.raises(dpkit.InvalidArgument, match="batch_size must be >= 1, got 0"):
            ElasticTrainer(g, model, opt, lambda w, r: dpkit.DistributedSampler(10, w, r), batch_size=0)
        t = ElasticTrainer(g, model, opt, lambda w, r: dpkit.DistributedSampler(10, w, r, seed=1), batch_size=4)
        got = []
        while t.epoch < 1:
            idx, pad, pos = t.next_batch()
            if t.epoch >= 1:
                break
            assert not pad
            got += idx
            assert t.step(lambda i: model(torch.ones(len(i), 2)).sum(), (idx, pad, pos)) is not None
        assert sorted(got) == list(range(10)) and t.step_count == 3  # 4 + 4 + 2
