"""Every vLLM monkeypatch of radiance-gemm (there is one).

Patch 1: RadianceBlockFp8LinearKernel first in vLLM's block-FP8 kernel lists.
  Why: vLLM chooses a block-FP8 linear kernel from a per-platform priority list
       (``_POSSIBLE_FP8_BLOCK_KERNELS``); its public ``register_linear_kernel`` has no block-FP8
       kind and only appends. Being first is what makes Fp8LinearMethod use this kernel (and, on
       the CPU build, what makes block-FP8 checkpoints run at all: its own kernels need AMX).
  What: inserts the class at the head of the CUDA, ROCm and CPU lists (once; idempotent).
  Remove when: vLLM's register_linear_kernel accepts block-FP8 kernels with a priority.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("vllm.radiance.gemm")

_lock = threading.Lock()
_state: dict[str, object] = {}


def install() -> tuple[bool, str]:
    with _lock:
        if "result" in _state:
            return _state["result"]  # type: ignore[return-value]
        try:
            from vllm.model_executor.kernels import linear as kernels
            from vllm.platforms import PlatformEnum
        except ImportError as exc:
            return False, f"vLLM not importable: {exc}"
        table = getattr(kernels, "_POSSIBLE_FP8_BLOCK_KERNELS", None)
        if not isinstance(table, dict):
            return False, "this vLLM has no _POSSIBLE_FP8_BLOCK_KERNELS list to join"
        from radiance.gemm.kernel import RadianceBlockFp8LinearKernel

        for platform in (PlatformEnum.CUDA, PlatformEnum.ROCM, PlatformEnum.CPU):
            entries = table.setdefault(platform, [])
            if RadianceBlockFp8LinearKernel in entries:
                entries.remove(RadianceBlockFp8LinearKernel)
            entries.insert(0, RadianceBlockFp8LinearKernel)
        result = (True, "RadianceBlockFp8LinearKernel first for block-FP8 linears on CUDA, ROCm, CPU")
        _state["result"] = result
        return result
