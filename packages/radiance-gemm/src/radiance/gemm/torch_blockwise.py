"""PyTorch's block-wise FP8 matmul (cuBLASLt, NVIDIA sm90): ``F.scaled_mm`` with ``BlockWise1x128``
activations and ``BlockWise128x128`` weights.

Layout rules of the op (``ScaledBlas.cpp``, ``is_blockwise_1x128_scaling`` /
``is_blockwise_128x128_scaling``): ``a [M, K]`` fp8 row-major, ``b`` passed as ``w.t()`` (a view of
the ``[N, K]`` weight), ``scale_a [M, K/128]`` outer-dim-major, i.e. strides ``(1, M)``, and the
weight scale ``[N/128, K/128]`` row-major, passed as its transpose (a view). cuBLASLt also wants M
a multiple of 4 (vLLM pads for the same reason), so odd M is padded to the next multiple of 4 and
the result sliced; at M = 1 the unpadded call is refused. The weight-scale check wants K/128
rounded up to a multiple of 4 rows (H200 run, torch 2.11: K = 256 refused with "scale_b must have
shape 4 x 16"), so such layers are not routed here; N is held to the same rule, untested otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def available() -> str | None:
    if not hasattr(F, "scaled_mm") or not hasattr(F, "ScalingType"):
        return f"torch {torch.__version__} has no torch.nn.functional.scaled_mm"
    if not hasattr(F.ScalingType, "BlockWise1x128"):
        return f"torch {torch.__version__} scaled_mm has no BlockWise1x128 recipe"
    return None


def unsupported_shape(n: int, k: int) -> str | None:
    """Why scaled_mm's block-wise recipe refuses an [N, K] weight, or None."""
    if (k // 128) % 4:
        return f"K/128 = {k // 128} is not a multiple of 4, which scaled_mm's block-wise weight scales need"
    if (n // 128) % 4:  # every N measured was a multiple of 512: nothing else is routed here
        return f"N/128 = {n // 128} is not a multiple of 4 (not measured with scaled_mm's block-wise recipe)"
    return None


def blockwise_mm(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                 out_dtype: torch.dtype) -> torch.Tensor:
    m, k = a.shape
    pad = (-m) % 4
    mp = m + pad
    groups = sa.shape[1]
    if pad:
        ap = a.new_zeros((mp, k))
        ap[:m] = a
        a = ap
    if pad or sa.stride(0) != 1 or (groups > 1 and sa.stride(1) != mp):
        # Column-major [Mp, G]: allocate [G, Mp] row-major and view it transposed. Padded rows
        # get scale 1 (their product is discarded) so no NaN can come from uninitialized memory.
        sap = sa.new_ones((groups, mp)).t()
        sap[:m] = sa
        sa = sap
    out = F.scaled_mm(a, b.t(), sa, F.ScalingType.BlockWise1x128, sb.t(),
                      F.ScalingType.BlockWise128x128, output_dtype=out_dtype)
    return out[:m] if pad else out
