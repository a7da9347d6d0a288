"""The specification of the kernels, and their CPU implementation: the epilogue ops (below) and
the block-FP8 linear (at the end).

Each op is vLLM's own native chain written out op for op: the same torch calls, in the same
order, on the same dtypes, so every intermediate rounding is the one stock vLLM performs and a
CPU result is bit-identical to stock vLLM (tests/test_reference_vs_vllm.py holds that against the
installed vLLM). The chains mirrored:

- ``add_rms_quant``: ``RMSNorm`` / ``GemmaRMSNorm`` ``forward_native`` (the IR ops ``rms_norm`` and
  ``fused_add_rms_norm``, native implementation) followed by dynamic ``QuantFP8.forward_native``.
- ``silu_mul_quant``: ``SiluAndMul.forward_native`` followed by the same quant.
- ``gdn_norm_quant``: ``RMSNormGated.forward_static`` (``group_size=None`` over a head,
  ``norm_before_gate=True``, silu gate) on ``[M, heads, head_dim]``, flattened back to ``[M, N]``,
  followed by the same quant.

Numerics that decide bit equality (read again whenever the vLLM pin moves):
- Fused add: the fp32 sum is normalised, not the residual rounded to the activation dtype; the
  residual output is that sum rounded to ``y``'s dtype.
- Plain RMSNorm rounds the normalised row to the weight's dtype and multiplies there (bf16 weight:
  a bf16 product; fp32 weight: an fp32 product), then rounds to the activation dtype. Gemma
  multiplies by ``weight.float() + 1`` in fp32 and rounds once.
- Quant: ``scale = max(amax / fp8_max, 1 / (fp8_max * 512))`` in fp32, where ``amax`` is taken in
  the activation dtype (exact) and widened. Per token the row is multiplied by the scale's
  reciprocal; per group of 128 it is divided by the scale. Then clamp to +-fp8_max and a
  round-to-nearest-even cast.
- ``x / fp8_max`` divides by a Python scalar. Eager CUDA (and Inductor on GPU) computes that as
  ``x * (1 / fp8_max)``, while the CPU divides; with ``fp8_max = 448`` the two differ in the last
  bit for some ``amax``. Running this module on a GPU therefore reproduces what vLLM computes on
  that GPU, which is what a kernel is compared against there.
- The FP8 format is the platform's: ``float8_e4m3fn`` (max 448) on NVIDIA and RDNA, and
  ``float8_e4m3fnuz`` on MI300-class AMD (gfx94x), where vLLM clamps to 224 rather than the
  format's 240 (its dynamic-quant accuracy choice), and so does this module.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F

# vLLM's dynamic-quant range per format: the format's finite max for e4m3fn, 224 for e4m3fnuz.
_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 224.0}

GROUP_SIZES = (0, 128)


@functools.lru_cache(maxsize=None)
def platform_fp8_dtype() -> torch.dtype:
    """The FP8 dtype vLLM quantizes activations to on this machine's GPU (e4m3fn without one)."""
    if torch.version.hip is not None and torch.cuda.is_available():
        arch = torch.cuda.get_device_properties(0).gcnArchName
        if "gfx94" in arch:
            return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def fp8_max(fp8_dtype: torch.dtype) -> float:
    """The clamp bound vLLM's dynamic quant uses for ``fp8_dtype``."""
    try:
        return _FP8_MAX[fp8_dtype]
    except KeyError:
        raise TypeError(
            f"fp8_dtype must be torch.float8_e4m3fn or torch.float8_e4m3fnuz, got {fp8_dtype}"
        ) from None


