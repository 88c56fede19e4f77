"""The compiled torch.distributed backend (dpkit._dist_ext), loaded only
when the torch this Python imports is the torch it was compiled against
(recorded in dpkit._build_info when the package was built). An extension
compiled against another libtorch can abort the interpreter while it loads
(C++ symbols and layouts differ between torch versions), so a mismatch is an
ImportError naming both versions instead, and the rest of dpkit (datasets,
samplers) keeps working."""
from . import _build_info


def check_torch() -> None:
    """Raises ImportError unless the backend was built and against the torch
    imported now."""
    if not _build_info.HAS_DIST:
        raise ImportError("dpkit was built without its torch.distributed backend (no torch with C++ headers, "
                          "or no Gloo, when the package was built; docs/python.md)")
    import torch
    if torch.__version__ != _build_info.TORCH_VERSION:
        raise ImportError(
            f"dpkit's torch.distributed backend was built against torch {_build_info.TORCH_VERSION}, but this "
            f"Python imports torch {torch.__version__} (from {torch.__file__}): reinstall dpkit with this torch "
            f"(pip install --no-build-isolation .)")


check_torch()

from ._dist_ext import *  # noqa: E402,F401,F403
from ._dist_ext import ProcessGroupDpkit, finalize, has_mpi, torch_version  # noqa: E402,F401

if has_mpi:
    from ._dist_ext import abort_mpi, broadcast_string, init_mpi  # noqa: E402,F401
