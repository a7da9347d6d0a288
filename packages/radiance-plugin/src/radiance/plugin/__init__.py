"""radiance.plugin: the vLLM entry point that installs every radiance package, and the CLI."""

from radiance.plugin.__about__ import __version__

__all__ = ["__version__"]
