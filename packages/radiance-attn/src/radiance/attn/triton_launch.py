"""radiance's launch of vLLM's Triton unified-attention kernel.

vLLM's wrapper (``unified_attention`` in ``vllm/v1/attention/ops/triton_unified_attention.py``)
splits the KV only for single-token decode, always into the 16 segments its backend allocated,
and runs every batch with ``max_seqlen_q > 1`` -- a speculative-decoding verify batch -- through
the unsplit kernel with a 16-row query block. ``RadianceUnifiedAttention`` has the wrapper's
signature and launches the same two kernels (``kernel_unified_attention``, ``reduce_segments``)
with the policy's split count, BLOCK_M/BLOCK_Q, tile, warps and the grid that follows, for
decode and verify batches -- or, where the table names it, runs the same launch shape on
radiance's own split-KV kernel (``split_kv_kernel``; a call it cannot take stays on vLLM's
kernel); anything it does not handle goes to the stock wrapper untouched.

Why split-KV is exact for verify batches: the kernel masks causally per (query row, key), each
segment stores its running max and exp-sum, and ``reduce_segments`` (which finds a token's
sequence in token mode) rescales and sums the partials -- the same online-softmax algebra as the
unsplit loop, only summed in another order, so results agree to fp32 accumulation order and
bf16 output rounding. A segment whose keys all lie after a row's position stores max 0 and
exp-sum 0, which the reduce weighs correctly.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Callable

from radiance.attn import graph_capture, policy, split_kv_kernel, tables
from radiance.attn.warn_once import warn_once

logger = logging.getLogger("vllm.radiance.attn")
_MAX_CACHED_DECISIONS = 256

# The keyword arguments this launch understands; any other (a newer vLLM's feature) sends the
# call to the stock wrapper.
_KNOWN = frozenset(
    (
        "q k v out cu_seqlens_q max_seqlen_q seqused_k max_seqlen_k softmax_scale causal "
        "window_size block_table softcap q_descale k_descale v_descale seq_threshold_3D "
        "num_par_softmax_segments softmax_segm_output softmax_segm_max softmax_segm_expsum "
        "alibi_slopes output_scale qq_bias sinks mm_prefix_range rswa_prefix_lens rswa_window "
        "use_alibi_sqrt kv_quant_mode k_scale_cache v_scale_cache chunk_lookback use_td "
        "mm_prefix_clamp_sliding_window"
    ).split()
)
_POSITIONAL = (
    "q k v out cu_seqlens_q max_seqlen_q seqused_k max_seqlen_k softmax_scale causal "
    "window_size block_table softcap q_descale k_descale v_descale"
).split()

# Kernel arguments the launch passes; checked against the kernel's signature once, at install.
KERNEL_ARGS = frozenset(
    (
        "output_ptr segm_output_ptr segm_max_ptr segm_expsum_ptr query_ptr key_cache_ptr "
        "value_cache_ptr sink_ptr block_tables_ptr seq_lens_ptr alibi_slopes_ptr qq_bias_ptr "
        "scale q_scale k_scale v_scale out_scale softcap num_query_heads num_queries_per_kv "
        "block_table_stride query_stride_0 query_stride_1 output_stride_0 output_stride_1 "
        "qq_bias_stride_0 BLOCK_SIZE TILE_SIZE HEAD_SIZE HEAD_SIZE_PADDED USE_ALIBI_SLOPES "
        "USE_ALIBI_SQRT USE_QQ_BIAS USE_SOFTCAP USE_SINKS SLIDING_WINDOW USE_CAUSAL "
        "USE_PER_SEQ_CAUSAL per_seq_causal_ptr USE_MM_PREFIX MAX_MM_RANGES mm_prefix_range_ptr "
        "rswa_prefix_lens_ptr R_SWA_WINDOW USE_R_SWA stride_k_cache_0 stride_k_cache_1 "
        "stride_k_cache_2 stride_k_cache_3 stride_v_cache_0 stride_v_cache_1 stride_v_cache_2 "
        "stride_v_cache_3 query_start_len_ptr BLOCK_Q num_seqs BLOCK_M NUM_SEGMENTS_PER_SEQ "
        "USE_FP8 IS_3D KV_QUANT_MODE Q_IS_FP8"
    ).split()
)
REDUCE_ARGS = frozenset(
    (
        "output_ptr segm_output_ptr segm_max_ptr segm_expsum_ptr seq_lens_ptr num_seqs "
        "num_query_heads out_scale_inv output_stride_0 output_stride_1 block_table_stride "
        "TILE_SIZE HEAD_SIZE HEAD_SIZE_PADDED query_start_len_ptr BLOCK_Q NUM_SEGMENTS_PER_SEQ USE_FP8"
    ).split()
)


def kernel_mismatch(module) -> str | None:
    """Why ``module``'s kernels cannot take this launch, or None when they can."""
    for name, needed in (("kernel_unified_attention", KERNEL_ARGS), ("reduce_segments", REDUCE_ARGS)):
        kernel = getattr(module, name, None)
        arg_names = getattr(kernel, "arg_names", None)
        if arg_names is None:
            return f"{name} is not a Triton kernel here (no Triton backend on this platform)"
        missing = sorted(needed - set(arg_names))
        if missing:
            return f"{name} lacks arguments {missing} (vLLM changed its kernel)"
    return None


