"""Every environment flag radiance reads: one table, shown by `radiance status` and the README.

A test checks that the README's flag table and this one name the same flags.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    name: str
    default: str
    package: str
    effect: str


FLAGS: tuple[Flag, ...] = (
    Flag("RADIANCE_DISABLE", "(empty)", "plugin",
         "comma list of hooks to leave out: gemm, fp8stream, attn, plugin (the report)"),
    Flag("RADIANCE_MODELS_DIR", "~/.cache/radiance/models", "plugin",
         "where the tiny local models are built and cached"),
    Flag("RADIANCE_CACHE_DIR", "~/.cache/radiance/kernels", "kernels",
         "where the JIT-built kernel library is cached (per user, private)"),
    Flag("RADIANCE_STRICT", "0", "kernels",
         "1: a kernel build failure raises instead of falling back to the reference"),
)
