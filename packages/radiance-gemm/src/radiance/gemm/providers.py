"""The block-FP8 GEMM providers and what each declares it serves.

Every provider computes ``a [M, K] fp8 @ b [N, K] fp8`` with activation scales ``[M, K/128]`` (any
strides) and weight scales ``[N/128, K/128]``, the reference's semantics (reference.py), and is
called as ``run(a, b, sa, sb, out_dtype, params, counters)`` where ``params`` is the provider's
launch configuration as a tuple of ints (resolved at load time, see ``parse_config``).

Nothing here imports vLLM: the GPU tests and the benchmark use this module alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radiance.gemm import reference

FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
M_ANY = 1 << 30


@dataclass(frozen=True)
class Provider:
    name: str
    platforms: tuple[str, ...]
    archs: tuple[str, ...] | None  # arch-name prefixes ("sm90", "gfx9"); None: any arch
    dtypes: tuple[torch.dtype, ...]
    m_min: int
    m_max: int
    wants_shuffled: bool
    needs_128: bool  # 128x128 weight blocks and N, K multiples of 128
    available: Callable[[], str | None]
    run: Callable[..., torch.Tensor]
    default_config: str
    describe: str
    shape_rule: Callable[[int, int], str | None] | None = None  # (N, K) -> why not, or None

    def serves(self, platform: str, arch: str, n: int, k: int, block: tuple[int, int],
               dtype: torch.dtype) -> str | None:
        """None when this provider can run the layer, else the reason it cannot."""
        if platform not in self.platforms:
            return f"not for {platform}"
        if self.archs is not None and not any(arch.startswith(a) for a in self.archs):
            return f"arch {arch} not in {'/'.join(self.archs)}"
        if dtype not in self.dtypes:
            return f"weight dtype {dtype} not served"
        if self.needs_128 and (tuple(block) != (128, 128) or n % 128 or k % 128):
            return f"needs 128x128 blocks and N, K multiples of 128 (N={n} K={k} block={list(block)})"
        if self.shape_rule is not None and (why := self.shape_rule(n, k)) is not None:
            return why
        return self.available()


# ---- CPU reference ---------------------------------------------------------------------------

def _run_reference(a, b, sa, sb, out_dtype, params, counters):
    block = (params[0], params[1]) if len(params) >= 2 and params[0] > 0 else (128, 128)
    return reference.block_fp8_mm(a, b, sa, sb, out_dtype, block)


# ---- Triton ----------------------------------------------------------------------------------

def _triton_available() -> str | None:
    try:
        import triton  # noqa: F401
        from radiance.gemm import triton_block_fp8  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"Triton unavailable: {type(exc).__name__}: {exc}"
    return None


def _run_splitk(a, b, sa, sb, out_dtype, params, counters):
    from radiance.gemm.triton_block_fp8 import splitk_mm

    bn, sk, warps, stages, fixup = params[:5]
    return splitk_mm(a, b, sa, sb, out_dtype, bn, sk, warps, stages, fixup,
                     counters if fixup == 1 and counters.numel() > 0 else None)


def _run_generic(a, b, sa, sb, out_dtype, params, counters):
    from radiance.gemm.triton_block_fp8 import generic_block_m, generic_mm

    bm, bn, warps, stages = params[:4]
    return generic_mm(a, b, sa, sb, out_dtype, bm if bm > 0 else generic_block_m(a.shape[0]),
                      bn, warps, stages)


# ---- radiance's CUDA decode GEMM (radiance-kernels, csrc/block_fp8_mm.cu) ----------------------

def _cuda_decode_available() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    from radiance.kernels.block_fp8_mm import unsupported_reason

    return unsupported_reason("cuda")


def _run_cuda_decode(a, b, sa, sb, out_dtype, params, counters):
    from radiance.kernels.block_fp8_mm import block_fp8_mm

    split, warps, rows, stages, wgmma, flags = params[:6]
    overlap, prefetch = unpack_flags(flags)
    return block_fp8_mm(a, b, sa, sb, out_dtype, split, warps, stages,
                        counters if counters.numel() > 0 else None, rows, wgmma, overlap, prefetch)


def _cuda_tma_available() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    from radiance.kernels.block_fp8_mm import unsupported_reason

    return unsupported_reason("cuda", "tma")


def _run_cuda_tma(a, b, sa, sb, out_dtype, params, counters):
    from radiance.kernels.block_fp8_mm import block_fp8_mm_tma

    split, stages = params[0], params[1]
    overlap, prefetch = unpack_flags(params[5])
    return block_fp8_mm_tma(a, b, sa, sb, out_dtype, split, stages,
                            counters if counters.numel() > 0 else None, overlap, prefetch)


# ---- PyTorch block-wise scaled_mm --------------------------------------------------------------

def _torch_available() -> str | None:
    from radiance.gemm import torch_blockwise

    return torch_blockwise.available()


def _torch_shape_rule(n: int, k: int) -> str | None:
    from radiance.gemm import torch_blockwise

    return torch_blockwise.unsupported_shape(n, k)


def _run_torch(a, b, sa, sb, out_dtype, params, counters):
    from radiance.gemm.torch_blockwise import blockwise_mm

    return blockwise_mm(a, b, sa, sb, out_dtype)


# ---- AITER -----------------------------------------------------------------------------------

def _aiter_plain_available() -> str | None:
    from radiance.gemm import aiter_block_fp8

    return aiter_block_fp8.plain_available()


def _aiter_preshuffle_available() -> str | None:
    from radiance.gemm import aiter_block_fp8

    return aiter_block_fp8.preshuffle_available()


def _run_aiter_plain(a, b, sa, sb, out_dtype, params, counters):
    from radiance.gemm.aiter_block_fp8 import plain_mm

    return plain_mm(a, b, sa, sb, out_dtype)


def _run_aiter_preshuffle(a, b, sa, sb, out_dtype, params, counters):
    from radiance.gemm.aiter_block_fp8 import preshuffle_mm

    return preshuffle_mm(a, b, sa, sb, out_dtype)


PROVIDERS: tuple[Provider, ...] = (
    Provider("cpu_reference", ("cpu",), None, FP8, 1, M_ANY, False, False, lambda: None,
             _run_reference, "", "dequantize in fp32, matmul, cast (the specification)"),
    Provider("triton_splitk", ("cuda", "rocm"), None, FP8, 1, 16, False, False,
             _triton_available, _run_splitk, "bn64-skauto-w4-s4-f2",
             "Triton split-K for decode sizes, weight read once"),
    Provider("cuda_decode", ("cuda",), ("sm89", "sm9", "sm10", "sm12"), (torch.float8_e4m3fn,), 1,
             16, False, True, _cuda_decode_available, _run_cuda_decode, "skauto-w4-r1-s4",
             "radiance CUDA kernel: fp8 tensor-core MMA (mma.sync, or wgmma on sm_90) fed from "
             "16-byte weight loads, split-K"),
    Provider("cuda_tma", ("cuda",), ("sm90",), (torch.float8_e4m3fn,), 1, 16, False, True,
             _cuda_tma_available, _run_cuda_tma, "skauto-s8",
             "radiance CUDA kernel for sm_90: [64 x 128] weight tiles streamed by the tensor memory "
             "accelerator into a shared-memory ring, wgmma from shared memory, split-K"),
    Provider("triton_generic", ("cuda", "rocm"), None, FP8, 1, M_ANY, False, False,
             _triton_available, _run_generic, "bmauto-bn128-w4-s3",
             "Triton tiled GEMM, per-group scaling"),
    Provider("torch_blockwise", ("cuda",), ("sm90",), (torch.float8_e4m3fn,), 1, M_ANY, False,
             True, _torch_available, _run_torch, "",
             "torch.nn.functional.scaled_mm BlockWise1x128 x BlockWise128x128 (cuBLASLt)",
             _torch_shape_rule),
    Provider("aiter_small_m", ("rocm",), None, FP8, 1, 16, False, True, _aiter_plain_available,
             _run_aiter_plain, "", "AITER gemm_a8w8_blockscale (its own split-K config)"),
    Provider("aiter_preshuffle", ("rocm",), None, FP8, 1, M_ANY, True, True,
             _aiter_preshuffle_available, _run_aiter_preshuffle, "",
             "AITER gemm_a8w8_blockscale_preshuffle on (16, 16)-shuffled weights"),
)
PROVIDER_INDEX = {p.name: i for i, p in enumerate(PROVIDERS)}
PARAMS = 6  # ints of launch configuration carried per route entry


def provider(name: str) -> Provider:
    try:
        return PROVIDERS[PROVIDER_INDEX[name]]
    except KeyError:
        raise ValueError(f"unknown GEMM provider {name!r}; known: {', '.join(PROVIDER_INDEX)}") from None


# The config fields each provider reads (see parse_config); the others take no config.
CONFIG_FIELDS: dict[str, set[str]] = {
    "triton_splitk": {"bn", "sk", "w", "s", "f"},
    "cuda_decode": {"sk", "w", "r", "s", "wg", "ov", "pf"},
    "cuda_tma": {"sk", "s", "ov", "pf"},
    "triton_generic": {"bm", "bn", "w", "s"},
}


def parse_config(name: str, config: str, n: int, k: int, sms: int,
                 block: tuple[int, int] = (128, 128)) -> tuple[int, ...]:
    """A provider's config string ("bn64-sk8-w4-s4-f1") as PARAMS ints; "auto" fields are resolved
    for this (N, K) and machine here, at load time, never per call."""
    fields = {}
    for part in filter(None, config.split("-")):
        match = re.fullmatch(r"([a-z]+)(\d+|auto)", part)
        if match is None:
            raise ValueError(f"bad {name} config field {part!r} in {config!r}")
        fields[match.group(1)] = match.group(2)
    known = CONFIG_FIELDS.get(provider(name).name, set())
    if set(fields) - known:
        raise ValueError(f"bad {name} config {config!r}: fields {sorted(set(fields) - known)} "
                         f"unknown; it takes {sorted(known) or 'none'}")
    if name == "triton_splitk":
        from radiance.gemm.triton_block_fp8 import auto_split

        bn = int(fields.get("bn", 64))
        if bn < 16 or bn & (bn - 1):  # the in-kernel fixup's counters are sized N/16
            raise ValueError(f"bad triton_splitk config {config!r}: bn must be a power of two >= 16")
        sk = fields.get("sk", "auto")
        fixup = fields.get("f", "2")
        if fixup not in ("0", "1", "2"):
            raise ValueError(f"bad triton_splitk config {config!r}: f is 0 (unsplit), 1 (in-kernel fixup) "
                             "or 2 (second-launch reduce)")
        # f0 has every K range store its partial straight into the output (last writer wins), so
        # it is only correct when one K range is launched; skauto or sk>1 may launch several.
        if fixup == "0" and (sk == "auto" or int(sk) > 1):
            raise ValueError(f"bad triton_splitk config {config!r}: f0 needs sk1 (one K range); "
                             "skauto or sk>1 takes f1 or f2")
        split = auto_split(n, k, bn, sms) if sk == "auto" else int(sk)
        return (bn, split, int(fields.get("w", 4)), int(fields.get("s", 4)), int(fixup), 0)
    if name == "cuda_decode":
        from radiance.kernels.block_fp8_mm import launch_error

        rows, warps, stages = int(fields.get("r", 1)), int(fields.get("w", 4)), int(fields.get("s", 4))
        wgmma = int(fields.get("wg", 0))  # G > 0: the sm_90 warpgroup-MMA kernel, G groups a stage
        sk = fields.get("sk", "auto")
        split = cuda_decode_split(n // max(rows, 1), k, sms) if sk == "auto" else int(sk)
        why = launch_error(n, split, warps, stages, rows, wgmma)
        if why is not None:
            raise ValueError(f"bad cuda_decode config {config!r}: {why}")
        return (split, warps, rows, stages, wgmma, _launch_flags(name, config, fields))
    if name == "cuda_tma":
        from radiance.kernels.block_fp8_mm import TMA_STAGES

        stages = int(fields.get("s", 8))
        if stages not in TMA_STAGES:
            raise ValueError(f"bad cuda_tma config {config!r}: stages "
                             f"{'/'.join(map(str, TMA_STAGES))}")
        sk = fields.get("sk", "auto")
        split = cuda_tma_split(n, k, sms, stages) if sk == "auto" else int(sk)
        if split < 1:
            raise ValueError(f"bad cuda_tma config {config!r}: split >= 1")
        return (split, stages, 0, 0, 0, _launch_flags(name, config, fields))
    if name == "triton_generic":
        bm = fields.get("bm", "auto")
        return (0 if bm == "auto" else int(bm), int(fields.get("bn", 128)),
                int(fields.get("w", 4)), int(fields.get("s", 3)), 0, 0)
    if name == "cpu_reference":
        return (block[0], block[1], 0, 0, 0, 0)
    return (0,) * PARAMS


def _launch_flags(name: str, config: str, fields: dict[str, str]) -> int:
    """The CUDA kernels' ``ov`` and ``pf`` fields, packed into one route int (``ov + 2 * pf``).
    ``ov1`` lets the next kernel in the stream launch before this GEMM's main loop (overlap_next in
    radiance.kernels.block_fp8_mm), ``ov0`` (default) after it; ``pf<G>`` has each block request G
    groups of each of its weight rows into L2 before its wait (l2_prefetch there; 0 by default)."""
    ov = fields.get("ov", "0")
    if ov not in ("0", "1"):
        raise ValueError(f"bad {name} config {config!r}: ov is 0 or 1")
    pf = fields.get("pf", "0")
    if pf == "auto" or not 0 <= int(pf) < 2**20:
        raise ValueError(f"bad {name} config {config!r}: pf is a number of groups below 2**20")
    return int(ov) + 2 * int(pf)


def unpack_flags(flags: int) -> tuple[bool, int]:
    """(overlap_next, l2_prefetch) from a route's packed launch flags (see _launch_flags)."""
    return bool(flags & 1), flags >> 1


