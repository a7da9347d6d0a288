"""The Triton-backend adapter against the installed vLLM package."""

import dataclasses
import importlib
import json
import logging
import types

import pytest
import torch

from radiance.attn import graph_capture, policy, tables, triton_launch, vllm_patches

triton_attn = pytest.importorskip("vllm.v1.attention.backends.triton_attn")


def test_install_skips_on_a_platform_without_triton_kernels(monkeypatch):
    # vLLM's CPU build replaces Triton with placeholders: nothing to launch, so nothing installed
    monkeypatch.delenv("RADIANCE_ATTN", raising=False)
    monkeypatch.delenv(tables.ENV_TABLE, raising=False)
    ops = importlib.import_module(vllm_patches.TRITON_OPS)
    try:
        applied, detail = vllm_patches.install()
    finally:
        vllm_patches.uninstall_triton(triton_attn)  # where it did install, later tests get stock
    if getattr(ops.kernel_unified_attention, "arg_names", None) is not None:
        pytest.skip("this vLLM has real Triton kernels: install applies here")
    assert not applied
    assert "not a Triton kernel here" in detail
    assert "AITER unified attention not importable" in detail
    assert triton_attn.unified_attention is ops.unified_attention


def test_disabled_by_flag(monkeypatch):
    monkeypatch.setenv("RADIANCE_ATTN", "0")
    assert vllm_patches.install() == (False, "disabled by RADIANCE_ATTN=0")


def test_unusable_table_override_leaves_attention_stock_at_install(monkeypatch, tmp_path):
    monkeypatch.delenv("RADIANCE_ATTN", raising=False)
    stock = triton_attn.unified_attention
    missing = tmp_path / "missing.json"
    monkeypatch.setenv(tables.ENV_TABLE, str(missing))
    applied, detail = vllm_patches.install()
    assert not applied and f"{tables.ENV_TABLE}={missing} cannot be used" in detail
    bad = tmp_path / "bad.json"
    bad.write_text('{"arch": "sm_90", "triton": {"default": {"split": {"coef": 1}}}}')
    monkeypatch.setenv(tables.ENV_TABLE, str(bad))
    applied, detail = vllm_patches.install()
    assert not applied and "split.coef/exp/min/max" in detail
    assert triton_attn.unified_attention is stock


def test_a_table_override_says_at_install_which_arch_it_serves(monkeypatch, tmp_path):
    monkeypatch.delenv("RADIANCE_ATTN", raising=False)
    monkeypatch.setattr(vllm_patches, "install_triton", lambda: (True, "launch installed"))
    monkeypatch.setattr(vllm_patches, "_install_aiter", lambda: (False, "no AITER"))
    other = tmp_path / "gfx1201.json"
    other.write_text(json.dumps({"arch": "gfx1201"}))
    monkeypatch.setenv(tables.ENV_TABLE, str(other))
    assert vllm_patches.install() == (True, f"{tables.ENV_TABLE}={other} serves gfx1201 only; "
                                            "triton: launch installed; aiter: no AITER")


def test_a_failing_adapter_is_reported_and_the_other_still_installs(monkeypatch):
    monkeypatch.delenv("RADIANCE_ATTN", raising=False)

    def broken():
        raise RuntimeError("aiter module shaped unexpectedly")

    monkeypatch.setattr(vllm_patches, "_install_aiter", broken)
    monkeypatch.setattr(vllm_patches, "install_triton", lambda: (True, "launch installed"))
    applied, detail = vllm_patches.install()
    assert applied
    assert detail == ("triton: launch installed; aiter: failed, left stock "
                      "(RuntimeError: aiter module shaped unexpectedly)")


@pytest.fixture
def installed(kernel_module):
    stock = triton_attn.unified_attention
    applied, detail = vllm_patches.install_triton(backend=triton_attn, kernel_module=kernel_module)
    yield applied, detail, stock
    vllm_patches.uninstall_triton(triton_attn)


def test_install_replaces_the_backend_namespace_idempotently(installed, kernel_module):
    applied, detail, stock = installed
    assert applied, detail
    wrapper = triton_attn.unified_attention
    assert isinstance(wrapper, triton_launch.RadianceUnifiedAttention)
    assert wrapper.stock is stock and wrapper.module is kernel_module
    assert getattr(triton_attn.TritonAttentionMetadataBuilder.__init__, "_radiance_orig", None) is not None
    again = vllm_patches.install_triton(backend=triton_attn, kernel_module=kernel_module)
    assert again == (True, "already installed")
    assert triton_attn.unified_attention is wrapper
    vllm_patches.uninstall_triton(triton_attn)
    assert triton_attn.unified_attention is stock
    assert getattr(triton_attn.TritonAttentionMetadataBuilder.__init__, "_radiance_orig", None) is None


