"""The specification of the block-FP8 linear, and the CPU implementation.

A block-FP8 checkpoint stores ``W`` as fp8 ``[N, K]`` with one fp32 scale per ``bn x bk`` block
(``[ceil(N/bn), ceil(K/bk)]``, 128x128 in practice); activations are quantized per token and per
group of ``bk`` columns (scale ``[M, ceil(K/bk)]``). The product is defined as

    out[m, n] = sum_k (q[m, k] * sa[m, k // bk]) * (w[n, k] * sw[n // bn, k // bk])

computed in fp32 and cast to the output dtype once. Every provider is compared against this.
A per-token activation scale ``[M]`` is the special case of equal group scales along a row; it is
broadcast as a stride-0 view (``group_scales``), never materialized.
"""

from __future__ import annotations

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def group_scales(scale: torch.Tensor, m: int, groups: int) -> torch.Tensor:
    """Activation scales in the ``[M, groups]`` layout every provider reads.

    ``[M]`` or ``[M, 1]`` (per token) becomes a stride-0 ``expand`` view of the same storage;
    ``[M, groups]`` is returned as is (any strides).
    """
    if scale.dtype != torch.float32:
        raise TypeError(f"activation scale must be float32, got {scale.dtype}")
    if scale.dim() == 1 and scale.shape[0] == m:
        return scale.unsqueeze(1).expand(m, groups)
    if scale.dim() == 2 and scale.shape[0] == m and scale.shape[1] == 1:
        return scale.expand(m, groups)
    if scale.dim() == 2 and scale.shape[0] == m and scale.shape[1] == groups:
        return scale
    raise ValueError(
        f"activation scale must be [M]={m}, [M, 1] or [M, K/group]=[{m}, {groups}], "
        f"got {list(scale.shape)}"
    )


def _expand_blocks(scale: torch.Tensor, rows: int, cols: int, bn: int, bk: int) -> torch.Tensor:
    return scale.repeat_interleave(bn, dim=0)[:rows].repeat_interleave(bk, dim=1)[:, :cols]


def dequantize_weight(
    w: torch.Tensor, w_scale: torch.Tensor, block: tuple[int, int] = (128, 128),
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``W`` in ``dtype``: every ``bn x bk`` block times its scale."""
    n, k = w.shape
    bn, bk = block
    if n % bn == 0 and k % bk == 0:
        wb = w.to(dtype).view(n // bn, bn, k // bk, bk)
        return (wb * w_scale.to(dtype)[:, None, :, None]).view(n, k)
    return w.to(dtype) * _expand_blocks(w_scale.to(dtype), n, k, bn, bk)


def dequantize_activation(
    q: torch.Tensor, scale: torch.Tensor, group: int = 128, dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``A`` in ``dtype`` from fp8 ``q [M, K]`` and scales ``[M]`` / ``[M, ceil(K/group)]``."""
    m, k = q.shape
    groups = -(-k // group)
    s = group_scales(scale, m, groups).to(dtype)
    if k % group == 0:
        return (q.to(dtype).view(m, groups, group) * s.unsqueeze(-1)).view(m, k)
    return q.to(dtype) * s.repeat_interleave(group, dim=1)[:, :k]


def block_fp8_mm(
    q: torch.Tensor, w: torch.Tensor, a_scale: torch.Tensor, w_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16, block: tuple[int, int] = (128, 128),
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``q @ w.T`` with both operands dequantized in ``compute_dtype``, cast once at the end.

    fp32 is the CPU provider; float64 is the yardstick the tests and benchmarks measure with.
    """
    a = dequantize_activation(q, a_scale, block[1], compute_dtype)
    b = dequantize_weight(w, w_scale, block, compute_dtype)
    return (a @ b.t()).to(out_dtype)


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
