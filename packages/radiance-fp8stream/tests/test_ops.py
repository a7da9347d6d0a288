"""The stream's custom ops: schema/fake/real agreement (opcheck) and equality with the reference."""

import operator

import pytest
import torch

import radiance.fp8stream.ops  # noqa: F401
from radiance.fp8stream.epilogues import Epilogues
from radiance.kernels import reference

FP8 = torch.float8_e4m3fn


def _rand(*shape, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)


def _same(a, b):
    if a.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("group", [0, 128])
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("with_residual", [True, False])
def test_ar_add_rms_quant_opcheck_and_reference(group, gemma, with_residual):
    y, w = _rand(7, 256, scale=3, seed=1), _rand(256, scale=0.1, seed=2)
    residual = _rand(7, 256, scale=5, seed=3) if with_residual else None
    args = (y, residual, w, 1e-6, gemma, group, FP8)
    torch.library.opcheck(torch.ops.radiance.ar_add_rms_quant, args)
    q, s, r = torch.ops.radiance.ar_add_rms_quant(*args)
    rq, rs, rr = reference.add_rms_quant(y, residual, w, 1e-6, gemma=gemma, group=group)
    assert _same(q, rq) and _same(s, rs)
    if with_residual:
        assert _same(r, rr) and r.data_ptr() != residual.data_ptr()
    else:
        # The op may not return its input: the first layer's stream continues from y itself.
        assert r.shape == (0, 256)


def test_ar_add_rms_quant_row_strided_input():
    wide = _rand(5, 512, seed=4)
    y = wide[:, :256]
    residual, w = _rand(5, 256, seed=5), _rand(256, seed=6)
    q, s, r = torch.ops.radiance.ar_add_rms_quant(y, residual, w, 1e-6, False, 128, FP8)
    rq, rs, rr = reference.add_rms_quant(y.contiguous(), residual, w, 1e-6, group=128)
    assert _same(q, rq) and _same(s, rs) and _same(r, rr)


@pytest.mark.parametrize("group", [0, 128])
def test_silu_mul_quant_opcheck_and_reference(group):
    gu = _rand(6, 512, scale=2, seed=7)
    torch.library.opcheck(torch.ops.radiance.silu_mul_quant, (gu, group, FP8))
    q, s = torch.ops.radiance.silu_mul_quant(gu, group, FP8)
    rq, rs = reference.silu_mul_quant(gu, group=group)
    assert _same(q, rq) and _same(s, rs)


@pytest.mark.parametrize("group", [0, 128])
def test_gdn_norm_quant_opcheck_and_reference(group):
    x, w = _rand(4, 256, seed=8), (1 + _rand(64, scale=0.02, seed=9).float()).to(torch.bfloat16)
    z = _rand(4, 512, seed=10)[:, 256:]  # a row-strided slice, as the GDN hands it over
    torch.library.opcheck(torch.ops.radiance.gdn_norm_quant, (x, z, w, 1e-6, group, FP8))
    q, s = torch.ops.radiance.gdn_norm_quant(x, z, w, 1e-6, group, FP8)
    rq, rs = reference.gdn_norm_quant(x, z.contiguous(), w, 1e-6, group=group)
    assert _same(q, rq) and _same(s, rs)


def test_bad_input_is_a_clear_error_before_any_work(monkeypatch):
    from radiance.kernels import ops as kops

    from radiance.fp8stream import fused_all_reduce
    from radiance.fp8stream import ops as stream_ops

    work = []

    def must_not_run(name):
        def run(*args, **kwargs):
            work.append(name)
            raise AssertionError(f"{name} ran on input that should have been refused")
        return run

    for module, name in ((kops, "_kernel"), (reference, "add_rms_quant"),
                         (reference, "silu_mul_quant"), (stream_ops, "tp_all_reduce"),
                         (fused_all_reduce, "one_kernel")):
        monkeypatch.setattr(module, name, must_not_run(name))
    y, w = _rand(3, 256), _rand(256)
    with pytest.raises(TypeError, match="dtype"):
        torch.ops.radiance.ar_add_rms_quant(y.float(), None, w, 1e-6, False, 0, FP8)
    with pytest.raises(ValueError, match="multiple"):
        torch.ops.radiance.silu_mul_quant(_rand(3, 200), 128, FP8)
    assert work == []


@pytest.mark.parametrize("group", [0, 128])
def test_opaque_and_traced_lowerings_agree(group):
    y, residual, w = _rand(3, 256, seed=11), _rand(3, 256, seed=12), _rand(256, seed=13)
    opaque, traced = Epilogues("opaque", 1), Epilogues("traced", 1)
    for res in (residual, None):
        a = opaque.add_rms_quant(y, res, w, 1e-5, False, group, FP8)
        b = traced.add_rms_quant(y, res, w, 1e-5, False, group, FP8)
        assert all(_same(u, v) for u, v in zip(a, b))
        if res is None:
            assert a[2] is y and b[2] is y
    gu = _rand(3, 512, seed=14)
    assert all(_same(u, v) for u, v in zip(opaque.silu_mul_quant(gu, group, FP8),
                                            traced.silu_mul_quant(gu, group, FP8)))
    with pytest.raises(ValueError, match="lowering"):
        Epilogues("inline", 1)


def test_ops_trace_as_single_nodes_under_torch_compile():
    y, residual, w = _rand(4, 256, seed=15), _rand(4, 256, seed=16), _rand(256, seed=17)

    def f(y, residual, w):
        return torch.ops.radiance.ar_add_rms_quant(y, residual, w, 1e-6, True, 128, FP8)

    graphs = []

    def keep_graph(gm, example_inputs):
        graphs.append(gm.graph)
        return gm.forward

    compiled = torch.compile(f, backend=keep_graph, fullgraph=True)
    got, want = compiled(y, residual, w), f(y, residual, w)
    assert all(_same(a, b) for a, b in zip(got, want))
    # dynamo keeps the op as one opaque node: nothing of the epilogue is traced into the graph
    calls = [n for n in graphs[0].nodes
             if n.op == "call_function" and n.target is not operator.getitem]
    assert len(graphs) == 1 and [str(n.target) for n in calls] == ["radiance.ar_add_rms_quant"]
