"""Staging vLLM's kernel and loading it without vLLM's import graph."""

import shutil
import sys
import types

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
    assert _from_vllm(kernel_module) == []


def _from_vllm(module) -> list[str]:
    """Globals of ``module`` (and of the staged helpers it imports) that are vLLM's objects."""
    seen = []
    for mod in (module, sys.modules[module.__name__.rsplit(".", 1)[0] + ".triton_attention_helpers"]):
        for name, value in vars(mod).items():
            origin = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
            if isinstance(origin, str) and origin.split(".")[0] == "vllm":
                seen.append(f"{mod.__name__}.{name} from {origin}")
    return seen


def test_load_imports_no_vllm_module(staged_dir, tmp_path, monkeypatch):
    """The GPU harness has no vLLM: a staged copy loads with every vllm module unimportable."""
    pytest.importorskip("triton")
    copy = tmp_path / "staged"
    shutil.copytree(staged_dir, copy)
    with open(copy / kernel_source.KV_QUANT_FILE, "a") as f:  # other bytes: load() imports it afresh
        f.write("\n# a copy\n")
    for name in [n for n in sys.modules if n.split(".")[0] == "vllm"]:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: an import raises
    monkeypatch.setitem(sys.modules, "vllm", None)
    module = kernel_source.load(copy)
    assert module is not kernel_source.load(staged_dir)
    assert "num_queries_per_kv" in module.kernel_unified_attention.arg_names
    assert _from_vllm(module) == []


def test_load_rejects_non_staged_dir(tmp_path):
    with pytest.raises(kernel_source.StagingError, match="not a staged kernel directory"):
        kernel_source.load(tmp_path)
