"""radiance.attn."""

from radiance.attn.__about__ import __version__

__all__ = ["__version__"]
