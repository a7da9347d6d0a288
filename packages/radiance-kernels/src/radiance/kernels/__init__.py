"""radiance.kernels: fused epilogue kernels for vLLM decode and the registry that selects them."""

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

__all__ = [
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