def test_install_refuses_placeholder_kernels():
    ops = importlib.import_module(vllm_patches.TRITON_OPS)
    if getattr(ops.kernel_unified_attention, "arg_names", None) is not None:
        pytest.skip("this vLLM has real Triton kernels")
    applied, detail = vllm_patches.install_triton(backend=triton_attn, kernel_module=ops)
    assert not applied and "not a Triton kernel" in detail
    assert triton_attn.unified_attention is ops.unified_attention


def _call_kwargs(**over):
    q = torch.zeros(8, 16, 256, dtype=torch.bfloat16)
    k = torch.zeros(4, 16, 2, 256, dtype=torch.bfloat16)
    kw = dict(q=q, k=k, v=k, out=torch.empty_like(q), cu_seqlens_q=torch.tensor([0, 4, 8], dtype=torch.int32),
              max_seqlen_q=4, seqused_k=torch.tensor([30, 30], dtype=torch.int32), max_seqlen_k=30,
              softmax_scale=0.06, causal=True, window_size=(-1, -1), block_table=torch.zeros(2, 2, dtype=torch.int32),
              softcap=0, q_descale=None, k_descale=None, v_descale=None, seq_threshold_3D=64,
              num_par_softmax_segments=16, softmax_segm_output=torch.empty(64 * 16 * 16 * 256),
              softmax_segm_max=torch.empty(64 * 16 * 16), softmax_segm_expsum=torch.empty(64 * 16 * 16))
    kw.update(over)
    return kw


@pytest.mark.parametrize("over,why", [
    (dict(window_size=(127, 0)), "sliding window"),
    (dict(window_size=(127, 0), chunk_lookback=1), "chunked attention (chunk_lookback 1)"),
    (dict(chunk_lookback=0), "chunked attention (chunk_lookback 0)"),
    (dict(causal=False), "non-causal"),
    (dict(alibi_slopes=torch.zeros(16)), "alibi_slopes"),
    (dict(kv_quant_mode=3), "kv_quant_mode 3"),
    (dict(use_td=True), "tensor descriptors"),
    (dict(softmax_segm_output=None), "no segment scratch"),
    (dict(softmax_segm_max=torch.empty(10, dtype=torch.float16)), "no segment scratch"),
])
def test_unhandled_calls_fall_back_to_stock(kernel_module, over, why):
    r = triton_launch.RadianceUnifiedAttention(kernel_module, arch="sm_90", num_sms=132)
    geo, launch, reason = r.decide(_call_kwargs(**over))
    assert launch is None and why in reason


def _policys_launch_here(geo, reason: str, triton_launch_of=None):
    """The policy's launch for ``geo`` as the wrapper runs it on CPU tensors: a warpgroup launch
    on the Triton pass (that pass needs an sm_90 GPU), its reason saying so."""
    want = (triton_launch_of or policy.triton_launch)(geo)
    if want is not None and want.partial_pass == "cuda_warpgroup":
        assert "Triton partial pass" in reason, reason
        want = dataclasses.replace(triton_launch.on_triton_pass(want, geo.q_per_kv), reason=reason)
    return want


def test_decision_for_a_verify_batch(kernel_module):
    r = triton_launch.RadianceUnifiedAttention(kernel_module, arch="sm_90", num_sms=132)
    geo, launch, reason = r.decide(_call_kwargs())
    assert geo.num_seqs == 2 and geo.num_tokens == 8 and geo.max_seqlen_q == 4 and geo.q_per_kv == 8
    assert launch == _policys_launch_here(geo, launch.reason)
    assert launch is not None and launch.is_3d
    # the segment count never exceeds what the given scratch holds
    assert 8 * 16 * launch.num_segments * 256 <= 64 * 16 * 16 * 256


