"""radiance.fp8stream: the fp8 residual-stream rewriter for vLLM decoder layers.

``install(model)`` rewrites a loaded model's decoder layers where every guard holds and returns
a ``Summary`` whose ``str()`` is the one-line report; ``uninstall(model)`` puts them back.
``radiance.fp8stream.vllm_patches.install`` is the plugin hook that runs ``install`` at load.
"""

from radiance.fp8stream.__about__ import __version__
from radiance.fp8stream.rewrite import Summary, install, last_summary, uninstall

__all__ = ["Summary", "__version__", "install", "last_summary", "uninstall"]
