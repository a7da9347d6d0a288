"""radiance's split-KV kernel: exact against the float64 reference, and its input checks."""

import json
from dataclasses import replace
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from radiance.attn import policy, split_kv_kernel


def _interpreted(*args) -> dict:
    """interp_split_kv.py's JSON lines by name, run under Triton's interpreter."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = Path(__file__).with_name("interp_split_kv.py")
    proc = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {c["name"]: c for c in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}


def test_kernel_matches_float64_reference_in_interpreter():
    cases = _interpreted()
    assert len(cases) == 7, cases
    for c in cases.values():
        # fp16 output: rounding alone is half an ulp; the fp32 sums and fp16 probabilities add less
        # than another, so every row is within 1 ulp of its own largest value. The query rows past
        # the batch's tokens (padding) keep what they held.
        assert c["finite"] and c["row_ulps_fp16"] <= 1.0 and c["table_ahead_identical"], c
        assert c["padding_untouched"], c


def test_reduce_leaves_out_empty_segments_and_padding_in_interpreter():
    # Partials written by the test: "no keys" segments (max -inf, output slot NaN) are left out, a
    # NaN max reaches its row, the padding token is not written; the rest within 1 fp16 ulp of float64.
    c = _interpreted("reduce")["reduce_contract"]
    assert c["finite"] and c["row_ulps_fp16"] <= 1.0, c
    assert c["nan_max_row_nan"] and c["padding_untouched"], c


def _tensors(kv=torch.float8_e4m3fn, k_scale=None):
    q = torch.zeros(4, 8, 64, dtype=torch.bfloat16)
    k = torch.zeros(8, 16, 2, 64).to(kv)
    scale = torch.tensor([0.5]).expand(2, 2) if k_scale is None else k_scale  # as vLLM passes it
    return q, k, k.clone(), torch.empty_like(q), scale, scale


def _launch(seg=16, bm=16, tile=32, group=4):
    return policy.TritonLaunch(seg, bm, max(1, bm // group), tile, 4, 2, "t", kernel="radiance")


def test_refusals_accept_a_vllm_call():
    assert split_kv_kernel.launch_refusal(_launch(), "bf16", "fp8", 4) is None
    assert split_kv_kernel.launch_refusal(_launch(), "bf16", "bf16", 4) is None
    assert split_kv_kernel.call_refusal(*_tensors()) is None
    assert split_kv_kernel.call_refusal(*_tensors(kv=torch.bfloat16)) is None


@pytest.mark.parametrize("launch, dtypes, why", [
    (_launch(seg=24), ("bf16", "fp8"), "power of two"),
    (_launch(bm=8), ("bf16", "fp8"), "at least 16"),
    (policy.TritonLaunch(16, 16, 8, 32, 4, 2, "t", kernel="radiance"), ("bf16", "fp8"), "exceeds BLOCK_M"),
    (_launch(), ("fp32", "fp32"), "fp32 queries"),
    (_launch(), ("bf16", "fp16"), "fp16 KV with bf16 queries"),
])
def test_launch_refusal(launch, dtypes, why):
    assert why in split_kv_kernel.launch_refusal(launch, *dtypes, 4)


@pytest.mark.parametrize("change, why", [
    (dict(kv=torch.float16), "KV dtype"),
    (dict(k_scale=torch.tensor([[0.5, 0.25], [0.5, 0.25]])), "per-tensor"),
])
def test_call_refusal(change, why):
    assert why in split_kv_kernel.call_refusal(*_tensors(**change))


def test_short_scratch_raises_before_any_launch():
    pytest.importorskip("triton")
    q, k, v, out, ks, vs = _tensors()
    cu, lens = torch.tensor([0, 4], dtype=torch.int32), torch.tensor([100], dtype=torch.int32)
    bt = torch.zeros(1, 8, dtype=torch.int32)
    units = 4 * 8 * 16
    with pytest.raises(ValueError, match="scratch"):  # one row short
        split_kv_kernel.launch(q, k, v, out, cu, lens, bt, 4, 0.125, ks, vs, _launch(),
                               torch.empty(units * 64), torch.empty(units - 1), torch.empty(units))


def _scratch_for(q, segments=16):
    units = q.shape[0] * q.shape[1] * segments
    return torch.empty(units * 64), torch.empty(units), torch.empty(units)


def test_an_unknown_partial_pass_raises_before_any_launch():
    pytest.importorskip("triton")
    q, k, v, out, ks, vs = _tensors()
    cu, lens = torch.tensor([0, 4], dtype=torch.int32), torch.tensor([100], dtype=torch.int32)
    bt = torch.zeros(1, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="partial_pass"):
        split_kv_kernel.launch(q, k, v, out, cu, lens, bt, 4, 0.125, ks, vs, _launch(), *_scratch_for(q),
                               partial_pass="ptx")


def test_cuda_partial_pass_refuses_before_any_launch():
    """The CUDA partial pass (radiance-kernels' split_kv_partial) takes num_warps as its key warps;
    a launch it has no instance for raises before anything runs, on any machine."""
    pytest.importorskip("triton")
    pytest.importorskip("radiance.kernels.split_kv_attention")
    q, k, v, out, ks, vs = _tensors()
    cu, lens = torch.tensor([0, 4], dtype=torch.int32), torch.tensor([100], dtype=torch.int32)
    bt = torch.zeros(1, 8, dtype=torch.int32)
    scratch = _scratch_for(q)
    with pytest.raises(ValueError, match="does not split over 3 key warps"):
        split_kv_kernel.launch(q, k, v, out, cu, lens, bt, 4, 0.125, ks, vs, replace(_launch(), num_warps=3),
                               *scratch, partial_pass="cuda")
    with pytest.raises(ValueError, match="head size 64"):  # the kernel has heads 128 and 256
        split_kv_kernel.launch(q, k, v, out, cu, lens, bt, 4, 0.125, ks, vs, replace(_launch(), num_warps=2),
                               *scratch, partial_pass="cuda")


def _call(**change):
    q, k, v, out, ks, vs = _tensors()
    kw = dict(q=q, k=k, v=v, out=out, k_descale=ks, v_descale=vs, q_descale=None, softcap=0, sinks=None,
              output_scale=None, kv_quant_mode=1)
    kw.update(change)
    return kw


@pytest.mark.parametrize("change, why", [
    (dict(sinks=torch.zeros(8)), "sinks"),
    (dict(output_scale=torch.ones(1)), "fp8 output"),
    (dict(q_descale=torch.ones(1)), "fp8 query"),
    (dict(softcap=30.0), "softcap"),
    (dict(kv_quant_mode=0), "kv_quant_mode 0"),
    (dict(k_descale=torch.tensor([[0.5, 0.25], [0.5, 0.25]])), "per-tensor"),
])
def test_wrapper_sends_what_the_kernel_cannot_take_to_vllms_kernel(change, why):
    from radiance.attn.triton_launch import radiance_kernel_refusal

    assert radiance_kernel_refusal(_call()) is None
    assert why in radiance_kernel_refusal(_call(**change))


def test_decision_keeps_a_geometry_the_kernel_cannot_run_on_vllms_kernel(kernel_module):
    """Settled once per geometry: fp16 queries over bf16 KV are not radiance's kernel's."""
    from radiance.attn import tune
    from radiance.attn.triton_launch import RadianceUnifiedAttention

    rule = tune._rule(16, 1 / 3, 4, 0, 0.4, 8, 9, "rk_t64w4s2")
    table = {"arch": "sm_90", "triton": {"default": rule, "classes": []}}
    r = RadianceUnifiedAttention(kernel_module, arch="sm_90", num_sms=132, table=table)
    kw = dict(_call(kv_quant_mode=0), k=torch.zeros(64, 16, 2, 64, dtype=torch.bfloat16),
              v=torch.zeros(64, 16, 2, 64, dtype=torch.bfloat16), cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32),
              max_seqlen_q=1, seqused_k=torch.tensor([900], dtype=torch.int32), max_seqlen_k=900,
              softmax_scale=0.125, causal=True, window_size=(-1, -1), block_table=torch.zeros(1, 64, dtype=torch.int32),
              softmax_segm_output=torch.empty(8 * 256 * 64), softmax_segm_max=torch.empty(8 * 256),
              softmax_segm_expsum=torch.empty(8 * 256))
    kw["q"] = torch.zeros(1, 8, 64, dtype=torch.bfloat16)
    _, launch, _ = r.decide(kw)
    assert launch.kernel == "radiance" and launch.num_segments > 1  # the table's choice, taken
    kw["q"] = torch.zeros(1, 8, 64, dtype=torch.float16)
    _, launch, reason = r.decide(kw)
    assert launch.kernel == "vllm" and launch.num_segments > 1 and "bf16 KV with fp16 queries" in reason


def test_a_launch_that_does_not_build_here_goes_to_stock_from_then_on(kernel_module, monkeypatch, caplog):
    """A table's launch this GPU cannot build (Triton raises while building, before any kernel
    runs): the call and every later one of that build go to the stock wrapper, built once."""
    import logging

    from radiance.attn import triton_launch, tune
    from radiance.attn.triton_launch import RadianceUnifiedAttention

    PTXASError = pytest.importorskip("triton.runtime.errors").PTXASError
    stock_calls, builds = [], []
    rule = tune._rule(16, 1 / 3, 4, 0, 0.4, 8, 9, "rk_t64w4s2")
    r = RadianceUnifiedAttention(kernel_module, stock=lambda **kw: stock_calls.append(kw["max_seqlen_k"]),
                                 arch="sm_90", num_sms=132, table={"arch": "sm_90", "triton": {"default": rule,
                                                                                              "classes": []}})

    def launch(*args, **kwargs):
        builds.append(1)
        raise PTXASError("ptxas fatal   : (C7602) Insufficient registers (96) to compile instruction")

    monkeypatch.setattr(triton_launch.split_kv_kernel, "launch", launch)

    def call(ctx):
        kw = dict(_call(), cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32), max_seqlen_q=1,
                  seqused_k=torch.tensor([ctx], dtype=torch.int32), max_seqlen_k=ctx, softmax_scale=0.125,
                  causal=True, window_size=(-1, -1), block_table=torch.zeros(1, 64, dtype=torch.int32),
                  softmax_segm_output=torch.empty(8 * 256 * 64), softmax_segm_max=torch.empty(8 * 256),
                  softmax_segm_expsum=torch.empty(8 * 256))
        kw["q"] = torch.zeros(1, 8, 64, dtype=torch.bfloat16)
        return r(**kw)

    with caplog.at_level(logging.WARNING, logger=triton_launch.logger.name):
        call(900)
        call(901)  # another geometry, the same build
    assert stock_calls == [900, 901] and len(builds) == 1
    assert "does not build here" in r.last_decision[2]
    (warning,) = [m for m in caplog.messages if "does not build on this GPU" in m]
    assert "PTXASError" in warning and "Insufficient registers" in warning
    # Other errors are not build failures: they still surface.
    r._unbuildable.clear()
    monkeypatch.setattr(triton_launch.split_kv_kernel, "launch", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        call(900)


def _compile(target, fp8: bool, v_in_registers: bool, head=128, group=4, block_m=16, tile=64, warps=4, stages=2,
             table_ahead=False, max_registers=None):
    """Build the main kernel for ``target`` as the runtime would (16-byte divisible pointers and
    strides), without a GPU."""
    triton = pytest.importorskip("triton")
    from triton.compiler import ASTSource

    kernel = split_kv_kernel._partial
    kv = "fp8e4nv" if fp8 else "bf16"
    ptrs = {"q_ptr": "*bf16", "k_ptr": f"*{kv}", "v_ptr": f"*{kv}", "block_table_ptr": "*i32",
            "seq_lens_ptr": "*i32", "cu_q_ptr": "*i32", "part_out_ptr": "*fp32", "part_max_ptr": "*fp32",
            "part_sum_ptr": "*fp32", "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32"}
    constexprs = dict(HEAD=head, HEAD_P=head, GROUP=group, BLOCK_M=block_m, BLOCK_Q=block_m // group, TILE=tile,
                      BLOCK_SIZE=16, FP8_KV=fp8, NUM_STAGES=stages, V_IN_REGISTERS=v_in_registers,
                      TABLE_AHEAD=table_ahead)
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ptrs:
            signature[name], attrs[(i,)] = ptrs[name], [["tt.divisibility", 16]]
        elif name == "scale_log2":
            signature[name] = "fp32"
        else:
            signature[name] = "i64" if "stride" in name else "i32"
            if "stride" in name:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": warps, **({"maxnreg": max_registers} if max_registers else {})}
    return triton.compile(src, target=target, options=options)


@pytest.mark.slow
def test_fp8_v_reaches_the_dot_without_byte_gathers_on_sm90():
    from triton.backends.compiler import GPUTarget

    ptx = _compile(GPUTarget("cuda", 90, 32), fp8=True, v_in_registers=True).asm["ptx"]
    # the V tile is converted where it is loaded and its fp16 operand read 8x8 blocks at a time
    assert "cvt.rn.f16x2.e4m3x2" in ptx and "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert "ld.shared.b8" not in ptx and "ld.shared.v2.b8" not in ptx


@pytest.mark.slow
def test_builds_for_rocm_with_tritons_conversion():
    from triton.backends.compiler import GPUTarget

    for fp8 in (False, True):
        assert "amdgcn" in _compile(GPUTarget("hip", "gfx1201", 32), fp8=fp8, v_in_registers=False, tile=32).asm


@pytest.mark.slow
def test_table_ahead_lets_three_stages_double_buffer_kv_on_sm90():
    import re

    from triton.backends.compiler import GPUTarget

    def kv_buffers(**kw):
        ttgir = _compile(GPUTarget("cuda", 90, 32), fp8=True, v_in_registers=True, stages=3, **kw).asm["ttgir"]
        return re.findall(r"local_alloc : \(\) -> !ttg.memdesc<(\d+)x64x128xf8E4M3FN", ttgir)

    # Without it the third stage goes to the block-table load the copies depend on: one K and
    # one V buffer. With the entries loaded a tile ahead, the copies have nothing to wait on and
    # the third stage becomes a second K/V buffer.
    assert kv_buffers() == ["1", "1"]
    assert kv_buffers(table_ahead=True) == ["2", "2"]


class _Recorder:
    """Stands in for a Triton kernel: records each launch's keyword arguments."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(kwargs)
            return "build"

        return launch


