"""benchmarks/python/dist_allreduce_perf.py runs and checks its sums, under
both launches: env:// (torchrun's variables, no MPI launcher) and mpirun with
"dpkit_store" beside "dpkit" (the store bootstrap and the MPI communicator
in one job, alternating batch by batch). Short sizes and batches: this
checks the table and the sums (#wrong, the exact float32 sum of every
size), not the speed (benchmarks/results/ has the speed)."""
import pathlib
import subprocess
import sys

import pytest

import dpkit
from conftest import mpirun_cmd
from test_torch_launch import run_ranks

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "python" / "dist_allreduce_perf.py"
ARGS = ["-b", "8", "-e", "4K", "-f", "8", "--batches", "2", "--batch-seconds", "0.002", "-w", "1"]

pytestmark = pytest.mark.skipif(not dpkit.distributed.available(), reason="the backend was not built")


def rows(out: str, backends):
    """The table's rows as {bytes: [(time_us, wrong) per backend]}; asserts
    the header names the backends in order."""
    head = [line for line in out.splitlines() if line.startswith("# dist.all_reduce")]
    assert head and f"backends {', '.join(backends)}" in head[0], out
    table = {}
    for line in out.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        x = line.split()
        cells = [(float(x[2 + 4 * i]), int(x[5 + 4 * i])) for i in range(len(backends))]
        table[int(x[0])] = cells
    return table


def check(table):
    assert sorted(table) == [8, 64, 512, 4096], table
    for size, cells in table.items():
        for t, wrong in cells:
            assert wrong == 0 and t > 0, (size, cells)


def test_env_launch():
    outs = run_ranks([sys.executable, str(BENCH), *ARGS], 2, timeout=300)
    check(rows(outs[0], ["dpkit", "gloo"]))


def test_mpirun_store_beside_mpi(mpi_env):
    """Under mpirun, --backends dpkit,dpkit_store,gloo: three groups in one
    job, the MPI communicator, the store bootstrap, gloo; every sum exact."""
    from dpkit import _dist
    cmd = mpirun_cmd(2)
    if cmd is None or not _dist.has_mpi:
        pytest.skip("no mpirun, or a build without MPI")
    p = subprocess.run([*cmd, "-x", "OMP_NUM_THREADS=1", sys.executable, str(BENCH), *ARGS,
                        "--backends", "dpkit,dpkit_store,gloo"],
                       env=mpi_env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    check(rows(p.stdout, ["dpkit", "dpkit_store", "gloo"]))
