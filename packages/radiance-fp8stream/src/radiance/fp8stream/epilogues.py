"""How a rewritten layer computes its epilogues: one opaque op, or the reference chain inline.

``opaque`` calls the ``radiance::*`` custom ops: one graph node and one launch per site, which is
the point of the stream wherever a GPU kernel serves. ``traced`` writes the reference chain (the
same torch ops as vLLM's native norm + quant) into the layer's code instead; it is what runs
where no kernel exists (the CPU). There the stock graph is compiled by Inductor, whose fused
reductions sum in another order than eager torch, so an opaque op running the reference eagerly
would differ from the compiled stock model in the last bits; the inline chain is compiled by the
same compiler as the stock chain and stays bit-identical, eager and compiled.
"""

from __future__ import annotations

import torch

import radiance.fp8stream.ops  # noqa: F401 - registers torch.ops.radiance.*
from radiance.fp8stream.ops import tp_all_reduce
from radiance.kernels import reference

LOWERINGS = ("opaque", "traced")


class Epilogues:
    def __init__(self, lowering: str, tp: int) -> None:
        if lowering not in LOWERINGS:
            raise ValueError(f"lowering must be one of {LOWERINGS}, got {lowering!r}")
        self.lowering = lowering
        self.opaque = lowering == "opaque"
        self.tp = tp

    def add_rms_quant(self, y, residual, weight, eps, gemma, group, fp8_dtype):
        """``(q, scale, residual_out)`` with ``y`` all-reduced first when it is a partial sum
        (tensor-parallel size > 1 and a residual to add). ``residual=None``: ``residual_out``
        is ``y``."""
        if self.opaque:
            q, scale, residual_out = torch.ops.radiance.ar_add_rms_quant(
                y, residual, weight, eps, gemma, group, fp8_dtype)
            return q, scale, (y if residual is None else residual_out)
        if residual is not None and self.tp > 1:
            y = tp_all_reduce(y)
        return reference.add_rms_quant(y, residual, weight, eps, gemma=gemma, group=group,
                                       fp8_dtype=fp8_dtype)

    def silu_mul_quant(self, gu, group, fp8_dtype):
        if self.opaque:
            return torch.ops.radiance.silu_mul_quant(gu, group, fp8_dtype)
        return reference.silu_mul_quant(gu, group=group, fp8_dtype=fp8_dtype)

    def gdn_norm_quant(self, x, z, weight, eps, group, fp8_dtype):
        if self.opaque:
            return torch.ops.radiance.gdn_norm_quant(x, z, weight, eps, group, fp8_dtype)
        return reference.gdn_norm_quant(x, z, weight, eps, group=group, fp8_dtype=fp8_dtype)