def test_launch_hands_the_register_cap_and_table_ahead_to_the_main_kernel(monkeypatch):
    partial, reduce = _Recorder(), _Recorder()
    monkeypatch.setattr(split_kv_kernel, "_kernels", lambda: (partial, reduce))
    q, k, v, out, ks, vs = _tensors()
    cu, lens = torch.tensor([0, 4], dtype=torch.int32), torch.tensor([100], dtype=torch.int32)
    units = 4 * 8 * 16
    scratch = (torch.empty(units * 64), torch.empty(units), torch.empty(units))
    args = (q, k, v, out, cu, lens, torch.zeros(1, 8, dtype=torch.int32), 4, 0.125, ks, vs)
    assert split_kv_kernel.launch(*args, replace(_launch(), max_registers=96, table_ahead=True), *scratch) == "build"
    split_kv_kernel.launch(*args, _launch(), *scratch)
    capped, plain = partial.launches
    assert (capped["maxnreg"], capped["TABLE_AHEAD"]) == (96, True)
    assert "maxnreg" not in plain and plain["TABLE_AHEAD"] is False
    assert all("maxnreg" not in kw for kw in reduce.launches)  # the reduce keeps its own build


def test_wrapper_hands_the_register_cap_to_vllms_kernel(kernel_module, monkeypatch):
    from radiance.attn import tune
    from radiance.attn.triton_launch import RadianceUnifiedAttention

    runner = RadianceUnifiedAttention(kernel_module, arch="any", num_sms=1, table={})
    recorder = _Recorder()  # swapped in after the wrapper checked the real kernel's signature
    monkeypatch.setattr(kernel_module, "kernel_unified_attention", recorder)
    monkeypatch.setattr(kernel_module, "reduce_segments", _Recorder())
    b = tune.Bench(kernel_module, tune.CLASSES[1], max_tokens=256, device=torch.device("cpu"), rotate_bytes=0)
    kw = b.radiance_kwargs(b.point(128, 1, 1)[0])
    runner.launch(kw, policy.TritonLaunch(4, 16, 4, 64, 4, 2, "t", max_registers=96))
    runner.launch(kw, policy.TritonLaunch(4, 16, 4, 64, 4, 2, "t"))
    assert recorder.launches[0]["maxnreg"] == 96 and "maxnreg" not in recorder.launches[1]


