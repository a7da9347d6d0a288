"""Every runtime patch radiance-attn applies to vLLM (its Triton backend, below), and the entry
to the AITER adapter (``aiter_adapter.py``, which patches AITER's own modules and documents each).

``install()`` is the plugin's hook: no argument, returns ``(applied, detail)``, idempotent
(vLLM calls plugins in every process, possibly twice). Each adapter is installed only when its
target is present; a target that is absent or not shaped as expected is left stock with the
reason in ``detail``.

Flags:
  RADIANCE_ATTN=0               install nothing (default 1)
  RADIANCE_ATTN_TRITON=0        leave vLLM's Triton backend stock (default 1)
  RADIANCE_ATTN_AITER=0         leave AITER's unified attention stock (default 1)
  RADIANCE_ATTN_TABLE=path      a per-arch table that replaces the shipped one for its arch
  RADIANCE_ATTN_SCRATCH_MIB=256 cap on the split-KV partial-output tensor (softmax_segm_output)
                                each Triton metadata builder reallocates (see _enlarge_scratch)
"""

from __future__ import annotations

import logging
import os
import threading

from radiance.attn import graph_capture, policy, tables
from radiance.attn.triton_launch import RadianceUnifiedAttention, kernel_mismatch

logger = logging.getLogger("vllm.radiance.attn")

_lock = threading.Lock()
TRITON_BACKEND = "vllm.v1.attention.backends.triton_attn"
TRITON_OPS = "vllm.v1.attention.ops.triton_unified_attention"
DEFAULT_SCRATCH_MIB = 256


def _flag(name: str, default: str = "1") -> bool:
    return os.environ.get(name, default).strip().lower() not in ("0", "false", "no", "off", "")


def install() -> tuple[bool, str]:
    if not _flag("RADIANCE_ATTN"):
        return False, "disabled by RADIANCE_ATTN=0"
    override = os.environ.get(tables.ENV_TABLE)
    parts = []
    if override:
        # Read here, not at the first attention call: a table that cannot be used leaves the
        # attention stock with the reason, instead of failing the serve mid-forward.
        try:
            table_arch = tables.load_file(override)["arch"]
        except (OSError, ValueError) as exc:
            return False, f"{tables.ENV_TABLE}={override} cannot be used ({exc}): attention left stock"
        # Which GPU this is is not known here without initializing CUDA from the plugin hook;
        # a lookup for another arch warns once that the file is ignored there (tables.for_arch).
        parts.append(f"{tables.ENV_TABLE}={override} serves {table_arch} only")
    with _lock:
        applied = False
        for name, flag, fn in (("triton", "RADIANCE_ATTN_TRITON", install_triton),
                               ("aiter", "RADIANCE_ATTN_AITER", _install_aiter)):
            if not _flag(flag):
                parts.append(f"{name}: disabled by {flag}=0")
                continue
            # Each adapter stands alone: one that fails is reported while the other stays on.
            try:
                ok, detail = fn()
            except Exception as exc:  # noqa: BLE001 - reported in the hook's detail, never hidden
                logger.warning("radiance-attn %s adapter failed, left stock: %s: %s",
                               name, type(exc).__name__, exc)
                ok, detail = False, f"failed, left stock ({type(exc).__name__}: {exc})"
            applied |= ok
            parts.append(f"{name}: {detail}")
        return applied, "; ".join(parts)


def _install_aiter() -> tuple[bool, str]:
    from radiance.attn import aiter_adapter

    return aiter_adapter.install()


# --------------------------------------------------------------------------------------------
# vLLM's Triton attention backend
# --------------------------------------------------------------------------------------------


def install_triton(backend=None, kernel_module=None) -> tuple[bool, str]:
    """Put radiance's launch in place of ``unified_attention`` in the Triton backend's namespace.

    Why: vLLM's wrapper splits the KV only for single-token decode (fixed 16 segments) and runs
         verify batches unsplit with a 16-row query block that re-reads the KV per block; on an
         H200, 1 sequence x width 4 x 32K context takes 1.70 ms stock vs 47 us split-KV.
    What: ``triton_attn.unified_attention`` (the name the backend's forward calls; it imported
         the function into its own namespace) becomes a ``RadianceUnifiedAttention`` over the
         same kernel module; the metadata builder's split-KV scratch is enlarged so the policy's
         segment counts fit (``_patch_builder``). Shapes the policy does not tune, and any
         unexpected argument, go to the stock wrapper.
    Remove when: vLLM sizes split-KV by geometry for verify batches and lets a query block hold
         every verify token of a sequence.

    ``backend``/``kernel_module`` default to the installed vLLM's; tests pass a kernel module
    with a real Triton backend when vLLM's own is a CPU placeholder.
    """
    try:
        if backend is None:
            import importlib

            backend = importlib.import_module(TRITON_BACKEND)
        if kernel_module is None:
            import importlib

            kernel_module = importlib.import_module(TRITON_OPS)
    except Exception as exc:  # noqa: BLE001 - absent or broken target: leave stock, say why
        return False, f"vLLM Triton attention not importable ({type(exc).__name__}: {exc})"
    current = getattr(backend, "unified_attention", None)
    if getattr(current, "_radiance", False):
        return True, "already installed"
    if current is None:
        return False, "triton_attn has no unified_attention (vLLM layout changed)"
    why = kernel_mismatch(kernel_module)
    if why is not None:
        return False, why
    if current is not getattr(kernel_module, "unified_attention", None) and kernel_module.__name__ == TRITON_OPS:
        return False, "triton_attn.unified_attention is not vLLM's wrapper (patched by someone else)"
    builder_detail = _patch_builder(backend)
    backend.unified_attention = RadianceUnifiedAttention(kernel_module, stock=current)
    backend._radiance_stock_unified_attention = current
    return True, f"radiance launch in triton_attn; {builder_detail}"


