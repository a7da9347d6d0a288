"""The unified-attention launch policy: geometry in, launch config out.

Pure functions, no torch, no GPU: every decision here is testable on a CPU and reproducible
from the numbers in a report line. Two consumers:

* AITER's unified attention (ROCm): ``aiter_decode_3d`` and ``aiter_prefill_2d`` take the config
  AITER's own selector returned and return the tuned one (the gfx1201 table).
* vLLM's Triton unified attention: ``triton_launch`` returns the whole launch (split count,
  BLOCK_M/BLOCK_Q, tile, warps, grid) that radiance's own launch of vLLM's kernel uses, or
  ``None`` to leave the stock wrapper in charge.

Every hardware-dependent number lives in a per-arch table (``tables.py``): a table fitted on one
GPU can never move a shape tuned on another.

The two levers, and why (measured first on gfx1201, 4K-128K context x 1-8 sequences x verify
width 1-9, CUDA-graph replays):

1. Split-KV count. Decode is a KV-streaming problem; a batch of a few sequences gives too few
   programs to fill the GPU unless each sequence's KV is split into segments, but every segment
   costs a Q load, a partial-output write and a share of the reduce. The measured optimum
   follows ``coef * (tiles / programs) ** exp`` (tiles: KV tiles one sequence walks; programs:
   the unsplit grid), floored to a power of two (the kernel takes the count as a constexpr, so
   powers of two bound the number of compiled variants) and clamped to
   ``[min, min(max, next_pow2(tiles))]`` -- more segments than tiles only adds empty programs.
   On gfx1201 ``coef=16, exp=1/3, [4, 128]`` was within 2.2% of the best split at every point.
   A rule may give the programs an exponent of their own (``programs_exp``): on the H200 the
   best split of radiance's warpgroup pass at >= 32K keeps the launch at about the same number
   of blocks whatever the context (head 256, fp8 KV: sequences x KV heads x segments = 256, two
   blocks an SM), which ``coef / programs ** programs_exp`` with ``exp`` near 0 follows and the
   shared exponent cannot.
2. BLOCK_M. The stock wrappers size the query block from the GQA ratio alone (16 rows), so a
   speculative-decoding verify batch of ``w`` tokens per sequence is cut into several q-blocks
   and each one streams the sequence's whole KV again. A block wide enough for all
   ``w * q_per_kv`` rows reads the KV once -- but padding rows cost compute, so widening is gated
   on the wide block being at least ``min_fill`` full (gfx1201: 0.8; at 36/64 rows it measured
   20% slower than stock).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from radiance.attn import tables as _tables

FP8 = "fp8"
TWO_BYTE = ("bf16", "fp16")
# A rule's ``max_query_len`` where it names none: the longest query a sequence of a verify batch
# may have; a longer batch is prefill-shaped and ``triton_launch`` leaves it stock.
DEFAULT_MAX_QUERY_LEN = 16


def next_pow2(x: int) -> int:
    return 1 << (max(1, int(x)) - 1).bit_length()


def floor_pow2(x: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(1.0, float(x))))))


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


@dataclass(frozen=True)
class Geometry:
    """One attention call, as the policy sees it."""

    arch: str  # "gfx1201", "sm_90", ...
    head_size: int
    num_query_heads: int
    num_kv_heads: int
    num_tokens: int  # query tokens in the batch
    num_seqs: int
    max_seqlen_q: int
    max_seqlen_k: int
    q_dtype: str = "bf16"  # "bf16" | "fp16" | "fp8" | "fp32"
    kv_dtype: str = "bf16"
    block_size: int = 16
    num_sms: int = 0  # compute units; 0 when unknown
    # Bytes of segment scratch the launch may use (fp32 partial outputs); 0: unlimited.
    scratch_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("head_size", "num_query_heads", "num_kv_heads", "num_seqs", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"Geometry.{name} must be a positive int, got {v!r}")
        for name in ("num_tokens", "max_seqlen_q", "max_seqlen_k", "num_sms", "scratch_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"Geometry.{name} must be a non-negative int, got {v!r}")
        if self.num_query_heads % self.num_kv_heads:
            raise ValueError(
                f"num_query_heads {self.num_query_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )
        for name in ("q_dtype", "kv_dtype"):
            if getattr(self, name) not in ("bf16", "fp16", "fp8", "fp32"):
                raise ValueError(f"Geometry.{name} must be bf16/fp16/fp8/fp32, got {getattr(self, name)!r}")

    @property
    def q_per_kv(self) -> int:
        return self.num_query_heads // self.num_kv_heads

    @property
    def all_decode(self) -> bool:
        """One query token per sequence (plain decode, or a drafter's own single-token pass)."""
        return self.max_seqlen_q <= 1

    @property
    def head_padded(self) -> int:
        return next_pow2(self.head_size)

    @property
    def rows_per_seq(self) -> int:
        """Query rows one sequence puts in a q-block if the block holds all its tokens."""
        return cdiv(max(1, self.num_tokens), self.num_seqs) * self.q_per_kv


def stock_block_m(q_per_kv: int) -> int:
    """The block both stock wrappers derive from the GQA ratio alone."""
    return 16 if q_per_kv <= 16 else next_pow2(q_per_kv)


def q_block_count(num_tokens: int, num_seqs: int, block_q: int) -> int:
    """The wrappers' upper bound on q-blocks: sum(floor(len/BLOCK_Q) + 1) <= tokens//BLOCK_Q + seqs.

    It stays correct for any BLOCK_Q (blocks past a sequence's query length return at once), so
    a wider block only ever shrinks the grid.
    """
    return num_tokens // block_q + num_seqs


def split_count(tiles: int, programs: int, rule: Mapping[str, Any]) -> int:
    """Segments for one sequence's KV: ``coef * tiles ** exp / programs ** programs_exp``
    (``programs_exp`` defaults to ``exp``: ``coef * (tiles / programs) ** exp``), power-of-two floor.

    Clamped to ``[min, min(max, next_pow2(tiles))]``, the lower bound winning when the two cross
    (a sequence of 1-2 tiles still gets ``min`` segments; the extra ones return at once). Returns
    1 (unsplit) when the rule has ``unsplit_below`` and the estimate falls under it.
    """
    tiles = max(1, int(tiles))
    exp = float(rule["exp"])
    want = float(rule["coef"]) * tiles**exp / max(1, int(programs)) ** float(rule.get("programs_exp", exp))
    seg = floor_pow2(want)
    unsplit_below = int(rule.get("unsplit_below", 0))
    if unsplit_below and seg < unsplit_below:
        return 1
    hi = min(int(rule["max"]), next_pow2(tiles))
    return max(int(rule["min"]), min(hi, seg))


def wide_block_m(geo: Geometry, wide: Mapping[str, Any] | None) -> int | None:
    """The widened BLOCK_M for a verify batch, or None to keep the stock block.

    Widening applies only to mixed batches of several query tokens per sequence (never to an
    all-decode pass) whose rows do not fit the stock block, only to the smallest allowed block
    that holds all of a sequence's rows, and only when that block is at least ``min_fill`` full.
    """
    if not wide or geo.all_decode:
        return None
    heads = wide.get("head_sizes")
    if heads and geo.head_size not in heads:
        return None
    rows = geo.rows_per_seq
    base = stock_block_m(geo.q_per_kv)
    if rows <= base:
        return None  # the stock block already holds every row: a wider one only adds padding
    for bm in sorted(int(b) for b in wide["block_m"]):
        if bm <= base or bm < rows:
            continue
        return bm if rows >= float(wide["min_fill"]) * bm else None
    return None


def lds_fits(arch: str, block_m: int, tile: int, head_padded: int, q_bytes: int = 2) -> bool:
    """Documented LDS clamp: the Q block and the larger KV tile each take at most half the LDS.

    Measured with Triton's AMD backend on gfx1201 (64 KiB): the kernel's shared footprint is the
    larger of the Q block and a KV tile in the dot dtype (e.g. BLOCK_M 128 x head 256 x bf16 =
    64 KiB exactly, the limit). AITER's 3D kernel is reported to need 65,792 B at such a shape:
    keeping each operand to half the LDS leaves room for the other and for the scratch Triton
    adds, and is verified by compiling every config the policy can emit (tests/test_lds.py).
    """
    limit = _tables.lds_bytes(arch)
    if not limit:
        return True
    return max(block_m, tile) * head_padded * max(2, q_bytes) <= limit // 2


# --------------------------------------------------------------------------------------------
# vLLM Triton unified attention
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TritonLaunch:
    """A complete launch of vLLM's ``kernel_unified_attention`` (+ ``reduce_segments``)."""

    num_segments: int  # 1: unsplit (2D); >1: split-KV (3D) + reduce
    block_m: int
    block_q: int
    tile_size: int
    num_warps: int | None = None  # None: Triton's default, as the stock wrapper leaves it
    num_stages: int | None = None
    reason: str = ""
    notes: tuple[str, ...] = field(default=(), compare=False)
    # "vllm": vLLM's kernel_unified_attention (+ reduce_segments); "radiance": radiance's own
    # split-KV kernel (split_kv_kernel.py), whose fp8 KV path keeps the scales out of the tile loop.
    kernel: str = "vllm"
    # Per-thread register cap handed to the compiler (Triton's ``maxnreg``): more blocks an SM
    # where registers are what limits them; None leaves it to ptxas.
    max_registers: int | None = None
    # radiance's kernel only: load the next KV tile's block-table entries one tile ahead
    # (split_kv_kernel.py explains both options).
    table_ahead: bool = False
    # radiance's kernel only: which partial pass writes the segments' partials ("triton":
    # split_kv_kernel._partial; "cuda_warpgroup": radiance-kernels' Hopper warpgroup-MMA pass,
    # whose query block is BLOCK_Q x heads-per-KV-head rows padded to a multiple of 8, not
    # BLOCK_M, and whose ring depth is num_stages; "cuda": its mma.sync pass, which the probes
    # time and no table names). The same reduce follows each.
    partial_pass: str = "triton"

    @property
    def is_3d(self) -> bool:
        return self.num_segments > 1

    def grid(self, num_tokens: int, num_seqs: int, num_kv_heads: int) -> tuple[int, ...]:
        q_blocks = q_block_count(num_tokens, num_seqs, self.block_q)
        if self.is_3d:
            return (q_blocks, num_kv_heads, self.num_segments)
        return (q_blocks, num_kv_heads)

    def describe(self) -> str:
        warps = self.num_warps if self.num_warps is not None else "default"
        kind = f"split-KV {self.num_segments} segments" if self.is_3d else "unsplit 2D"
        who = ""
        if self.kernel == "radiance":
            who = "radiance kernel, " if self.partial_pass == "triton" else f"radiance kernel ({self.partial_pass}), "
        extra = (f" registers<={self.max_registers}" if self.max_registers is not None else "") + (
            " block-table one tile ahead" if self.table_ahead else "")
        return f"{who}{kind}, BLOCK_M={self.block_m} BLOCK_Q={self.block_q} TILE={self.tile_size} warps={warps}{extra}"


def warpgroup_block_q(block_m: int, q_per_kv: int, max_seqlen_q: int) -> int:
    """BLOCK_Q of a warpgroup partial pass launched for a ``block_m``-row block: no more query
    tokens than the batch's longest sequence has. That pass pads a block's rows to a multiple of
    8, not to BLOCK_M, so a width-6 step at 8 heads a KV head runs 48 rows, not 64; the q-block
    count is the same either way."""
    return max(1, min(block_m // q_per_kv, max(1, int(max_seqlen_q))))


def stock_triton_tile(geo: Geometry, is_3d: bool) -> int:
    """vLLM's ``_get_tile_size`` for the no-sliding-window case."""
    if not is_3d:
        return 32
    return 16 if geo.q_dtype in ("bf16", "fp16", "fp32") else 32


def verify_max_query_len(table: Mapping[str, Any] | None, geo: Geometry | None = None) -> int:
    """The longest query a sequence of a verify batch has under ``table``: the ``max_query_len`` of
    the rule ``geo``'s class falls in (without ``geo``, the table's default rule). A batch with a
    longer one is prefill-shaped (``triton_launch`` leaves it stock)."""
    tri = (table or {}).get("triton") or {}
    rule = _tables.matching_rule(table, geo) if tri and geo is not None else tri.get("default")
    return int((rule or {}).get("max_query_len", DEFAULT_MAX_QUERY_LEN))


def triton_launch(geo: Geometry, table: Mapping[str, Any] | None = None) -> TritonLaunch | None:
    """The launch radiance uses for vLLM's Triton kernel, or None to keep the stock wrapper.

    Returns None (stock) when the arch has no table, for a prefill-shaped batch (the policy
    tunes decode and verify batches only), or when the 2D grid already fills the GPU and the
    split rule says unsplit with the stock block.
    """
    table = _tables.for_arch(geo.arch) if table is None else table
    if not table:
        return None
    rule = _tables.triton_rule(table, geo)
    if rule is None:
        return None
    if geo.max_seqlen_q > int(rule.get("max_query_len", DEFAULT_MAX_QUERY_LEN)):
        return None  # prefill-shaped: stock's 2D launch is what it was tuned for

    base_bm = stock_block_m(geo.q_per_kv)
    bm = wide_block_m(geo, rule.get("wide")) or base_bm
    wide_cfg = (rule.get("wide") or {}).get("launch", {}).get(str(bm), {}) if bm != base_bm else {}
    block_q = max(1, bm // geo.q_per_kv)

    tile = int(wide_cfg.get("tile", rule.get("tile_3d") or stock_triton_tile(geo, True)))
    if geo.kv_dtype == FP8 or geo.q_dtype == FP8:
        tile = max(tile, 32)  # fp8 dots need K >= 32 on both vendors
    while not lds_fits(geo.arch, bm, tile, geo.head_padded) and tile > 16:
        tile //= 2
    while not lds_fits(geo.arch, bm, tile, geo.head_padded) and bm > base_bm:
        bm //= 2
        block_q = max(1, bm // geo.q_per_kv)
        wide_cfg = {}

    programs = q_block_count(geo.num_tokens, geo.num_seqs, block_q) * geo.num_kv_heads
    tiles = cdiv(max(1, geo.max_seqlen_k), tile)
    split = rule["split"]
    if "split_scale" in wide_cfg:
        # A widened block's program does more rows' work per KV tile than the stock block's, so
        # its best segment count for the same tiles per program differs (the H200 fit halves it
        # for head 256's 128-row block, doubles it for head 128's 32-row block on bf16 KV).
        split = {**split, "coef": float(split["coef"]) * float(wide_cfg["split_scale"])}
    seg = split_count(tiles, programs, split)
    notes = []
    if seg > 1 and geo.scratch_bytes:
        per_segment = max(1, geo.num_tokens) * geo.num_query_heads * geo.head_padded * 4
        cap = geo.scratch_bytes // per_segment
        if cap < seg:
            notes.append(f"segments {seg} -> {floor_pow2(cap) if cap >= 2 else 1} (scratch)")
            seg = floor_pow2(cap) if cap >= 2 else 1
    if seg <= 1 and bm == base_bm and geo.max_seqlen_q > 1:
        return None  # exactly stock's verify launch
    if seg <= 1:
        tile = stock_triton_tile(geo, False) if bm == base_bm else tile
    if wide_cfg:  # a widened block's launch options are its own entry's, never the 3D keys
        warps, stages, kernel = wide_cfg.get("warps"), wide_cfg.get("stages"), wide_cfg.get("kernel", "vllm")
        registers, ahead = wide_cfg.get("registers"), wide_cfg.get("table_ahead", False)
        partial_pass = wide_cfg.get("partial_pass", "triton")
    else:
        warps = rule.get("warps_3d") if seg > 1 else None
        stages = rule.get("stages_3d") if seg > 1 else None
        kernel = rule.get("kernel_3d", "vllm")
        registers = rule.get("registers_3d") if seg > 1 else None
        ahead = rule.get("table_ahead_3d", False)
        partial_pass = rule.get("partial_pass_3d", "triton")
    if seg <= 1:
        kernel = "vllm"  # radiance's kernel is split-KV only; unsplit launches are vLLM's 2D kernel
    if kernel != "radiance":
        partial_pass = "triton"
    elif partial_pass == "cuda_warpgroup":
        block_q = warpgroup_block_q(bm, geo.q_per_kv, geo.max_seqlen_q)
    return TritonLaunch(
        num_segments=seg,
        block_m=bm,
        block_q=block_q,
        tile_size=tile,
        num_warps=None if warps is None else int(warps),
        num_stages=None if stages is None else int(stages),
        kernel=kernel,
        max_registers=None if registers is None else int(registers),
        table_ahead=bool(ahead) and kernel == "radiance" and partial_pass == "triton",
        partial_pass=partial_pass,
        reason=f"table {table.get('arch', geo.arch)}{' (provisional)' if table.get('provisional') else ''}",
        notes=tuple(notes),
    )


# --------------------------------------------------------------------------------------------
# AITER unified attention (ROCm): overlays on the config AITER's selectors return
# --------------------------------------------------------------------------------------------


def aiter_decode_3d(
    geo: Geometry,
    attn_cfg: Mapping[str, Any],
    reduce_cfg: Mapping[str, Any],
    num_2d_programs: int,
    table: Mapping[str, Any] | None = None,
) -> tuple[dict, dict, int | None]:
    """Tuned (attn_config, reduce_config, BLOCK_M or None) for AITER's split-KV decode kernel.

    ``attn_cfg``/``reduce_cfg`` are what AITER's ``select_3d_config`` returned; keys the table
    does not cover are left as AITER chose them. The BLOCK_M is not part of AITER's config (its
    wrapper derives it), so it is returned separately for the launch to apply.
    """
    attn, red = dict(attn_cfg), dict(reduce_cfg)
    table = _tables.for_arch(geo.arch) if table is None else table
    aiter = (table or {}).get("aiter")
    if not aiter:
        return attn, red, None
    d3 = aiter.get("decode_3d", {})
    if geo.q_dtype != FP8 or geo.kv_dtype != FP8 or not d3:
        return attn, red, None  # the table covers fp8 Q + fp8 KV decode only
    attn.update(d3["attn"])
    red.update(d3["reduce"])
    verify = d3.get("verify")
    if geo.all_decode or not verify or geo.head_size not in verify.get("head_sizes", ()):
        # The drafter's own single-token pass already runs near the DRAM roofline; the verify
        # rules cost it ~1%, so it keeps the constants above and AITER's split count.
        return attn, red, None
    attn.update(verify.get("attn", {}))
    programs = int(num_2d_programs)
    bm = wide_block_m(geo, verify.get("wide"))
    if bm is not None:
        launch = verify["wide"]["launch"][str(bm)]
        attn["TILE_SIZE"] = red["TILE_SIZE"] = int(launch["tile"])
        attn["num_warps"] = int(launch["warps"])
        # The split rule sees the widened launch's program count, since that is what runs.
        programs = q_block_count(geo.num_tokens, geo.num_seqs, bm // geo.q_per_kv) * geo.num_kv_heads
        if not lds_fits(geo.arch, bm, attn["TILE_SIZE"], geo.head_padded):
            bm = None
            attn["TILE_SIZE"] = red["TILE_SIZE"] = int(d3["attn"]["TILE_SIZE"])
            programs = int(num_2d_programs)
    tiles = cdiv(max(1, geo.max_seqlen_k), int(attn["TILE_SIZE"]))
    seg = split_count(tiles, programs, verify["split"])
    attn["NUM_SEGMENTS_PER_SEQ"] = red["NUM_SEGMENTS_PER_SEQ"] = seg
    return attn, red, bm


def aiter_prefill_2d(geo: Geometry, cfg: Mapping[str, Any], table: Mapping[str, Any] | None = None) -> dict:
    """Tuned config for AITER's 2D kernel (prefill, and decode batches AITER runs unsplit)."""
    out = dict(cfg)
    table = _tables.for_arch(geo.arch) if table is None else table
    p2 = ((table or {}).get("aiter") or {}).get("prefill_2d")
    if not p2:
        return out
    if geo.kv_dtype in TWO_BYTE:
        out.update(p2["two_byte_kv"])
    elif geo.max_seqlen_q >= int(p2["fp8_large_prefill"]["min_query_len"]):
        out.update({k: v for k, v in p2["fp8_large_prefill"].items() if k != "min_query_len"})
    by_head = p2.get("by_head_size", {}).get(str(geo.head_size))
    if by_head:
        out.update(by_head)
    if "BLOCK_M" in out:
        # BLOCK_Q is derived from BLOCK_M upstream, so it must follow any change to it.
        out["BLOCK_Q"] = max(1, int(out["BLOCK_M"]) // geo.q_per_kv)
    head_padded = geo.head_padded
    while "BLOCK_M" in out and not lds_fits(geo.arch, int(out["BLOCK_M"]), int(out.get("TILE_SIZE", 16)), head_padded):
        if int(out["BLOCK_M"]) <= stock_block_m(geo.q_per_kv):
            break
        out["BLOCK_M"] = int(out["BLOCK_M"]) // 2
        out["BLOCK_Q"] = max(1, out["BLOCK_M"] // geo.q_per_kv)
    return out
