"""radiance.fp8stream."""

from radiance.fp8stream.__about__ import __version__

__all__ = ["__version__"]
