"""Every GPU provider except aiter_preshuffle (not covered: it reads a shuffled weight) against the
float64 reference on the GPU at hand (M = 1 included), the pre-quantized per-token path, the
split-K fixup's scratch contract, and the route custom op under torch.compile with dynamic M.
Imports only radiance.gemm's provider modules (no vLLM)."""

import pytest
import torch

from radiance.gemm import dispatch, providers, reference
from radiance.gemm.platform import device_platform, sm_count

pytestmark = pytest.mark.gpu

SHAPES = [(1, 2048, 4096), (2, 1024, 2048), (5, 2000, 1536), (8, 4096, 2048), (16, 6144, 2048),
          (17, 1024, 512), (64, 2048, 2048), (300, 1536, 1024), (2048, 2048, 4096)]
CONFIGS = {
    "cuda_decode": ["skauto-w4-r1-s4", "sk1-w8-r1-s2", "sk4-w4-r4-s5", "sk1-w8-r8-s2", "sk2-w4-r2-s3",
                    "skauto-w4-r4-s4-wg1", "sk3-w8-r8-s3-wg1", "sk2-w4-r4-s3-wg2"],
    "cuda_tma": ["skauto-s8", "sk1-s4", "sk3-s6", "sk16-s12"],
    "triton_splitk": ["bn64-skauto-w4-s4-f1", "bn64-skauto-w4-s4-f2", "bn32-sk4-w4-s4-f1",
                      "bn64-sk1-w4-s4-f0"],
    "triton_generic": ["bmauto-bn128-w4-s3", "bm128-bn128-w8-s3"],
    "torch_blockwise": [""],
    "aiter_small_m": [""],
}


def _operands(m, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.05
    q, sa = reference.quantize_activation(x, 128)
    wq, sw = reference.quantize_weight(w)
    return q, wq, sa, sw


def _cases():
    for name, configs in CONFIGS.items():
        for cfg in configs:
            for m, n, k in SHAPES:
                yield pytest.param(name, cfg, m, n, k, id=f"{name}[{cfg}]-{m}x{n}x{k}")


def _servable(name, m, n, k, cfg=""):
    platform, arch = device_platform("cuda")
    p = providers.provider(name)
    why = p.serves(platform, arch, n, k, (128, 128), torch.float8_e4m3fn)
    if why is None and not p.m_min <= m <= p.m_max:
        why = f"M={m} outside {p.m_min}-{p.m_max}"
    if why is None and name == "cuda_decode" and any(f in cfg.split("-") for f in ("wg1", "wg2")):
        from radiance.kernels.block_fp8_mm import unsupported_reason

        why = unsupported_reason("cuda", "wgmma")
    return why


@pytest.mark.parametrize("name,cfg,m,n,k", list(_cases()))
def test_provider_matches_float64_reference(name, cfg, m, n, k):
    why = _servable(name, m, n, k, cfg)
    if why:
        pytest.skip(why)
    q, wq, sa, sw = _operands(m, n, k)
    out = providers.run(name, q, wq, sa, sw, torch.bfloat16, cfg or None)
    ref = reference.block_fp8_mm(q, wq, sa, sw, torch.float64, compute_dtype=torch.float64)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    err = (out.double() - ref).abs()
    bad = err > reference.bf16_tolerance(ref)
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} off; max err {float(err.max()):.4g}"


@pytest.mark.parametrize("name,cfg", [("cuda_decode", "sk2-w4-r2-s4"), ("cuda_tma", "sk2-s8"),
                                      ("triton_splitk", "bn64-skauto-w4-s4-f1"),
                                      ("triton_generic", "bmauto-bn128-w4-s3"),
                                      ("torch_blockwise", "")])
def test_per_token_stride0_scales_equal_group_scales_bit_for_bit(name, cfg):
    m, n, k = 8, 2048, 2048
    if _servable(name, m, n, k):
        pytest.skip(_servable(name, m, n, k))
    q, wq, _, sw = _operands(m, n, k)
    s_tok = torch.rand(m, device="cuda") * 0.01 + 1e-3
    view = reference.group_scales(s_tok, m, k // 128)
    assert view.stride() == (1, 0) and view.data_ptr() == s_tok.data_ptr()
    a = providers.run(name, q, wq, view, sw, torch.bfloat16, cfg or None)
    b = providers.run(name, q, wq, view.contiguous(), sw, torch.bfloat16, cfg or None)
    assert torch.equal(a, b)


@pytest.mark.parametrize("name,cfg", [("triton_splitk", "bn64-sk8-w4-s4-f1"),
                                      ("cuda_decode", "sk8-w4-r1-s4"), ("cuda_decode", "sk4-w8-r4-s2"),
                                      ("cuda_decode", "sk8-w4-r4-s3-wg1"), ("cuda_tma", "sk8-s6")])
def test_splitk_fixup_leaves_counters_zero_and_is_deterministic(name, cfg):
    m, n, k = 12, 4096, 4096
    if _servable(name, m, n, k, cfg):
        pytest.skip(_servable(name, m, n, k, cfg))
    q, wq, sa, sw = _operands(m, n, k)
    counters = torch.zeros(n // 16, dtype=torch.int32, device="cuda")
    first = providers.run(name, q, wq, sa, sw, torch.bfloat16, cfg, counters)
    for _ in range(50):
        again = providers.run(name, q, wq, sa, sw, torch.bfloat16, cfg, counters)
        assert torch.equal(first, again)
    torch.cuda.synchronize()
    assert int(counters.abs().sum()) == 0


def test_route_op_compiles_once_and_branches_on_m_at_run_time():
    n, k = 2048, 2048
    platform, arch = device_platform("cuda")
    route = list(dispatch.plan(platform, arch, n, k, sms=sm_count("cuda")))
    _, wq, _, sw = _operands(1, n, k)
    counters = torch.zeros(n // 16, dtype=torch.int32, device="cuda")

    def linear(q, sa):
        return torch.ops.radiance_gemm.block_fp8_mm(q, wq, sa, sw, counters, route, torch.bfloat16)

    compiled = torch.compile(linear, fullgraph=True, dynamic=True)
    for m in (1, 3, 16, 40, 256):
        q, _, sa, _ = _operands(m, n, k, seed=m)
        out = compiled(q, sa)
        ref = reference.block_fp8_mm(q, wq, sa, sw, torch.float64, compute_dtype=torch.float64)
        assert ((out.double() - ref).abs() <= reference.bf16_tolerance(ref)).all(), m
        assert torch.equal(out, dispatch.run_route(route, q, wq, sa, sw, torch.bfloat16, counters))


def test_bad_input_raises_before_launch():
    q, wq, sa, sw = _operands(4, 256, 512)
    with pytest.raises(ValueError):
        providers.run("triton_generic", q, wq.cpu(), sa, sw, torch.bfloat16)
    with pytest.raises(TypeError):
        providers.run("triton_splitk", q.float(), wq, sa, sw, torch.bfloat16)