def cuda_decode_split(n: int, k: int, sms: int) -> int:
    """K ranges per block column for the CUDA decode GEMM (``n``: rows / row warps, i.e. 16 times
    the block columns): the largest power of two (at most 8) that keeps the grid within two
    blocks per multiprocessor; small N gets the split, large N none (its column tiles already
    fill the card)."""
    tiles = max(1, n // 16)
    split = 1
    while split < 8 and tiles * (split * 2) <= 2 * sms and k // 128 >= split * 2:
        split *= 2
    return split


def cuda_tma_split(n: int, k: int, sms: int, stages: int) -> int:
    """K ranges per 64-row column tile for the TMA kernel: as many as fill the blocks the SMs hold
    at once (shared memory: ``stages`` tiles of the 16-token kernel a block, 227 KiB an SM), at
    most 16, each range at least two groups: one wave, every block's tiles requested at its start."""
    from radiance.kernels.block_fp8_mm import TMA_ROWS, tma_smem_bytes

    per_sm = max(1, (227 << 10) // tma_smem_bytes(stages))
    tiles = max(1, n // TMA_ROWS)
    return max(1, min(16, per_sm * sms // tiles, k // 256))


def format_params(name: str, params: tuple[int, ...]) -> str:
    overlap, prefetch = unpack_flags(params[5])
    ov = ("-ov1" if overlap else "") + (f"-pf{prefetch}" if prefetch else "")
    if name == "cuda_tma":
        return "sk{}-s{}".format(*params[:2]) + ov
    if name == "cuda_decode":
        return "sk{}-w{}-r{}-s{}".format(*params[:4]) + (f"-wg{params[4]}" if params[4] else "") + ov
    if name == "triton_splitk":
        return "bn{}-sk{}-w{}-s{}-f{}".format(*params[:5])
    if name == "triton_generic":
        bm = "auto" if params[0] == 0 else str(params[0])
        return "bm{}-bn{}-w{}-s{}".format(bm, *params[1:4])
    return ""


def run(name: str, a, b, sa, sb, out_dtype, config: str | None = None, counters=None):
    """Run one provider directly (tests, benchmarks): validates, resolves its config, launches."""
    p = provider(name)
    check_operands(a, b, sa, sb)
    n, k = b.shape
    sms = 1
    if a.is_cuda:
        from radiance.gemm.platform import sm_count

        sms = sm_count(a.device)
    params = parse_config(name, p.default_config if config is None else config, n, k, sms)
    if counters is None:
        counters = torch.empty(0, dtype=torch.int32, device=a.device)
    groups = math.ceil(k / 128)
    return p.run(a, b, reference.group_scales(sa, a.shape[0], groups), sb, out_dtype, params,
                 counters)


def check_operands(a, b, sa, sb) -> None:
    """Clear errors before any launch: dtypes, ranks, shapes, devices."""
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in FP8:
            raise TypeError(f"{name} must be fp8 (e4m3fn/e4m3fnuz), got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {list(t.shape)}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"K mismatch: a {list(a.shape)} vs b {list(b.shape)}")
    if a.stride(1) != 1 or b.stride(1) != 1:
        raise ValueError("a and b must be contiguous along K")
    n, k = b.shape
    if sb.dtype != torch.float32 or sb.dim() != 2:
        raise TypeError(f"weight scale must be a 2-D float32 tensor, got {sb.dtype} {list(sb.shape)}")
    if sb.shape[1] != math.ceil(k / 128):
        raise ValueError(f"weight scale {list(sb.shape)} does not match K={k} in 128-column blocks")
    devices = {t.device for t in (a, b, sa, sb)}
    if len(devices) != 1:
        raise ValueError(f"operands on different devices: {sorted(map(str, devices))}")
    reference.group_scales(sa, a.shape[0], math.ceil(k / 128))
