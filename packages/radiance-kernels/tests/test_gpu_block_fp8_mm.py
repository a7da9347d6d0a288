"""The decode block-FP8 GEMM kernel against its float64 specification on the GPU at hand: every M
from 1 to 16, every launch variant, the three activation-scale layouts, the three output dtypes,
CUDA-graph replay, rows past M never read, the split-K counters left zero."""

import pytest
import torch

from radiance.kernels import reference
from radiance.kernels.block_fp8_mm import block_fp8_mm, unsupported_reason

pytestmark = pytest.mark.gpu

FP8_MAX = 448.0


@pytest.fixture(autouse=True)
def _needs_kernel():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    why = unsupported_reason("cuda")
    if why:
        pytest.skip(why)


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


def _check(out, a, sa, b, sb, rel=2.0**-7):
    ref = reference.block_fp8_mm(a, b, sa, sb, torch.float64, compute_dtype=torch.float64)
    amax = ref.abs().amax()
    tol = ref.abs() * rel + amax * rel / 8
    err = (out.double() - ref).abs()
    assert torch.isfinite(out).all()
    assert (err <= tol).all(), f"{int((err > tol).sum())} of {err.numel()} off, max {float(err.max()):.3g}"


@pytest.mark.parametrize("m", range(1, 17))
def test_every_m_matches_float64_reference(m):
    a, sa, b, sb = _operands(m, 2048, 4096, seed=m)
    _check(block_fp8_mm(a, b, sa, sb), a, sa, b, sb)


@pytest.mark.parametrize("m", [1, 8, 9, 16])
@pytest.mark.parametrize("warps,row_warps,stages,split", [(8, 1, 2, 1), (4, 1, 3, 4)])
def test_large_weight_without_activation_prefetch(m, warps, row_warps, stages, split):
    """Past 32 MiB of weight the kernel requests activations in each group's own iteration (no
    prefetch one group ahead): the other code path, checked the same way."""
    a, sa, b, sb = _operands(m, 5120, 7168, seed=100 + m)
    assert b.numel() > 32 << 20
    _check(block_fp8_mm(a, b, sa, sb, split=split, warps=warps, stages=stages, row_warps=row_warps),
           a, sa, b, sb)


@pytest.mark.parametrize("split", [1, 2, 3, 8, 64])
@pytest.mark.parametrize("warps,row_warps,stages", [(4, 1, 2), (4, 1, 5), (4, 2, 3), (4, 4, 4),
                                                    (8, 1, 2), (8, 2, 2), (8, 4, 2), (8, 8, 2)])
@pytest.mark.parametrize("m", [1, 9])
def test_launch_variants(split, warps, row_warps, stages, m):
    # K = 1920: 15 groups, so no variant divides it evenly and the chunk tails are exercised.
    a, sa, b, sb = _operands(m, 1024, 1920, seed=split * 10 + warps + stages + row_warps)
    out = block_fp8_mm(a, b, sa, sb, split=split, warps=warps, stages=stages, row_warps=row_warps)
    _check(out, a, sa, b, sb)


@pytest.mark.parametrize("layout", ["row_major", "column_major", "per_token_stride0"])
def test_activation_scale_layouts(layout):
    m, n, k = 7, 1536, 2048
    a, sa, b, sb = _operands(m, n, k)
    if layout == "column_major":
        sa = sa.t().contiguous().t()
    elif layout == "per_token_stride0":
        sa = reference.group_scales(sa[:, 0].contiguous(), m, k // 128)
        assert sa.stride(1) == 0
    _check(block_fp8_mm(a, b, sa, sb, split=2), a, sa, b, sb)
    assert torch.equal(block_fp8_mm(a, b, sa, sb), block_fp8_mm(a, b, sa.contiguous(), sb))


@pytest.mark.parametrize("out_dtype,rel", [(torch.bfloat16, 2.0**-7), (torch.float16, 2.0**-10),
                                           (torch.float32, 2.0**-16)])
def test_output_dtypes(out_dtype, rel):
    a, sa, b, sb = _operands(16, 2048, 2048)
    out = block_fp8_mm(a, b, sa, sb, out_dtype, split=4)
    assert out.dtype == out_dtype and out.shape == (16, 2048)
    _check(out, a, sa, b, sb, rel)


def test_rows_past_m_and_strided_rows_are_never_read():
    m, n, k = 5, 1024, 2048
    a, sa, b, sb = _operands(m, n, k)
    # a is a row-strided view whose padding columns and following rows are NaN codes
    buf = torch.full((16, k + 256), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    buf[:m, :k] = a
    view = buf[:m, :k]
    assert view.stride(0) == k + 256
    out = block_fp8_mm(view, b, sa, sb)
    _check(out, a, sa, b, sb)


def test_cuda_graph_replay_and_counters():
    m, n, k = 12, 2048, 4096
    a, sa, b, sb = _operands(m, n, k)
    counters = torch.zeros(n // 16, dtype=torch.int32, device="cuda")
    eager = block_fp8_mm(a, b, sa, sb, split=4, counters=counters)
    a_in, sa_in = a.clone(), sa.clone()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        block_fp8_mm(a_in, b, sa_in, sb, split=4, counters=counters)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = block_fp8_mm(a_in, b, sa_in, sb, split=4, counters=counters)
    for seed in range(20):
        a2, sa2, _, _ = _operands(m, n, k, seed=100 + seed)
        a_in.copy_(a2)
        sa_in.copy_(sa2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, block_fp8_mm(a2, b, sa2, sb, split=4, counters=counters))
    a_in.copy_(a)
    sa_in.copy_(sa)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
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
