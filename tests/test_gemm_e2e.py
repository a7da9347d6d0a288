"""radiance-gemm in real vLLM (CPU build): block-FP8 tiny Qwen3 and Qwen3-Next load and generate
through RadianceBlockFp8LinearKernel (vLLM's own CPU kernels need AMX and refuse), and the kernel's
outputs on the checkpoints' own linears equal a float64 dequantized reference within bf16
rounding."""

import re
from pathlib import Path

import pytest
import torch

from radiance.plugin import tiny_models
from vllm_harness import run_vllm_generate

KINDS = ("qwen3", "qwen3_next_dense")
ROUTE = re.compile(r"block_fp8_linear\s+platform=cpu arch=cpu N=(\d+) K=(\d+) M=1-inf\s*\n.*-> (\S+)")


@pytest.fixture(scope="module", params=KINDS)
def fp8_model(request):
    return request.param, tiny_models.build(request.param, "fp8_block")


def _quantized_shapes(kind, model_dir):
    from safetensors.torch import load_file

    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    return {tuple(tensors[f"{name}.weight"].shape) for name in tiny_models.quantized_linears(kind)}


@pytest.mark.slow
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "compiled"])
def test_fp8_block_model_generates_through_radiance_kernel(fp8_model, eager):
    kind, model_dir = fp8_model
    if not eager and kind != "qwen3":
        pytest.skip("one compiled run (qwen3) shows the kernel traces; the hybrid runs eager")
    res = run_vllm_generate(model_dir, sampling={"max_tokens": 8, "temperature": 0.0,
                                                 "ignore_eos": True},
                            llm_kwargs={"enforce_eager": eager})
    log = res["stdout"] + res["stderr"]
    assert len(res["outputs"][0]["token_ids"]) == 8
    assert "Selected RadianceBlockFp8LinearKernel for Fp8LinearMethod" in log
    # the selection report names the provider for the fp8 linears (vLLM fuses q/k/v and
    # gate/up, so N is a sum of checkpoint shapes; every checkpoint K shows up)
    routed = {(int(n), int(k)): p for n, k, p in ROUTE.findall(log)}
    assert {k for _, k in routed} == {k for _, k in _quantized_shapes(kind, model_dir)}
    assert set(routed.values()) == {"cpu_reference"}


def test_checkpoint_linears_within_bf16_rounding_of_float64(fp8_model):
    """Every fp8 linear of the checkpoint, loaded through vLLM's kernel selection and our
    process_weights_after_loading, against the float64 dequantized product; and the
    pre-quantized tuple path (per-token scales) against the same input with group scales."""
    from safetensors.torch import load_file
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.kernels import linear as kernels
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        GroupShape,
        create_fp8_quant_key,
    )

    from radiance.gemm import accepts_prequantized, reference, vllm_patches
    from radiance.gemm.kernel import RadianceBlockFp8LinearKernel

    kind, model_dir = fp8_model
    assert vllm_patches.install()[0]
    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    with set_current_vllm_config(VllmConfig()):
        for name in tiny_models.quantized_linears(kind):
            w, s = tensors[f"{name}.weight"], tensors[f"{name}.weight_scale_inv"]
            kern = kernels.init_fp8_linear_kernel(
                activation_quant_key=create_fp8_quant_key(static=False, group_shape=GroupShape(1, 128)),
                weight_quant_key=create_fp8_quant_key(static=True, group_shape=GroupShape(128, 128)),
                input_dtype=torch.bfloat16, out_dtype=torch.bfloat16, weight_shape=tuple(w.shape))
            assert isinstance(kern, RadianceBlockFp8LinearKernel), name
            layer = torch.nn.Module()
            layer.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
            layer.weight_scale_inv = torch.nn.Parameter(s.clone(), requires_grad=False)
            layer.input_scale = None
            kern.process_weights_after_loading(layer)
            assert accepts_prequantized(layer) == 128
            n, k = w.shape
            for m in (1, 5):
                x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
                out = kern.apply_weights(layer, x)
                q, sa = kern.quant_fp8(x, None, None)
                ref = reference.block_fp8_mm(q, w, sa, s, torch.float64, (128, 128), torch.float64)
                bad = (out.double() - ref).abs() > reference.bf16_tolerance(ref)
                assert not bad.any(), f"{name} M={m}: {int(bad.sum())} outputs off"
            s_tok = sa.amax(dim=1)
            q_tok = (q.float() * sa.repeat_interleave(128, 1)[:, :k] / s_tok[:, None]).to(w.dtype)
            a = kern.apply_weights(layer, (q_tok, s_tok))
            b = kern.apply_weights(layer, (q_tok, s_tok[:, None].repeat(1, -(-k // 128)).contiguous()))
            assert torch.equal(a, b), name
