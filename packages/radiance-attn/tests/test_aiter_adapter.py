"""AITER adapter: what can be checked honestly without ROCm."""

import copy
import importlib.util
import sys
import types
from typing import NamedTuple

import pytest
import torch

from radiance.attn import aiter_adapter, policy, tables

FP8 = torch.float8_e4m3fn

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


# AITER's newer wrapper builds a ``_UAParams`` (the whole batch shape) and asks
# ``get_unified_attention_config(op, params, backend, arch)`` for each op's config. The patch is
# exercised on a stand-in with that signature, returning configs of the shapes AITER's per-arch
# tables hold; the fields are the ones of ``_UAParams`` the adapter reads.
class UAParams(NamedTuple):
    num_tokens: int
    num_query_heads: int
    num_kv_heads: int
    head_size: int
    head_size_v: int
    num_seqs: int
    max_seqlen_q: int
    max_seqlen_k: int
    block_size: int
    q_dtype: torch.dtype
    kv_cache_dtype: torch.dtype
    shuffled_kv_cache: bool
    num_2d_prgms: int  # q-blocks at the stock BLOCK_Q x KV heads


STOCK = {"kv_split": {"TILE_SIZE": 64, "NUM_SEGMENTS": 8},
         "attn_3d": {"BLOCK_M": 16, "num_warps": 2, "num_stages": 2, "waves_per_eu": 2},
         "reduce": {"num_warps": 2, "num_stages": 1, "waves_per_eu": 2},
         "attn_2d": {"BLOCK_M": 16, "TILE_SIZE": 32, "num_warps": 2, "num_stages": 1, "waves_per_eu": 6}}


def _newer_module(tuned_flag: bool, calls=None):
    def get_unified_attention_config(op, params, backend="triton", arch=None):
        if calls is not None:
            calls.append(op)
        cfg = copy.deepcopy(STOCK[op])
        return (cfg, False) if tuned_flag else cfg

    return types.SimpleNamespace(get_unified_attention_config=get_unified_attention_config)


