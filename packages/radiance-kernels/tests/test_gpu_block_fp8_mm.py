"""The decode block-FP8 GEMM kernels (mma.sync; wgmma and TMA on sm_90) against their float64
specification on the GPU at hand: every M from 1 to 16, every launch variant, the three
activation-scale layouts, the three output dtypes, CUDA-graph replay, rows past M never read, the
split-K counters left zero."""

import pytest
import torch

from radiance.kernels import reference
from radiance.kernels.block_fp8_mm import block_fp8_mm, block_fp8_mm_tma, unsupported_reason

pytestmark = pytest.mark.gpu

FP8_MAX = 448.0


@pytest.fixture(autouse=True)
def _needs_kernel():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    why = unsupported_reason("cuda")
    if why:
        pytest.skip(why)


# The three kernels; wgmma and tma where the device has warpgroup MMAs (sm_90).
KERNELS = ["mma_sync", "wgmma", "tma"]


def _needs(kernel: str):
    why = unsupported_reason("cuda", kernel)
    if why:
        pytest.skip(why)


def _run(kernel: str, a, b, sa, sb, out_dtype=torch.bfloat16, split=1, counters=None, **launch):
    """One kernel's product; ``launch`` overrides its default launch config (the mma.sync
    kernel's own, one warpgroup of 4 warps for wgmma, 8 stages for tma)."""
    if kernel == "tma":
        return block_fp8_mm_tma(a, b, sa, sb, out_dtype, split=split, counters=counters, **launch)
    if kernel == "wgmma":
        launch = {"warps": 4, "row_warps": 4, "wgmma": 1, **launch}
    return block_fp8_mm(a, b, sa, sb, out_dtype, split=split, counters=counters, **launch)


