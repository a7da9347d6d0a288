"""The plugin inside real vLLM (CPU build): loaded in every process, VLLM_PLUGINS, isolation."""

import re

import pytest

from radiance.plugin import generate, tiny_models

LOADED = re.compile(r"radiance plugin loaded \(pid (\d+), process ([^)]*)\)")


@pytest.fixture(scope="module")
def model_dir():
    return tiny_models.build("qwen3", "bf16")


def test_loaded_in_front_end_engine_core_and_worker(model_dir):
    res = generate.generate(
        model_dir,
        ["Hello"],
        max_tokens=4,
        llm_kwargs={"enforce_eager": True, "distributed_executor_backend": "mp"},
        engine_in_process=False,
        capture_stderr=True,
    )
    assert res.texts and res.token_ids[0]
    pids = {int(m.group(1)) for m in LOADED.finditer(res.stderr)}
    # front end (LLM), engine core, and the mp executor's worker: three processes.
    assert len(pids) >= 3, res.stderr[-3000:]
    # the front end's own record: every hook ran once, in order
    assert [e["package"] for e in res.record] == ["gemm", "fp8stream", "attn", "plugin"]
    # the worker printed the report after warm-up, once
    assert res.stderr.count("radiance install record:") == 1


def test_vllm_plugins_excluding_radiance_keeps_it_out(model_dir):
    res = generate.generate(
        model_dir, ["Hello"], max_tokens=4, llm_kwargs={"enforce_eager": True},
        env={"VLLM_PLUGINS": "some_other_plugin"}, capture_stderr=True,
    )
    assert res.texts and res.token_ids[0]
    assert res.record == []
    assert not LOADED.search(res.stderr)
    assert "radiance install record" not in res.stderr
