import sys
from pathlib import Path

import pytest
import torch

try:
    import radiance.gemm  # noqa: F401
except ImportError:  # a checkout without the packages installed (the GPU machine)
    _PKGS = Path(__file__).resolve().parents[2]
    sys.path[:0] = [str(_PKGS / "radiance-gemm" / "src"), str(_PKGS / "radiance-kernels" / "src")]


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
