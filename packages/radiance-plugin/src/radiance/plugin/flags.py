"""Every environment flag radiance reads: one table, shown by `radiance status` and the README.

A test checks that the README's flag table and this one name the same flags.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    name: str
    default: str
    package: str
    effect: str


FLAGS: tuple[Flag, ...] = (
    Flag("RADIANCE_DISABLE", "(empty)", "plugin",
         "comma list of hooks to leave out: gemm, fp8stream, attn, plugin (the report)"),
    Flag("RADIANCE_MODELS_DIR", "${XDG_CACHE_HOME:-~/.cache}/radiance/models", "plugin",
         "where the tiny local models are built and cached"),
    Flag("RADIANCE_CACHE_DIR", "${XDG_CACHE_HOME:-~/.cache}/radiance", "kernels",
         "root of the per-user kernel cache (libraries under kernels/); private, never shared"),
    Flag("RADIANCE_STRICT", "0", "kernels",
         "1: a kernel build failure or a missing compiler raises instead of falling back"),
    Flag("RADIANCE_KERNELS_PREBUILT", "1", "kernels",
         "0: ignore kernel libraries a wheel carries prebuilt (RADIANCE_KERNELS_AOT_ARCHS at its "
         "build) and build on first use"),
    Flag("RADIANCE_KERNELS_EXTRA_FLAGS", "(unset)", "kernels",
         "extra compiler flags (shell words) for the kernel build on first use, e.g. -lineinfo; "
         "part of the cache key; while set, prebuilt libraries are not used"),
    Flag("RADIANCE_GEMM_PROVIDER", "(unset)", "gemm",
         "force one block-FP8 GEMM provider for every M it serves (e.g. triton_splitk for "
         "M <= 16, the normal route above); an unknown name raises"),
    Flag("RADIANCE_GEMM_EXCLUDE", "(unset)", "gemm",
         "comma list of GEMM providers never to use; an unknown name raises"),
    Flag("RADIANCE_GEMM_WGMMA", "1", "gemm",
         "0: the points the sm90 table routes to a warpgroup-MMA kernel (cuda_tma, "
         "cuda_decode's wgmma configs) run cuda_decode's mma.sync kernel instead (group sums "
         "exact in fp32; warpgroup-MMA sums carry Hopper's fp8 tensor-core rounding, below a "
         "bf16 output's, not an fp16 one's)"),
    Flag("RADIANCE_PRESHUFFLE", "0", "gemm",
         "1: on ROCm with a recent AITER, shuffle genuine 128x128-block weights at load and "
         "route them to AITER's preshuffle GEMM (not yet measured on AMD, so off)"),
    Flag("RADIANCE_FP8_STREAM", "1", "fp8stream",
         "rewrite decoder layers so each RowParallel epilogue is one fused op feeding the next "
         "FP8 linears; 0 leaves them stock"),
    Flag("RADIANCE_GDN_NORM_QUANT", "0", "fp8stream",
         "1: also fuse Qwen3-Next's GatedDeltaNet output norm with its quant (stream on only)"),
    Flag("RADIANCE_FUSED_ALLREDUCE", "1", "fp8stream",
         "at tensor-parallel size > 1, run each epilogue's all-reduce inside the epilogue kernel "
         "(peer-mapped buffers, one launch) where setup succeeds; 0: vLLM's all-reduce, then "
         "the epilogue kernel"),
    Flag("RADIANCE_ATTN", "1", "attn",
         "0: install no attention adapter"),
    Flag("RADIANCE_ATTN_TRITON", "1", "attn",
         "0: leave vLLM's Triton unified attention stock"),
    Flag("RADIANCE_ATTN_AITER", "1", "attn",
         "0: leave AITER's unified attention stock"),
    Flag("RADIANCE_ATTN_TABLE", "(unset)", "attn",
         "path of a tuned table JSON replacing the shipped one for the arch it names"),
    Flag("RADIANCE_ATTN_SCRATCH_MIB", "256", "attn",
         "cap on the extra split-KV scratch per attention metadata builder"),
)
