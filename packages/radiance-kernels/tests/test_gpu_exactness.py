"""The kernels against the reference, on the same GPU, over the issue's grid.

Outputs must be fully written: before each kernel call the caching allocator's free blocks of the
output sizes are filled with a poison byte (allocate, fill, free: the op's torch.empty then gets
those blocks back); the op runs twice with two different poisons and both runs must agree bit for
bit, so an element the kernel never wrote would show up as a difference. The test also checks that
the poisoning reaches a fresh torch.empty of the same size, so the method is shown to work.

Equality: residual_out bit-identical; scales and q codes bit-identical except where the fp32 sum
of squares of a row (or head) was added in another order than torch's reduction tree, or (the
gated norm) where the kernel's approximate silu differs from torch's in its last bits. Such a row
may differ in its scale's last bits and then in some codes; every differing code must be exactly
one code away, and the fraction of codes affected is bounded (MAX_CODE_FRACTION). The gated
norm's differences are also traced: each must sit where the fp32 product, moved by
GDN_TRACE_REL, rounds to another value of the activation dtype (see gdn_untraced_codes).
"""

from __future__ import annotations

import itertools

import pytest
import torch

MS = (1, 2, 8, 32, 64, 256, 512, 2048, 8192)
KS = (2048, 4096, 5120, 8192, 10240)
MAX_CODE_FRACTION = 1e-4
EPS = 1e-6
# How far the gated norm's fp32 product may move before its rounding: the approximate silu's
# bound (64 fp32 bit patterns, test_gpu_elementwise_all_inputs) and the head sums' order, with
# room. About 2 * 2^-16 / 2^-8 = 1/128 of bf16 values lie that close to a rounding midpoint, so
# a difference from any other cause is caught with probability ~0.99.
GDN_TRACE_REL = 2.0**-16


def poison_allocator(shapes_bytes, value: int) -> None:
    """Fill then free blocks of the given byte sizes so the next allocations reuse them."""
    held = [torch.full((n,), value, dtype=torch.uint8, device="cuda") for n in shapes_bytes]
    del held


def code_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in FP8 code steps (sign-magnitude codes mapped to a monotone integer line)."""
    def line(t):
        u = t.view(torch.uint8).to(torch.int32)
        mag = u & 0x7F
        return torch.where(u >= 0x80, -mag, mag)
    return (line(a) - line(b)).abs()


def diff_stats(out, ref) -> dict:
    """Statistics of a kernel result against the reference, all outputs of one case."""
    q, s = out[0], out[1]
    rq, rs = ref[0], ref[1]
    stats = {"codes": q.numel(), "rows": q.shape[0]}
    q_bits, rq_bits = q.view(torch.uint8), rq.view(torch.uint8)
    diff = q_bits != rq_bits
    dist = code_distance(q, rq)
    # A NaN code (0x7F/0xFF, or 0x80 for fnuz) must match exactly; distance is meaningless there.
    nan_code = (rq_bits == 0x80) if rq.dtype == torch.float8_e4m3fnuz else ((rq_bits & 0x7F) == 0x7F)
    stats["nan_code_mismatches"] = int((diff & nan_code).sum())
    stats["diff_codes"] = int(diff.sum())
    stats["diff_rows"] = int(diff.any(dim=1).sum())
    stats["max_code_distance"] = int(dist.max()) if q.numel() else 0
    s_bits, rs_bits = s.view(torch.int32), rs.view(torch.int32)
    stats["scale_mismatches"] = int((s_bits != rs_bits).sum())
    if len(out) > 2:
        ro, rro = out[2], ref[2]
        stats["residual_mismatches"] = int((ro.view(torch.int16) != rro.view(torch.int16)).sum())
    else:
        stats["residual_mismatches"] = 0
    # Rows whose scale differs are the sum-order rows; a code that differs in a row whose scale is
    # identical can only come from the normalised value itself (also the sum order: rsqrt input).
    stats["fraction_codes"] = stats["diff_codes"] / max(1, stats["codes"])
    return stats


def gdn_fragile_values(args) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's ``gated_rms_norm`` output and which of its values are fragile: their fp32
    product (``gated_rms_norm_f32``), scaled by 1 -+ GDN_TRACE_REL, rounds to another value of
    the activation dtype."""
    from radiance.kernels import reference
    dtype = args[0].dtype
    p = reference.gated_rms_norm_f32(*args)
    y = p.to(dtype)
    return y, ((p * (1 - GDN_TRACE_REL)).to(dtype) != y) | ((p * (1 + GDN_TRACE_REL)).to(dtype) != y)