def test_warpgroup_refusal_before_any_launch():
    """The warpgroup partial pass's own limits, decided from the launch, dtypes and device."""
    pytest.importorskip("radiance.kernels.split_kv_attention")
    wg = replace(_launch(seg=16, bm=64, tile=64, group=8), block_q=6, partial_pass="cuda_warpgroup")
    args = (256, torch.bfloat16, torch.float8_e4m3fn, 8)
    assert "32-key tile (the warpgroup pass takes 64)" in split_kv_kernel.warpgroup_refusal(replace(wg, tile_size=32), *args, "cpu")
    assert "80 query rows" in split_kv_kernel.warpgroup_refusal(replace(wg, block_q=10), *args, "cpu")
    assert "needs a CUDA GPU" in split_kv_kernel.warpgroup_refusal(wg, *args, "cpu")


def test_warpgroup_call_refusal_wants_16_byte_alignment():
    pytest.importorskip("radiance.kernels.split_kv_attention")
    q, k, v, *_ = _tensors()
    assert split_kv_kernel.warpgroup_call_refusal(q, k, v) is None
    assert "q is not 16-byte aligned" in split_kv_kernel.warpgroup_call_refusal(q[:, :, 1:], k, v)
    assert "K cache" in split_kv_kernel.warpgroup_call_refusal(q, k[:, :, :, 4:], v)


