"""The backend "dpkit" launched without MPI (torch's env:// variables, as
torchrun sets them), when processes die: the node's shared segment is gone
from /dev/shm as soon as every rank has it mapped, so SIGKILLing every rank
in the middle of a collective leaves nothing there; a rank that dies while
the others wait in a collective makes them raise dpkit.PeerError within
seconds, not at the group's timeout."""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

import dpkit

WORKER = pathlib.Path(__file__).with_name("dist_worker.py")

pytestmark = pytest.mark.skipif(not dpkit.distributed.available(), reason="the backend was not built")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(case, outdir, world):
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_", "PMI", "PMIX_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(base, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world), DPKIT_TEST_INIT="env", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), case, str(outdir)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def dpkit_shm(pids=None):
    """dpkit's entries in /dev/shm (of the processes `pids`, if given)."""
    names = [n for n in os.listdir("/dev/shm") if n.startswith("dpkit-")]
    if pids is not None:
        names = [n for n in names if any(f"-{p}-" in n for p in pids)]
    return names


def test_sigkill_every_rank_mid_collective_leaves_nothing(tmp_path):
    procs = start("spin", tmp_path, 2)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline, "the workers did not start"
            assert all(p.poll() is None for p in procs), [p.communicate()[0][-2000:] for p in procs]
            time.sleep(0.05)
        pids = [p.pid for p in procs]
        # the ranks run on the node's segment (mapped, its name already unlinked)
        maps = pathlib.Path(f"/proc/{pids[0]}/maps").read_text()
        assert "/dev/shm/dpkit-gloo-" in maps and "(deleted)" in maps, "no shared segment mapped"
        assert dpkit_shm(pids) == []
        time.sleep(0.2)  # in the middle of all-reduces
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.communicate(timeout=30)
            assert p.returncode == -signal.SIGKILL
        assert dpkit_shm(pids) == []
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


def test_rank_death_survivors_raise_peer_error(tmp_path):
    """The last of 3 ranks _exits while the others all-reduce 64 MiB (group
    timeout 5 s): each survivor raises dpkit.PeerError naming the dead rank
    well before the timeout (the segment's process check)."""
    procs = start("rank_death", tmp_path, 3)
    # waited for in order: the dead rank stays a zombie while the survivors
    # wait for it (dpkit looks for unreaped dead peers too)
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert procs[2].returncode == 3, outs[2][-2000:]
    death = float((tmp_path / "death").read_text())
    for r in (0, 1):
        assert procs[r].returncode == 0, outs[r][-2000:]
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert res["error"].startswith("PeerError"), res
        assert "rank 2" in res["error"], res
        assert res["error_at"] - death < 3.0, res
    assert dpkit_shm([p.pid for p in procs]) == []


@pytest.mark.skipif(int(__import__("torch").__version__.split(".")[0]) < 2,
                    reason="Debian's torch 1.13 torchrun does not run on Python 3.11 (upstream bug)")
def test_torchrun_restart_after_sigkill(tmp_path):
    """torchrun --max-restarts 1: rank 1 is SIGKILLed at step 10 of 20; the
    agent restarts the group, which resumes from rank 0's checkpoint and
    finishes with the sums of 20 steps on every rank; nothing of dpkit's is
    left in /dev/shm."""
    before = set(dpkit_shm())
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI", "PMIX_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env["OMP_NUM_THREADS"] = "1"
    script = pathlib.Path(__file__).with_name("torchrun_restart_train.py")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
                        "--monitor-interval", "0.5", "--master-port", str(free_port()), str(script), str(tmp_path)],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:]
    for r in range(2):
        done = json.loads((tmp_path / f"done{r}.json").read_text())
        assert done["attempt"] == 1 and done["start"] == 10, done
        assert done["w"] == [60.0] * 8, done  # 20 steps of 1 + 2
        assert done["backend"] == "dpkit", done
    assert set(dpkit_shm()) - before == set()
