"""The stream's environment flags, read and validated in one place.

Every flag takes exactly ``0`` or ``1``; anything else is a configuration mistake and raises a
``ValueError`` naming the flag and the value, so a typo never silently leaves the stream off.
"""

from __future__ import annotations

import os

STREAM = "RADIANCE_FP8_STREAM"
GDN_NORM_QUANT = "RADIANCE_GDN_NORM_QUANT"
FUSED_ALLREDUCE = "RADIANCE_FUSED_ALLREDUCE"

# Decided by the H200 per-site measurements (benchmarks/results; the numbers are in the README's
# Flags section): the fused input and mid epilogues beat the compiled stock chain at every
# measured M in every committed run, so the stream is on. The GatedDeltaNet norm epilogue lost to
# stock at M = 1 in one run, the stock chain moving a lot from run to run: opt-in until that
# baseline is settled.
# The one-kernel all-reduce epilogue at tensor-parallel size > 1 is exact (bit-identical to
# all-reduce + the epilogue kernel on every rank), so it is on wherever the peer setup succeeds.
DEFAULTS = {STREAM: "1", GDN_NORM_QUANT: "0", FUSED_ALLREDUCE: "1"}


def _read(name: str) -> bool:
    raw = os.environ.get(name, DEFAULTS[name])
    value = raw.strip()
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {raw!r}")
    return value == "1"


def stream_enabled() -> bool:
    """``RADIANCE_FP8_STREAM``: rewrite the decoder layers after load."""
    return _read(STREAM)


def gdn_norm_quant_enabled() -> bool:
    """``RADIANCE_GDN_NORM_QUANT``: also fuse the GatedDeltaNet output norm with its quant."""
    return _read(GDN_NORM_QUANT)


def fused_allreduce_enabled() -> bool:
    """``RADIANCE_FUSED_ALLREDUCE``: at tensor-parallel size > 1, fold the all-reduce into the
    epilogue kernel (one launch per site) where the peer setup succeeds and the shape allows."""
    return _read(FUSED_ALLREDUCE)


def validate() -> tuple[bool, bool]:
    """The stream and gdn flags (``RADIANCE_FUSED_ALLREDUCE`` is checked too); raises
    ``ValueError`` on a bad value of any of them."""
    fused_allreduce_enabled()
    return stream_enabled(), gdn_norm_quant_enabled()


def cache_factors() -> dict[str, str]:
    """What the stream adds to vLLM's compile-cache key while it is on."""
    from radiance.fp8stream.__about__ import __version__

    stream, gdn = validate()
    return {
        "radiance.fp8stream.version": __version__,
        STREAM: "1" if stream else "0",
        GDN_NORM_QUANT: "1" if gdn else "0",
    }
