"""Shared configuration of the cross-package end-to-end tests (real vLLM on this machine).

Caches and tiny models stay inside the checkout's ignored ``.radiance/`` folder unless the
environment already says where they go; vLLM engines, which run in subprocesses
(``vllm_harness``), inherit these variables.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
_LOCAL = CHECKOUT / ".radiance"

ENV_DEFAULTS = {
    "VLLM_CACHE_ROOT": str(_LOCAL / "cache" / "vllm"),
    "TORCHINDUCTOR_CACHE_DIR": str(_LOCAL / "cache" / "inductor"),
    "RADIANCE_CACHE_DIR": str(_LOCAL / "cache" / "kernels"),
    "RADIANCE_MODELS_DIR": str(_LOCAL / "models"),
    # GiB of KV cache per CPU engine; vLLM's default (4) is too much for a small CI machine.
    "VLLM_CPU_KVCACHE_SPACE": "1",
}
for _key, _value in ENV_DEFAULTS.items():
    os.environ.setdefault(_key, _value)


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
