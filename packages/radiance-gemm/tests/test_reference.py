"""The CPU provider (fp32 reference) against the float64 yardstick, and its input checks."""

import pytest
import torch

from radiance.gemm import providers, reference


def _operands(m, n, k, block=(128, 128), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) * 0.05
    q, sa = reference.quantize_activation(x, block[1])
    wq, sw = reference.quantize_weight(w, block)
    return q, wq, sa, sw


@pytest.mark.parametrize("m,n,k,block", [
    (1, 256, 512, (128, 128)),
    (7, 384, 1024, (128, 128)),
    (33, 200, 320, (128, 128)),   # N, K not multiples of the block: ragged last blocks
    (4, 256, 256, (64, 128)),
])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_cpu_reference_within_bf16_rounding_of_float64(m, n, k, block, out_dtype):
    q, wq, sa, sw = _operands(m, n, k, block)
    out = reference.block_fp8_mm(q, wq, sa, sw, out_dtype, block)
    ref = reference.block_fp8_mm(q, wq, sa, sw, torch.float64, block, torch.float64)
    assert out.dtype == out_dtype and out.shape == (m, n)
    err = (out.double() - ref).abs()
    assert (err <= reference.bf16_tolerance(ref)).all(), err.max()


def test_cpu_provider_through_the_provider_table_matches_reference():
    q, wq, sa, sw = _operands(5, 256, 384)
    out = providers.run("cpu_reference", q, wq, sa, sw, torch.bfloat16)
    assert torch.equal(out, reference.block_fp8_mm(q, wq, sa, sw, torch.bfloat16))


def test_dequantize_matches_explicit_block_loop():
    _, wq, _, sw = _operands(1, 200, 320)
    deq = reference.dequantize_weight(wq, sw, (128, 128), torch.float64)
    for bi in range(sw.shape[0]):
        for bj in range(sw.shape[1]):
            blk = wq[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128].double() * float(sw[bi, bj])
            assert torch.equal(deq[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128], blk)


def test_quantize_activation_mirrors_vllm_native_group_quant():
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    x = torch.randn(6, 512, dtype=torch.bfloat16)
    with set_current_vllm_config(VllmConfig()):
        q_ref, s_ref = QuantFP8(False, GroupShape(1, 128)).forward_native(x)
    q, s = reference.quantize_activation(x, 128)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s, s_ref)


@pytest.mark.parametrize("bad,exc", [
    (lambda q, w, sa, sw: (q.float(), w, sa, sw), TypeError),
    (lambda q, w, sa, sw: (q, w[:, :256], sa, sw), ValueError),
    (lambda q, w, sa, sw: (q, w, sa[:, :1].repeat(1, 3), sw), ValueError),
    (lambda q, w, sa, sw: (q, w, sa.double(), sw), TypeError),
    (lambda q, w, sa, sw: (q, w, sa, sw[:, :1]), ValueError),
])
def test_bad_operands_raise_before_any_launch(bad, exc):
    args = bad(*_operands(3, 256, 512))
    with pytest.raises(exc):
        providers.run("cpu_reference", *args, torch.bfloat16)