def _warpgroup_table():
    from radiance.attn import tune

    rule = tune._rule(16, 1 / 3, 4, 0, 0.4, 8, 9, "rk_t64w4s2", {64: "wg_s2", 128: "wg_s2"})
    return {"arch": "sm_90", "triton": {"default": rule, "classes": []}}


def _verify_call(q_len=6, kv_heads=2, group=8):
    kw = dict(_call(), cu_seqlens_q=torch.tensor([0, q_len], dtype=torch.int32), max_seqlen_q=q_len,
              seqused_k=torch.tensor([4096], dtype=torch.int32), max_seqlen_k=4096, softmax_scale=0.0625,
              causal=True, window_size=(-1, -1), block_table=torch.zeros(1, 256, dtype=torch.int32),
              softmax_segm_output=torch.empty(q_len * 16 * 256 * 256), softmax_segm_max=torch.empty(q_len * 16 * 256),
              softmax_segm_expsum=torch.empty(q_len * 16 * 256))
    kw["q"] = torch.zeros(q_len, kv_heads * group, 256, dtype=torch.bfloat16)
    kw["k"] = torch.zeros(256, 16, kv_heads, 256).to(torch.float8_e4m3fn)
    kw["v"] = kw["k"].clone()
    kw["out"] = torch.empty_like(kw["q"])
    return kw


