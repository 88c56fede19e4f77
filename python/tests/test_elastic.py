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