def test_decisions_are_kept_per_geometry(kernel_module, monkeypatch):
    calls = []
    real = policy.triton_launch

    def counting(geo, table=None):
        calls.append(geo)
        return real(geo, table)

    monkeypatch.setattr(policy, "triton_launch", counting)
    r = triton_launch.RadianceUnifiedAttention(kernel_module, arch="sm_90", num_sms=132)
    first = r.decide(_call_kwargs())
    for _ in range(3):  # the other layers of the step: same geometry, no policy call
        assert r.decide(_call_kwargs()) == first
    assert len(calls) == 1
    longer = r.decide(_call_kwargs(max_seqlen_k=120))
    assert len(calls) == 2 and longer[0].max_seqlen_k != first[0].max_seqlen_k
    assert longer[1] == _policys_launch_here(longer[0], longer[1].reason, real)
    for n in range(triton_launch._MAX_CACHED_DECISIONS + 5):  # growing contexts stay bounded
        r.decide(_call_kwargs(max_seqlen_k=1000 + n))
    assert len(r._launches) <= triton_launch._MAX_CACHED_DECISIONS


@pytest.fixture
def capture(monkeypatch):
    """Calls decided as if a CUDA graph were being captured; no max_model_len recorded yet."""
    monkeypatch.setattr(graph_capture, "capturing", lambda device: True)
    monkeypatch.setattr(graph_capture, "_max_model_len", None)


def test_a_captured_launch_is_chosen_for_max_model_len(kernel_module, capture):
    # vLLM captures decode with one-key sequences: chosen for them, the split rule would take its
    # short-context split and every replay at a long context would run it
    r = triton_launch.RadianceUnifiedAttention(kernel_module, arch="sm_90", num_sms=132)
    graph_capture.note_max_model_len(32768)
    geo, launch, reason = r.decide(_call_kwargs(max_seqlen_k=4))
    assert geo.max_seqlen_k == 32768
    assert reason.endswith("; chosen during CUDA-graph capture for max_model_len 32768")
    assert launch.num_segments > policy.triton_launch(dataclasses.replace(geo, max_seqlen_k=4)).num_segments
    assert launch == _policys_launch_here(geo, launch.reason)
    # a capture longer than max_model_len keeps its own
    assert r.decide(_call_kwargs(max_seqlen_k=40000))[0].max_seqlen_k == 40000


def test_a_capture_without_max_model_len_says_so_once(kernel_module, capture, caplog):
    r = triton_launch.RadianceUnifiedAttention(kernel_module, arch="sm_90", num_sms=132)
    with caplog.at_level(logging.WARNING, logger="vllm.radiance.attn"):
        for _ in range(3):
            geo, launch, reason = r.decide(_call_kwargs(max_seqlen_k=4))
    assert geo.max_seqlen_k == 4 and reason.endswith("for the capture's context")
    assert sum("no max_model_len recorded" in m for m in caplog.messages) == 1


def test_calls_outside_a_capture_keep_their_context(kernel_module, monkeypatch):
    monkeypatch.setattr(graph_capture, "_max_model_len", 32768)
    r = triton_launch.RadianceUnifiedAttention(kernel_module, arch="sm_90", num_sms=132)
    geo, launch, reason = r.decide(_call_kwargs(max_seqlen_k=4))
    assert geo.max_seqlen_k == 4 and "capture" not in reason
    assert not graph_capture.capturing(torch.device("cpu"))


def test_the_metadata_builder_records_max_model_len(monkeypatch, caplog):
    class Builder:  # the hook wraps whatever __init__ the backend's builder has
        def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
            self.config = vllm_config

    backend = types.SimpleNamespace(TritonAttentionMetadataBuilder=Builder)
    monkeypatch.setattr(graph_capture, "_max_model_len", None)
    monkeypatch.setattr(vllm_patches, "_enlarge_scratch", lambda builder, config: None)
    vllm_patches._patch_builder(backend)
    Builder(None, [], types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=40960)), "cpu")
    assert graph_capture.max_model_len() == 40960
    with caplog.at_level(logging.WARNING, logger="vllm.radiance.attn"):
        built = Builder(None, [], types.SimpleNamespace(), "cpu")  # no model config: warned, still built
    assert built.config is not None and graph_capture.max_model_len() == 40960
    assert any("no max_model_len" in m for m in caplog.messages)
    with pytest.raises(ValueError, match="positive"):
        graph_capture.note_max_model_len(0)


def test_unchunked_calls_are_radiances(kernel_module):
    # vLLM's default (-1) is no chunking: the verify batch keeps its launch
    r = triton_launch.RadianceUnifiedAttention(kernel_module, arch="sm_90", num_sms=132)
    assert r.decide(_call_kwargs(chunk_lookback=-1)) == r.decide(_call_kwargs())
    assert r.decide(_call_kwargs(chunk_lookback=-1))[1] is not None


