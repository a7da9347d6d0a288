"""The one-kernel all-reduce epilogue on vLLM's tensor-parallel group.

At tensor-parallel size > 1 every ``ar_add_rms_quant`` site would run vLLM's all-reduce and then
the epilogue kernel. ``setup()`` builds radiance's peer all-reduce (``radiance.kernels.
peer_all_reduce``) on vLLM's tensor-parallel group once per process, right after the target
model is loaded (every rank loads it at the same point, so the setup's collectives line up);
from then on ``one_kernel`` serves the calls whose shapes allow it with the fused kernel, one
launch per site, and returns None for the rest, which keep the two-step path.

vLLM's own custom all-reduce, when active, is left alone: radiance maps its own buffers (two
staging halves and the flags per rank), registers nothing with vLLM's communicator and never
touches vLLM's buffers or graph-buffer registration; vLLM's all-reduce keeps serving every other
all-reduce and the two-step fallback.
"""

from __future__ import annotations

import logging

from radiance.fp8stream import flags
from radiance.kernels import ops as kops

logger = logging.getLogger("vllm.radiance.fp8stream")

_comm = None
_status = "not set up (no tensor-parallel model loaded yet)"


def status() -> str:
    """One line: on, with the group, or off and why."""
    return _status


def _vllm_custom_all_reduce(tp_group) -> str:
    comm = getattr(tp_group, "device_communicator", None)
    ca = getattr(comm, "ca_comm", None)
    if ca is not None and not getattr(ca, "disabled", True):
        return "vLLM's custom all-reduce is active alongside (radiance uses its own buffers)"
    return "vLLM's custom all-reduce is not active"


def _set(comm, line: str) -> str:
    global _comm, _status
    _comm, _status = comm, line
    return line


def _off(line: str, world_size) -> str:
    _set(None, line)
    logger.info("fused all-reduce epilogue %s", line)
    from radiance.kernels import registry
    from radiance.kernels.peer_all_reduce import OP

    registry.record(OP, {"world_size": world_size}, None, line)
    return line


def setup(fused_sites: int, ubatching: bool = False) -> str:
    """Set up the peer all-reduce for this process's tensor-parallel group when the flag is on,
    the group has more than one rank and the rewrite installed ``fused_sites`` > 0 epilogues that
    reduce. ``ubatching``: vLLM overlaps micro-batches (DBO), which puts a rank's all-reduces on
    more than one stream, while the peer exchange counts calls in one stream order, so it stays
    off. Idempotent. Returns the status line; every outcome but tensor-parallel size 1 (nothing
    to reduce, nothing to report) is also logged and recorded in the selection report."""
    if _comm is not None:
        return _status
    # Read first so a bad value raises whatever the group size.
    enabled = flags.fused_allreduce_enabled()
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return _off("off (vLLM's parallel groups are not initialized)", "unknown")
    tp = parallel_state.get_tp_group()
    if tp.world_size == 1:
        return _set(None, "off (tensor-parallel size 1: nothing to reduce)")
    if not enabled:
        return _off(f"off ({flags.FUSED_ALLREDUCE}=0)", tp.world_size)
    if ubatching:
        return _off("off (micro-batch overlap runs a rank's all-reduces on two streams)", tp.world_size)
    if fused_sites == 0:
        return _off("off (the fp8 stream installed no epilogue that reduces)", tp.world_size)
    from radiance.kernels import registry
    from radiance.kernels.peer_all_reduce import KERNEL_NAME, OP, PeerAllReduce

    comm = PeerAllReduce(tp.cpu_group, tp.device)
    if not comm.enabled:
        line = _set(None, f"off: {comm.reason}")
        logger.warning("fused all-reduce epilogue %s; the two-step path (vLLM's all-reduce, then "
                       "the epilogue kernel) serves every site", line)
    else:
        line = _set(comm, f"on (tp={tp.world_size}, rank {tp.rank_in_group}; "
                          f"{_vllm_custom_all_reduce(tp)})")
        logger.info("fused all-reduce epilogue %s", line)
    registry.record(OP, {"world_size": tp.world_size, "setup": "peer buffers"},
                    KERNEL_NAME if comm.enabled else None, "" if comm.enabled else line)
    return line


def one_kernel(y, residual, weight, eps, gemma, group, fp8_dtype):
    """The fused op's outputs when the one-kernel path serves this call, else None (the caller
    then all-reduces and runs the epilogue). The arguments are checked first either way, so bad
    ones raise before any collective.

    The branch reads the setup outcome (the same on every rank) and shapes only."""
    comm = _comm
    if comm is None:
        kops.check_add_rms_quant_args(y, residual, weight, eps, group, fp8_dtype)
        return None
    # The peer set checks the arguments before anything else.
    return comm.serve_ar_add_rms_quant(y, residual, weight, eps, gemma=gemma, group=group,
                                       fp8_dtype=fp8_dtype)


def _reset_for_tests() -> None:
    _set(None, "not set up (no tensor-parallel model loaded yet)")
