"""benchmarks/python/dist_allreduce_perf.py runs and checks its sums, under
both launches: env:// (torchrun's variables, no MPI launcher) and mpirun with
"dpkit_store" beside "dpkit" (the store bootstrap and the MPI communicator
in one job, alternating batch by batch). Short sizes and batches: this
checks the table and the sums (#wrong, the exact float32 sum of every
size), not the speed (benchmarks/results/ has the speed). The same for
benchmarks/python/dist_collectives_perf.py: every operation's table, its
results exact on every backend."""
import pathlib
import subprocess
import sys

import pytest

import dpkit
from conftest import mpirun_cmd
from test_torch_launch import run_ranks

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "python" / "dist_allreduce_perf.py"
COLL_BENCH = BENCH.with_name("dist_collectives_perf.py")
OPS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter",
       "send_recv"]
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


def op_tables(out: str, backends):
    """dist_collectives_perf.py's tables as {op: ({bytes: [(time_us, wrong)
    or None per backend]}, {backend: why it did not run})}; asserts each
    header names the backends in order."""
    tables, op = {}, None
    for line in out.splitlines():
        if not line.strip():
            continue
        x = line.split()
        if line.startswith("# ") and x[1].endswith(":") and x[1][:-1] in OPS and "backends" in line:
            op = x[1][:-1]
            assert f"backends {', '.join(backends)} (torch" in line, line
            tables[op] = ({}, {})
        elif line.startswith("# ") and x[1:3] == [op, "over"]:
            tables[op][1][x[3].rstrip(":")] = line
        elif not line.startswith("#"):
            assert op is not None, out
            tables[op][0][int(x[0])] = [None if x[2 + 4 * i] == "-" else (float(x[2 + 4 * i]), int(x[5 + 4 * i]))
                                        for i in range(len(backends))]
    return tables


def check_ops(tables, backends):
    """Every operation at 8, 64, 512, 4096 B (2 ranks: the sizes split
    evenly), every backend's results exact. A backend may be missing only
    where gloo refuses the flat all-gather or reduce-scatter (torch 1.13's
    gloo: "no support for _allgather_base", "does not support
    _reduce_scatter_base")."""
    assert sorted(tables) == sorted(OPS), tables
    for op, (table, failed) in tables.items():
        assert sorted(table) == [8, 64, 512, 4096], (op, table)
        for b, why in failed.items():
            assert b == "gloo" and op in ("all_gather", "reduce_scatter") and "support" in why, (op, why)
        for size, cells in table.items():
            for b, cell in zip(backends, cells):
                if cell is None:
                    assert b in failed, (op, size, cells)
                    continue
                t, wrong = cell
                assert wrong == 0 and t > 0, (op, size, b, cells)


def test_collectives_env_launch():
    """env://: every operation, "dpkit" and "gloo", every size exact."""
    outs = run_ranks([sys.executable, str(COLL_BENCH), *ARGS], 2, timeout=300)
    check_ops(op_tables(outs[0], ["dpkit", "gloo"]), ["dpkit", "gloo"])


def test_collectives_mpirun(mpi_env):
    """Under mpirun: every operation over the MPI communicator, the store
    bootstrap ("dpkit_store") and gloo, every size exact."""
    from dpkit import _dist
    cmd = mpirun_cmd(2)
    if cmd is None or not _dist.has_mpi:
        pytest.skip("no mpirun, or a build without MPI")
    backends = ["dpkit", "dpkit_store", "gloo"]
    p = subprocess.run([*cmd, "-x", "OMP_NUM_THREADS=1", sys.executable, str(COLL_BENCH), *ARGS,
                        "--backends", ",".join(backends)],
                       env=mpi_env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    check_ops(op_tables(p.stdout, backends), backends)