def dtype_name(dtype) -> str:
    import torch

    if dtype in (torch.bfloat16,):
        return "bf16"
    if dtype in (torch.float16,):
        return "fp16"
    if dtype in (torch.float32,):
        return "fp32"
    if dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2):
        return "fp8"
    raise TypeError(f"unsupported attention dtype {dtype}")


def detect_arch(device=None) -> str | None:
    """'sm_90', 'gfx1201', ... for the current GPU, or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    if torch.version.hip is not None:
        return str(getattr(props, "gcnArchName", "")).split(":")[0] or None
    return f"sm_{props.major}{props.minor}"


def build_errors() -> tuple[type[BaseException], ...]:
    """Triton's errors for a launch that does not build on this GPU (more shared memory than it
    has, a register cap below what the dots need, a compile error). They are raised while the
    kernel is built, before it runs: the call can still go to the stock wrapper."""
    import importlib

    found = []
    for module, name in (("triton.runtime.errors", "OutOfResources"), ("triton.runtime.errors", "PTXASError"),
                         ("triton.compiler.errors", "CompilationError")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _build_key(geo: policy.Geometry, launch: policy.TritonLaunch) -> tuple:
    """What a launch's build depends on (its segment count and grid do not change the build)."""
    return (geo.arch, geo.q_dtype, geo.kv_dtype, geo.head_size, geo.q_per_kv, geo.block_size,
            replace(launch, num_segments=2 if launch.is_3d else 1, reason=""))


