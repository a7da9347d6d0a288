"""The AITER providers' availability reasons and the weight shuffle's size check (no AITER needed)."""

import sys
import types

import pytest
import torch

from radiance.gemm import aiter_block_fp8


@pytest.fixture
def no_aiter(monkeypatch):
    # None in sys.modules makes every import of these names fail, with or without AITER installed
    for name in ("aiter", "aiter.ops", "aiter.ops.shuffle", *aiter_block_fp8._MODULES):
        monkeypatch.setitem(sys.modules, name, None)


def test_import_errors_are_reported_with_their_message(no_aiter):
    mod, why = aiter_block_fp8._load()
    assert mod is None
    for name in aiter_block_fp8._MODULES:
        assert f"{name}: ModuleNotFoundError: import of {name} halted" in why
    fn, why = aiter_block_fp8._load_shuffle()
    assert fn is None
    assert why.startswith("aiter.ops.shuffle.shuffle_weight not importable (ModuleNotFoundError: ")


def test_a_missing_shuffle_is_reported_as_its_import_error_not_as_too_old(monkeypatch):
    fake = types.SimpleNamespace(__name__="aiter_fake", gemm_a8w8_blockscale_preshuffle=lambda *a: None)
    monkeypatch.setattr(aiter_block_fp8, "_mod", fake)
    monkeypatch.setattr(aiter_block_fp8, "_shuffle", None)
    monkeypatch.setattr(aiter_block_fp8, "_shuffle_why", "shuffle: ImportError: libfoo.so missing")
    assert aiter_block_fp8.preshuffle_available() == "shuffle: ImportError: libfoo.so missing"
    monkeypatch.setattr(aiter_block_fp8, "_mod", types.SimpleNamespace(__name__="aiter_fake"))
    assert aiter_block_fp8.preshuffle_available().startswith("AITER too old: aiter_fake has no")


def test_shuffle_weight_refuses_a_changed_element_count_before_reshaping(monkeypatch):
    w = torch.zeros(32, 256, dtype=torch.float8_e4m3fn)
    monkeypatch.setattr(aiter_block_fp8, "_shuffle", lambda t, layout: t.reshape(-1)[:-16])
    with pytest.raises(ValueError, match=r"returned \[8176\] .* for a \[32, 256\] weight"):
        aiter_block_fp8.shuffle_weight(w)
    # a same-size shuffle comes back in the logical [N, K] shape
    monkeypatch.setattr(aiter_block_fp8, "_shuffle", lambda t, layout: t.reshape(2, -1))
    assert aiter_block_fp8.shuffle_weight(w).shape == (32, 256)