def _quantize(x: torch.Tensor, rows: int, cols: int):
    """fp8 codes and fp32 scales of ``x`` in rows x cols blocks (amax / 448 per block)."""
    n, k = x.shape
    blocks = x.view(n // rows, rows, k // cols, cols)
    s = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=1e-12)
    q = (blocks / s[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(n, k), s.float()


def _operands(m, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g) * torch.rand(m, 1, device="cuda", generator=g) * 4
    w = torch.randn(n, k, device="cuda", generator=g) * 0.05
    a, sa = _quantize(x, 1, 128)
    b, sb = _quantize(w, 128, 128)
    return a, sa, b, sb


def _wgmma_step_columns(kernel: str) -> torch.Tensor:
    """[4, 32]: the columns of a 128-column group that each k32 wgmma of the kernel multiplies:
    in order for the TMA kernel; for the wgmma kernel K relabelled as in mma_step (step 2h + s
    takes bytes 8s..8s+7 of each thread's 16-byte slice 16q.. of half h)."""
    if kernel == "tma":
        return torch.arange(128).view(4, 32)
    return torch.tensor([[64 * (j // 2) + 16 * q + 8 * (j % 2) + i for q in range(4) for i in range(8)]
                         for j in range(4)])


def _wgmma_loss_bound(a, sa, b, sb, kernel: str) -> torch.Tensor:
    """[M, N] upper bound of what Hopper's fp8 wgmma may lose against exact sums. Its datapath
    (MMA-Sim, arXiv:2511.10909): per k32 instruction the 32 products and the accumulator are
    aligned to the largest term's exponent E and each truncated to 13 fractional bits (< 2^(E-13)
    lost a term), summed exactly, and the sum truncated to 14 significant bits. The kernel chains
    the 4 instructions of a 128-column group and promotes the group to fp32 (times sa * sb)."""
    m, k = a.shape
    n, groups = b.shape[0], k // 128
    cols = (torch.arange(groups)[:, None, None] * 128 + _wgmma_step_columns(kernel)).reshape(-1).to(a.device)
    af = a.float()[:, cols].view(m, 1, groups, 4, 32)
    sbn = sb.double().repeat_interleave(128, 0)[:n]
    bound = torch.empty(m, n, dtype=torch.float64, device=a.device)
    for n0 in range(0, n, 256):
        prod = af * b[n0:n0 + 256].float()[:, cols].view(1, -1, groups, 4, 32)  # exact in fp32
        top = prod.abs().amax(-1).double()
        step = prod.double().sum(-1)
        del prod
        done = torch.zeros_like(step[..., 0])  # exact sum of the steps so far
        lost = torch.zeros_like(done)
        for j in range(4):
            held = done.abs() + lost  # the accumulator entering step j, at most
            e = torch.floor(torch.log2(torch.maximum(top[..., j], held).clamp_min(2.0**-60))) + 1
            aligned = 33 * torch.exp2(e - 13)
            done = done + step[..., j]
            lost = lost + aligned + (done.abs() + lost + aligned) * 2.0**-13
        scale = sa.double()[:, None, :] * sbn[n0:n0 + 256][None]
        bound[:, n0:n0 + 256] = (lost * scale.abs()).sum(-1)
    return bound


def _check(out, a, sa, b, sb, rel=2.0**-7, kernel="mma_sync"):
    """out within ``rel`` of the float64 reference (plus 1/8 of it at the output's largest value);
    the wgmma and TMA kernels also within what the fp8 wgmma datapath may lose
    (_wgmma_loss_bound)."""
    ref = reference.block_fp8_mm(a, b, sa, sb, torch.float64, compute_dtype=torch.float64)
    amax = ref.abs().amax()
    tol = ref.abs() * rel + amax * rel / 8
    if kernel != "mma_sync":
        tol = tol + _wgmma_loss_bound(a, sa, b, sb, kernel)
    err = (out.double() - ref).abs()
    assert torch.isfinite(out).all()
    assert (err <= tol).all(), f"{int((err > tol).sum())} of {err.numel()} off, max {float(err.max()):.3g}"


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("m", range(1, 17))
def test_every_m_matches_float64_reference(m, kernel):
    _needs(kernel)
    a, sa, b, sb = _operands(m, 2048, 4096, seed=m)
    _check(_run(kernel, a, b, sa, sb), a, sa, b, sb, kernel=kernel)


@pytest.mark.parametrize("m", [1, 8, 9, 16])
@pytest.mark.parametrize("warps,row_warps,stages,split,wgmma", [
    (8, 1, 2, 1, 0), (4, 1, 3, 4, 0), (8, 8, 3, 1, 1), (4, 4, 4, 8, 1), (8, 8, 2, 2, 2)])
def test_large_weight_without_activation_prefetch(m, warps, row_warps, stages, split, wgmma):
    """Past 32 MiB of weight the kernel requests activations in each group's own iteration (no
    prefetch one group ahead): the other code path, checked the same way."""
    kernel = "wgmma" if wgmma else "mma_sync"
    _needs(kernel)
    a, sa, b, sb = _operands(m, 5120, 7168, seed=100 + m)
    assert b.numel() > 32 << 20
    _check(block_fp8_mm(a, b, sa, sb, split=split, warps=warps, stages=stages, row_warps=row_warps,
                        wgmma=wgmma), a, sa, b, sb, kernel=kernel)


@pytest.mark.parametrize("split", [1, 2, 3, 8, 64])
@pytest.mark.parametrize("warps,row_warps,stages,wgmma", [
    (4, 1, 2, 0), (4, 1, 5, 0), (4, 2, 3, 0), (4, 4, 4, 0), (8, 1, 2, 0), (8, 2, 2, 0),
    (8, 4, 2, 0), (8, 8, 2, 0),
    (4, 4, 2, 1), (4, 4, 5, 1), (8, 8, 2, 1), (8, 8, 3, 1), (4, 4, 2, 2), (4, 4, 3, 2), (8, 8, 2, 2)])
@pytest.mark.parametrize("m", [1, 9, 16])
def test_launch_variants(split, warps, row_warps, stages, wgmma, m):
    # K = 1920: 15 groups, so no variant divides it evenly and the tails (of a warp's groups, of
    # the wgmma kernel's 4-group activation chunks) are exercised.
    kernel = "wgmma" if wgmma else "mma_sync"
    _needs(kernel)
    a, sa, b, sb = _operands(m, 1024, 1920, seed=split * 10 + warps + stages + row_warps)
    out = block_fp8_mm(a, b, sa, sb, split=split, warps=warps, stages=stages, row_warps=row_warps,
                       wgmma=wgmma)
    _check(out, a, sa, b, sb, kernel=kernel)


@pytest.mark.parametrize("split", [1, 2, 3, 8, 64])
@pytest.mark.parametrize("stages", [4, 6, 8, 12])
@pytest.mark.parametrize("m", [1, 9, 16])
def test_tma_launch_variants(split, stages, m):
    # K = 1920: 15 groups, so the ring wraps a partial number of times and splits are uneven;
    # N = 1152: 18 blocks of 64 rows, two to each 128-row weight scale.
    _needs("tma")
    a, sa, b, sb = _operands(m, 1152, 1920, seed=split * 10 + stages)
    _check(block_fp8_mm_tma(a, b, sa, sb, split=split, stages=stages), a, sa, b, sb, kernel="tma")


def test_tma_maps_follow_address_shape_and_contents():
    """The launch reuses tensor maps it encoded before for the same address and shape: a view
    with the same first row but fewer rows, new contents at a reused address, and the same
    address read at another row stride must each give the product of what is in memory now."""
    _needs("tma")
    a, sa, b, sb = _operands(5, 2048, 1024, seed=7)
    for rows in (2048, 1024, 2048):  # same base address, 2048 then 1024 then 2048 rows
        _check(block_fp8_mm_tma(a, b[:rows], sa, sb[:rows // 128], split=2), a, sa, b[:rows],
               sb[:rows // 128], kernel="tma")
    b1, sb1 = b.clone(), sb.clone()
    a2, sa2, b2, sb2 = _operands(5, 2048, 1024, seed=8)
    a.copy_(a2), b.copy_(b2), sa.copy_(sa2), sb.copy_(sb2)  # new contents, same addresses
    _check(block_fp8_mm_tma(a, b, sa, sb, split=2), a2, sa2, b2, sb2, kernel="tma")
    # One buffer read at two row strides from the same address: a map reused across strides
    # would read the second call's weight with the first one's stride.
    buf = torch.zeros(2048 * 1152, dtype=torch.uint8, device="cuda")
    dense = buf[:2048 * 1024].view(2048, 1024).view(torch.float8_e4m3fn)
    dense.copy_(b2)
    _check(block_fp8_mm_tma(a2, dense, sa2, sb2, split=2), a2, sa2, b2, sb2, kernel="tma")
    strided = buf.view(2048, 1152)[:, :1024].view(torch.float8_e4m3fn)
    strided.copy_(b1)  # the first weight's values, now 1152 bytes a row
    assert strided.data_ptr() == dense.data_ptr() and strided.stride(0) == 1152
    _check(block_fp8_mm_tma(a2, strided, sa2, sb1, split=2), a2, sa2, b1, sb1, kernel="tma")


@pytest.mark.parametrize("m", [1, 8, 9, 16])
def test_tma_large_weight(m):
    """A 37 MB weight, every group of a long K range through a ring that wraps many times."""
    _needs("tma")
    a, sa, b, sb = _operands(m, 5120, 7168, seed=200 + m)
    _check(block_fp8_mm_tma(a, b, sa, sb, split=2, stages=6), a, sa, b, sb, kernel="tma")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", ["row_major", "column_major", "per_token_stride0"])
def test_activation_scale_layouts(layout, kernel):
    _needs(kernel)
    kw = {"warps": 8, "row_warps": 8, "stages": 2} if kernel == "wgmma" else {}
    m, n, k = 7, 1536, 2048
    a, sa, b, sb = _operands(m, n, k)
    if layout == "column_major":
        sa = sa.t().contiguous().t()
    elif layout == "per_token_stride0":
        sa = reference.group_scales(sa[:, 0].contiguous(), m, k // 128)
        assert sa.stride(1) == 0
    _check(_run(kernel, a, b, sa, sb, split=2, **kw), a, sa, b, sb, kernel=kernel)
    assert torch.equal(_run(kernel, a, b, sa, sb, **kw), _run(kernel, a, b, sa.contiguous(), sb, **kw))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("out_dtype,rel", [(torch.bfloat16, 2.0**-7), (torch.float16, 2.0**-10),
                                           (torch.float32, 2.0**-16)])
def test_output_dtypes(out_dtype, rel, kernel):
    _needs(kernel)
    kw = {"stages": 3} if kernel == "wgmma" else {}
    a, sa, b, sb = _operands(16, 2048, 2048)
    out = _run(kernel, a, b, sa, sb, out_dtype, split=4, **kw)
    assert out.dtype == out_dtype and out.shape == (16, 2048)
    _check(out, a, sa, b, sb, rel, kernel=kernel)


@pytest.mark.parametrize("kernel", KERNELS)
def test_rows_past_m_and_strided_rows_are_never_read(kernel):
    _needs(kernel)
    m, n, k = 5, 1024, 2048
    a, sa, b, sb = _operands(m, n, k)
    # a is a row-strided view whose padding columns and following rows are NaN codes
    buf = torch.full((16, k + 256), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    buf[:m, :k] = a
    view = buf[:m, :k]
    assert view.stride(0) == k + 256
    out = _run(kernel, view, b, sa, sb)
    _check(out, a, sa, b, sb, kernel=kernel)


@pytest.mark.parametrize("kernel", KERNELS)
def test_cuda_graph_replay_and_counters(kernel):
    _needs(kernel)
    kw = {"warps": 8, "row_warps": 8, "stages": 2} if kernel == "wgmma" else {}
    m, n, k = 12, 2048, 4096
    a, sa, b, sb = _operands(m, n, k)
    counters = torch.zeros(n // 16, dtype=torch.int32, device="cuda")
    eager = _run(kernel, a, b, sa, sb, split=4, counters=counters, **kw)
    a_in, sa_in = a.clone(), sa.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the eager call above shares the counters
    with torch.cuda.stream(stream):
        _run(kernel, a_in, b, sa_in, sb, split=4, counters=counters, **kw)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _run(kernel, a_in, b, sa_in, sb, split=4, counters=counters, **kw)
    for seed in range(20):
        a2, sa2, _, _ = _operands(m, n, k, seed=100 + seed)
        a_in.copy_(a2)
        sa_in.copy_(sa2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, _run(kernel, a2, b, sa2, sb, split=4, counters=counters, **kw))
    a_in.copy_(a)
    sa_in.copy_(sa)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    assert int(counters.abs().sum()) == 0


@pytest.mark.parametrize("prefetch", [0, 64])
@pytest.mark.parametrize("kernel", KERNELS)
def test_overlapped_launches_keep_stream_order(kernel, prefetch):
    """A decode step's chain, layer after layer in one stream: add_rms_quant's codes feed the
    GEMM, whose output is the next add_rms_quant's input, the GEMMs sharing one split-K counter
    buffer. Launched with overlap_next, each GEMM lets the next kernel start before its own
    main loop (and with l2_prefetch requests its weight into L2 before its wait); every layer's
    output must still equal the chain launched without either, bit for bit, eagerly and over
    CUDA-graph replays with fresh inputs (a read of data not yet written, or a counter shared too
    early, would show here). With prefetch the K range is not split, so that every kernel's
    block has groups past its ring's first requests to prefetch (16 groups against at most 8)."""
    _needs(kernel)
    from radiance.kernels import ops

    m, n, layers = 8, 2048, 6
    split = 1 if prefetch else 4
    g = torch.Generator(device="cuda").manual_seed(7)
    weights = [_quantize(torch.randn(n, n, device="cuda", generator=g) * 0.05, 128, 128)
               for _ in range(layers)]
    norm_w = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(torch.bfloat16)
    counters = torch.zeros(n // 16, dtype=torch.int32, device="cuda")
    y_in = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)
    res_in = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)

    def chain(overlap_next: bool) -> list[torch.Tensor]:
        y, res, outs = y_in, res_in, []
        for b, sb in weights:
            q, s, res = ops.add_rms_quant(y, res, norm_w, 1e-6, group=128)
            y = _run(kernel, q, b, s, sb, split=split, counters=counters, overlap_next=overlap_next,
                     l2_prefetch=prefetch if overlap_next else 0)
            outs.append(y)
        return outs

    plain = chain(False)
    torch.cuda.synchronize()
    for got, want in zip(chain(True), plain):
        assert torch.equal(got, want)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        chain(True)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain(True)
    for seed in range(10):
        gs = torch.Generator(device="cuda").manual_seed(200 + seed)
        y_in.copy_(torch.randn(m, n, device="cuda", generator=gs))
        res_in.copy_(torch.randn(m, n, device="cuda", generator=gs))
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(captured, chain(False)):
            assert torch.equal(got, want)
    assert int(counters.abs().sum()) == 0


def test_bad_launch_raises():
    a, sa, b, sb = _operands(4, 256, 512)
    with pytest.raises(ValueError, match="out of range"):
        block_fp8_mm(torch.cat([a] * 5), b, torch.cat([sa] * 5), sb)
    with pytest.raises(ValueError, match="one CUDA device"):
        block_fp8_mm(a, b, sa, sb.cpu())
    with pytest.raises(ValueError, match="16-byte"):
        block_fp8_mm(a.view(torch.uint8)[:, 1:129].view(torch.float8_e4m3fn), b[:, :128],
                     sa[:, :1].contiguous(), sb[:, :1].contiguous())
    for bad in (-1, 2**20, True, 1.5):
        with pytest.raises(ValueError, match="l2_prefetch"):
            block_fp8_mm(a, b, sa, sb, l2_prefetch=bad)