def quant_fp8(
    x: torch.Tensor, *, group: int = 0, fp8_dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic FP8 quant of ``x`` ``[M, K]``: per token (scale ``[M]``) or per 128 columns
    (scale ``[M, K/128]``), as ``QuantFP8(static=False, ...).forward_native``."""
    fmax = fp8_max(fp8_dtype)
    fmin = -fmax
    min_scale = 1.0 / (fmax * 512.0)
    if group == 0:
        x_max = x.abs().amax(dim=-1)
        x_max = x_max.unsqueeze(-1).to(torch.float32)
        scale = (x_max / fmax).clamp(min=min_scale)
        out = x.to(torch.float32) * scale.to(torch.float32).reciprocal()
        q = out.clamp(fmin, fmax).to(fp8_dtype)
        return q, scale.squeeze(-1)
    if group not in GROUP_SIZES:
        raise ValueError(f"group must be 0 (per token) or 128, got {group}")
    M, K = x.shape
    if K % group:
        raise ValueError(f"K={K} is not a multiple of the group size {group}")
    x_grouped = x.view(-1, K // group, group)
    absmax = x_grouped.abs().max(dim=-1, keepdim=True)[0].float()
    scales = (absmax / fmax).clamp(min=min_scale)
    x_scaled = x_grouped / scales
    q = x_scaled.clamp(fmin, fmax).to(fp8_dtype).view(M, K)
    return q, scales.squeeze(-1).reshape(M, K // group)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    x = x.to(weight.dtype) * weight
    return x.to(orig_dtype)


def _fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    x = x + residual.to(torch.float32)
    residual_out = x.to(orig_dtype)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    x = x.to(weight.dtype) * weight
    return x.to(orig_dtype), residual_out


def add_rms_quant(
    y: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    *,
    gemma: bool = False,
    group: int = 0,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``residual_out = y + residual``; ``q, scale = quant(rms_norm(residual_out) * w)``.

    ``y``, ``residual``: ``[M, K]`` bf16/fp16; ``weight``: ``[K]``; ``gemma`` multiplies by
    ``1 + w`` in fp32. Returns ``(q [M, K] fp8, scale [M] or [M, K/128] fp32, residual_out)``.
    With ``residual=None`` (the first layer) the op is plain RMSNorm + quant, and
    ``residual_out`` is ``y`` itself (the same tensor, not a copy): the stream continues from
    the layer's input, as vLLM's decoder layers do (``residual = hidden_states``).
    """
    w = weight.float() + 1.0 if gemma else weight
    if residual is None:
        normed = _rms_norm(y, w, eps)
        residual_out = y
    else:
        normed, residual_out = _fused_add_rms_norm(y, residual, w, eps)
    q, scale = quant_fp8(normed, group=group, fp8_dtype=fp8_dtype)
    return q, scale, residual_out


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gu = [gate | up]``, rounded to ``gu``'s dtype after each op."""
    d = gu.shape[-1] // 2
    return F.silu(gu[..., :d]) * gu[..., d:]


def silu_mul_quant(
    gu: torch.Tensor, *, group: int = 0, fp8_dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q, scale = quant(silu(gate) * up)`` for ``gu = [M, 2N]`` (gate columns first)."""
    return quant_fp8(silu_mul(gu), group=group, fp8_dtype=fp8_dtype)


def _gated_rms_norm_heads(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-head RMSNorm of ``x`` ``[M, N]`` (head dim ``weight.numel()``) times weight times
    ``silu(z)``, in fp32, per head: ``[M, N / head_dim, head_dim]``."""
    M, N = x.shape
    head_dim = weight.numel()
    xh = x.view(M, N // head_dim, head_dim).float()
    zh = z.view(M, N // head_dim, head_dim).float()
    w = weight.float()
    variance = xh.pow(2).mean(dim=-1, keepdim=True)
    x_normed = xh * torch.rsqrt(variance + eps)
    out = x_normed * w
    return out * F.silu(zh)


def gated_rms_norm_f32(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The value ``gated_rms_norm`` rounds, in fp32: ``[M, N]``."""
    return _gated_rms_norm_heads(x, z, weight, eps).view(x.shape)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-head RMSNorm times weight times ``silu(z)`` in fp32, rounded once to ``x``'s dtype
    (vLLM's ``RMSNormGated``); ``[M, N]``."""
    # Rounded per head, then viewed as rows: with the view first, Inductor (torch 2.11) fails to
    # compile this chain for dynamic M with group-128 scales (CantSplit in its index splitting).
    return _gated_rms_norm_heads(x, z, weight, eps).to(x.dtype).view(x.shape)


def gdn_norm_quant(
    x: torch.Tensor,
    z: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    group: int = 0,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q, scale = quant(gated_rms_norm(x, z, weight, eps))`` over the whole ``[M, N]`` row.

    ``z`` may be row-strided (a slice of a wider projection); its last dim must be contiguous.
    """
    return quant_fp8(gated_rms_norm(x, z, weight, eps), group=group, fp8_dtype=fp8_dtype)


def all_reduce(partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensor-parallel sum of the ranks' ``partials`` (in rank order), as radiance's one-shot
    all-reduce computes it on every rank: widened to fp32, added left to right, rounded once to
    the partials' dtype."""
    if not partials:
        raise ValueError("all_reduce needs at least one partial")
    acc = partials[0].to(torch.float32)
    for part in partials[1:]:
        acc = acc + part.to(torch.float32)
    return acc.to(partials[0].dtype)


def ar_add_rms_quant(
    partials: Sequence[torch.Tensor],
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    gemma: bool = False,
    group: int = 0,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``add_rms_quant(all_reduce(partials), residual, ...)``: the fused all-reduce epilogue."""
    return add_rms_quant(all_reduce(partials), residual, weight, eps, gemma=gemma, group=group,
                         fp8_dtype=fp8_dtype)


# --------------------------------------------------------------------------- block-FP8 linear
# The specification of the block-FP8 GEMM (csrc/block_fp8_mm.cu, and every provider of
# radiance-gemm). A block-FP8 checkpoint stores ``W`` as fp8 ``[N, K]`` with one fp32 scale per
# ``bn x bk`` block (``[ceil(N/bn), ceil(K/bk)]``, 128x128 in practice); activations are quantized
# per token and per group of ``bk`` columns (scale ``[M, ceil(K/bk)]``). The product is
#
#     out[m, n] = sum_k (q[m, k] * sa[m, k // bk]) * (w[n, k] * sw[n // bn, k // bk])
#
# computed in fp32 (float64 as the yardstick) and cast to the output dtype once. A per-token
# activation scale ``[M]`` is the special case of equal group scales along a row; it is broadcast
# as a stride-0 view (``group_scales``), never materialized.


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
