"""dpkit.distributed.bind_to_cores: torchrun's processes bound the way
mpirun binds its ranks (each its slice of the allowed CPUs), checked in a
fresh interpreter against os.sched_getaffinity and torch's thread count."""
import json
import os
import subprocess
import sys

import pytest

CODE = r"""
import json, os, sys
import torch, dpkit
try:
    got = dpkit.distributed.bind_to_cores()
    print(json.dumps({"cpus": got, "threads": torch.get_num_threads()}))
except ValueError as e:
    print(json.dumps({"error": str(e)}))
"""


def run_bind(env_extra, drop=()):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI", "PMIX")) and k not in drop}
    env.update(env_extra)
    p = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_each_local_rank_gets_its_slice():
    cpus = sorted(os.sched_getaffinity(0))
    n = len(cpus)
    for lws in (1, 2, n, n + 1):
        for lr in range(lws):
            r = run_bind({"LOCAL_RANK": str(lr), "LOCAL_WORLD_SIZE": str(lws)})
            if n >= lws:
                per = n // lws
                want = cpus[lr * per:(lr + 1) * per]
            else:
                want = [cpus[lr % n]]
            assert r["cpus"] == want, (lr, lws, r)
            assert r["threads"] == len(want)


def test_bad_or_missing_local_rank_is_a_value_error_naming_it():
    r = run_bind({"LOCAL_WORLD_SIZE": "2"}, drop=("LOCAL_RANK",))
    assert "LOCAL_RANK is not set" in r["error"]
    r = run_bind({"LOCAL_RANK": "x", "LOCAL_WORLD_SIZE": "2"})
    assert "LOCAL_RANK='x' is not an integer" in r["error"]
    r = run_bind({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"})
    assert "local rank 2 not in [0, 2)" in r["error"]


def test_under_an_mpi_launcher_nothing_changes():
    cpus = sorted(os.sched_getaffinity(0))
    r = run_bind({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "LOCAL_RANK": "1",
                  "LOCAL_WORLD_SIZE": "2"})
    assert r["cpus"] == cpus
