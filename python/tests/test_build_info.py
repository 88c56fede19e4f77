"""A dpkit built against another torch than the one imported: `import dpkit`
works (the data path), the backend is not loaded (loading an extension
compiled against another libtorch can abort the interpreter), and
`import dpkit._dist` / init_process_group("dpkit") raise ImportError naming
both torch versions. The other torch is faked: a copy of the installed
package whose recorded build version (dpkit/_build_info.py) is changed."""
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

import dpkit
from dpkit import _build_info

CHILD = r"""
import json, sys
import dpkit
out = {"available": dpkit.distributed.available(), "reason": dpkit.distributed.unavailable_reason()}
lines = sys.argv[1]
ds = dpkit.JsonlDataset(lines, progress=False)
out["data"] = [ds[0], ds[1]]
try:
    import dpkit._dist
    out["import"] = "no error"
except ImportError as e:
    out["import"] = str(e)
try:
    import torch.distributed as dist
    dist.init_process_group("dpkit", init_method="file://" + sys.argv[2], rank=0, world_size=1)
    out["init"] = "no error"
except Exception as e:
    out["init"] = type(e).__name__ + ": " + str(e)
out["loaded"] = "dpkit._dist_ext" in sys.modules
print(json.dumps(out))
"""


def test_recorded_torch_version_is_the_imported_one():
    import torch
    if _build_info.HAS_DIST:
        assert _build_info.TORCH_VERSION == torch.__version__
        assert dpkit.distributed.available()


def test_backend_built_for_another_torch(tmp_path):
    pytest.importorskip("torch.distributed")
    import torch
    pkg = pathlib.Path(dpkit.__file__).parent
    copy = tmp_path / "site" / "dpkit"
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "_build_info.py").write_text('TORCH_VERSION = "0.0.1+other"\nHAS_DIST = True\n')
    lines = tmp_path / "a.jsonl"
    lines.write_text('{"x": 1}\n{"x": 2}\n')
    p = subprocess.run([sys.executable, "-c", CHILD, str(lines), str(tmp_path / "store")], cwd=tmp_path,
                       env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["data"] == [{"x": 1}, {"x": 2}]
    assert out["available"] is False and not out["loaded"]
    for msg in (out["reason"], out["import"], out["init"]):
        assert "0.0.1+other" in msg and torch.__version__ in msg, out
    assert out["init"].startswith("ImportError"), out
