"""The vLLM kernel class inside the installed vLLM (CPU build): list position, load, apply."""

import pytest
import torch

pytest.importorskip("vllm")

from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.kernels import linear as kernels  # noqa: E402
from vllm.model_executor.layers.quantization.utils.quant_utils import (  # noqa: E402
    GroupShape,
    create_fp8_quant_key,
)
from vllm.platforms import PlatformEnum  # noqa: E402

import radiance.gemm  # noqa: E402
from radiance.gemm import reference, vllm_patches  # noqa: E402
from radiance.gemm.kernel import RadianceBlockFp8LinearKernel  # noqa: E402


def test_install_puts_the_kernel_first_on_cuda_rocm_cpu_and_is_idempotent():
    assert vllm_patches.install()[0]
    assert vllm_patches.install()[0]
    for platform in (PlatformEnum.CUDA, PlatformEnum.ROCM, PlatformEnum.CPU):
        lst = kernels._POSSIBLE_FP8_BLOCK_KERNELS[platform]
        assert lst[0] is RadianceBlockFp8LinearKernel
        assert lst.count(RadianceBlockFp8LinearKernel) == 1


def _layer(n, k, block=(128, 128), seed=0):
    vllm_patches.install()
    g = torch.Generator().manual_seed(seed)
    act = create_fp8_quant_key(static=False, group_shape=GroupShape(1, block[1]))
    wkey = create_fp8_quant_key(static=True, group_shape=GroupShape(*block))
    kern = kernels.init_fp8_linear_kernel(
        activation_quant_key=act, weight_quant_key=wkey, input_dtype=torch.bfloat16,
        out_dtype=torch.bfloat16, weight_shape=(n, k))
    layer = torch.nn.Module()
    wq, ws = reference.quantize_weight(torch.randn(n, k, generator=g) * 0.05, block)
    layer.weight = torch.nn.Parameter(wq, requires_grad=False)
    layer.weight_scale_inv = torch.nn.Parameter(ws, requires_grad=False)
    layer.input_scale = None
    kern.process_weights_after_loading(layer)
    return kern, layer


@pytest.fixture
def vllm_config():
    with set_current_vllm_config(VllmConfig()):
        yield


@pytest.mark.parametrize("m,n,k,block", [(1, 256, 512, (128, 128)), (9, 384, 640, (128, 128)),
                                         (3, 256, 256, (64, 128))])
def test_vllm_chooses_it_and_output_is_within_bf16_rounding_of_float64(vllm_config, m, n, k, block):
    kern, layer = _layer(n, k, block)
    assert isinstance(kern, RadianceBlockFp8LinearKernel)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    out = kern.apply_weights(layer, x)
    q, s = kern.quant_fp8(x, None, None)
    ref = reference.block_fp8_mm(q, layer.weight, s, layer.weight_scale_inv, torch.float64,
                                 block, torch.float64)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert ((out.double() - ref).abs() <= reference.bf16_tolerance(ref)).all()
    # the weight keeps its logical [N, K] meaning, and the true sizes are recorded
    assert layer.weight.shape == (n, k) and layer.radiance_weight_layout == "plain"
    assert (layer.radiance_gemm_n, layer.radiance_gemm_k) == (n, k)


def test_capability_flag_and_accepts_prequantized(vllm_config):
    _, layer = _layer(256, 512)
    assert layer.radiance_fp8_input_group == 128
    assert radiance.gemm.accepts_prequantized(layer) == 128
    assert radiance.gemm.accepts_prequantized(torch.nn.Linear(4, 4)) is None


def test_tuple_input_equals_activation_input_and_per_token_equals_groups(vllm_config):
    kern, layer = _layer(384, 512)
    x = torch.randn(2, 3, 512, dtype=torch.bfloat16)  # leading dims are kept
    out = kern.apply_weights(layer, x)
    q, s = kern.quant_fp8(x.reshape(-1, 512), None, None)
    via_tuple = kern.apply_weights(layer, (q.view(2, 3, 512), s.view(2, 3, 4)))
    assert via_tuple.shape == (2, 3, 384) and torch.equal(via_tuple, out)

    s_tok = s.amax(dim=1)  # one scale per token, requantize with it
    q_tok = (q.float() * s.repeat_interleave(128, 1) / s_tok[:, None]).to(torch.float8_e4m3fn)
    a = kern.apply_weights(layer, (q_tok, s_tok))
    b = kern.apply_weights(layer, (q_tok, s_tok[:, None].repeat(1, 4).contiguous()))
    assert torch.equal(a, b)


def test_tuple_input_with_leading_dims_takes_flattened_scales(vllm_config):
    kern, layer = _layer(384, 512)
    x = torch.randn(6, 512, dtype=torch.bfloat16)
    q, s = kern.quant_fp8(x, None, None)
    flat = kern.apply_weights(layer, (q, s))
    # q [2, 3, K] with its group scale flattened to [M, K/128] = [6, 4]
    grouped = kern.apply_weights(layer, (q.view(2, 3, 512), s.reshape(6, 4)))
    assert grouped.shape == (2, 3, 384) and torch.equal(grouped.view(6, 384), flat)
    # and a per-token scale flattened to [M] = [6]
    s_tok = s.amax(dim=1)
    q_tok = (q.float() * s.repeat_interleave(128, 1) / s_tok[:, None]).to(torch.float8_e4m3fn)
    by_token = kern.apply_weights(layer, (q_tok.view(2, 3, 512), s_tok))
    assert torch.equal(by_token.view(6, 384), kern.apply_weights(layer, (q_tok, s_tok)))
    # a group scale of the wrong width or row count is a ValueError, not a reshape error
    with pytest.raises(ValueError, match=r"\[M, K/group\]=\[6, 4\], got \[6, 3\]"):
        kern.apply_weights(layer, (q.view(2, 3, 512), torch.ones(6, 3)))
    with pytest.raises(ValueError, match=r"per group \[2, 3, 4\] / \[6, 4\], got \[5, 4\]"):
        kern.apply_weights(layer, (q.view(2, 3, 512), torch.ones(5, 4)))


def test_tuple_input_bad_shapes_raise(vllm_config):
    kern, layer = _layer(256, 512)
    q = torch.zeros(3, 256, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError):
        kern.apply_weights(layer, (q, torch.ones(3)))
    q = torch.zeros(3, 512, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError):
        kern.apply_weights(layer, (q, torch.ones(3, 3)))


def test_selection_is_recorded_at_load(vllm_config):
    from radiance.kernels import registry

    _layer(256, 768)
    rows = [r for r in registry.selections()
            if r["op"] == "block_fp8_linear" and r["query"].get("N") == 256 and r["query"].get("K") == 768]
    assert rows and rows[-1]["kernel"] == "cpu_reference"
