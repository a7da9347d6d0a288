"""The block-FP8 linear kernel vLLM's ``Fp8LinearMethod`` picks once ``vllm_patches.install()``
has put it first in the platform's list of block-FP8 kernels.

Load time (``process_weights_after_loading``): vLLM's own weight normalisation (fnuz on MI300,
ROCm padding), e8m0 scales widened to fp32, then a route per layer (dispatch.plan) and, only if
that route's provider wants it, the (16, 16) weight shuffle. A shuffled weight keeps its logical
``[N, K]`` shape and dtype in ``layer.weight``; ``layer.radiance_weight_layout`` names the layout and
``layer.radiance_gemm_n`` / ``radiance_gemm_k`` record the true sizes.

Call time (``apply_weights``): the input is either activations (quantized here with vLLM's own
``QuantFP8``, 1x128 groups) or a pre-quantized ``(q, scale)`` tuple from the fp8 stream, scale per
token ``[M]`` or per group ``[M, K/128]``; a per-token scale is broadcast to the group layout as a
stride-0 view. Then the route: on CPU its single provider inline (plain torch ops the compiler
can fuse), on a GPU the ``radiance_gemm::block_fp8_mm`` custom op that branches on M.
"""

from __future__ import annotations

import logging

import torch

from vllm.model_executor.kernels.linear.scaled_mm.BlockScaledMMLinearKernel import (
    Fp8BlockScaledMMLinearKernel,
)
from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
from vllm.model_executor.utils import replace_parameter
from vllm.platforms import current_platform

from radiance.gemm import INPUT_GROUP_ATTR, dispatch, reference
from radiance.gemm.platform import device_platform, sm_count
from radiance.gemm.providers import PROVIDERS

logger = logging.getLogger("vllm.radiance.gemm")


def _platform_name() -> str | None:
    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_rocm():
        return "rocm"
    if current_platform.is_cuda():
        return "cuda"
    return None


