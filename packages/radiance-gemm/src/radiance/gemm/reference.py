"""The block-FP8 linear's specification as this package uses it: the product (defined, with its
CUDA kernel, in ``radiance.kernels.reference``: ``block_fp8_mm`` and its dequantize/scale-layout
helpers, re-exported here), the quantizers that make block-FP8 checkpoints and activations, and
the "equal within bf16 rounding" yardstick every provider is measured with.
"""

from __future__ import annotations

import torch

from radiance.kernels.reference import (  # noqa: F401  (re-exported)
    block_fp8_mm,
    dequantize_activation,
    dequantize_weight,
    fp8_max,
    group_scales,
)


def quantize_activation(
    x: torch.Tensor, group: int = 128, fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token-group quant, in vLLM's native order: ``scale = max(amax / fp8_max,
    min_scale)``, ``q = clamp(x / scale)``. Returns ``(q [M, K], scale [M, ceil(K/group)])``."""
    m, k = x.shape
    fmax = fp8_max(fp8_dtype)
    min_scale = 1.0 / (fmax * 512.0)
    groups = -(-k // group)
    pad = groups * group - k
    xp = torch.nn.functional.pad(x, (0, pad)) if pad else x
    xg = xp.view(m, groups, group)
    s = (xg.abs().amax(dim=-1, keepdim=True).float() / fmax).clamp(min=min_scale)
    q = (xg / s).clamp(-fmax, fmax).to(fp8_dtype).view(m, groups * group)[:, :k]
    return q.contiguous(), s.squeeze(-1)


def quantize_weight(
    w: torch.Tensor, block: tuple[int, int] = (128, 128),
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-quantize a float weight the way block-FP8 checkpoints are made (amax per block)."""
    n, k = w.shape
    bn, bk = block
    gn, gk = -(-n // bn), -(-k // bk)
    wp = torch.nn.functional.pad(w.float(), (0, gk * bk - k, 0, gn * bn - n))
    wb = wp.view(gn, bn, gk, bk)
    s = (wb.abs().amax(dim=(1, 3)) / fp8_max(fp8_dtype)).clamp(min=1e-12)
    q = (wb / s[:, None, :, None]).clamp(-fp8_max(fp8_dtype), fp8_max(fp8_dtype)).to(fp8_dtype)
    return q.view(gn * bn, gk * bk)[:n, :k].contiguous(), s.contiguous()


def bf16_tolerance(ref64: torch.Tensor) -> torch.Tensor:
    """Elementwise bound for "equal within bf16 rounding": one bf16 ulp of the reference (2^-7
    relative, bf16 keeps 8 significant bits) plus an absolute floor for outputs that cancel to
    near zero, where the fp32-vs-float64 summation order is all that differs."""
    scale = ref64.abs().amax().clamp(min=1e-30)
    return ref64.abs() * 2.0**-7 + scale * 2.0**-10
