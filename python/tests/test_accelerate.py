"""Hugging Face accelerate over the backend "dpkit": `accelerate launch`
with 2 processes runs examples/python/accelerate_train.py (the group made
before Accelerator(), which adopts it) for 50 steps over "dpkit" and over
"gloo"; both report the backend they asked for and every step's loss is
equal bit for bit. Skipped where accelerate is not installed (CI's Debian
torch 1.13 has none; the torch 2.x venv of docs/python.md has it)."""
import lzma
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import dpkit

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "python" / "accelerate_train.py"

accelerate = pytest.importorskip("accelerate")
pytestmark = pytest.mark.skipif(not dpkit.distributed.available(), reason="the backend was not built")


def run(backend, data, log):
    exe = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or shutil.which("accelerate")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI", "PMIX_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.run([exe, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                        "--mixed_precision", "no", "--dynamo_backend", "no", str(SCRIPT), "--data", str(data),
                        "--steps", "50", "--backend", backend, "--loss-log", str(log)],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:]
    assert p.stdout.count(f"get_backend() = {backend}") == 2, p.stdout[-4000:]


def test_accelerate_losses_equal_gloo(tmp_path):
    data = tmp_path / "corpus.jsonl"
    data.write_bytes(lzma.decompress((ROOT / "data" / "debian-descriptions.jsonl.xz").read_bytes()))
    run("dpkit", data, tmp_path / "dpkit")
    run("gloo", data, tmp_path / "gloo")
    for r in (0, 1):
        a = (tmp_path / f"dpkit.rank{r}").read_text().splitlines()
        b = (tmp_path / f"gloo.rank{r}").read_text().splitlines()
        assert len(a) == 50 and a == b
