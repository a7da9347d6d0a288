"""Portable Triton block-FP8 GEMMs (NVIDIA and AMD; no arch-specific intrinsics).

Both kernels walk K one 128-column scale group at a time: a ``tl.dot`` of the fp8 tiles gives the
group's fp32 partial product, which is multiplied by the row's activation scale and the column's
weight-block scale before it joins the fp32 accumulator. That is the reference's order of
operations per group; only the summation order across groups and inside the dot differs.

split-K (decode, M <= 16): one program per (BLOCK_N columns, K range). At decode sizes the weight
is the whole cost (N*K bytes, read once); splitting K puts enough programs on the machine to pull
full bandwidth when N alone gives too few column tiles. Partial sums are combined either
  - in-kernel (FIXUP=1): each program stores its fp32 partial, then bumps a per-column-tile
    counter (acq_rel, GPU scope, after a CTA barrier so the release covers every thread's stores);
    the program that arrives last sums the partials, writes the output and resets the counter to
    zero, so the counter buffer is zero before and after every launch (a scratch, not state); or
  - by a second small kernel (FIXUP=2), one extra launch and no cross-program ordering.
FIXUP=0 is the unsplit case: each program writes its tile directly.

generic (M > 16): a grouped-ordering tiled GEMM with the same per-group scaling.

The weight is read in [BLOCK_N, 128] tiles whose rows are 128 contiguous bytes, already full
memory transactions on both vendors; a pre-shuffled layout buys nothing for a Triton kernel that
stages tiles through shared memory, so no shuffled variant is offered here (AITER's preshuffle
kernel, whose MFMA operand layout is what the shuffle serves, is a separate provider).

Activation scales are read through their strides, so the row-major, column-major and stride-0
(per-token scale broadcast to groups) layouts all run without a copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

GROUP = 128


@triton.jit
def _group_partial(a_ptr, b_ptr, sa_ptr, sb_ptr, offs_m, offs_n, mask_m, mask_n, g, K,
                   s_am, s_ak, s_bn, s_bk, s_sam, s_sag, s_sbn, s_sbg,
                   BLOCK_K: tl.constexpr):
    offs_k = g * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_k = offs_k < K
    a = tl.load(a_ptr + offs_m[:, None] * s_am + offs_k[None, :] * s_ak,
                mask=mask_m[:, None] & mask_k[None, :], other=0.0)
    b = tl.load(b_ptr + offs_n[:, None] * s_bn + offs_k[None, :] * s_bk,
                mask=mask_n[:, None] & mask_k[None, :], other=0.0)
    sa = tl.load(sa_ptr + offs_m * s_sam + g * s_sag, mask=mask_m, other=0.0)
    sb = tl.load(sb_ptr + (offs_n // BLOCK_K) * s_sbn + g * s_sbg, mask=mask_n, other=0.0)
    return tl.dot(a, tl.trans(b)) * sa[:, None] * sb[None, :]


@triton.jit
def _splitk_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, c_ptr, part_ptr, count_ptr,
                   M, N, K, groups_per_split, n_splits,
                   s_am, s_ak, s_bn, s_bk, s_sam, s_sag, s_sbn, s_sbg, s_cm, s_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   FIXUP: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k_groups = tl.cdiv(K, BLOCK_K)
    g0 = pid_k * groups_per_split
    g1 = tl.minimum(g0 + groups_per_split, k_groups)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g in range(g0, g1):
        acc += _group_partial(a_ptr, b_ptr, sa_ptr, sb_ptr, offs_m, offs_n, mask_m, mask_n, g, K,
                              s_am, s_ak, s_bn, s_bk, s_sam, s_sag, s_sbn, s_sbg, BLOCK_K)
    mask_c = mask_m[:, None] & mask_n[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * s_cm + offs_n[None, :] * s_cn
    if FIXUP == 0:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_c)
    else:
        p_ptrs = part_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :]
        tl.store(p_ptrs, acc, mask=mask_c)
        if FIXUP == 1:
            tl.debug_barrier()
            arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if arrived == n_splits - 1:
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(0, n_splits):
                    q_ptrs = part_ptr + s * M * N + offs_m[:, None] * N + offs_n[None, :]
                    total += tl.load(q_ptrs, mask=mask_c, other=0.0, cache_modifier=".cg")
                tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=mask_c)
                tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")


@triton.jit
def _splitk_reduce_kernel(part_ptr, c_ptr, M, N, n_splits, s_cm, s_cn,
                          BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, n_splits):
        total += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0)
    m = offs // N
    n = offs % N
    tl.store(c_ptr + m * s_cm + n * s_cn, total.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _generic_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, c_ptr, M, N, K,
                    s_am, s_ak, s_bn, s_bk, s_sam, s_sag, s_sbn, s_sbg, s_cm, s_cn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    # Grouped ordering: GROUP_M row tiles sweep the column tiles together, so a weight tile
    # fetched into L2 serves GROUP_M activation tiles before it is evicted.
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows
    pid_n = (pid % per_group) // rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g in range(0, tl.cdiv(K, BLOCK_K)):
        acc += _group_partial(a_ptr, b_ptr, sa_ptr, sb_ptr, offs_m, offs_n, mask_m, mask_n, g, K,
                              s_am, s_ak, s_bn, s_bk, s_sam, s_sag, s_sbn, s_sbg, BLOCK_K)
    c_ptrs = c_ptr + offs_m[:, None] * s_cm + offs_n[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def splitk_geometry(n: int, k: int, block_n: int, split_k: int) -> tuple[int, int, int]:
    """(column tiles, K groups per split, splits actually launched) for a requested split."""
    tiles_n = triton.cdiv(n, block_n)
    k_groups = triton.cdiv(k, GROUP)
    per_split = triton.cdiv(k_groups, max(1, min(split_k, k_groups)))
    return tiles_n, per_split, triton.cdiv(k_groups, per_split)


def auto_split(n: int, k: int, block_n: int, sms: int) -> int:
    """Enough (column tile, K range) programs for about two waves on ``sms`` multiprocessors,
    as a power of two, never more splits than K groups."""
    tiles_n = triton.cdiv(n, block_n)
    want = max(1, (2 * sms) // max(1, tiles_n))
    split = 1 << (want.bit_length() - 1)
    return max(1, min(split, triton.cdiv(k, GROUP)))


def splitk_mm(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
              out_dtype: torch.dtype, block_n: int = 64, split_k: int = 4, num_warps: int = 4,
              num_stages: int = 4, fixup: int = 1,
              counters: torch.Tensor | None = None) -> torch.Tensor:
    """``a [M<=16, K] fp8 @ b [N, K] fp8`` with block scales; see the module doc for ``fixup``.
    ``counters``: int32, at least ``cdiv(N, block_n)`` zeros (left zero); allocated if None."""
    m, k = a.shape
    n = b.shape[0]
    if m > 16:
        raise ValueError(f"split-K serves M <= 16 (one 16-row block), got M={m}")
    tiles_n, per_split, splits = splitk_geometry(n, k, block_n, split_k)
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    mode = 0 if splits == 1 else fixup
    part = c if mode == 0 else torch.empty((splits, m, n), dtype=torch.float32, device=a.device)
    if mode == 1 and counters is None:
        counters = torch.zeros(tiles_n, dtype=torch.int32, device=a.device)
    cnt = counters if mode == 1 else c
    _splitk_kernel[(tiles_n, splits)](
        a, b, sa, sb, c, part, cnt, m, n, k, per_split, splits,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), sa.stride(0), sa.stride(1),
        sb.stride(0), sb.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=GROUP, FIXUP=mode,
        num_warps=num_warps, num_stages=num_stages)
    if mode == 2:
        block = 1024
        _splitk_reduce_kernel[(triton.cdiv(m * n, block),)](
            part, c, m, n, splits, c.stride(0), c.stride(1), BLOCK=block, num_warps=4)
    return c


def generic_mm(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
               out_dtype: torch.dtype, block_m: int = 64, block_n: int = 128,
               num_warps: int = 4, num_stages: int = 3, group_m: int = 8) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _generic_kernel[grid](
        a, b, sa, sb, c, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), sa.stride(0), sa.stride(1),
        sb.stride(0), sb.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=GROUP, GROUP_M=group_m,
        num_warps=num_warps, num_stages=num_stages)
    return c


def generic_block_m(m: int) -> int:
    """The row tile for ``m`` rows: the smallest of 16/32/64/128 that covers it (16 is tl.dot's
    minimum), so small batches do not pay for padding rows."""
    for bm in (16, 32, 64):
        if m <= bm:
            return bm
    return 128
