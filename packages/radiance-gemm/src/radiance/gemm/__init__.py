"""radiance.gemm: block-FP8 GEMM dispatch for vLLM.

``accepts_prequantized(layer)`` is the contract with the fp8 stream: a linear served by this
package's kernel takes a pre-quantized ``(q, scale)`` input and this returns the activation
grouping its provider wants (128), else None.
"""

from __future__ import annotations

from radiance.gemm.__about__ import __version__

INPUT_GROUP_ATTR = "radiance_fp8_input_group"


def accepts_prequantized(layer) -> int | None:
    group = getattr(layer, INPUT_GROUP_ATTR, None)
    return group if isinstance(group, int) and group > 0 else None


__all__ = ["INPUT_GROUP_ATTR", "__version__", "accepts_prequantized"]
