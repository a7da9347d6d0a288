"""Staging vLLM's kernel and loading it without vLLM's import graph."""

import pytest

from radiance.attn import kernel_source


def test_rewrite_keeps_lines_and_maps_imports():
    src = (
        "import torch\n"
        "import vllm.envs as envs\n"
        "from vllm.triton_utils import tl, triton\n"
        "from vllm.v1.attention.ops.triton_attention_helpers import (\n"
        "    a,\n"
        "    b,\n"
        ")\n"
        "from vllm.v1.kv_cache_interface import KVQuantMode\n"
        "def f():\n"
        "    from vllm.v1.attention.ops.int4 import g\n"
    )
    out = kernel_source.rewrite_imports(src, {"triton_attention_helpers"})
    assert out.count("\n") == src.count("\n")
    lines = out.splitlines()
    assert lines[1] == "from ._shim import envs as envs"
    assert lines[2] == "from ._shim import tl, triton"
    assert lines[3] == "from .triton_attention_helpers import a, b"
    assert lines[7] == "from .kv_quant_mode import KVQuantMode"
    assert lines[9].strip() == "from vllm.v1.attention.ops.int4 import g"  # lazy import left alone


def test_rewrite_refuses_unknown_vllm_imports():
    with pytest.raises(kernel_source.StagingError, match="vllm.model_executor"):
        kernel_source.rewrite_imports("from vllm.model_executor import x\n", set())
    with pytest.raises(kernel_source.StagingError, match="other_helpers"):
        kernel_source.rewrite_imports("from vllm.v1.attention.ops.other_helpers import x\n", set())


def test_stage_and_load_installed_vllm(staged_dir, kernel_module):
    manifest = kernel_source.read_manifest(staged_dir)
    assert set(manifest["files"]) == {"triton_unified_attention.py", "triton_attention_helpers.py", "kv_quant_mode.py"}
    assert manifest["backend_constants"] == {"NUM_PAR_SOFTMAX_SEGMENTS": 16, "MIN_LAUNCH_GRID_SIZE_2D": 128}
    # the real Triton JIT kernels, not vLLM's CPU placeholders
    assert "num_queries_per_kv" in kernel_module.kernel_unified_attention.arg_names
    assert "NUM_SEGMENTS_PER_SEQ" in kernel_module.reduce_segments.arg_names
    assert kernel_module.KVQuantMode.FP8_PER_TENSOR == 1
    assert not any(n.startswith("vllm") for n in kernel_module.__dict__ if n == "vllm")


def test_load_rejects_non_staged_dir(tmp_path):
    with pytest.raises(kernel_source.StagingError, match="not a staged kernel directory"):
        kernel_source.load(tmp_path)
