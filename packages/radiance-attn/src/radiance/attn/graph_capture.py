"""The context a launch chosen while a CUDA graph is being captured must serve.

vLLM's default CUDA-graph mode (FULL_AND_PIECEWISE) captures decode steps, and verify steps whose
sequences share a width, as whole graphs, once per captured batch size, from dummy sequences
holding only their own query tokens, and replays each at every context. Chosen for the capture's
``max_seqlen_k``, radiance's launch is the split rule's short-context one (4 segments where one
32K sequence wants 128): replayed at long contexts it took up to 14x the time of the launch the
table names for them, and single-sequence decode at head 256 on bf16 KV 1.25-1.32x the time of
vLLM's own launch (an H100, ``benchmarks/results/graph_capture.md``).

So while a graph is being captured the policy is asked for the longest context the graph can be
replayed at, the model's ``max_model_len``, which vLLM's Triton metadata builder records here
when vLLM constructs it (``vllm_patches._patch_builder``). A shorter context replays the same
launch: its segments past a sequence's last tile store "no keys" and return, and the reduce
loads no output slice of theirs. Measured there, that launch takes 0.99-1.01x the time of the
launch chosen for the real context from 32K, up to 1.12x at 8K and 1.24x at 2K (eight
sequences, where the longer context's split has the most empty blocks), and 0.007-0.94x stock's.
"""

from __future__ import annotations

_max_model_len: int | None = None


def note_max_model_len(max_model_len: int | None) -> None:
    """Record the longest context a captured graph may be replayed at (vLLM's max_model_len);
    None forgets it (captures then choose for their own context, as before this module)."""
    global _max_model_len
    if max_model_len is not None and int(max_model_len) <= 0:
        raise ValueError(f"max_model_len must be positive, got {max_model_len!r}")
    _max_model_len = None if max_model_len is None else int(max_model_len)


def max_model_len() -> int | None:
    """The recorded max_model_len; None until vLLM's metadata builder (or a caller) records one."""
    return _max_model_len


def capturing(device) -> bool:
    """Whether a call on ``device`` is being captured into a CUDA graph (the current stream is
    capturing; always False for a device that is not CUDA)."""
    if getattr(device, "type", None) != "cuda":
        return False
    import torch

    return torch.cuda.is_current_stream_capturing()

