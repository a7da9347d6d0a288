"""The decode-size block-FP8 GEMM (csrc/block_fp8_mm.cu): validate, launch.

``block_fp8_mm(a, b, sa, sb)`` computes ``reference.block_fp8_mm`` (its specification) for
``M <= 16`` on NVIDIA sm_89+ with fp8 tensor-core MMAs, reading the weight once. It is a building
block for radiance-gemm's dispatch, which decides where it runs (``unsupported_reason`` says why it
cannot); called where it cannot run, it raises rather than falling back, so a caller never
mistakes the reference's speed for the kernel's.

Launch parameters: ``warps`` per block (4 or 8), ``row_warps`` of them side by side along N (16
rows each; the others split the block's K range), ``split`` K ranges per block column (> 1 puts
more blocks on the GPU when N is small; their fp32 partials are summed by the last block to
finish, in a fixed order, using ``counters``: int32 zeros, at least N/16, left zero) and
``stages`` (weight groups each warp keeps in flight through its shared-memory ring: 2-5 with 4
warps, 2 with 8). ``wgmma=G`` (1 or 2) runs the sm_90 kernel on warpgroup MMAs (Hopper's native
fp8 tensor-core instruction; sm_90 runs ``mma.sync`` e4m3 as f16 MMAs on widened operands) with G
consecutive K groups a ring stage: every warp side by side (``row_warps == warps``, 64 or 128 rows
a block); see ``WGMMA_STAGES`` for the stages each shape has. Its sums carry Hopper's fp8 tensor-core
rounding (14 significant bits per 32-product step, promoted to fp32 every 128 columns, as in the
block-FP8 GEMMs vLLM runs there), finer than a bf16 output's rounding but not than fp16's.
``overlap_next`` (both kernels) lets the next kernel in the stream launch before this one's main
loop instead of after it, so its prologue (and, where its blocks fit beside these, its first
weight requests) overlaps this kernel; which is faster depends on the shape (csrc/block_fp8_mm.cuh,
release_early), so it is a launch parameter like the others. ``l2_prefetch=G`` (both kernels,
sm_90) has each block request up to G groups (128 columns) of each of its weight rows into L2
before it waits for the previous kernel, past the few its ring requests there: a block made
resident early (the previous GEMM launched with ``overlap_next``) streams its share while it
waits (csrc/block_fp8_mm.cuh, prefetch_weight_l2). 0: off. It changes no result.

``block_fp8_mm_tma(a, b, sa, sb)`` is the same product by the sm_90 kernel that streams the weight
with the tensor memory accelerator (csrc/block_fp8_mm_tma.cu): 64 weight rows a block (N a
multiple of 64), ``stages`` [64 x 128] weight tiles in flight a block (``TMA_STAGES``), ``split``
as above (``counters``: at least N/64 int32 zeros); wgmma from shared memory, the same rounding.
"""

from __future__ import annotations

import torch

from radiance.kernels import library
from radiance.kernels.ops import DTYPE_CODE, check_code, stream_of

OP = "block_fp8_mm"
M_MAX = 16
TILE_ROWS = 16
GROUP = 128

# (warps, groups a ring stage) -> the stages the wgmma kernel is built for (a ring of at most
# 64 KiB of dynamic shared memory).
WGMMA_STAGES = {(4, 1): (2, 3, 4, 5), (8, 1): (2, 3), (4, 2): (2, 3), (8, 2): (2,)}
TMA_ROWS = 64  # weight rows a block of the TMA kernel
TMA_STAGES = (4, 6, 8, 12)


def tma_smem_bytes(stages: int, token_tiles: int = 2) -> int:
    """Dynamic shared memory of one TMA-kernel block (csrc/block_fp8_mm_tma.cu, tma_smem_bytes):
    1 KiB of alignment slack, ``stages`` ring stages of a [64 x 128] weight tile plus the tokens'
    [8 * token_tiles x 128] tile, a transaction barrier a stage and the split-K flag."""
    return 1024 + stages * (TMA_ROWS * GROUP + 8 * token_tiles * GROUP) + stages * 8 + 8

# The three kernels and their bit in the library's radiance_block_fp8_mm_supported().
KERNEL_BITS = {"mma_sync": 1, "wgmma": 2, "tma": 4}

_reasons: dict[tuple[int, str], str | None] = {}


def unsupported_reason(device, kernel: str = "mma_sync") -> str | None:
    """None when ``kernel`` (``mma_sync``, ``wgmma`` or ``tma``) runs on ``device``, else why not
    (decided once per device)."""
    if kernel not in KERNEL_BITS:
        raise ValueError(f"unknown kernel {kernel!r}; known: {', '.join(KERNEL_BITS)}")
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA GPU"
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, kernel)
    if key not in _reasons:
        _reasons[key] = _reason(index, kernel)
    return _reasons[key]


