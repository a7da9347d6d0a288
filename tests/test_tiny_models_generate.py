"""Every tiny model kind loads and generates with real vLLM on this machine (one engine each)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from vllm_harness import run_vllm_generate

from radiance.plugin import tiny_models as tm

MAX_TOKENS = 6


def _gemm_cpu_path_installed() -> bool:
    # radiance-gemm's vLLM hook module is what puts its block-FP8 kernel (with a CPU provider)
    # first in vLLM's list; without it stock vLLM's CPU block-FP8 kernel runs and needs AMX.
    try:
        return importlib.util.find_spec("radiance.gemm.vllm_patches") is not None
    except ModuleNotFoundError:
        return False


GEMM_CPU_PATH = _gemm_cpu_path_installed()
needs_gemm_cpu_path = pytest.mark.xfail(
    not GEMM_CPU_PATH,
    reason="stock vLLM CPU block-FP8 needs AMX; radiance-gemm's CPU provider serves it",
    strict=False,
)
# Stock vLLM 0.32 on a CPU without AMX builds no FP8 MoE method ("Unsupported FP8 MoE backend:
# NONE"; its CPU FP8 experts need AMX), and radiance-gemm serves linears, not fused experts: only
# the fully quantized MoE kind hits this.
NO_CPU_FP8_MOE = "Unsupported FP8 MoE backend"

CASES = [pytest.param(kind, "bf16", id=f"{kind}-bf16") for kind in tm.KINDS] + [
    pytest.param(kind, "fp8_block", id=f"{kind}-fp8_block", marks=needs_gemm_cpu_path)
    for kind in tm.KINDS
]


def _check_greedy_generation(result: dict, vocab_size: int) -> None:
    (out,) = result["outputs"]
    ids = out["token_ids"]
    assert len(ids) == MAX_TOKENS and out["finish_reason"] == "length"
    assert all(0 <= i < vocab_size for i in ids)
    assert out["text"], "generated text is empty"
    assert len(out["logprobs"]) == MAX_TOKENS
    for token, step in zip(ids, out["logprobs"]):
        # Greedy: the sampled token is the most likely one, and probabilities are sane.
        assert token in step
        assert step[token] == max(step.values())
        assert all(lp <= 0.0 for lp in step.values())


@pytest.mark.slow
@pytest.mark.parametrize("kind,dtype", CASES)
def test_tiny_model_generates(kind, dtype):
    model_dir = tm.build(kind, dtype)
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    result = run_vllm_generate(
        model_dir,
        prompts=["The quick brown fox"],
        sampling={"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True, "logprobs": 2},
        check=False,
    )
    if result["returncode"] != 0 and kind == "qwen3_next_moe" and dtype == "fp8_block":
        assert NO_CPU_FP8_MOE in result["log"], result["log"][-6000:]
        pytest.xfail("stock vLLM has no FP8 MoE experts for this CPU (they need AMX) and "
                     "radiance-gemm serves linears only")
    assert result["returncode"] == 0, result["log"][-6000:]
    _check_greedy_generation(result, vocab_size)