class RadianceBlockFp8LinearKernel(Fp8BlockScaledMMLinearKernel):
    """Block-FP8 W8A8 linear with per-layer provider routing and a pre-quantized input path."""

    def __init__(self, config) -> None:
        super().__init__(config)
        if current_platform.is_cuda():
            # Column-major activation scales ([M, K/128] with strides (1, M)): the layout
            # PyTorch's block-wise scaled_mm reads without a copy; the Triton providers read
            # scales through their strides, so this costs them nothing.
            act = config.activation_quant_key.scale
            self.quant_fp8 = QuantFP8(static=act.static, group_shape=act.group_shape,
                                      num_token_padding=None, column_major_scales=True,
                                      use_ue8m0=False)

    @classmethod
    def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
        platform = _platform_name()
        if platform is None:
            return False, "radiance-gemm serves CPU, CUDA and ROCm only"
        if platform != "cpu":
            reasons = []
            for p in PROVIDERS:
                if platform in p.platforms and not p.wants_shuffled:
                    why = p.available()
                    if why is None:
                        return True, None
                    reasons.append(f"{p.name}: {why}")
            return False, "no GPU provider available (" + "; ".join(reasons) + ")"
        return True, None

    @classmethod
    def can_implement(cls, config) -> tuple[bool, str | None]:
        ok, why = super().can_implement(config)
        if not ok:
            return ok, why
        act = config.activation_quant_key.scale.group_shape
        wgt = config.weight_quant_key.scale.group_shape
        if not act.is_per_group() or act.col != wgt.col:
            return False, f"needs 1x{wgt.col} activation groups matching the weight blocks, got {act}"
        if config.out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
            return False, f"output dtype {config.out_dtype} not served"
        if _platform_name() != "cpu" and (wgt.row, wgt.col) != (128, 128):
            return False, f"GPU providers need 128x128 weight blocks, got {wgt.row}x{wgt.col}"
        return True, None

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        super().process_weights_after_loading(layer)
        params = self._get_layer_params(layer)
        scale = params.block_scale
        if scale.dtype != torch.float32:
            # e8m0 (exponent-only) or other narrow scales: every provider reads fp32.
            if scale.dtype == torch.float8_e8m0fnu:
                scale = (scale.data.view(torch.uint8).to(torch.int32) << 23).view(torch.float32)
            replace_parameter(layer, params.block_scale_attr, scale.data.float().contiguous())
            scale = getattr(layer, params.block_scale_attr)
        weight = params.weight
        n, k = int(weight.shape[0]), int(weight.shape[1])
        block = (int(self.weight_group_shape.row), int(self.weight_group_shape.col))
        platform, arch = device_platform(weight.device)
        route = dispatch.plan(platform, arch, n, k, block, weight.dtype,
                              sm_count(weight.device) if platform != "cpu" else 1)
        layout = "plain"
        if dispatch.wants_shuffled(route):
            from radiance.gemm.aiter_block_fp8 import shuffle_weight

            replace_parameter(layer, params.WEIGHT, shuffle_weight(weight.data))
            layout = "aiter_shuffle_16x16"
        layer.radiance_gemm_n = n
        layer.radiance_gemm_k = k
        layer.radiance_weight_layout = layout
        layer.radiance_gemm_route = route
        layer.radiance_gemm_inline = platform == "cpu"
        layer.radiance_gemm_counters = torch.zeros(
            -(-n // 16) if platform != "cpu" else 0, dtype=torch.int32, device=weight.device)
        setattr(layer, INPUT_GROUP_ATTR, block[1])
        logger.debug("radiance-gemm N=%d K=%d: %s", n, k, dispatch.describe(route))

    def apply_weights(self, layer: torch.nn.Module, x, bias: torch.Tensor | None = None,
                      **kwargs) -> torch.Tensor:
        params = self._get_layer_params(layer)
        weight = params.weight
        w_scale = params.block_scale
        n, k = weight.shape
        group = self.weight_group_shape.col
        groups = -(-k // group)
        if isinstance(x, tuple):
            q, scale = x
            if q.dtype != weight.dtype or q.shape[-1] != k:
                raise ValueError(f"pre-quantized input must be {weight.dtype} [..., {k}], "
                                 f"got {q.dtype} {list(q.shape)}")
            lead = q.shape[:-1]
            q2 = q.reshape(-1, k)
            m = q2.shape[0]
            tokens = (tuple(lead), (m,))  # the input's leading dims, as given or flattened
            rows = tuple(scale.shape[:-1]) if scale.dim() else None
            if scale.numel() == m and (tuple(scale.shape) in tokens or rows in tokens):
                scale = scale.reshape(m)  # per token, optionally with a trailing 1
            elif rows in tokens:
                scale = scale.reshape(m, scale.shape[-1])  # per group; group_scales checks the count
            else:
                raise ValueError(f"pre-quantized scale must be per token {list(lead)} / [{m}] or per group "
                                 f"{[*lead, groups]} / [{m}, {groups}], got {list(scale.shape)}")
            s2 = reference.group_scales(scale, m, groups)
        else:
            lead = x.shape[:-1]
            q2, s2 = self.quant_fp8(x.reshape(-1, k), None, None, use_triton=self.use_triton)
        if layer.radiance_gemm_inline:
            out = reference.block_fp8_mm(q2, weight, s2, w_scale, self.config.out_dtype,
                                         (self.weight_group_shape.row, group))
        else:
            out = torch.ops.radiance_gemm.block_fp8_mm(
                q2, weight, s2, w_scale, layer.radiance_gemm_counters,
                list(layer.radiance_gemm_route), self.config.out_dtype)
        if bias is not None:
            out = out + bias
        return out.to(self.config.out_dtype).view(*lead, n)

    def apply_block_scaled_mm(self, A, B, As, Bs) -> torch.Tensor:
        raise NotImplementedError("RadianceBlockFp8LinearKernel overrides apply_weights")
