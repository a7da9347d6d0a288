"""The public ops: input validation before any launch, CPU dispatch to the reference, the report."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from radiance.kernels import library, ops, reference, registry

BF16 = torch.bfloat16


def _t(*shape, dtype=BF16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _arq(**over):
    args = dict(y=_t(4, 256), residual=_t(4, 256, seed=1), weight=_t(256, seed=2), eps=1e-6)
    kw = {k: over.pop(k) for k in ("gemma", "group", "fp8_dtype") if k in over}
    args.update(over)
    return ops.add_rms_quant(args["y"], args["residual"], args["weight"], args["eps"], **kw)


@pytest.mark.parametrize("over, exc, msg", [
    (dict(y=_t(4, 256).float()), TypeError, "y dtype must be one of bfloat16, float16, got torch.float32"),
    (dict(y=[[1.0]]), TypeError, "y must be a torch.Tensor, got list"),
    (dict(y=_t(2, 4, 256), residual=None), ValueError, "y must be 2-D"),
    (dict(y=_t(256, 4).t()), ValueError, "y must have a contiguous last dim"),
    (dict(y=_t(1, 256).expand(4, 256)), ValueError, "y rows overlap"),
    (dict(residual=_t(4, 256, dtype=torch.float16)), TypeError, "residual dtype torch.float16 differs from y dtype"),
    (dict(residual=_t(4, 128)), ValueError, "residual shape (4, 128) differs from y shape (4, 256)"),
    (dict(residual=_t(4, 512)[:, :256]), ValueError, "residual must be contiguous"),
    (dict(weight=_t(256).to(torch.int32)), TypeError, "weight dtype must be one of bfloat16, float16, float32"),
    (dict(weight=_t(128)), ValueError, "weight must be 1-D of size 256 (K)"),
    (dict(weight=_t(512)[::2]), ValueError, "weight must be contiguous"),
    (dict(y=_t(4, 260), residual=None, weight=_t(260)), ValueError, "K=260 must be a positive multiple of 8"),
    (dict(y=_t(4, 136), residual=None, weight=_t(136), group=128), ValueError,
     "K=136 must be a multiple of the quant group 128"),
    (dict(group=64), ValueError, "group must be 0 (per token) or 128, got 64"),
    (dict(group=True), ValueError, "group must be 0 (per token) or 128, got True"),
    (dict(fp8_dtype=torch.float8_e5m2), TypeError, "fp8_dtype must be torch.float8_e4m3fn or"),
    (dict(eps=float("nan")), ValueError, "eps must be finite and >= 0, got nan"),
    (dict(eps=-1e-6), ValueError, "eps must be finite and >= 0"),
    (dict(eps="1e-6"), TypeError, "eps must be a float, got str"),
    (dict(weight=_t(256).to("meta")), ValueError, "all tensors must be on one device"),
])
def test_add_rms_quant_rejects_bad_input(over, exc, msg):
    with pytest.raises(exc) as info:
        _arq(**over)
    assert msg in str(info.value)


@pytest.mark.parametrize("gu, kw, exc, msg", [
    (_t(4, 512).half().float(), {}, TypeError, "gu dtype must be one of bfloat16, float16"),
    (_t(512), {}, ValueError, "gu must be 2-D"),
    (_t(4, 515), {}, ValueError, "gu width 515 must be even"),
    (_t(4, 12), {}, ValueError, "N=6 must be a positive multiple of 8"),
    (_t(4, 272), dict(group=128), ValueError, "N=136 must be a multiple of the quant group 128"),
    (_t(512, 4).t(), {}, ValueError, "gu must have a contiguous last dim"),
    (_t(4, 512), dict(group=256), ValueError, "group must be 0 (per token) or 128"),
])
def test_silu_mul_quant_rejects_bad_input(gu, kw, exc, msg):
    with pytest.raises(exc) as info:
        ops.silu_mul_quant(gu, **kw)
    assert msg in str(info.value)


@pytest.mark.parametrize("x, z, w, exc, msg", [
    (_t(4, 512).float(), _t(4, 512), _t(128), TypeError, "x dtype must be one of"),
    (_t(4, 512), _t(4, 512, dtype=torch.float16), _t(128), TypeError, "z dtype torch.float16 differs"),
    (_t(4, 512), _t(4, 256), _t(128), ValueError, "z shape (4, 256) differs from x shape (4, 512)"),
    (_t(4, 512), _t(512, 4).t(), _t(128), ValueError, "z must have a contiguous last dim"),
    (_t(4, 512), _t(4, 512), _t(2, 64), ValueError, "weight must be 1-D of size head_dim"),
    (_t(4, 512), _t(4, 512), _t(96), ValueError, "N=512 must be a multiple of head_dim=96"),
    (_t(4, 512), _t(4, 512), _t(128).to(torch.int8), TypeError, "weight dtype must be one of"),
    (_t(4, 36), _t(4, 36), _t(12), ValueError, "N=36 must be a positive multiple of 8"),
    (_t(4, 512), _t(4, 512).to("meta"), _t(128), ValueError, "all tensors must be on one device"),
])
def test_gdn_norm_quant_rejects_bad_input(x, z, w, exc, msg):
    with pytest.raises(exc) as info:
        ops.gdn_norm_quant(x, z, w, 1e-6)
    assert msg in str(info.value)


def _same(a, b):
    if a.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [0, 128])
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_cpu_dispatch_equals_reference(dtype, group, fp8):
    m, k = 5, 1024
    y = _t(m, 2 * k, dtype=dtype, seed=3)[:, k:]
    res = _t(m, k, dtype=dtype, seed=4)
    w = _t(k, dtype=dtype, seed=5)
    for gemma in (False, True):
        for r in (res, None):
            got = ops.add_rms_quant(y, r, w, 1e-5, gemma=gemma, group=group, fp8_dtype=fp8)
            want = reference.add_rms_quant(y, r, w, 1e-5, gemma=gemma, group=group, fp8_dtype=fp8)
            assert all(_same(a, b) for a, b in zip(got, want))
            assert got[0].dtype == fp8 and got[1].dtype == torch.float32
    gu = _t(m, 2 * k, dtype=dtype, seed=6)
    assert all(_same(a, b) for a, b in zip(ops.silu_mul_quant(gu, group=group, fp8_dtype=fp8),
                                          reference.silu_mul_quant(gu, group=group, fp8_dtype=fp8)))
    x, z = _t(m, k, dtype=dtype, seed=7), _t(m, 3 * k, dtype=dtype, seed=8)[:, :k]
    gw = _t(128, dtype=dtype, seed=9)
    assert all(_same(a, b) for a, b in zip(
        ops.gdn_norm_quant(x, z, gw, 1e-6, group=group, fp8_dtype=fp8),
        reference.gdn_norm_quant(x, z, gw, 1e-6, group=group, fp8_dtype=fp8)))


def test_first_layer_returns_y_as_residual_and_empty_batch():
    y, w = _t(3, 256), _t(256, seed=1)
    q, s, r = ops.add_rms_quant(y, None, w, 1e-6)
    assert r is y and q.shape == (3, 256) and s.shape == (3,)
    q, s, r = ops.add_rms_quant(_t(0, 256), _t(0, 256), w, 1e-6, group=128)
    assert q.shape == (0, 256) and s.shape == (0, 2) and r.shape == (0, 256)


def test_registry_reports_why_the_reference_runs_on_cpu():
    ops.silu_mul_quant(_t(2, 4096, seed=10), group=128)
    rows = [r for r in registry.selections()
            if r["op"] == "silu_mul_quant" and r["query"]["K"] == 2048 and r["query"]["group"] == 128]
    assert len(rows) == 1 and rows[0]["kernel"] is None
    assert rows[0]["reason"] == (
        "radiance_jit: tensors on cpu: the kernels run on CUDA/ROCm GPUs only")
    lines = registry.report_lines(rows, "radiance kernels")
    assert "no kernel, reference runs: radiance_jit: tensors on cpu" in lines[-1]
    if not torch.cuda.is_available():
        assert not ops.available()
        assert ops.unavailable_reason().startswith("no GPU")


def test_gdn_head_dims_the_kernel_refuses_are_served_by_the_reference(monkeypatch):
    query = {"device": "cuda", "device_index": 0, "dtype": "bfloat16", "K": 3072, "group": 128,
             "fp8": "float8_e4m3fn"}
    for head_dim in (96, 4, 512):
        why = ops._serves(dict(query, head_dim=head_dim))
        assert why == f"head_dim={head_dim} (the kernel takes powers of two from 8 to 256)"
    assert "head_dim" not in (ops._serves(dict(query, head_dim=128)) or "")

    class Launches:  # stands for a served library: any launch is recorded and refused
        def gdn_norm_quant(self, *args):
            raise RuntimeError("kernel launched")

    # The op decides as on a GPU whose library serves (on CPU tensors it would take the reference
    # for their device alone), so only the head_dim check stands between the call and a launch.
    decide = ops._kernel
    monkeypatch.setattr(ops, "_kernel", lambda op, device, *rest: decide(op, torch.device("cuda", 0), *rest))
    monkeypatch.setattr(library, "why_not", lambda index=0: None)
    monkeypatch.setattr(library, "get", lambda index=0: Launches())
    monkeypatch.setattr(ops, "stream_of", lambda device: 0)
    ops._reset_decisions_for_tests()
    try:
        x, z = _t(4, 3072, seed=23), _t(4, 3072, seed=24)
        for head_dim in (96, 4, 512):
            w = _t(head_dim, seed=25)
            got = ops.gdn_norm_quant(x, z, w, 1e-6, group=128)
            want = reference.gdn_norm_quant(x, z, w, 1e-6, group=128)
            assert all(_same(g, r) for g, r in zip(got, want)), head_dim
        with pytest.raises(RuntimeError, match="kernel launched"):  # a head_dim it takes launches
            ops.gdn_norm_quant(x, z, _t(128, seed=25), 1e-6, group=128)
    finally:
        ops._reset_decisions_for_tests()  # no decision made against the stand-in may outlive the test


def test_rows_not_16_byte_aligned_run_the_reference(monkeypatch):
    class Launches:  # stands for a served kernel: any launch is recorded and refused
        def silu_mul_quant(self, *args):
            raise RuntimeError("kernel launched")

    monkeypatch.setattr(ops, "_kernel", lambda *args, **kwargs: Launches())
    monkeypatch.setattr(ops, "stream_of", lambda device: 0)
    buf = _t(4, 2 * 2048 + 16, seed=21)
    for misaligned in (buf[:, 1:4097], _t(4, 4100, seed=22)[:, :4096]):  # 2 bytes in; 8200 B rows
        got = ops.silu_mul_quant(misaligned, group=128)
        want = reference.silu_mul_quant(misaligned, group=128)
        assert all(_same(g, w) for g, w in zip(got, want))
    with pytest.raises(RuntimeError, match="kernel launched"):  # an aligned view still launches
        ops.silu_mul_quant(buf[:, 8:4104], group=128)


def test_decision_is_asked_once_per_shape_class():
    before = {(r["op"], repr(sorted(r["query"].items()))): r["count"] for r in registry.selections()}
    for seed in range(3):
        ops.silu_mul_quant(_t(seed + 1, 1536, seed=seed))
    rows = [r for r in registry.selections()
            if r["op"] == "silu_mul_quant" and r["query"]["K"] == 768 and r["query"]["group"] == 0]
    assert len(rows) == 1
    key = ("silu_mul_quant", repr(sorted(rows[0]["query"].items())))
    assert rows[0]["count"] - before.get(key, 0) <= 1


def test_import_is_lazy():
    code = ("import sys, radiance.kernels as k; assert 'torch' not in sys.modules; "
            "assert 'radiance.kernels.library' not in sys.modules; "
            "assert callable(k.add_rms_quant); assert 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