def _reason(index: int, kernel: str) -> str | None:
    if torch.version.hip is not None:
        return "NVIDIA only (fp8 mma.sync); ROCm has no build of it"
    cc = torch.cuda.get_device_capability(index)
    if cc < (8, 9):
        return f"needs sm_89+ (fp8 tensor-core MMA), device is sm_{cc[0]}{cc[1]}"
    if kernel != "mma_sync" and cc != (9, 0):
        return f"the {kernel} kernel needs sm_90 (warpgroup MMA), device is sm_{cc[0]}{cc[1]}"
    lib = library.get(index)
    if lib is None:
        return library.why_not(index)
    if not lib.block_fp8_mm_supported() & KERNEL_BITS[kernel]:
        return "the library reports the device unsupported"
    return None


def launch_error(n: int, split: int, warps: int, stages: int, row_warps: int,
                 wgmma: int = 0) -> str | None:
    """Why the kernel cannot launch this configuration for N rows, or None. The mma.sync
    kernel's shared-memory ring is warps x stages x 2 KiB, held within 40 KiB of static shared
    memory; the wgmma kernel's stages are listed in WGMMA_STAGES."""
    if (split < 1 or warps not in (4, 8) or row_warps not in (1, 2, 4, 8) or warps % row_warps
            or (n // TILE_ROWS) % row_warps):
        return (f"launch split={split} warps={warps} row_warps={row_warps}: needs split >= 1, "
                f"warps 4 or 8, row_warps 1/2/4/8 dividing warps and N/16={n // TILE_ROWS}")
    if not wgmma and not (2 <= stages <= 5 and warps * stages <= 20):
        return (f"launch warps={warps} stages={stages}: the mma.sync kernel takes stages 2-5 "
                "(4 warps) or 2 (8)")
    if wgmma:
        built = WGMMA_STAGES.get((warps, wgmma))
        if row_warps != warps or built is None or stages not in built:
            return (f"launch wgmma={wgmma} warps={warps} row_warps={row_warps} stages={stages}: "
                    "the wgmma kernel puts every warp side by side (row_warps == warps), with "
                    + ", ".join(f"stages {'/'.join(map(str, v))} for {w} warps x {g} groups a "
                                f"stage" for (w, g), v in WGMMA_STAGES.items()))
    return None


def check_args(a, b, sa, sb, out_dtype, split, warps, stages, counters, row_warps=1,
               wgmma=0) -> None:
    """Every condition the kernel needs, as a TypeError/ValueError before anything launches."""
    check_operands(a, b, sa, sb, out_dtype, counters, TILE_ROWS,
                   lambda n: launch_error(n, split, warps, stages, row_warps, wgmma))


def check_operands(a, b, sa, sb, out_dtype, counters, rows: int, launch=None) -> None:
    """The operands' conditions (``rows``: N's multiple, one counter per ``rows`` rows);
    ``launch(N)``, why the launch config cannot serve N rows or None, is checked after their
    shapes and before their devices."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float8_e4m3fn:
            raise TypeError(f"{name} must be a float8_e4m3fn tensor, got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
        if t.dim() != 2 or t.stride(1) != 1:
            raise ValueError(f"{name} must be 2-D with a contiguous last dim, got shape "
                             f"{tuple(t.shape)} strides {t.stride()}")
        if t.stride(0) % 16 or t.data_ptr() % 16:
            raise ValueError(f"{name} rows must start on 16-byte boundaries (row stride "
                             f"{t.stride(0)}, address mod 16 = {t.data_ptr() % 16})")
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k:
        raise ValueError(f"K mismatch: a {tuple(a.shape)} vs b {tuple(b.shape)}")
    for name, t in (("a", a), ("b", b)):
        if t.stride(0) < k:  # an expanded or overlapping view
            raise ValueError(f"{name} row stride {t.stride(0)} < K={k}: rows must not overlap")
    if not 1 <= m <= M_MAX:
        raise ValueError(f"M={m} out of range: the decode GEMM serves 1 <= M <= {M_MAX}")
    if n < rows or n % rows or k < GROUP or k % GROUP:
        raise ValueError(f"N={n} must be a multiple of {rows} and K={k} of {GROUP}")
    groups = k // GROUP
    for name, t, shape in (("sa", sa, (m, groups)), ("sb", sb, (-(-n // GROUP), groups))):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            raise TypeError(f"{name} must be a float32 tensor")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {list(shape)}, got {list(t.shape)}")
    if out_dtype not in DTYPE_CODE:
        raise TypeError(f"out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
    why = launch(n) if launch is not None else None
    if why is not None:
        raise ValueError(why)
    tensors = [a, b, sa, sb] + ([counters] if counters is not None else [])
    if len({t.device for t in tensors}) != 1 or a.device.type != "cuda":
        raise ValueError("operands must all be on one CUDA device, got "
                         f"{sorted({str(t.device) for t in tensors})}")
    if counters is not None and (counters.dtype != torch.int32 or counters.numel() < n // rows
                                 or not counters.is_contiguous()):
        raise ValueError(f"counters must be contiguous int32 with at least N/{rows}={n // rows} "
                         "elements (zeros)")


def splits_launched(k: int, split: int) -> int:
    """The K ranges a requested ``split`` becomes (never an empty one)."""
    groups = k // GROUP
    per = -(-groups // max(1, min(split, groups)))
    return -(-groups // per)


def block_fp8_mm(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                 out_dtype: torch.dtype = torch.bfloat16, split: int = 1, warps: int = 4,
                 stages: int = 4, counters: torch.Tensor | None = None,
                 row_warps: int = 1, wgmma: int = 0, overlap_next: bool = False,
                 l2_prefetch: int = 0) -> torch.Tensor:
    """``a [M<=16, K] fp8 @ b [N, K] fp8`` with 1x128 / 128x128 scales -> ``[M, N] out_dtype``."""
    check_args(a, b, sa, sb, out_dtype, split, warps, stages, counters, row_warps, wgmma)
    _check_prefetch(l2_prefetch)
    lib, c, partial, counters, splits = _prepare(a, b, out_dtype, split, counters, TILE_ROWS,
                                                 "wgmma" if wgmma else "mma_sync")
    code = lib.block_fp8_mm(*_c_operands(a, b, sa, sb, c, out_dtype, partial, counters, splits),
                            splits, warps, row_warps, stages, int(wgmma), int(overlap_next),
                            l2_prefetch, stream_of(a.device))
    check_code(lib, code, OP)
    return c


def block_fp8_mm_tma(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                     out_dtype: torch.dtype = torch.bfloat16, split: int = 1, stages: int = 8,
                     counters: torch.Tensor | None = None, overlap_next: bool = False,
                     l2_prefetch: int = 0) -> torch.Tensor:
    """The same product by the sm_90 TMA kernel (N a multiple of 64)."""
    _check_prefetch(l2_prefetch)
    if split < 1 or stages not in TMA_STAGES:
        raise ValueError(f"launch split={split} stages={stages}: the TMA kernel takes split >= 1 "
                         f"and stages {'/'.join(map(str, TMA_STAGES))}")
    check_operands(a, b, sa, sb, out_dtype, counters, TMA_ROWS)
    lib, c, partial, counters, splits = _prepare(a, b, out_dtype, split, counters, TMA_ROWS, "tma")
    code = lib.block_fp8_mm_tma(*_c_operands(a, b, sa, sb, c, out_dtype, partial, counters, splits),
                                splits, stages, int(overlap_next), l2_prefetch, stream_of(a.device))
    check_code(lib, code, OP)
    return c


def _check_prefetch(l2_prefetch: int) -> None:
    if not isinstance(l2_prefetch, int) or isinstance(l2_prefetch, bool) or not 0 <= l2_prefetch < 2**20:
        raise ValueError(f"l2_prefetch must be an int of groups in [0, 2**20), got {l2_prefetch!r}")


def _c_operands(a, b, sa, sb, c, out_dtype, partial, counters, splits) -> tuple:
    """The arguments both C entry points take first: operands, strides, sizes, split-K scratch."""
    return (a.data_ptr(), a.stride(0), sa.data_ptr(), sa.stride(0), sa.stride(1),
            b.data_ptr(), b.stride(0), sb.data_ptr(), sb.stride(0), sb.stride(1),
            c.data_ptr(), c.stride(0), DTYPE_CODE[out_dtype], a.shape[0], b.shape[0], a.shape[1],
            partial.data_ptr() if partial is not None else None,
            counters.data_ptr() if splits > 1 else None)


def _prepare(a, b, out_dtype, split, counters, rows, kernel):
    """The library, the output, and for split K its partials and counters (zeros if not given)."""
    why = unsupported_reason(a.device, kernel)
    if why is not None:
        raise RuntimeError(f"radiance {OP} ({kernel} kernel) cannot run here: {why}")
    m, k = a.shape
    n = b.shape[0]
    splits = splits_launched(k, split)
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    partial = None
    if splits > 1:
        partial = torch.empty((splits, m, n), dtype=torch.float32, device=a.device)
        if counters is None:
            counters = torch.zeros(n // rows, dtype=torch.int32, device=a.device)
    lib = library.get(a.device.index if a.device.index is not None else torch.cuda.current_device())
    return lib, c, partial, counters, splits
