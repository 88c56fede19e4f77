"""The torch.distributed backend "dpkit" under mpirun (dist_worker.py):
collectives against a local exact reference and against gloo on the same
inputs, torch DDP over "dpkit" against DDP over "gloo", and the unhappy
paths (mismatch, timeout, bad tensors)."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import dpkit
from conftest import mpirun_cmd

WORKER = pathlib.Path(__file__).with_name("dist_worker.py")

pytestmark = pytest.mark.skipif(not dpkit.distributed.available() or mpirun_cmd(2) is None,
                                reason="the backend was built without torch/MPI, or no mpirun")


def run(case, np, env, outdir, timeout=240):
    """Runs dist_worker.py CASE on `np` ranks; returns each rank's result
    (from the files the ranks write, ordered by rank)."""
    cmd = mpirun_cmd(np) + [sys.executable, str(WORKER), case, str(outdir)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    files = sorted(outdir.glob("rank*.json"))
    assert p.returncode == 0 and len(files) == np, p.stdout[-3000:] + p.stderr[-3000:]
    return sorted((json.loads(f.read_text()) for f in files), key=lambda d: d["rank"])


@pytest.mark.parametrize("np", [2, 3])
def test_collectives(np, mpi_env, tmp_path):
    res = run("collectives", np, mpi_env, tmp_path)
    assert all(r["checked"] > 100 for r in res)


def test_ddp_equals_gloo(mpi_env, tmp_path):
    """The same model, data and seeds: DDP over "dpkit" and over "gloo" give
    the same losses and parameters, bit for bit (2 ranks: a sum of two is
    exact in any order)."""
    for r in run("ddp", 2, mpi_env, tmp_path):
        assert r["dpkit"] == r["gloo"]
        assert r["params_equal"], r["max_param_diff"]
        assert r["dpkit"][-1] < r["dpkit"][0] + 0.1


def test_registered_memory(mpi_env, tmp_path):
    """DDP over "dpkit" with its bucket buffers registered (every all-reduce
    of a bucket with a whole page runs the direct path) gives gloo's losses
    and parameters bit for bit; register_memory keeps a tensor's data, an
    all-reduce of it is right, release_memory keeps the result."""
    for r in run("registered", 2, mpi_env, tmp_path):
        assert r["dpkit"] == r["gloo"]
        assert r["params_equal"], r["max_param_diff"]
        assert r["buckets"] >= 2 and r["shared_buckets"] >= 1, r
        assert r["registered_during"] == r["buckets"] and r["registered_after_release"] == 0, r
        # [shared, again, kept, right, released, released again, kept after]
        assert r["checks"] == [[True, True, True, True, True, False, True]] * 2, r["checks"]
        assert r["noncontiguous"].startswith("InvalidArgument") and "not contiguous" in r["noncontiguous"]
        assert r["gloo_group"].startswith("ValueError") and "not dpkit's" in r["gloo_group"]


def test_errors(mpi_env, tmp_path):
    for r in run("errors", 2, mpi_env, tmp_path):
        assert r["noncontiguous"].startswith("InvalidArgument") and "not contiguous" in r["noncontiguous"]
        assert r["band"].startswith("InvalidArgument") and "non-integral" in r["band"]
        # sizes 4 and 8: both ranks raise, naming both calls; never a result
        assert r["mismatch"].startswith("MismatchError"), r["mismatch"]
        assert "4, sum" in r["mismatch"] and "8, sum" in r["mismatch"]
        assert r["after"].startswith("CommunicatorError") and "failed earlier" in r["after"]


@pytest.mark.parametrize("np", [2, 3])
def test_ops(np, mpi_env, tmp_path):
    """Every operation beside the all-reduce family (gather, scatter,
    all-to-all, sends and receives, object collectives, coalesced forms,
    bitwise, bool, complex, sparse, monitored barrier, sequence numbers,
    a subgroup) against the exact reference and gloo."""
    assert all(r["checked"] > 40 for r in run("ops", np, mpi_env, tmp_path))


def check_ops_errors(res):
    """What test_ops_errors (mpirun) and test_torch_launch (env://) assert of
    dist_worker.py's ops_errors case."""
    r0, r1 = res
    # rank 0 gathers, rank 1 scatters: both raise, and the mismatch names both calls
    for r in res:
        assert r["kinds"].split(":")[0] in ("MismatchError", "PeerError"), r["kinds"]
    both = r0["kinds"] + r1["kinds"]
    assert "gather(" in both and "scatter(" in both and "MismatchError" in both, both
    # split sizes that disagree: both ranks raise before any data moves, naming both counts
    for r in res:
        assert r["splits"].startswith("MismatchError") and "rank 0 sends 6 elements to rank 1, which expects 4" \
            in r["splits"], r["splits"]
    # a send nobody receives (rank 1 receives with another tag): the rank whose
    # deadline passes first times out ("Timed out"), the other stops on its
    # notice; each names its own operation (torch's tags, not the transport's)
    assert "receive from rank 0 (tag 5" in r1["unreceived"] and "send to rank 1 (tag 0" in r0["unreceived"], res
    for r in res:
        assert r["unreceived"].startswith(("TimeoutError: dpkit: Timed out", "PeerError")), r["unreceived"]
    assert any(r["unreceived"].startswith("TimeoutError: dpkit: Timed out") for r in res), res
    for r in res:
        assert r["unreceived_s"] < 3.5, r["unreceived_s"]
    assert "Rank 1 failed to pass monitoredBarrier" in r0["monitored"], r0["monitored"]
    for r in res:
        assert "tag -3" in r["tag"] and r["tag"].startswith(("InvalidArgument", "ValueError", "RuntimeError")), r["tag"]
        assert "rank 5" in r["rank"], r["rank"]
        assert "do not split evenly" in r["sizes"] or "split" in r["sizes"], r["sizes"]


def test_ops_errors(mpi_env, tmp_path):
    check_ops_errors(run("ops_errors", 2, mpi_env, tmp_path))


def test_destroy_while_busy(mpi_env, tmp_path):
    """destroy_process_group of a group whose worker still runs all-reduces
    of tensors Python dropped: returns (the destructor lets the GIL go
    while it waits for the worker; before, both ranks hung), and the
    default group still works."""
    for r in run("destroy_busy", 2, mpi_env, tmp_path, timeout=60):
        assert r["destroy_s"] < 30 and r["sum"] == [2.0] * 4, r


def test_timeout(mpi_env, tmp_path):
    r0 = run("timeout", 2, mpi_env, tmp_path)[0]
    assert r0["timeout"].startswith("TimeoutError") and "rank 1" in r0["timeout"], r0
    assert 1.9 < r0["elapsed_s"] < 4.0


def test_training_example_resumes(corpus, tmp_path, mpi_env):
    """examples/python/train_sections.py (docs/python.md's loop): 20 steps on
    2 ranks, then resumed from its checkpoint to step 30 on 3 ranks; the
    sampler's offset goes on from where it stopped."""
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "train_sections.py"
    ck = tmp_path / "ck.pt"

    def train(np, *extra):
        cmd = mpirun_cmd(np) + [sys.executable, str(example), "--data", str(corpus), "--checkpoint", str(ck),
                                "--log-every", "10", *extra]
        p = subprocess.run(cmd, env=mpi_env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        return p.stdout

    out = train(2, "--steps", "20")
    assert "step 20 epoch 0 loss" in out and '"offset": 40' in out  # 20 steps x 2 ranks of one global sequence
    out = train(3, "--steps", "30", "--resume")
    assert "resumed at step 20, epoch 0, offset 40" in out
    assert "step 30 epoch 0 loss" in out and '"offset": 70' in out  # + 10 steps x 3 ranks


def test_unhandled_exception_ends_the_job(mpi_env, tmp_path):
    """Rank 1 of 2 raises while rank 0 waits for it in an all-reduce (timeout
    120 s): the job ends within seconds, with rank 1's traceback. Before,
    rank 1's exit waited in MPI_Finalize for rank 0, which waited for rank 1
    up to the timeout (in CI: a training run's rank 1 raised, and the run hung
    until the test's 300 s limit)."""
    cmd = mpirun_cmd(2) + [sys.executable, str(WORKER), "raise", str(tmp_path)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=mpi_env, capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-3000:]
    assert "rank 1 fails on purpose" in out and "dpkit: rank 1: unhandled RuntimeError; MPI_Abort" in out, out[-3000:]
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "rank0.json").exists()


def test_rank_death_survivors_exit(mpi_env, tmp_path):
    """A rank _exits in the middle of a 64 MiB all-reduce (3 ranks, timeout
    5 s, mpirun not aborting on a non-zero exit): each survivor raises a
    dpkit error and its process exits (dpkit's atexit: the group's shutdown
    and MPI_Finalize) within the timeout + 5 s of the death. Before, every
    survivor hung forever in the transport's teardown (MPI_Win_free)."""
    cmd = mpirun_cmd(3)
    cmd = cmd[:1] + ["--mca", "orte_abort_on_non_zero_status", "0"] + cmd[1:] + [
        sys.executable, str(WORKER), "rank_death", str(tmp_path)]
    # mpirun itself may linger after a rank's death although every rank has
    # exited (Open MPI 4.1): wait for the survivors' exit marks, then end it
    p = subprocess.Popen(cmd, env=mpi_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None and not all(
            (tmp_path / f"exit{r}").exists() for r in (0, 1)):
        time.sleep(0.1)
    if p.poll() is None:
        time.sleep(1)
        os.killpg(p.pid, signal.SIGKILL)
    out = p.communicate()[0]
    assert (tmp_path / "death").exists(), out[-3000:]
    death = float((tmp_path / "death").read_text())
    for rank in (0, 1):
        res = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert res["error"].startswith("PeerError") or res["error"].startswith("TimeoutError"), (res, out[-3000:])
        assert res["error_at"] - death < 5.0 + 5.0
        assert (tmp_path / f"exit{rank}").exists(), out[-3000:]
        exit_at = float((tmp_path / f"exit{rank}").read_text())
        assert exit_at - death < 5.0 + 5.0, exit_at - death