def test_a_chunked_call_runs_the_stock_wrapper(kernel_module, monkeypatch):
    # vLLM's Gemma3/rnj1 chunked layers: a sliding window and chunk_lookback 1, which radiance's
    # launch has no mask for
    seen = []
    r = triton_launch.RadianceUnifiedAttention(kernel_module, stock=lambda **kw: seen.append(kw), arch="sm_90",
                                               num_sms=132)
    monkeypatch.setattr(r, "launch", lambda *a: pytest.fail("radiance launched a chunked call"))
    r(**_call_kwargs(window_size=(8191, 0), chunk_lookback=1))
    assert len(seen) == 1 and seen[0]["chunk_lookback"] == 1
    assert r.last_decision == (None, None, "stock: chunked attention (chunk_lookback 1)")


def test_unknown_keyword_goes_to_stock_with_one_warning_a_reason(kernel_module, caplog):
    seen = []

    def stock(*a, **kw):
        seen.append(kw)

    r = triton_launch.RadianceUnifiedAttention(kernel_module, stock=stock, arch="sm_90", num_sms=132)
    with caplog.at_level(logging.WARNING, logger=triton_launch.logger.name):
        r(**_call_kwargs(), some_future_flag=True)
        r(**_call_kwargs(), some_future_flag=False)
        r(**_call_kwargs(), other_flag=1)
        r(*_call_kwargs().values())  # more positional arguments than vLLM's wrapper takes
        r(**_call_kwargs(q=None))  # decide() fails reading it
        r(**_call_kwargs(q=None))
    assert [kw.get("some_future_flag") for kw in seen[:2]] == [True, False] and len(seen) == 6
    assert [m.split(": ", 2)[2] for m in _messages(caplog)] == [
        "unknown keyword arguments ['some_future_flag']", "unknown keyword arguments ['other_flag']",
        f"{len(_call_kwargs())} positional arguments, more than the {len(triton_launch._POSITIONAL)} radiance reads",
        "unexpected input (AttributeError: 'NoneType' object has no attribute 'dim')"]


def test_report_lines_tell_decode_verify_and_prefill_apart(kernel_module, caplog):
    """One line for the first batch of each kind; a verify batch is one the table's rule serves
    (max_query_len), a longer one is prefill, not a first verify batch."""
    table = {"arch": "sm_90", "triton": {"default": {"max_query_len": 9, "max_seqs": 8,
                                                     "split": {"coef": 16, "exp": 1 / 3, "min": 4, "max": 128}},
                                         "classes": []}}
    r = triton_launch.RadianceUnifiedAttention(kernel_module, stock=lambda **kw: None, arch="sm_90", num_sms=132,
                                               table=table)
    r.launch = lambda *a: None

    def call(width, **over):
        q = torch.zeros(2 * width, 16, 256, dtype=torch.bfloat16)
        return _call_kwargs(q=q, out=torch.empty_like(q), max_seqlen_q=width,
                            cu_seqlens_q=torch.tensor([0, width, 2 * width], dtype=torch.int32), **over)

    with caplog.at_level(logging.INFO, logger=triton_launch.logger.name):
        r(**call(12))  # longer than the rule's 9: prefill
        r(**call(10, window_size=(127, 0)))  # no geometry read: the table's default rule says prefill
        r(**call(9))
        r(**call(1))
        r(**call(4))
    lines = _messages(caplog)
    assert [m.split(" (")[0] for m in lines] == ["radiance-attn first prefill batch",
                                                 "radiance-attn first verify batch",
                                                 "radiance-attn first decode batch"]
    assert "stock wrapper [stock: policy keeps the stock launch]" in lines[0]
    assert "stock wrapper" not in lines[1]
    no_rule = triton_launch.RadianceUnifiedAttention(kernel_module, arch="gfx90a", num_sms=1, table={"arch": "x"})
    assert no_rule._batch_kind({"max_seqlen_q": policy.DEFAULT_MAX_QUERY_LEN}, None) == "verify"
    assert no_rule._batch_kind({"max_seqlen_q": policy.DEFAULT_MAX_QUERY_LEN + 1}, None) == "prefill"


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == triton_launch.logger.name]


def test_scratch_rows():
    # 8 seqs x (1 + 3 spec tokens) x 128 segments of 16 heads x 256 fp32, in a 16-segment layout
    rows = vllm_patches.scratch_rows(16, 256, 16, 32, 128, 1 << 30)
    assert rows == 32 * 128 // 16
    # the byte budget caps it: 64 MiB / (16 * 256 * 4 B) = 4096 slots
    assert vllm_patches.scratch_rows(16, 256, 16, 32, 128, 64 << 20) == 4096 // 16