def gdn_untraced_codes(args, group: int, out, ref) -> int:
    """Differing codes of the gated norm that its two known causes do not explain.

    A code under an unchanged scale can differ only if its own value rounded the other way (the
    quant is exact given the scale), so that value must be fragile (gdn_fragile_values); a
    changed scale needs a changed group maximum, so the group must hold a fragile value as large
    as the reference's maximum, and then any of its codes may move."""
    y, fragile = gdn_fragile_values(args)
    m, n = y.shape
    g = group or n
    mag = y.float().abs().view(m, n // g, g)
    top_fragile = (fragile.view(m, n // g, g) & (mag == mag.amax(dim=-1, keepdim=True))).any(dim=-1)
    scale_same = (out[1].view(torch.int32) == ref[1].view(torch.int32)).view(m, n // g)
    explained = torch.where(scale_same, False, top_fragile).repeat_interleave(g, dim=1) | (
        fragile & scale_same.repeat_interleave(g, dim=1))
    differ = out[0].view(torch.uint8) != ref[0].view(torch.uint8)
    return int((differ & ~explained).sum())


def make_inputs(op: str, m: int, k: int, dtype, *, residual=True, gemma=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32) * scale).to(dtype)
    if op == "add_rms_quant":
        y = rnd(m, k)
        res = rnd(m, k) if residual else None
        w = rnd(k, scale=0.1) if gemma else (1.0 + rnd(k, scale=0.1).float()).to(dtype)
        return (y, res, w, EPS), {"gemma": gemma}
    if op == "silu_mul_quant":
        return (rnd(m, 2 * k, scale=2.0),), {}
    # gdn: z strided (a view into a wider buffer, as in the GDN projection output)
    x = rnd(m, k)
    zbuf = rnd(m, k + 256)
    z = zbuf[:, 128:128 + k]
    w = (1.0 + rnd(128, scale=0.1).float()).to(dtype)
    return (x, z, w, EPS), {}


def output_bytes(op: str, m: int, k: int, group: int, dtype, residual: bool) -> list[int]:
    sizes = [m * k, 4 * m * (k // group if group else 1)]
    if op == "add_rms_quant" and residual:
        sizes.append(m * k * torch.tensor([], dtype=dtype).element_size())
    return sizes


def run_case(op: str, m: int, k: int, dtype, group: int, *, residual=True, gemma=False, seed=0,
             inject_nonfinite=False):
    from radiance.kernels import ops, reference
    args, kw = make_inputs(op, m, k, dtype, residual=residual, gemma=gemma, seed=seed)
    if inject_nonfinite:
        first = args[0]
        first[0, 5] = float("nan")
        if m > 1:
            first[1, 7] = float("inf")
        if m > 2:
            first[2, 3] = -float("inf")
    kw["group"] = group
    fn_k, fn_r = getattr(ops, op), getattr(reference, op)
    sizes = output_bytes(op, m, k, group, dtype, residual)
    outs = []
    for poison in (0xA5, 0x5A):
        poison_allocator(sizes, poison)
        outs.append(fn_k(*args, **kw))
    torch.cuda.synchronize()
    # The op falls back to the reference where no kernel serves, or for rows not 16-byte
    # aligned; here the kernel must have run.
    assert ops._vector_aligned(*(t for t in args if isinstance(t, torch.Tensor)))
    served = [lib for key, lib in ops._decisions.items()
              if key[0] == op and key[2] == dtype and key[3] == k and key[4] == group]
    assert served and None not in served, (
        f"{op} M={m} K={k} group={group}: no kernel served the call (the reference ran): "
        f"{ops.unavailable_reason()}")
    ref = fn_r(*args, **kw)
    a, b = outs
    unwritten = sum(int((x.view(torch.uint8) != y.view(torch.uint8)).sum())
                    for x, y in zip(a, b) if x.numel())
    stats = diff_stats(a, ref)
    stats["unwritten_bytes"] = unwritten
    if op == "gdn_norm_quant":
        stats["untraced_codes"] = gdn_untraced_codes(args, group, a, ref)
    return stats


def _grid():
    for m, k in itertools.product(MS, KS):
        yield m, k


@pytest.mark.gpu
def test_poison_reaches_fresh_allocations():
    poison_allocator([4096], 0xA5)
    t = torch.empty(4096, dtype=torch.uint8, device="cuda")
    assert bool((t == 0xA5).all()), "the caching allocator did not hand the poisoned block back"


def _assert_ok(stats, case):
    assert stats["unwritten_bytes"] == 0, (case, stats)
    assert stats["residual_mismatches"] == 0, (case, stats)
    assert stats["max_code_distance"] <= 1, (case, stats)
    assert stats["fraction_codes"] <= MAX_CODE_FRACTION, (case, stats)
    assert stats.get("untraced_codes", 0) == 0, (case, stats)


def assert_nonfinite_bits_match(stats):
    """A case with NaN/Inf rows: scales and NaN codes bit for bit, other codes within one."""
    assert stats["unwritten_bytes"] == 0
    assert stats["scale_mismatches"] == 0, stats
    assert stats["nan_code_mismatches"] == 0, stats
    assert stats["diff_codes"] == 0 or stats["max_code_distance"] <= 1, stats
    assert stats["residual_mismatches"] == 0, stats


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("group", [0, 128])
@pytest.mark.parametrize("gemma", [False, True], ids=["plain", "gemma"])
@pytest.mark.parametrize("residual", [True, False], ids=["res", "nores"])
def test_add_rms_quant_grid(dtype, group, gemma, residual):
    for i, (m, k) in enumerate(_grid()):
        case = ("add_rms_quant", m, k, dtype, group, gemma, residual)
        _assert_ok(run_case("add_rms_quant", m, k, dtype, group, residual=residual, gemma=gemma,
                            seed=i), case)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("group", [0, 128])
@pytest.mark.parametrize("op", ["silu_mul_quant", "gdn_norm_quant"])
def test_other_ops_grid(op, dtype, group):
    for i, (m, k) in enumerate(_grid()):
        _assert_ok(run_case(op, m, k, dtype, group, seed=1000 + i), (op, m, k, dtype, group))


@pytest.mark.gpu
@pytest.mark.parametrize("group", [0, 128])
@pytest.mark.parametrize("op", ["add_rms_quant", "silu_mul_quant", "gdn_norm_quant"])
def test_nonfinite_rows_match_reference_bits(op, group):
    """Rows holding NaN/Inf: torch's amax propagates NaN, so such a row (or group) gets a NaN
    scale and NaN codes; an Inf gives an Inf amax. The kernel must give the very same bits."""
    stats = run_case(op, 8, 4096, torch.bfloat16, group, seed=7, inject_nonfinite=True)
    assert_nonfinite_bits_match(stats)


def test_gdn_trace_explains_only_fragile_codes():
    """The trace has teeth: on the reference's own output (CPU), a code moved at a value that is
    not fragile is reported, one moved at a fragile value is not."""
    from radiance.kernels import reference
    g = torch.Generator().manual_seed(3)
    m, n = 4, 1024
    x = torch.randn(m, n, generator=g).to(torch.bfloat16)
    z = torch.randn(m, n, generator=g).to(torch.bfloat16)
    w = (1.0 + 0.1 * torch.randn(128, generator=g)).to(torch.bfloat16)
    args = (x, z, w, EPS)
    for group in (0, 128):
        ref = reference.gdn_norm_quant(*args, group=group)
        assert gdn_untraced_codes(args, group, ref, ref) == 0
        fragile = gdn_fragile_values(args)[1]
        assert 0 < int(fragile.sum()) < m * n // 20
        for index, expect in ((int(fragile.view(-1).nonzero()[0]), 0),
                              (int((~fragile).view(-1).nonzero()[0]), 1)):
            q = ref[0].clone()
            q.view(torch.uint8).view(-1)[index] ^= 1  # one code step on the magnitude
            assert gdn_untraced_codes(args, group, (q, ref[1]), ref) == expect, (group, index)
        # a changed scale explains its group's codes only if the group's largest value is fragile
        y = gdn_fragile_values(args)[0]
        g = group or n
        mag = y.float().abs().view(m, n // g, g)
        top = (fragile.view(m, n // g, g) & (mag == mag.amax(dim=-1, keepdim=True))).any(dim=-1)
        row, col = (int(i) for i in (~top).nonzero()[0])
        scale = ref[1].clone().view(m, n // g)
        scale[row, col] = torch.nextafter(scale[row, col], torch.tensor(float("inf")))
        q = ref[0].clone()
        q.view(torch.uint8)[row, col * g + int((~fragile[row, col * g:(col + 1) * g]).nonzero()[0])] ^= 1
        assert gdn_untraced_codes(args, group, (q, scale.view(ref[1].shape)), ref) == 1, group
