"""The one-kernel all-reduce epilogue's wiring: setup outcomes, and which path the op takes.

The kernel itself runs on a GPU with several processes (radiance-kernels'
benchmarks/peer_all_reduce_check.py); here the op's branch is driven with a stand-in peer set
whose fused call is the reference, so what is checked is the routing: the one-kernel path when
the peer set serves the shape, vLLM's all-reduce then the epilogue otherwise, and the same
outputs either way.
"""

import logging

import pytest
import torch

from radiance.fp8stream import flags, fused_all_reduce
from radiance.fp8stream import ops as stream_ops
from radiance.kernels import ops as kops
from radiance.kernels import reference

FP8 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def _fresh_state():
    fused_all_reduce._reset_for_tests()
    yield
    fused_all_reduce._reset_for_tests()


def _rand(*shape, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)


def _bits(t):
    return t.view(torch.uint8) if t.dtype == FP8 else t


class StandInPeerSet:
    """Two ranks holding the same partial: the fused call is the reference on [y, y]."""

    def __init__(self, why_not=None):
        self.why_not = why_not
        self.fused_calls = 0

    def serve_ar_add_rms_quant(self, y, residual, weight, eps, *, gemma, group, fp8_dtype):
        # As the real peer set: the arguments are checked before anything else.
        kops.check_add_rms_quant_args(y, residual, weight, eps, group, fp8_dtype)
        if self.why_not is not None:
            return None
        self.fused_calls += 1
        return reference.ar_add_rms_quant([y, y], residual, weight, eps, gemma=gemma,
                                          group=group, fp8_dtype=fp8_dtype)


@pytest.fixture
def tp2(monkeypatch):
    calls = []

    def all_reduce(y):
        calls.append(y.shape)
        return reference.all_reduce([y, y])

    monkeypatch.setattr(stream_ops, "tp_world_size", lambda: 2)
    monkeypatch.setattr(stream_ops, "tp_all_reduce", all_reduce)
    return calls


def _op(y, residual, w, gemma=False, group=128):
    return torch.ops.radiance.ar_add_rms_quant(y, residual, w, 1e-6, gemma, group, FP8)


@pytest.mark.parametrize("why_not", [None, "M=513 outside 1..512"])
def test_op_takes_the_one_kernel_path_only_where_it_serves(tp2, why_not):
    peers = StandInPeerSet(why_not)
    fused_all_reduce._set(peers, "on (stand-in)")
    y, res, w = _rand(4, 256, seed=1), _rand(4, 256, seed=2), _rand(256, scale=0.1, seed=3)
    out = _op(y, res, w)
    expected = reference.ar_add_rms_quant([y, y], res, w, 1e-6, group=128)
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(out, expected))
    assert peers.fused_calls == (1 if why_not is None else 0)
    assert len(tp2) == (0 if why_not is None else 1)


def test_without_a_peer_set_the_op_reduces_then_runs_the_epilogue(tp2):
    y, res, w = _rand(4, 256, seed=1), _rand(4, 256, seed=2), _rand(256, scale=0.1, seed=3)
    out = _op(y, res, w, gemma=True, group=0)
    expected = reference.ar_add_rms_quant([y, y], res, w, 1e-6, gemma=True, group=0)
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(out, expected))
    assert len(tp2) == 1


@pytest.mark.parametrize("peer_set", [False, True])
def test_bad_arguments_raise_before_the_all_reduce(tp2, peer_set):
    if peer_set:
        fused_all_reduce._set(StandInPeerSet("M=513 outside 1..512"), "on (stand-in)")
    y, res = _rand(4, 256, seed=1), _rand(4, 256, seed=2)
    with pytest.raises(ValueError, match="weight"):
        _op(y, res, _rand(128, scale=0.1, seed=3))
    with pytest.raises(ValueError, match="residual"):
        _op(y, res[:, :128].contiguous(), _rand(256, scale=0.1, seed=3))
    assert tp2 == []


def test_first_layer_never_reduces(tp2):
    peers = StandInPeerSet()
    fused_all_reduce._set(peers, "on (stand-in)")
    y, w = _rand(4, 256, seed=1), _rand(256, scale=0.1, seed=3)
    q, s, r = _op(y, None, w)
    rq, rs, _ = reference.add_rms_quant(y, None, w, 1e-6, group=128)
    assert torch.equal(_bits(q), _bits(rq)) and torch.equal(s, rs) and r.shape == (0, 256)
    assert peers.fused_calls == 0 and tp2 == []


def test_setup_flag_value_is_validated(monkeypatch):
    monkeypatch.setenv(flags.FUSED_ALLREDUCE, "yes")
    with pytest.raises(ValueError, match="RADIANCE_FUSED_ALLREDUCE must be 0 or 1"):
        fused_all_reduce.setup(fused_sites=4)
    with pytest.raises(ValueError, match="RADIANCE_FUSED_ALLREDUCE"):
        flags.validate()


@pytest.fixture
def report(caplog):
    """What setup put in the selection report (its reasons) and in the stream's log."""
    from radiance.kernels import registry

    registry.REGISTRY.clear_log()
    with caplog.at_level(logging.INFO, logger="vllm.radiance.fp8stream"):
        yield lambda: ([r["reason"] for r in registry.selections() if r["op"] == "ar_add_rms_quant"],
                       [r.getMessage() for r in caplog.records if r.name == "vllm.radiance.fp8stream"])
    registry.REGISTRY.clear_log()


def test_setup_without_parallel_groups_is_off_and_says_so(report):
    line = fused_all_reduce.setup(fused_sites=4)
    assert line == "off (vLLM's parallel groups are not initialized)"
    assert report() == ([line], [f"fused all-reduce epilogue {line}"])
    assert fused_all_reduce.one_kernel(_rand(2, 64), _rand(2, 64), _rand(64), 1e-6, False, 0,
                                       FP8) is None


class _TpGroup:
    world_size = 2
    rank_in_group = 0


def _groups(monkeypatch, world_size):
    from vllm.distributed import parallel_state

    group = _TpGroup()
    group.world_size = world_size
    monkeypatch.setattr(parallel_state, "model_parallel_is_initialized", lambda: True)
    monkeypatch.setattr(parallel_state, "get_tp_group", lambda: group)


@pytest.fixture
def tp2_groups(monkeypatch):
    _groups(monkeypatch, 2)


def test_setup_at_tp1_is_off_and_quiet(monkeypatch, report):
    _groups(monkeypatch, 1)
    line = fused_all_reduce.setup(fused_sites=4)
    assert line == "off (tensor-parallel size 1: nothing to reduce)"
    assert fused_all_reduce.status() == line
    assert report() == ([], [])


def test_setup_off_by_flag(monkeypatch, tp2_groups, report):
    monkeypatch.setenv(flags.FUSED_ALLREDUCE, "0")
    line = fused_all_reduce.setup(fused_sites=4)
    assert line == "off (RADIANCE_FUSED_ALLREDUCE=0)" and fused_all_reduce.status() == line
    assert report() == ([line], [f"fused all-reduce epilogue {line}"])


def test_setup_off_under_micro_batch_overlap(tp2_groups, report):
    line = fused_all_reduce.setup(fused_sites=4, ubatching=True)
    assert line == "off (micro-batch overlap runs a rank's all-reduces on two streams)"
    assert report() == ([line], [f"fused all-reduce epilogue {line}"])


def test_setup_off_without_reducing_sites(tp2_groups, report):
    line = fused_all_reduce.setup(fused_sites=0)
    assert line == "off (the fp8 stream installed no epilogue that reduces)"
    assert report() == ([line], [f"fused all-reduce epilogue {line}"])
