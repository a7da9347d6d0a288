"""The stream's custom ops (namespace ``radiance``): one opaque op per epilogue site.

Each op wraps the matching ``radiance.kernels.ops`` function (the GPU kernel where one serves,
the reference otherwise) and has a fake implementation, so vLLM's torch.compile traces the op
as a single node and its CUDA-graph capture records a single launch. Outputs are always fresh
tensors (a custom op may not return one of its inputs); nothing here allocates with a
data-dependent size or reads a device value on the host, so capture is safe.

``ar_add_rms_quant`` finishes a RowParallel linear's epilogue: the tensor-parallel all-reduce of
the partial sum ``y`` (vLLM's own all-reduce, so its custom/NCCL choice is kept), then residual
add + RMSNorm + dynamic FP8 quant; where radiance's peer all-reduce is set up and the shape
allows, both run as one kernel instead (``fused_all_reduce``). With tensor-parallel size 1 there
is nothing to reduce. With ``residual=None`` (the first layer) ``y`` is the embedding output,
already complete: no all-reduce, plain RMSNorm + quant, and the third output is an empty
``[0, K]`` tensor because the stream continues from ``y`` itself, which the op may not hand
back.
"""

from __future__ import annotations

from typing import Optional

import torch

from radiance.fp8stream import fused_all_reduce
from radiance.kernels import ops as kops


def tp_world_size() -> int:
    """vLLM's tensor-parallel size, 1 when vLLM or its parallel groups are not set up."""
    try:
        from vllm.distributed import parallel_state
    except ImportError:
        return 1
    if not parallel_state.model_parallel_is_initialized():
        return 1
    return parallel_state.get_tensor_model_parallel_world_size()


def tp_all_reduce(y: torch.Tensor) -> torch.Tensor:
    from vllm.distributed import tensor_model_parallel_all_reduce

    return tensor_model_parallel_all_reduce(y)


def _scale_shape(m: int, k: int, group: int) -> tuple[int, ...]:
    return (m, k // group) if group else (m,)


@torch.library.custom_op("radiance::ar_add_rms_quant", mutates_args=())
def ar_add_rms_quant(
    y: torch.Tensor,
    residual: Optional[torch.Tensor],
    weight: torch.Tensor,
    eps: float,
    gemma: bool,
    group: int,
    fp8_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if residual is not None and tp_world_size() > 1:
        # one_kernel checks the arguments either way, so bad ones raise on every rank alike
        # (they are the same shapes everywhere) before the all-reduce below.
        fused = fused_all_reduce.one_kernel(y, residual, weight, eps, gemma, group, fp8_dtype)
        if fused is not None:
            return fused
        y = tp_all_reduce(y)
    q, scale, residual_out = kops.add_rms_quant(
        y, residual, weight, eps, gemma=gemma, group=group, fp8_dtype=fp8_dtype)
    if residual is None:
        residual_out = y.new_empty((0, y.shape[1]))
    return q, scale, residual_out


@ar_add_rms_quant.register_fake
def _ar_add_rms_quant_fake(y, residual, weight, eps, gemma, group, fp8_dtype):
    m, k = y.shape
    return (
        y.new_empty((m, k), dtype=fp8_dtype),
        y.new_empty(_scale_shape(m, k, group), dtype=torch.float32),
        y.new_empty((m, k) if residual is not None else (0, k)),
    )


@torch.library.custom_op("radiance::silu_mul_quant", mutates_args=())
def silu_mul_quant(
    gu: torch.Tensor, group: int, fp8_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    return kops.silu_mul_quant(gu, group=group, fp8_dtype=fp8_dtype)


@silu_mul_quant.register_fake
def _silu_mul_quant_fake(gu, group, fp8_dtype):
    m, n = gu.shape[0], gu.shape[1] // 2
    return (
        gu.new_empty((m, n), dtype=fp8_dtype),
        gu.new_empty(_scale_shape(m, n, group), dtype=torch.float32),
    )


@torch.library.custom_op("radiance::gdn_norm_quant", mutates_args=())
def gdn_norm_quant(
    x: torch.Tensor,
    z: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    group: int,
    fp8_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    return kops.gdn_norm_quant(x, z, weight, eps, group=group, fp8_dtype=fp8_dtype)


@gdn_norm_quant.register_fake
def _gdn_norm_quant_fake(x, z, weight, eps, group, fp8_dtype):
    m, n = x.shape
    return (
        x.new_empty((m, n), dtype=fp8_dtype),
        x.new_empty(_scale_shape(m, n, group), dtype=torch.float32),
    )
