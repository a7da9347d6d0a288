"""AITER adapter: what can be checked honestly without ROCm."""

import importlib.util
import sys

import pytest
import torch

from radiance.attn import aiter_adapter, policy

HAS_AITER = importlib.util.find_spec("aiter") is not None


@pytest.mark.skipif(HAS_AITER, reason="AITER is installed here")
def test_install_skips_without_aiter():
    assert aiter_adapter.install() == (False, "AITER unified attention not importable")


def test_geometry_is_read_from_the_wrappers_frame():
    # AITER's wrapper holds the batch shape in its locals; the selectors are called from it.
    def select(*a):
        return aiter_adapter.wrapper_geometry("gfx1201", 256, 32768, torch.float8_e4m3fn, torch.float8_e4m3fn, 16)

    def unified_attention(q, num_seqs, num_kv_heads, max_seqlen_q):  # noqa: ARG001 - locals are read
        return select()

    q = torch.empty(9, 12, 256)
    geo = unified_attention(q, 1, 2, 9)
    assert geo == policy.Geometry(arch="gfx1201", head_size=256, num_query_heads=12, num_kv_heads=2,
                                  num_tokens=9, num_seqs=1, max_seqlen_q=9, max_seqlen_k=32768,
                                  q_dtype="fp8", kv_dtype="fp8", block_size=16)


def test_geometry_unreadable_returns_none():
    def unified_attention(q):  # no num_seqs local: not AITER's wrapper
        return aiter_adapter.wrapper_geometry("gfx1201", 256, 1024, torch.bfloat16, torch.bfloat16, 16)

    assert unified_attention(torch.empty(1, 1, 1)) is None

    def unified_attention(q, num_seqs):  # noqa: F811 - a frame missing num_kv_heads
        return aiter_adapter.wrapper_geometry("gfx1201", 256, 1024, torch.bfloat16, torch.bfloat16, 16)

    assert unified_attention(torch.empty(1, 1, 1), 1) is None


@pytest.mark.skipif(not HAS_AITER, reason="AITER is not installed (needs ROCm)")
def test_every_alias_patched_and_idempotent():
    applied, detail = aiter_adapter.install()
    if not applied:
        pytest.skip(detail)
    mods = [m for n, m in sys.modules.items() if n in aiter_adapter.MODULE_NAMES]
    assert mods and all(getattr(m, "_radiance_attn_wrapped", False) for m in mods)
    again = aiter_adapter.install()
    assert again[0] and "0 newly patched" in again[1]
