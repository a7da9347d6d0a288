"""AITER's block-FP8 GEMMs on ROCm: the preshuffled-weight kernel and the plain small-M kernel.

AITER moved its Triton GEMMs from ``aiter.ops.triton.gemm_a8w8_blockscale`` to
``aiter.ops.triton.gemm.basic.gemm_a8w8_blockscale``; both paths are tried. The preshuffle
kernel reads the weight shuffled ``(16, 16)`` (``aiter.ops.shuffle.shuffle_weight``) and viewed as
``[N/16, K*16]``; the shuffled buffer is kept in a logical ``[N, K]`` tensor and reshaped (a view)
per call. Only builds whose preshuffle entry point takes ``is_x_scale_tranposed`` are used: with
it the activation scale is read through its own strides (no transposed copy per call, one launch
saved per GEMM); older builds, such as the PyPI ``amd-aiter`` wheel, lack the preshuffle GEMM or
that argument and are reported as too old.
"""

from __future__ import annotations

import importlib
import inspect

import torch

_MODULES = (
    "aiter.ops.triton.gemm.basic.gemm_a8w8_blockscale",
    "aiter.ops.triton.gemm_a8w8_blockscale",
)

# Small-M preshuffle config measured on gfx1201: 16-row tiles for decode, 64 for prefill; one
# 128-column K step per scale group.
_BASE = {"BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 8, "num_warps": 4, "num_stages": 1,
         "waves_per_eu": 2, "matrix_instr_nonkdim": 16, "cache_modifier": None, "NUM_KSPLIT": 1}


def _load():
    errors = []
    for name in _MODULES:
        try:
            return importlib.import_module(name), None
        except Exception as exc:  # noqa: BLE001 - any import failure means "not this path"
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    return None, "AITER not importable (" + "; ".join(errors) + ")"


def _load_shuffle():
    try:
        from aiter.ops.shuffle import shuffle_weight
    except Exception as exc:  # noqa: BLE001 - reported as the preshuffle provider's reason
        return None, f"aiter.ops.shuffle.shuffle_weight not importable ({type(exc).__name__}: {exc})"
    return shuffle_weight, None


_mod, _why = _load()
_shuffle, _shuffle_why = _load_shuffle() if _mod is not None else (None, _why)


def plain_available() -> str | None:
    if _mod is None:
        return _why
    if not hasattr(_mod, "gemm_a8w8_blockscale"):
        return f"{_mod.__name__} has no gemm_a8w8_blockscale"
    return None


def preshuffle_available() -> str | None:
    if _mod is None:
        return _why
    fn = getattr(_mod, "gemm_a8w8_blockscale_preshuffle", None)
    if fn is None:
        return f"AITER too old: {_mod.__name__} has no gemm_a8w8_blockscale_preshuffle"
    if _shuffle is None:
        return _shuffle_why
    if "is_x_scale_tranposed" not in inspect.signature(fn).parameters:
        return "AITER too old: preshuffle GEMM cannot read the activation scale by strides"
    return None


def shuffle_weight(w: torch.Tensor) -> torch.Tensor:
    """The (16, 16)-shuffled weight, same logical shape [N, K] and element count."""
    n, k = w.shape
    shuffled = _shuffle(w, (16, 16))
    if shuffled.numel() != n * k:
        raise ValueError(f"shuffle_weight returned {list(shuffled.shape)} ({shuffled.numel()} elements) "
                         f"for a [{n}, {k}] weight; the preshuffle GEMM needs the same element count")
    return shuffled.reshape(n, k).contiguous()


def preshuffle_mm(a, b_shuffled, sa, sb, out_dtype):
    n, k = b_shuffled.shape
    cfg = dict(_BASE, BLOCK_SIZE_M=16 if a.shape[0] <= 32 else 64, BLOCK_SIZE_N=128)
    return _mod.gemm_a8w8_blockscale_preshuffle(
        a, b_shuffled.view(n // 16, k * 16), sa, sb, out_dtype, config=cfg,
        is_x_scale_tranposed=False)


def plain_mm(a, b, sa, sb, out_dtype):
    return _mod.gemm_a8w8_blockscale(a, b, sa, sb, out_dtype)