def _params(width=7, seqs=1, kv=FP8, head=256, q_heads=16, kv_heads=2, **kw):
    tokens, qpkv = width * seqs, q_heads // kv_heads
    fields = dict(num_tokens=tokens, num_query_heads=q_heads, num_kv_heads=kv_heads, head_size=head, head_size_v=head,
                  num_seqs=seqs, max_seqlen_q=width, max_seqlen_k=32768, block_size=16, q_dtype=kv,
                  kv_cache_dtype=kv, shuffled_kv_cache=False,
                  num_2d_prgms=(seqs if width == 1 else tokens // max(1, 16 // qpkv) + seqs) * kv_heads)
    fields.update(kw)
    return UAParams(**fields)


def _lookup(tuned_flag=False, calls=None):
    mod = _newer_module(tuned_flag, calls)
    table = tables.for_arch("gfx1201")
    assert aiter_adapter.patch_lookup_module(mod, "get_unified_attention_config", "gfx1201", table)
    assert not aiter_adapter.patch_lookup_module(mod, "get_unified_attention_config", "gfx1201", table)

    def get(op, params, backend="triton"):
        res = mod.get_unified_attention_config(op, params, backend=backend)
        if tuned_flag:
            assert isinstance(res, tuple) and res[1] is False  # the (config, is_tuned) form is kept
            return res[0]
        return res

    return get


@pytest.mark.parametrize("tuned_flag", [False, True])
def test_newer_lookup_verify_batch_gets_the_gfx1201_rules(tuned_flag):
    get = _lookup(tuned_flag)
    p = _params()  # 1 sequence, width 7, 8 queries a KV head: 56 rows, 88% of a 64-row block
    # the widened block: tile 32, 4 warps, one 64-row q-block a KV head (2 programs), so
    # 16 * cbrt(1024 tiles / 2 programs) = 128 segments
    assert get("kv_split", p) == {"TILE_SIZE": 32, "NUM_SEGMENTS": 128}
    # BLOCK_M is the config's here (the wrapper derives BLOCK_Q and the grid); what the wrapper
    # passes beside the config (TILE_SIZE, the segment count) stays out of it
    assert get("attn_3d", p) == {"BLOCK_M": 64, "num_warps": 4, "num_stages": 1, "waves_per_eu": 6}
    assert get("reduce", p) == {"num_warps": 8, "num_stages": 1, "waves_per_eu": 2}
    # the same decision as the selector path's policy call
    attn, _, bm = policy.aiter_decode_3d(aiter_adapter.params_geometry("gfx1201", p),
                                         {"TILE_SIZE": 64, "NUM_SEGMENTS_PER_SEQ": 8}, {}, p.num_2d_prgms,
                                         tables.for_arch("gfx1201"))
    assert (attn["TILE_SIZE"], attn["NUM_SEGMENTS_PER_SEQ"], bm) == (32, 128, 64)


def test_newer_lookup_drafter_pass_keeps_aiters_split_and_block():
    get = _lookup()
    p = _params(width=1, seqs=4)
    assert get("kv_split", p) == {"TILE_SIZE": 16, "NUM_SEGMENTS": 8}
    assert get("attn_3d", p) == {"BLOCK_M": 16, "num_warps": 4, "num_stages": 1, "waves_per_eu": 6}
    assert get("reduce", p) == {"num_warps": 8, "num_stages": 1, "waves_per_eu": 2}


def test_newer_lookup_prefill_by_head_size():
    get = _lookup()
    p = _params(width=300, head=512, kv=torch.bfloat16, q_heads=16, kv_heads=8)
    assert get("attn_2d", p) == {"BLOCK_M": 32, "BLOCK_Q": 16, "TILE_SIZE": 16, "num_warps": 4, "num_stages": 1,
                                 "waves_per_eu": 1}


@pytest.mark.parametrize("change", [dict(kv=torch.bfloat16), dict(shuffled_kv_cache=True), dict(head_size_v=128)])
def test_newer_lookup_leaves_what_the_table_does_not_cover(change):
    get = _lookup()
    p = _params(**change)
    for op in ("kv_split", "attn_3d", "reduce"):
        assert get(op, p) == STOCK[op], op


def test_newer_lookup_keeps_gluon_configs_and_warns_once_on_unexpected_params(caplog):
    get = _lookup()
    assert get("attn_3d", _params(), backend="gluon") == STOCK["attn_3d"]
    odd = types.SimpleNamespace(**{k: v for k, v in _params()._asdict().items() if k != "num_2d_prgms"})
    with caplog.at_level("WARNING", logger="vllm.radiance.attn"):
        assert get("kv_split", odd) == STOCK["kv_split"]
        assert get("kv_split", odd) == STOCK["kv_split"]
    assert len([r for r in caplog.records if "AITER's own config kept" in r.message]) == 1


def test_newer_lookup_decides_once_a_batch():
    # AITER asks kv_split, attn_3d, reduce in turn: one policy decision, no second split lookup
    calls = []
    get = _lookup(calls=calls)
    p = _params()
    first = [get(op, p) for op in ("kv_split", "attn_3d", "reduce")]
    assert calls == ["kv_split", "attn_3d", "reduce"]
    # asked without kv_split first (another geometry), attn_3d reads AITER's split itself and the
    # decision is the same one
    other = _lookup(calls=calls)
    calls.clear()
    assert other("attn_3d", p) == first[1] and calls == ["attn_3d", "kv_split"]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "vllm.radiance.attn" and r.levelname == "WARNING"]


def test_newer_lookup_warns_with_the_field_params_geometry_could_not_read(caplog):
    get = _lookup()
    odd = _params()._replace(num_tokens="seven")
    with caplog.at_level("WARNING", logger="vllm.radiance.attn"):
        assert get("kv_split", odd) == STOCK["kv_split"]
        assert get("attn_3d", odd) == STOCK["attn_3d"]
    (warning,) = _warnings(caplog)
    assert "ValueError: invalid literal for int() with base 10: 'seven'" in warning
    assert warning.endswith("; AITER's own config kept")


def _selector_module():
    def select_3d_config(head_size, max_seqlen_k, q_dtype, kv_cache_dtype, block_size, num_2d_prgms, tile=64):
        return {"TILE_SIZE": tile, "NUM_SEGMENTS_PER_SEQ": 16, "num_warps": 2}, {"TILE_SIZE": tile, "num_warps": 2}

    def select_2d_config(head_size, max_seqlen_q, max_seqlen_k, q_dtype, kv_cache_dtype, block_size,
                         num_queries_per_kv, shuffled_kv_cache=False):
        return {"BLOCK_M": 16, "TILE_SIZE": 32, "num_warps": 2}

    mod = types.SimpleNamespace(select_3d_config=select_3d_config, select_2d_config=select_2d_config,
                                kernel_unified_attention_3d=object())
    assert aiter_adapter.patch_selector_module(mod, "gfx1201", tables.for_arch("gfx1201"))
    return mod


def test_selectors_keep_aiters_config_and_warn_once_a_reason(caplog):
    mod = _selector_module()
    args = dict(head_size=256, max_seqlen_k=32768, q_dtype=FP8, kv_cache_dtype=FP8, block_size=16, num_2d_prgms=4)

    def unified_attention(q, num_seqs, num_kv_heads, max_seqlen_q, **kw):  # noqa: ARG001 - AITER's frame
        return mod.select_3d_config(**kw)

    q = torch.empty(9, 12, 256)
    with caplog.at_level("WARNING", logger="vllm.radiance.attn"):
        for _ in range(2):
            assert mod.select_3d_config(**args)[0]["TILE_SIZE"] == 64  # no AITER frame above
            assert unified_attention(q, 1, 2, 9, **args, tile=24)[0]["TILE_SIZE"] == 24  # 24 % 16
            assert mod.select_2d_config(256, 9, "many", FP8, FP8, 16, 6) == {"BLOCK_M": 16, "TILE_SIZE": 32,
                                                                            "num_warps": 2}
        # what the policy applies to: no warning, the gfx1201 verify rules
        attn, _ = unified_attention(q, 1, 2, 9, **args)
    assert attn["TILE_SIZE"] == 32
    got = _warnings(caplog)
    assert len(got) == 3, got
    assert "not called from an AITER unified_attention frame" in got[0]
    assert "AITER's 3D tile 24 is not a multiple of the KV block size 16" in got[1]
    assert "select_2d_config took or returned something unexpected (ValueError: invalid literal" in got[2]


def test_keyword_lookup_warns_when_the_policy_cannot_apply(caplog):
    def get_config(head_size=None, max_seqlen_k=0, q_dtype=None, kv_cache_dtype=None, block_size=16):
        return {"TILE_SIZE": 64, "NUM_SEGMENTS_PER_SEQ": 16}, {"num_warps": 2}

    mod = types.SimpleNamespace(get_config=get_config)
    # a user's table whose decode section lacks its reduce overlay
    table = {"arch": "gfx1201", "aiter": {"decode_3d": {"attn": {"TILE_SIZE": 16}}}}
    assert aiter_adapter.patch_lookup_module(mod, "get_config", "gfx1201", table)

    def unified_attention(q, num_seqs, num_kv_heads, max_seqlen_q):  # noqa: ARG001 - AITER's frame
        return mod.get_config(head_size=256, max_seqlen_k=32768, q_dtype=FP8, kv_cache_dtype=FP8)

    with caplog.at_level("WARNING", logger="vllm.radiance.attn"):
        assert unified_attention(torch.empty(9, 12, 256), 1, 2, 9) == get_config()
    (warning,) = _warnings(caplog)
    assert "AITER's get_config took or returned something unexpected (KeyError: 'reduce')" in warning


def test_install_reports_why_a_present_aiter_failed_to_import(monkeypatch, tmp_path):
    pkg = tmp_path / "fake_rocm_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "broken.py").write_text("raise RuntimeError('HIP runtime not found')\n")
    (pkg / "needs_dep.py").write_text("import radiance_attn_test_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    names = ("fake_rocm_attn.absent", "fake_rocm_attn.broken", "fake_rocm_attn.needs_dep")
    monkeypatch.setattr(aiter_adapter, "MODULE_NAMES", names)
    # an absent module is AITER not installed (quiet); the other two are a present but broken one
    assert aiter_adapter.install() == (
        False, "AITER unified attention not importable (fake_rocm_attn.broken: RuntimeError: HIP runtime not "
               "found; fake_rocm_attn.needs_dep: ModuleNotFoundError: No module named "
               "'radiance_attn_test_missing_dependency')")
