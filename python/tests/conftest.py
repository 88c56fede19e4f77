"""Shared fixtures of the dpkit Python tests (run by scripts/test.sh after
`pip install .`; docs/python.md)."""
import lzma
import os
import pathlib
import shutil

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CORPUS_XZ = REPO / "data" / "debian-descriptions.jsonl.xz"


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> pathlib.Path:
    """The repository's real corpus (63,956 JSON lines with num_tokens),
    decompressed once per session."""
    out = tmp_path_factory.mktemp("corpus") / "debian-descriptions.jsonl"
    with lzma.open(CORPUS_XZ) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def mpirun_cmd(np: int):
    """mpirun for `np` local ranks as the test machine allows (root, more
    ranks than cores), or None without mpirun."""
    exe = shutil.which("mpirun") or shutil.which("mpiexec")
    if exe is None:
        return None
    return [exe, "-np", str(np), "--oversubscribe", "--mca", "btl", "self,vader"]


@pytest.fixture
def mpi_env():
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_mpi_yield_when_idle": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    return env
