"""radiance.kernels: fused epilogue kernels for vLLM decode and the registry that selects them.

The ops (``add_rms_quant``, ``silu_mul_quant``, ``gdn_norm_quant``, ``available``,
``unavailable_reason``) and the ``ops`` / ``reference`` / ``library`` modules load on first
access: importing this package imports neither torch nor builds anything.
"""

import importlib

from radiance.kernels.__about__ import __version__
from radiance.kernels.registry import (
    REGISTRY,
    Kernel,
    Selection,
    kernels,
    mark_unavailable,
    record,
    register,
    report_lines,
    select,
    selections,
)

_LAZY_OPS = ("add_rms_quant", "silu_mul_quant", "gdn_norm_quant", "available", "unavailable_reason")
_LAZY_MODULES = ("ops", "reference", "library")


def __getattr__(name: str):
    if name in _LAZY_OPS:
        return getattr(importlib.import_module("radiance.kernels.ops"), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(f"radiance.kernels.{name}")
    raise AttributeError(f"module 'radiance.kernels' has no attribute {name!r}")


__all__ = [
    "add_rms_quant",
    "available",
    "gdn_norm_quant",
    "silu_mul_quant",
    "unavailable_reason",
    "REGISTRY",
    "Kernel",
    "Selection",
    "__version__",
    "kernels",
    "mark_unavailable",
    "record",
    "register",
    "report_lines",
    "select",
    "selections",
]
