"""The backend "dpkit" launched the way torchrun launches: plain processes
with torch's env:// variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE) and no MPI launcher, each calling
init_process_group("dpkit"); the group meets through torch's store
(dist_worker.py's cases). Also file:// and tcp:// init methods, ranks that
disagree on the world size, and ranks that never come. torchrun itself is
not used: Debian's torch 1.13 torchrun does not run on Python 3.11; these
are its environment variables."""
import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

import dpkit

WORKER = pathlib.Path(__file__).with_name("dist_worker.py")

pytestmark = pytest.mark.skipif(not dpkit.distributed.available(), reason="the backend was not built")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(argv, world, ranks=None, world_of=None, timeout=120, extra=None):
    """Starts `argv` as ranks `ranks` (default: all) of `world`, torchrun's
    environment and no MPI launcher's; waits for all of them (each under
    `timeout`), asserts each exited 0; returns {rank: its output}.
    `world_of(rank)` gives a rank another WORLD_SIZE."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_", "PMI", "PMIX_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    port = free_port()
    procs = []
    for r in (range(world) if ranks is None else ranks):
        env = dict(base, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE=str(world_of(r) if world_of else world), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1", **(extra or {}))
        procs.append((r, subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    outs = {}
    try:
        for r, p in procs:
            outs[r] = p.communicate(timeout=timeout)[0]
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for r, p in procs:
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n" + outs[r][-3000:]
    return outs


def spawn(case, outdir, world, ranks=None, init="env", world_of=None, timeout=120, extra=None):
    """Runs dist_worker.py CASE as ranks `ranks` (default: all) of `world`
    (run_ranks); returns {rank: result}."""
    outs = run_ranks([sys.executable, str(WORKER), case, str(outdir)], world, ranks, world_of, timeout,
                     dict(DPKIT_TEST_INIT=init, **(extra or {})))
    return {r: json.loads((outdir / f"rank{r}.json").read_text()) for r in outs}


@pytest.mark.parametrize("world", [2, 3])
def test_env_collectives(world, tmp_path):
    """env:// (torchrun's): every collective equals the local reference and
    gloo's result; the group runs over the Gloo transport met through
    torch's store; with 3 ranks a subgroup meets under its own prefix."""
    res = spawn("short", tmp_path, world)
    for r in res.values():
        assert r["transport"] == "gloo" and r["checked"] > 40, r


@pytest.mark.parametrize("world", [2, 3])
def test_env_ops(world, tmp_path):
    """env://: every operation beside the all-reduce family against the exact
    reference and gloo (dist_worker.py's ops case), over the Gloo transport
    (the node's shared memory for the messages)."""
    assert all(r["checked"] > 40 for r in spawn("ops", tmp_path, world).values())


def test_env_ops_errors(tmp_path):
    """env://: the unhappy path of the added operations (test_distributed's
    check_ops_errors)."""
    from test_distributed import check_ops_errors
    res = spawn("ops_errors", tmp_path, 2, timeout=90)
    check_ops_errors([res[0], res[1]])


def test_destroy_while_busy(tmp_path):
    """env://: destroy_process_group of a group whose worker still runs
    all-reduces of tensors Python dropped returns (before the fix it waited
    forever for the GIL that the destructor held)."""
    for r in spawn("destroy_busy", tmp_path, 2, timeout=60).values():
        assert r["destroy_s"] < 30 and r["sum"] == [2.0] * 4, r


@pytest.mark.parametrize("scheme", ["file", "tcp"])
def test_file_and_tcp_init(scheme, tmp_path):
    init = f"file://{tmp_path}/store" if scheme == "file" else f"tcp://127.0.0.1:{free_port()}"
    res = spawn("short", tmp_path, 2, init=init)
    assert all(r["transport"] == "gloo" for r in res.values())


def test_world_size_disagreement(tmp_path):
    """Rank 1 says WORLD_SIZE=3, rank 0 says 2: both raise
    dpkit.InvalidArgument naming both sizes, well within the timeout (10 s),
    never a hang."""
    res = spawn("init_error", tmp_path, 2, world_of=lambda r: 3 if r == 1 else 2, timeout=60,
                extra={"DPKIT_TEST_TIMEOUT": "10"})
    for r in res.values():
        assert r["error"].startswith("InvalidArgument") and r["dpkit"], r
        assert "says the group has 3 ranks" in r["error"] or "says the group has 2 ranks" in r["error"], r
        assert "says 2" in r["error"] or "says 3" in r["error"], r
        assert r["elapsed_s"] < 10, r


def test_missing_rank_times_out(tmp_path):
    """Only rank 0 of 2 is started (file:// store: torch itself does not
    wait): dpkit.TimeoutError naming rank 1 after the timeout (3 s)."""
    res = spawn("init_error", tmp_path, 2, ranks=[0], init=f"file://{tmp_path}/store", timeout=60)
    r = res[0]
    assert r["error"].startswith("TimeoutError") and r["dpkit"] and "rank(s) 1 did not join" in r["error"], r
    assert 2.9 < r["elapsed_s"] < 8, r


def test_missing_rank_env_times_out(tmp_path):
    """Only rank 0 of 2 with env://: torch's TCPStore waits for the other
    rank and raises its own error within the timeout (3 s)."""
    res = spawn("init_error", tmp_path, 2, ranks=[0], timeout=60)
    r = res[0]
    assert r["error"] != "none" and r["elapsed_s"] < 10, r
