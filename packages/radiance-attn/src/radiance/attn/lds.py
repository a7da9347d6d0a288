"""Shared-memory (LDS) footprint of vLLM's unified-attention kernel for a launch config.

Triton compiles for a target without the GPU being present, so the footprint of every config
the policy can emit is checked at CI time, for gfx1201 (64 KiB of LDS per workgroup) in
particular: a config that does not fit fails to launch with an out-of-resources error, which on
a serving engine means a model that does not start.
"""

from __future__ import annotations

from dataclasses import dataclass

from radiance.attn.policy import next_pow2

_TRITON_DTYPE = {"bf16": "*bf16", "fp16": "*fp16", "fp8": "*fp8e4nv", "fp32": "*fp32"}
# ROCm gfx12 uses the OCP e4m3 encoding too (fp8e4nv in Triton's naming).


@dataclass(frozen=True)
class KernelShape:
    """What fixes the kernel's constexprs for one compile."""

    head_size: int
    num_query_heads: int
    num_kv_heads: int
    q_dtype: str  # "bf16" | "fp16" | "fp8"
    kv_dtype: str
    block_m: int
    tile_size: int
    num_warps: int
    num_stages: int | None
    num_segments: int  # 1: the 2D (unsplit) kernel
    block_size: int = 16


def compile_kernel(module, shape: KernelShape, target):
    """Compile ``module.kernel_unified_attention`` for ``target`` (a triton GPUTarget)."""
    import triton
    from triton.compiler import ASTSource

    kernel = module.kernel_unified_attention
    qpkv = shape.num_query_heads // shape.num_kv_heads
    is_3d = shape.num_segments > 1
    kv_fp8 = shape.kv_dtype == "fp8"
    q_fp8 = shape.q_dtype == "fp8"
    constexprs = {
        "num_query_heads": shape.num_query_heads,
        "num_queries_per_kv": qpkv,
        "BLOCK_SIZE": shape.block_size,
        "TILE_SIZE": shape.tile_size,
        "HEAD_SIZE": shape.head_size,
        "HEAD_SIZE_PADDED": next_pow2(shape.head_size),
        "USE_ALIBI_SLOPES": False,
        "USE_ALIBI_SQRT": False,
        "USE_QQ_BIAS": False,
        "USE_SOFTCAP": False,
        "USE_SINKS": False,
        "SLIDING_WINDOW": 0,
        "USE_CAUSAL": True,
        "USE_PER_SEQ_CAUSAL": False,
        "USE_MM_PREFIX": False,
        "MAX_MM_RANGES": 0,
        "R_SWA_WINDOW": 0,
        "USE_R_SWA": False,
        "stride_k_cache_3": 1,
        "stride_v_cache_3": 1,
        "BLOCK_Q": max(1, shape.block_m // qpkv),
        "BLOCK_M": shape.block_m,
        "NUM_SEGMENTS_PER_SEQ": shape.num_segments,
        "USE_FP8": False,
        "IS_3D": is_3d,
        "KV_QUANT_MODE": 1 if kv_fp8 else 0,
        "CHUNK_LOOKBACK": -1,
        "CHUNK_SIZE": -1,
        "USE_TD": False,
        "USE_TD_QO": False,
        "Q_IS_FP8": q_fp8,
        "MM_PREFIX_CLAMP_SW": False,
        # pointers the decode case leaves out
        "sink_ptr": None,
        "alibi_slopes_ptr": None,
        "qq_bias_ptr": None,
        "per_seq_causal_ptr": None,
        "mm_prefix_range_ptr": None,
        "k_scale_cache_ptr": None,
        "v_scale_cache_ptr": None,
        "q_scale": None,
        "stride_ks_blk": None,
        "stride_ks_slot": None,
        "stride_ks_head": None,
        "stride_vs_blk": None,
        "stride_vs_slot": None,
        "stride_vs_head": None,
    }
    if not is_3d:
        constexprs.update(segm_output_ptr=None, segm_max_ptr=None, segm_expsum_ptr=None)
    ptr = {
        "output_ptr": _TRITON_DTYPE[shape.q_dtype],
        "query_ptr": _TRITON_DTYPE[shape.q_dtype],
        "key_cache_ptr": _TRITON_DTYPE[shape.kv_dtype],
        "value_cache_ptr": _TRITON_DTYPE[shape.kv_dtype],
        "block_tables_ptr": "*i32",
        "seq_lens_ptr": "*i32",
        "query_start_len_ptr": "*i32",
        "rswa_prefix_lens_ptr": "*i32",
        "k_scale": "*fp32",
        "v_scale": "*fp32",
        "segm_output_ptr": "*fp32",
        "segm_max_ptr": "*fp32",
        "segm_expsum_ptr": "*fp32",
    }
    scalars = {"scale": "fp32", "out_scale": "fp32", "softcap": "fp32", "num_seqs": "i32"}
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ptr:
            signature[name] = ptr[name]
        elif name in scalars:
            signature[name] = scalars[name]
        elif "stride" in name:
            signature[name] = "i64"
        elif name in ("FP8_MIN", "FP8_MAX"):
            continue  # keep the kernel's own defaults
        else:
            raise ValueError(f"unknown kernel argument {name!r}: the kernel changed, update lds.py")
    for name in ("FP8_MIN", "FP8_MAX"):
        if name in kernel.arg_names:
            signature[name] = "constexpr"
            p = kernel.params[kernel.arg_names.index(name)]
            constexprs[name] = p.default
    src = ASTSource(kernel, signature, constexprs={k: v for k, v in constexprs.items() if k in kernel.arg_names})
    options = {"num_warps": shape.num_warps}
    if shape.num_stages is not None:
        options["num_stages"] = shape.num_stages
    return triton.compile(src, target=target, options=options)


def shared_bytes(module, shape: KernelShape, arch: str) -> int:
    """Bytes of LDS/shared memory one workgroup of this config needs on ``arch``."""
    from triton.backends.compiler import GPUTarget

    if arch.startswith("gfx"):
        target = GPUTarget("hip", arch, 32 if arch.startswith("gfx1") else 64)
    elif arch.startswith("sm_"):
        target = GPUTarget("cuda", int(arch[3:]), 32)
    else:
        raise ValueError(f"unknown arch {arch!r}")
    return int(compile_kernel(module, shape, target).metadata.shared)