def uninstall_triton(backend) -> None:
    """Undo install_triton on ``backend`` (tests and A/B runs)."""
    stock = getattr(backend, "_radiance_stock_unified_attention", None)
    if stock is not None:
        backend.unified_attention = stock
        del backend._radiance_stock_unified_attention
    cls = getattr(backend, "TritonAttentionMetadataBuilder", None)
    orig = getattr(getattr(cls, "__init__", None), "_radiance_orig", None)
    if orig is not None:
        cls.__init__ = orig


def scratch_rows(num_heads_q: int, head_padded: int, segments_in_layout: int, max_tokens: int,
                 max_segments: int, budget_bytes: int) -> int:
    """Rows of the builder's ``[rows, heads, segments, head]`` scratch radiance needs.

    The kernel addresses segment partials as ``token * heads * S + head * S + segment`` for the
    launch's S, so only the total size matters: ``max_tokens * max_segments`` (token, segment)
    slots, capped by the byte budget (the policy clamps its segment count to what fits).
    """
    per_slot = num_heads_q * head_padded * 4
    slots = min(max_tokens * max_segments, max(0, budget_bytes) // per_slot)
    return -(-slots // segments_in_layout)


def _patch_builder(backend) -> str:
    """Enlarge the Triton metadata builder's split-KV scratch for radiance's segment counts.

    Why: the builder allocates ``[3D threshold, heads, 16, head]`` fp32 -- room for 16 segments
         of single-token decode -- and radiance also splits verify batches, into up to 128.
    What: after the stock ``__init__``, reallocates the three scratch tensors with more rows
         (same layout and dtype, so the stock path reads them exactly as before), sized for
         ``max_num_seqs`` (at most the table's ``max_seqs``) x (1 + speculative tokens) query
         tokens x the table's largest split, the partial-output tensor within
         RADIANCE_ATTN_SCRATCH_MIB (rounded up to a whole row; never smaller than stock's).
         It also records the model's ``max_model_len``: launches chosen while a CUDA graph is
         captured are chosen for it (``graph_capture.py``).
    Remove when: the backend sizes its scratch for split verify batches itself (the record of
         max_model_len stays while vLLM captures attention with one-token dummy sequences).
    """
    cls = getattr(backend, "TritonAttentionMetadataBuilder", None)
    if cls is None:
        return "no TritonAttentionMetadataBuilder: split launches use the stock scratch only"
    if getattr(cls.__init__, "_radiance_orig", None) is not None:
        return "builder scratch already enlarged"
    orig = cls.__init__

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device, *args, **kwargs):
        orig(self, kv_cache_spec, layer_names, vllm_config, device, *args, **kwargs)
        try:
            graph_capture.note_max_model_len(vllm_config.model_config.max_model_len)
        except (AttributeError, TypeError, ValueError) as exc:
            logger.warning("radiance-attn: no max_model_len in vLLM's config (%s: %s); launches captured into "
                           "CUDA graphs are chosen for the capture's context", type(exc).__name__, exc)
        try:
            _enlarge_scratch(self, vllm_config)
        except Exception as exc:  # noqa: BLE001 - keep the stock scratch, the policy clamps to it
            logger.warning("radiance-attn: split-KV scratch left stock (%s: %s)", type(exc).__name__, exc)

    __init__._radiance_orig = orig
    cls.__init__ = __init__
    return "builder scratch enlarged for split verify batches"


def _enlarge_scratch(builder, vllm_config) -> None:
    import torch

    out = builder.softmax_segm_output
    rows, heads, segs, head_padded = out.shape
    spec = getattr(vllm_config, "speculative_config", None)
    spec_tokens = int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0
    max_seqs = int(vllm_config.scheduler_config.max_num_seqs)
    arch = None
    if out.device.type == "cuda":
        from radiance.attn.triton_launch import detect_arch

        arch = detect_arch(out.device)
    table = tables.for_arch(arch) if arch else None
    rule = ((table or {}).get("triton") or {}).get("default") or {}
    max_seqs = min(max_seqs, int(rule.get("max_seqs", max_seqs)))
    max_segments = int((rule.get("split") or {}).get("max", 128))
    budget = int(os.environ.get("RADIANCE_ATTN_SCRATCH_MIB", DEFAULT_SCRATCH_MIB)) << 20
    want = scratch_rows(heads, head_padded, segs, max_seqs * (1 + spec_tokens), max_segments, budget)
    if want <= rows:
        return
    kw = dict(dtype=torch.float32, device=out.device)
    builder.softmax_segm_output = torch.empty((want, heads, segs, head_padded), **kw)
    builder.softmax_segm_max = torch.empty((want, heads, segs), **kw)
    builder.softmax_segm_expsum = torch.empty((want, heads, segs), **kw)
    logger.info("radiance-attn: split-KV scratch %d -> %d rows (%.1f MiB)", rows, want,
                want * heads * segs * (head_padded + 2) * 4 / 2**20)


__all__ = ["install", "install_triton", "uninstall_triton", "scratch_rows", "policy"]