class RadianceUnifiedAttention:
    """Drop-in for vLLM's ``unified_attention`` wrapper (same signature)."""

    _radiance = True

    def __init__(self, kernel_module, stock: Callable | None = None, *, arch: str | None = None,
                 table: dict | None = None, num_sms: int | None = None) -> None:
        why = kernel_mismatch(kernel_module)
        if why is not None:
            raise ValueError(why)
        self.module = kernel_module
        self.stock = stock if stock is not None else kernel_module.unified_attention
        self._arch = arch
        self._table = table
        self._num_sms = num_sms
        self._logged: set[str] = set()
        self._warned: set[str] = set()
        # The verify batch's longest query under the rule serving a geometry (or, for a call read
        # no geometry from, under the arch's default rule), so the report tells verify from
        # prefill as the policy does.
        self._verify_max_q: dict[policy.Geometry | str | None, int] = {}
        # Policy decisions by geometry. Outside a CUDA graph this wrapper runs for every layer of
        # every step and the policy costs ~10 us of Python a call; the layers of one step share a
        # geometry, so all but the first are a dict lookup.
        self._launches: dict[policy.Geometry, policy.TritonLaunch | None] = {}
        # Launch builds that failed here (_build_key -> why): their geometries go to the stock
        # wrapper from then on, without building again.
        self._unbuildable: dict[tuple, str] = {}
        self._build_errors = build_errors()
        self._lock = threading.Lock()
        self.last_decision: tuple[policy.Geometry | None, policy.TritonLaunch | None, str] | None = None

    # -- decisions -----------------------------------------------------------------------------

    def _device_facts(self, device) -> tuple[str | None, int]:
        if self._arch is None or self._num_sms is None:
            import torch

            if device.type == "cuda":
                props = torch.cuda.get_device_properties(device)
                self._arch = self._arch or detect_arch(device)
                self._num_sms = self._num_sms or int(props.multi_processor_count)
            else:
                self._num_sms = self._num_sms or 0
        return self._arch, int(self._num_sms or 0)

    def _unsupported(self, kw: dict) -> str | None:
        if kw.get("causal", True) is not True:
            return "non-causal or per-sequence causal"
        for name in ("alibi_slopes", "qq_bias", "mm_prefix_range", "rswa_prefix_lens", "k_scale_cache"):
            if kw.get(name) is not None:
                return name
        # vLLM masks chunked local attention (CHUNK_LOOKBACK) for any chunk_lookback > -1 while a
        # sliding window is set, which the window check below refuses too; radiance's launches
        # pass no CHUNK_LOOKBACK, so this check does not lean on that coupling.
        lookback = kw.get("chunk_lookback")
        if lookback is not None and int(lookback) > -1:
            return f"chunked attention (chunk_lookback {int(lookback)})"
        if int(kw.get("kv_quant_mode", 0)) not in (0, 1):
            return f"kv_quant_mode {int(kw['kv_quant_mode'])}"
        if kw.get("use_td"):
            return "tensor descriptors"
        window = kw["window_size"]
        if window is not None and window[0] >= 0:
            return "sliding window"
        if getattr(self.module, "is_batch_invariant", False):
            return "batch invariance"
        q = kw["q"]
        if q.dim() != 3 or kw["k"].dim() != 4:
            return "unexpected tensor ranks"
        return None

    def decide(self, kw: dict) -> tuple[policy.Geometry | None, policy.TritonLaunch | None, str]:
        """(geometry, launch or None for stock, reason) for one call's keyword arguments."""
        why = self._unsupported(kw)
        if why is not None:
            return None, None, f"stock: {why}"
        q, k, seqused_k = kw["q"], kw["k"], kw["seqused_k"]
        arch, num_sms = self._device_facts(q.device)
        if arch is None:
            return None, None, "stock: no GPU arch"
        head_padded = policy.next_pow2(q.shape[2])
        scratch = 0
        segm = (kw.get("softmax_segm_output"), kw.get("softmax_segm_max"), kw.get("softmax_segm_expsum"))
        if all(t is not None for t in segm) and all(_usable_scratch(t, q.device) for t in segm):
            units = min(segm[0].numel() // head_padded, segm[1].numel(), segm[2].numel())
            scratch = units * head_padded * 4
        if scratch == 0:
            return None, None, "stock: no segment scratch"
        max_seqlen_k, capture_note = int(kw["max_seqlen_k"]), ""
        if graph_capture.capturing(q.device):  # the launch is replayed at every context: graph_capture.py
            bound = graph_capture.max_model_len()
            if bound is None:
                warn_once(self._warned, self._lock, "a CUDA graph is captured with no max_model_len recorded "
                          "(vLLM's Triton metadata builder records it): launches are chosen for the capture's context")
                capture_note = "; chosen during CUDA-graph capture for the capture's context"
            else:
                max_seqlen_k = max(max_seqlen_k, bound)
                capture_note = f"; chosen during CUDA-graph capture for max_model_len {bound}"
        geo = policy.Geometry(
            arch=arch,
            head_size=int(q.shape[2]),
            num_query_heads=int(q.shape[1]),
            num_kv_heads=int(k.shape[2]),
            num_tokens=int(q.shape[0]),
            num_seqs=int(seqused_k.shape[0]),
            max_seqlen_q=int(kw["max_seqlen_q"]),
            max_seqlen_k=max_seqlen_k,
            q_dtype=dtype_name(q.dtype),
            kv_dtype=dtype_name(k.dtype),
            block_size=int(kw["v"].shape[1]),
            num_sms=num_sms,
            scratch_bytes=scratch,
        )
        if geo in self._launches:
            launch = self._launches[geo]
        else:
            table = self._table if self._table is not None else tables.for_arch(arch)
            launch = policy.triton_launch(geo, table)
            why = None
            if launch is not None and launch.kernel == "radiance":
                why = split_kv_kernel.launch_refusal(launch, geo.q_dtype, geo.kv_dtype, geo.q_per_kv)
                if why is None and launch.partial_pass == "cuda_warpgroup":
                    launch = _warpgroup_or_triton_pass(launch, geo, q, k)
            if why is not None:  # the same launch shape on vLLM's kernel
                launch = replace(on_vllms_kernel(launch, geo.q_per_kv), reason=f"{launch.reason}; vLLM's kernel: {why}")
            if len(self._launches) >= _MAX_CACHED_DECISIONS:
                self._launches.clear()  # contexts grow every step: keep the map bounded
            self._launches[geo] = launch
        if launch is None:
            return geo, None, "stock: policy keeps the stock launch" + capture_note
        if self._unbuildable:  # empty unless a build failed: no key to make on the hot path
            why = self._unbuildable.get(_build_key(geo, launch))
            if why is not None:
                return geo, None, f"stock: {launch.describe()} does not build here ({why})"
        return geo, launch, launch.reason + capture_note

    # -- the call ------------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        if args:
            if len(args) > len(_POSITIONAL):
                self._warn_fallback(f"{len(args)} positional arguments, more than the {len(_POSITIONAL)} "
                                    "radiance reads")
                return self.stock(*args, **kwargs)
            kwargs = {**dict(zip(_POSITIONAL, args)), **kwargs}
        if not _KNOWN.issuperset(kwargs) or not all(n in kwargs for n in _POSITIONAL):
            unknown = sorted(set(kwargs) - _KNOWN)
            missing = [n for n in _POSITIONAL if n not in kwargs]
            self._warn_fallback(f"unknown keyword arguments {unknown}" if unknown
                                else f"missing arguments {missing}")
            return self.stock(**kwargs)
        try:
            geo, launch, reason = self.decide(kwargs)
        except (TypeError, ValueError, AttributeError, IndexError) as exc:
            geo, launch, reason = None, None, f"stock: unexpected input ({type(exc).__name__}: {exc})"
            self._warn_fallback(reason[len("stock: "):])
        if launch is not None and launch.kernel == "radiance":
            why = radiance_kernel_refusal(kwargs)
            if why is not None:  # same launch shape on vLLM's kernel, which takes every such call
                launch = on_vllms_kernel(launch, geo.q_per_kv)
                reason = f"{reason}; vLLM's kernel: {why}"
            elif launch.partial_pass == "cuda_warpgroup":
                why = split_kv_kernel.warpgroup_call_refusal(kwargs["q"], kwargs["k"], kwargs["v"])
                if why is not None:
                    launch = on_triton_pass(launch, geo.q_per_kv)
                    reason = f"{reason}; Triton partial pass: {why}"
        self.last_decision = (geo, launch, reason)
        self._log_first(kwargs, geo, launch, reason)
        if launch is None:
            return self.stock(**kwargs)
        try:
            self.launch(kwargs, launch)
        except self._build_errors as exc:
            # A table (a user's RADIANCE_ATTN_TABLE, or one fitted on another GPU of the arch)
            # can name a launch this GPU cannot build; the output is untouched until the
            # kernels run, so stock computes the call.
            why = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
            self._unbuildable[_build_key(geo, launch)] = f"{type(exc).__name__}: {why}"
            logger.warning("radiance-attn: %s does not build on this GPU (%s: %s); those batches run the "
                           "stock wrapper", launch.describe(), type(exc).__name__, why)
            self.last_decision = (geo, None, f"stock: {launch.describe()} does not build here")
            return self.stock(**kwargs)
        return None

    def _warn_fallback(self, why: str) -> None:
        """A call radiance cannot read goes to the stock wrapper: say so once per distinct reason."""
        warn_once(self._warned, self._lock, f"a call goes to the stock wrapper: {why}")

    def _batch_kind(self, kw, geo) -> str:
        """'decode', 'verify' or 'prefill', by the longest query a verify batch has under the rule
        serving ``geo`` (policy.verify_max_query_len): longer batches the policy leaves stock."""
        max_q = int(kw["max_seqlen_q"])
        if max_q <= 1:
            return "decode"
        key = geo if geo is not None else self._arch
        bound = self._verify_max_q.get(key)
        if bound is None:
            arch = geo.arch if geo is not None else self._arch
            table = self._table if self._table is not None else tables.for_arch(arch) if arch else None
            bound = policy.verify_max_query_len(table, geo)
            if len(self._verify_max_q) >= _MAX_CACHED_DECISIONS:
                self._verify_max_q.clear()
            self._verify_max_q[key] = bound
        return "verify" if max_q <= bound else "prefill"

    def _log_first(self, kw, geo, launch, reason) -> None:
        if len(self._logged) == 3:  # every kind reported: nothing to classify on the hot path
            return
        kind = self._batch_kind(kw, geo)
        if kind in self._logged:
            return
        with self._lock:
            if kind in self._logged:
                return
            self._logged.add(kind)
        what = launch.describe() if launch is not None else "stock wrapper"
        shape = (
            f"seqs={geo.num_seqs} tokens={geo.num_tokens} max_kv={geo.max_seqlen_k} head={geo.head_size} "
            f"q_heads={geo.num_query_heads} kv_heads={geo.num_kv_heads} kv={geo.kv_dtype}"
            if geo is not None
            else f"max_q={int(kw['max_seqlen_q'])} max_kv={int(kw['max_seqlen_k'])}"
        )
        logger.info("radiance-attn first %s batch (%s): %s [%s]", kind, shape, what, reason)
        try:
            from radiance.kernels.registry import record
        except ImportError:
            return
        query = {"batch": kind, **({"arch": geo.arch, "seqs": geo.num_seqs, "tokens": geo.num_tokens,
                                     "max_kv": geo.max_seqlen_k, "head": geo.head_size,
                                     "kv_heads": geo.num_kv_heads, "kv": geo.kv_dtype} if geo else {})}
        record("attn.triton_unified_attention", query, what if launch is not None else None, reason)

    def launch(self, kw: dict, launch: policy.TritonLaunch) -> None:
        """Launch ``launch`` (decide() and, for radiance's kernel, radiance_kernel_refusal() have
        checked every precondition)."""
        m = self.module
        q, k, v, out = kw["q"], kw["k"], kw["v"], kw["out"]
        seqused_k, block_table, cu_seqlens_q = kw["seqused_k"], kw["block_table"], kw["cu_seqlens_q"]
        if launch.kernel == "radiance":
            split_kv_kernel.launch(q, k, v, out, cu_seqlens_q, seqused_k, block_table, int(kw["max_seqlen_q"]),
                                   kw["softmax_scale"], kw["k_descale"], kw["v_descale"], launch,
                                   kw["softmax_segm_output"], kw["softmax_segm_max"], kw["softmax_segm_expsum"])
            return
        sinks = kw.get("sinks")
        output_scale = kw.get("output_scale")
        softcap = kw["softcap"]
        num_seqs = int(seqused_k.shape[0])
        num_query_heads = int(q.shape[1])
        num_kv_heads = int(k.shape[2])
        head_size = int(q.shape[2])
        head_padded = policy.next_pow2(head_size)
        is_3d = launch.is_3d
        grid = launch.grid(int(q.shape[0]), num_seqs, num_kv_heads)
        extra = {}
        if launch.num_warps is not None:
            extra["num_warps"] = launch.num_warps
        if launch.num_stages is not None:
            extra["num_stages"] = launch.num_stages
        if launch.max_registers is not None:
            extra["maxnreg"] = launch.max_registers
        segm_out = kw["softmax_segm_output"] if is_3d else None
        segm_max = kw["softmax_segm_max"] if is_3d else None
        segm_sum = kw["softmax_segm_expsum"] if is_3d else None
        out_scale = 1 / output_scale if output_scale is not None else 1.0
        q_is_fp8 = q.dtype == m.current_platform.fp8_dtype()
        m.kernel_unified_attention[grid](
            output_ptr=out,
            segm_output_ptr=segm_out,
            segm_max_ptr=segm_max,
            segm_expsum_ptr=segm_sum,
            query_ptr=q,
            key_cache_ptr=k,
            value_cache_ptr=v,
            sink_ptr=sinks,
            block_tables_ptr=block_table,
            seq_lens_ptr=seqused_k,
            alibi_slopes_ptr=None,
            qq_bias_ptr=None,
            scale=kw["softmax_scale"],
            q_scale=kw["q_descale"],
            k_scale=kw["k_descale"],
            v_scale=kw["v_descale"],
            out_scale=out_scale,
            softcap=softcap,
            num_query_heads=num_query_heads,
            num_queries_per_kv=num_query_heads // num_kv_heads,
            block_table_stride=block_table.stride(0),
            query_stride_0=q.stride(0),
            query_stride_1=q.stride(1),
            output_stride_0=out.stride(0),
            output_stride_1=out.stride(1),
            qq_bias_stride_0=0,
            BLOCK_SIZE=int(v.shape[1]),
            TILE_SIZE=launch.tile_size,
            HEAD_SIZE=head_size,
            HEAD_SIZE_PADDED=head_padded,
            USE_ALIBI_SLOPES=False,
            USE_ALIBI_SQRT=False,
            USE_QQ_BIAS=False,
            USE_SOFTCAP=(softcap > 0),
            USE_SINKS=(sinks is not None),
            SLIDING_WINDOW=0,
            USE_CAUSAL=True,
            USE_PER_SEQ_CAUSAL=False,
            per_seq_causal_ptr=None,
            USE_MM_PREFIX=False,
            MAX_MM_RANGES=0,
            mm_prefix_range_ptr=None,
            rswa_prefix_lens_ptr=seqused_k,
            R_SWA_WINDOW=0,
            USE_R_SWA=False,
            stride_k_cache_0=k.stride(0),
            stride_k_cache_1=k.stride(1),
            stride_k_cache_2=k.stride(2),
            stride_k_cache_3=k.stride(3),
            stride_v_cache_0=v.stride(0),
            stride_v_cache_1=v.stride(1),
            stride_v_cache_2=v.stride(2),
            stride_v_cache_3=v.stride(3),
            query_start_len_ptr=cu_seqlens_q,
            BLOCK_Q=launch.block_q,
            num_seqs=num_seqs,
            BLOCK_M=launch.block_m,
            NUM_SEGMENTS_PER_SEQ=launch.num_segments,
            USE_FP8=output_scale is not None,
            IS_3D=is_3d,
            KV_QUANT_MODE=int(kw.get("kv_quant_mode", 0)),
            Q_IS_FP8=q_is_fp8,
            **extra,
        )
        if is_3d:
            m.reduce_segments[(int(q.shape[0]), num_query_heads)](
                output_ptr=out,
                segm_output_ptr=segm_out,
                segm_max_ptr=segm_max,
                segm_expsum_ptr=segm_sum,
                seq_lens_ptr=seqused_k,
                num_seqs=num_seqs,
                num_query_heads=num_query_heads,
                out_scale_inv=out_scale,
                output_stride_0=out.stride(0),
                output_stride_1=out.stride(1),
                block_table_stride=block_table.stride(0),
                TILE_SIZE=launch.tile_size,
                HEAD_SIZE=head_size,
                HEAD_SIZE_PADDED=head_padded,
                query_start_len_ptr=cu_seqlens_q,
                BLOCK_Q=launch.block_q,
                NUM_SEGMENTS_PER_SEQ=launch.num_segments,
                USE_FP8=output_scale is not None,
            )


def radiance_kernel_refusal(kw: dict) -> str | None:
    """Why radiance's split-KV kernel cannot take this call (vLLM's kernel then runs the same
    launch shape), or None. Per call: the options and tensors; what depends on the geometry
    alone (dtypes, block sizes, scratch) was settled with the decision."""
    import torch

    for name, what in (("output_scale", "fp8 output"), ("sinks", "attention sinks"), ("q_descale", "fp8 query")):
        if kw.get(name) is not None:
            return what
    if kw["softcap"]:
        return "softcap"
    fp8_kv = kw["k"].dtype == torch.float8_e4m3fn
    if int(kw.get("kv_quant_mode", 0)) != (1 if fp8_kv else 0):
        return f"kv_quant_mode {int(kw.get('kv_quant_mode', 0))} with {kw['k'].dtype} KV"
    return split_kv_kernel.call_refusal(kw["q"], kw["k"], kw["v"], kw["out"], kw["k_descale"], kw["v_descale"])


def _warpgroup_or_triton_pass(launch: policy.TritonLaunch, geo: policy.Geometry, q, k) -> policy.TritonLaunch:
    """A table's warpgroup launch where that pass runs here, else the same launch on radiance's
    Triton partial pass (BLOCK_Q back to BLOCK_M's), with the reason."""
    why = split_kv_kernel.warpgroup_refusal(launch, geo.head_size, q.dtype, k.dtype, geo.q_per_kv, q.device)
    if why is None:
        return launch
    return replace(on_triton_pass(launch, geo.q_per_kv), reason=f"{launch.reason}; Triton partial pass: {why}")


def on_triton_pass(launch: policy.TritonLaunch, q_per_kv: int) -> policy.TritonLaunch:
    """The same launch on radiance's Triton partial pass (its tile, warps and stages; BLOCK_Q back
    to BLOCK_M's)."""
    return replace(launch, partial_pass="triton", block_q=max(1, launch.block_m // q_per_kv))


def on_vllms_kernel(launch: policy.TritonLaunch, q_per_kv: int) -> policy.TritonLaunch:
    """The same launch shape on vLLM's kernel, which takes every call radiance's may refuse (its
    options of radiance's kernel dropped, BLOCK_Q back to BLOCK_M's)."""
    return replace(on_triton_pass(launch, q_per_kv), kernel="vllm", table_ahead=False)


def _usable_scratch(t, device) -> bool:
    import torch

    return t.dtype == torch.float32 and t.device == device and t.is_contiguous()