def test_a_warpgroup_launch_runs_where_it_can_and_on_the_triton_pass_elsewhere(kernel_module, monkeypatch):
    """A table's warpgroup launch: on this machine (no sm_90 GPU) the same launch on the Triton
    pass, with the reason; where the pass runs, its launch, handed to split_kv_kernel.launch; a
    call whose tensors it cannot take, the Triton pass for that call."""
    pytest.importorskip("radiance.kernels.split_kv_attention")
    from radiance.attn import triton_launch
    from radiance.attn.triton_launch import RadianceUnifiedAttention

    r = RadianceUnifiedAttention(kernel_module, arch="sm_90", num_sms=132, table=_warpgroup_table())
    _, launch, reason = r.decide(_verify_call())
    assert (launch.kernel, launch.partial_pass, launch.block_m, launch.block_q) == ("radiance", "triton", 64, 8)
    assert "Triton partial pass: needs a CUDA GPU" in reason

    monkeypatch.setattr(split_kv_kernel, "warpgroup_refusal", lambda *a: None)
    launched = []
    monkeypatch.setattr(triton_launch.split_kv_kernel, "launch", lambda *a, **k: launched.append(a[11]))
    r = RadianceUnifiedAttention(kernel_module, arch="sm_90", num_sms=132, table=_warpgroup_table())
    r(**_verify_call())
    assert (launched[-1].partial_pass, launched[-1].block_m, launched[-1].block_q) == ("cuda_warpgroup", 64, 6)
    kw = _verify_call()
    kw["q"] = torch.zeros(6, 16, 264, dtype=torch.bfloat16)[:, :, 4:260]  # 8-byte aligned view
    r(**kw)
    assert (launched[-1].partial_pass, launched[-1].block_q) == ("triton", 8)
    assert "Triton partial pass: q is not 16-byte aligned" in r.last_decision[2]
