"""The plugin inside real vLLM (CPU build): loaded in every process, VLLM_PLUGINS, isolation."""

import re

import pytest
from vllm_harness import run_vllm_generate

from radiance.plugin import tiny_models

LOADED = re.compile(r"radiance plugin loaded \(pid (\d+), process ([^)]*)\)")


@pytest.fixture(scope="module")
def model_dir():
    return tiny_models.build("qwen3", "bf16")


def test_loaded_in_front_end_engine_core_and_worker(model_dir):
    res = run_vllm_generate(
        model_dir,
        sampling={"max_tokens": 4, "temperature": 0.0},
        llm_kwargs={"distributed_executor_backend": "mp"},
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    )
    assert res["outputs"][0]["token_ids"]
    # The front end (the process that built LLM): its install record came back, every hook
    # once, in the documented order. (Its log line is not in the log: vLLM configures logging
    # in the front end only after plugins have loaded.)
    assert [e["package"] for e in res["record"]] == ["gemm", "fp8stream", "attn", "plugin"]
    # The engine core and the mp executor's worker, each its own process, loaded it too.
    roles = {}
    for line in res["log"].splitlines():
        m = LOADED.search(line)
        if m:
            role = re.match(r"\s*\(([\w-]+) pid=(\d+)\)", line)
            assert role is not None and int(role.group(2)) == int(m.group(1)), line
            roles["worker" if "Worker" in role.group(1) else role.group(1)] = int(m.group(1))
    assert set(roles) == {"EngineCore", "worker"}, res["log"][-4000:]
    assert len(set(roles.values())) == 2
    # rank 0's worker printed the report after warm-up, once
    assert res["log"].count("radiance install record:") == 1
    assert "radiance kernel selection" in res["log"]


def test_vllm_plugins_excluding_radiance_keeps_it_out(model_dir):
    res = run_vllm_generate(
        model_dir,
        sampling={"max_tokens": 4, "temperature": 0.0},
        env={"VLLM_PLUGINS": "some_other_plugin", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    assert res["outputs"][0]["token_ids"]
    assert res["record"] == []
    assert not LOADED.search(res["log"])
    assert "radiance install record" not in res["log"]


def test_a_failing_hook_is_recorded_and_generation_goes_on(model_dir):
    stock = run_vllm_generate(
        model_dir, env={"RADIANCE_DISABLE": "fp8stream", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    res = run_vllm_generate(
        model_dir, env={"RADIANCE_FP8_STREAM": "maybe", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    failed = [e for e in res["record"] if e["status"] == "failed"]
    assert [(e["package"], e["hook"]) for e in failed] == [("fp8stream", "model_rewrite")]
    assert "RADIANCE_FP8_STREAM" in failed[0]["detail"] and "maybe" in failed[0]["detail"]
    assert "radiance-fp8stream model_rewrite failed, left stock" in res["log"]
    # the hooks after it still ran, and the model generated the same tokens as without it
    assert [e["package"] for e in res["record"]] == ["gemm", "fp8stream", "attn", "plugin"]
    assert res["outputs"][0]["token_ids"] == stock["outputs"][0]["token_ids"]
