"""The rewritten decoder-layer forwards and the two sub-module replacements.

Each forward is the stock body of its family with the epilogue sites that ``rewrite`` enabled
(``LayerPlan``) swapped for one stream op; the branches ``rewrite`` only allows to stay live
when the matching site is off (layer scale) are kept verbatim. Layers whose stock body has
other live branches (sequence-parallel MoE) are never given these forwards.

Contract between layers: ``(hidden_states, residual)`` as in vLLM. When a layer's input site is
on and tensor-parallel size > 1, the ``hidden_states`` it receives is the previous layer's
un-reduced down_proj output, and its input epilogue all-reduces it. The last layer never hands
a partial sum on, so the final norm and any drafter see the stock contract.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from radiance.fp8stream.epilogues import Epilogues


@dataclass
class SiteQuant:
    """How one site quantizes: the consumer's grouping and FP8 format."""

    group: int
    fp8_dtype: torch.dtype
    gemma: bool = False  # the site's norm multiplies by (1 + w) (GemmaRMSNorm)


@dataclass
class LayerPlan:
    index: int
    family: str  # "qwen3_next" or "dense"
    epilogues: Epilogues
    input: SiteQuant | None = None
    mid: SiteQuant | None = None
    act: SiteQuant | None = None
    gdn_norm: SiteQuant | None = None
    partial_output: bool = False  # this layer's down_proj stays un-reduced (tp > 1 hand-off)


def _input_epilogue(self, plan: LayerPlan, hidden_states, residual):
    norm = self.input_layernorm
    site = plan.input
    q, scale, residual_out = plan.epilogues.add_rms_quant(
        hidden_states, residual, norm.weight, norm.variance_epsilon, site.gemma, site.group,
        site.fp8_dtype)
    return (q, scale), residual_out


def _mid_epilogue(self, plan: LayerPlan, attn_out, residual):
    norm = self.post_attention_layernorm
    site = plan.mid
    q, scale, residual = plan.epilogues.add_rms_quant(
        attn_out, residual, norm.weight, norm.variance_epsilon, site.gemma, site.group,
        site.fp8_dtype)
    return self.mlp((q, scale)), residual


def _input(self, plan: LayerPlan, hidden_states, residual):
    """The layer's input side: the fused epilogue where planned, else the stock input norm."""
    if plan.input is not None:
        return _input_epilogue(self, plan, hidden_states, residual)
    if residual is None:
        return self.input_layernorm(hidden_states), hidden_states
    return self.input_layernorm(hidden_states, residual)


def _layer_scaled(hidden_states, scale):
    """Qwen3-Next's optional per-layer scale, as its stock forward applies it."""
    if len(hidden_states.shape) == 2:
        return hidden_states * (scale.to(hidden_states.dtype)[0] + 1)
    return hidden_states * (scale.to(hidden_states.dtype) + 1)


def qwen3_next_forward(self, hidden_states, residual, positions, **kwargs):
    """Stream form of ``Qwen3NextDecoderLayer.forward`` (Gemma norms, GDN or full attention)."""
    plan: LayerPlan = self._radiance_fp8stream
    hidden_states, residual = _input(self, plan, hidden_states, residual)

    if self.layer_type == "linear_attention":
        hidden_states = self.linear_attn(hidden_states=hidden_states)
    else:
        hidden_states = self.self_attn(hidden_states=hidden_states, positions=positions)

    if self.layer_scale:  # only with the mid site off (rewrite's guard)
        hidden_states = _layer_scaled(hidden_states, self.attn_layer_scale)

    if plan.mid is not None:
        hidden_states, residual = _mid_epilogue(self, plan, hidden_states, residual)
    else:
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        hidden_states = self.mlp(hidden_states)

    if self.layer_scale:
        hidden_states = _layer_scaled(hidden_states, self.ffn_layer_scale)
    return hidden_states, residual


def dense_forward(self, positions, hidden_states, residual, **kwargs):
    """Stream form of the Llama / Qwen3 decoder layer (plain RMSNorm)."""
    plan: LayerPlan = self._radiance_fp8stream
    hidden_states, residual = _input(self, plan, hidden_states, residual)
    hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states)
    if plan.mid is not None:
        return _mid_epilogue(self, plan, hidden_states, residual)
    hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
    return self.mlp(hidden_states), residual


FORWARDS = {"qwen3_next": qwen3_next_forward, "dense": dense_forward}


class SiluMulQuant(nn.Module):
    """Drop-in for an MLP's ``SiluAndMul``: returns ``(q, scale)`` for its down_proj."""

    def __init__(self, stock: nn.Module, site: SiteQuant, epilogues: Epilogues) -> None:
        super().__init__()
        self.stock = stock  # kept so uninstall can put it back
        self.site = site
        self.epilogues = epilogues

    def forward(self, gate_up: torch.Tensor):
        return self.epilogues.silu_mul_quant(gate_up, self.site.group, self.site.fp8_dtype)

    def extra_repr(self) -> str:
        return f"group={self.site.group}, fp8={self.site.fp8_dtype}, lowering={self.epilogues.lowering}"


def gdn_output_projection(self, core_attn_out: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Stream form of ``QwenGatedDeltaNetAttention._output_projection``: gated per-head RMSNorm
    + quant in one op, ``(q, scale)`` into out_proj."""
    plan: LayerPlan = self._radiance_fp8stream
    site = plan.gdn_norm
    tokens = core_attn_out.shape[0]
    q, scale = plan.epilogues.gdn_norm_quant(
        core_attn_out.reshape(tokens, -1), z.reshape(tokens, -1), self.norm.weight,
        self.norm.eps, site.group, site.fp8_dtype)
    output, _ = self.out_proj((q, scale))
    return output
