"""radiance.gemm."""

from radiance.gemm.__about__ import __version__

__all__ = ["__version__"]
