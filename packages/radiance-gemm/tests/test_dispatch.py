"""Route planning (load time) and the per-call M branch."""

import json

import pytest
import torch

from radiance.gemm import dispatch, providers
from radiance.kernels import registry

W = dispatch.ROUTE_WIDTH


def _names(route):
    return [(route[i], providers.PROVIDERS[route[i + 1]].name) for i in range(0, len(route), W)]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("RADIANCE_GEMM_PROVIDER", "RADIANCE_GEMM_EXCLUDE", "RADIANCE_PRESHUFFLE", "RADIANCE_GEMM_WGMMA"):
        monkeypatch.delenv(var, raising=False)
    dispatch.load_table.cache_clear()


def test_cpu_routes_every_m_to_the_reference():
    assert _names(dispatch.plan("cpu", "cpu", 256, 512)) == [(providers.M_ANY, "cpu_reference")]


def test_sm90_default_is_splitk_for_decode_then_torch(monkeypatch):
    monkeypatch.setattr(dispatch, "load_table", lambda arch: None)
    route = dispatch.plan("cuda", "sm90", 2048, 4096, sms=132)
    assert _names(route) == [(16, "triton_splitk"), (providers.M_ANY, "torch_blockwise")]
    bn, split = route[2], route[3]
    assert bn == 64 and split >= 2  # 32 column tiles alone cannot fill 132 SMs


def test_non_hopper_cuda_uses_triton_generic_above_16(monkeypatch):
    monkeypatch.setattr(dispatch, "load_table", lambda arch: None)
    assert _names(dispatch.plan("cuda", "sm80", 2048, 4096, sms=108))[-1][1] == "triton_generic"
    # torch's block-wise recipe needs 128-multiples; a ragged N falls to Triton even on sm90
    assert _names(dispatch.plan("cuda", "sm90", 2000, 4096, sms=132))[-1][1] == "triton_generic"


def test_force_and_exclude(monkeypatch):
    monkeypatch.setattr(dispatch, "load_table", lambda arch: None)
    monkeypatch.setenv("RADIANCE_GEMM_PROVIDER", "triton_generic")
    assert _names(dispatch.plan("cuda", "sm90", 2048, 4096, sms=132)) == [
        (providers.M_ANY, "triton_generic")]
    # a provider limited to M <= 16 serves exactly that range; the normal route serves the rest
    monkeypatch.setenv("RADIANCE_GEMM_PROVIDER", "triton_splitk")
    assert _names(dispatch.plan("cuda", "sm90", 2048, 4096, sms=132)) == [
        (16, "triton_splitk"), (providers.M_ANY, "torch_blockwise")]
    monkeypatch.setenv("RADIANCE_GEMM_PROVIDER", "no_such")
    with pytest.raises(ValueError):
        dispatch.plan("cuda", "sm90", 2048, 4096)
    monkeypatch.delenv("RADIANCE_GEMM_PROVIDER")
    monkeypatch.setenv("RADIANCE_GEMM_EXCLUDE", "torch_blockwise")
    assert _names(dispatch.plan("cuda", "sm90", 2048, 4096, sms=132))[-1][1] == "triton_generic"


def test_forced_provider_that_cannot_serve_is_reported_and_ignored(monkeypatch):
    monkeypatch.setenv("RADIANCE_GEMM_PROVIDER", "torch_blockwise")
    route = dispatch.plan("cpu", "cpu", 256, 512)
    assert _names(route) == [(providers.M_ANY, "cpu_reference")]
    rows = [r for r in registry.selections() if r["kernel"] is None and "torch_blockwise" in r["reason"]]
    assert rows and "not for cpu" in rows[-1]["reason"]


def test_measured_table_is_used_with_nearest_shape(monkeypatch):
    table = {"arch": "sm90", "shapes": {
        "2048x4096": [[4, "triton_splitk", "bn32-sk8-w4-s4-f1"], [64, "triton_generic", "bm32-bn128-w4-s3"],
                      [2048, "torch_blockwise", ""]],
        "25600x5120": [[2048, "torch_blockwise", ""]]}}
    monkeypatch.setattr(dispatch, "load_table", lambda arch: table if arch == "sm90" else None)
    idx = providers.PROVIDER_INDEX
    want = (4, idx["triton_splitk"], 32, 8, 4, 4, 1, 0,
            64, idx["triton_generic"], 32, 128, 4, 3, 0, 0,
            providers.M_ANY, idx["torch_blockwise"], 0, 0, 0, 0, 0, 0)
    assert dispatch.plan("cuda", "sm90", 2048, 4096, sms=132) == want
    # an unmeasured shape takes the nearest measured one's plan, entry for entry (the default
    # would be split-K up to 16 then torch; 25600x5120's plan is torch alone)
    assert dispatch.plan("cuda", "sm90", 2560, 4096, sms=132) == want
    near = [r for r in registry.selections() if r["query"].get("N") == 2560 and r["query"]["M"] == "1-4"]
    assert near[-1]["reason"] == "table sm90 (measured 2048x4096)"
    rows = [r for r in registry.selections() if r["query"].get("N") == 2048 and r["query"]["M"] == "1-4"]
    assert rows[-1]["kernel"] == "triton_splitk[bn32-sk8-w4-s4-f1]"
    assert "table sm90" in rows[-1]["reason"]


class _FakeResources:
    """``importlib.resources`` whose table file fails to read with ``error``."""

    def __init__(self, error):
        self.error, self.reads = error, 0

    def files(self, package):
        return self

    def joinpath(self, *parts):
        return self

    def read_text(self):
        self.reads += 1
        raise self.error

    def __str__(self):
        return "tables/sm90.json"


def test_a_missing_table_is_no_table_and_an_unreadable_one_is_reported(monkeypatch):
    warnings = []
    monkeypatch.setattr(dispatch.logger, "warning", lambda *args: warnings.append(args[0] % args[1:]))
    monkeypatch.setattr(dispatch, "_TABLE_ERRORS", {})
    monkeypatch.setattr(dispatch, "resources", _FakeResources(FileNotFoundError("no such file")))
    assert dispatch.load_table("sm90") is None and not warnings and not dispatch._TABLE_ERRORS

    dispatch.load_table.cache_clear()
    fake = _FakeResources(PermissionError(13, "Permission denied"))
    monkeypatch.setattr(dispatch, "resources", fake)
    assert dispatch.load_table("sm90") is None
    assert dispatch.load_table("sm90") is None  # cached: read and reported once
    assert fake.reads == 1 and len(warnings) == 1
    assert "tables/sm90.json unreadable (PermissionError: [Errno 13] Permission denied)" in warnings[0]
    # the layer is still served, by the built-in default, and the report says why
    route = dispatch.plan("cuda", "sm90", 2048, 4096, sms=132)
    assert _names(route) == [(16, "triton_splitk"), (providers.M_ANY, "torch_blockwise")]
    rows = [r for r in registry.selections() if r["query"].get("N") == 2048 and r["query"]["M"] == "1-16"]
    assert rows[-1]["reason"] == ("default (table sm90 unreadable: tables/sm90.json: "
                                  "PermissionError: [Errno 13] Permission denied)")


def test_table_rows_are_kept_per_provider_and_m_limited_ones_keep_their_bound(monkeypatch):
    table = {"arch": "sm90", "shapes": {
        "2048x4096": [[8, "cuda_decode", "skauto-w4-r1-s4"], [16, "triton_splitk", ""],
                      [2048, "torch_blockwise", ""]],
        "4096x4096": [[1, "triton_splitk", ""], [4, "triton_splitk", "bn32-sk8-w4-s4-f1"]]}}
    monkeypatch.setattr(dispatch, "load_table", lambda arch: table if arch == "sm90" else None)
    # a row whose provider is unusable here is dropped; the measured rows around it stay
    monkeypatch.setenv("RADIANCE_GEMM_EXCLUDE", "cuda_decode")
    assert _names(dispatch.plan("cuda", "sm90", 2048, 4096, sms=132)) == [
        (16, "triton_splitk"), (providers.M_ANY, "torch_blockwise")]
    rows = [r for r in registry.selections() if r["query"].get("N") == 2048]
    assert "without unusable cuda_decode" in rows[-1]["reason"]
    # a table measured only at decode sizes never hands M > 16 to split-K (16-row blocks)
    monkeypatch.delenv("RADIANCE_GEMM_EXCLUDE")
    assert _names(dispatch.plan("cuda", "sm90", 4096, 4096, sms=132)) == [
        (1, "triton_splitk"), (4, "triton_splitk"), (providers.M_ANY, "torch_blockwise")]


def test_wgmma_flag_swaps_the_tables_warpgroup_mma_points_for_the_mma_sync_kernel(monkeypatch):
    table = {"arch": "sm90", "shapes": {
        "12288x2048": [[4, "cuda_tma", "sk2-s8"], [8, "cuda_decode", "skauto-w8-r2-s2"],
                       [16, "cuda_decode", "skauto-w4-r4-s4-wg1"], [2048, "torch_blockwise", ""]]}}
    monkeypatch.setattr(dispatch, "load_table", lambda arch: table if arch == "sm90" else None)
    # their availability needs a GPU; the plan does not
    patched = list(providers.PROVIDERS)
    for name in ("cuda_decode", "cuda_tma"):
        idx = providers.PROVIDER_INDEX[name]
        patched[idx] = providers.Provider(**{**patched[idx].__dict__, "available": lambda: None})
    monkeypatch.setattr(providers, "PROVIDERS", tuple(patched))
    monkeypatch.setattr(dispatch, "PROVIDERS", providers.PROVIDERS)

    def decode_entries():
        route = dispatch.plan("cuda", "sm90", 12288, 2048, sms=132)
        w = dispatch.ROUTE_WIDTH
        out = []
        for i in range(0, len(route), w):
            name = providers.PROVIDERS[route[i + 1]].name
            if name.startswith("cuda_"):
                out.append((route[i], name, providers.format_params(name, tuple(route[i + 2:i + w]))))
        return out

    on = decode_entries()
    assert on[0] == (4, "cuda_tma", "sk2-s8") and on[-1][0] == 16 and on[-1][2].endswith("-wg1")
    monkeypatch.setenv("RADIANCE_GEMM_WGMMA", "0")
    off = decode_entries()
    default = providers.format_params("cuda_decode", providers.parse_config(
        "cuda_decode", providers.provider("cuda_decode").default_config, 12288, 2048, 132))
    assert off == [(4, "cuda_decode", default), (8, "cuda_decode", "sk1-w8-r2-s2"),
                   (16, "cuda_decode", default)]
    rows = [r for r in registry.selections() if r["query"].get("N") == 12288]
    assert "RADIANCE_GEMM_WGMMA=0" in rows[-1]["reason"]


def test_unknown_exclude_name_and_bad_configs_raise(monkeypatch):
    monkeypatch.setenv("RADIANCE_GEMM_EXCLUDE", "torch-blockwise")
    with pytest.raises(ValueError, match="unknown providers"):
        dispatch.plan("cuda", "sm90", 2048, 4096, sms=132)
    for name, bad in (("triton_splitk", "bn64-skauto-w4-u2-f1"), ("triton_splitk", "bn8"),
                      ("triton_generic", "bm64-sk2"), ("torch_blockwise", "w4")):
        with pytest.raises(ValueError, match=f"bad {name} config"):
            providers.parse_config(name, bad, 4096, 4096, 132)
    with pytest.raises(ValueError, match="unknown GEMM provider"):
        providers.parse_config("no_such", "", 4096, 4096, 132)


@pytest.mark.parametrize("bad,why", [
    ("bn64-sk4-w4-s4-f3", "f is 0 .unsplit., 1 .in-kernel fixup. or 2"),
    ("bn64-sk1-w4-s4-f9", "f is 0 .unsplit., 1 .in-kernel fixup. or 2"),
    ("bn64-sk1-w4-s4-fauto", "f is 0 .unsplit., 1 .in-kernel fixup. or 2"),
    # f0 lets every K range overwrite the output: refused wherever more than one can launch
    ("bn64-sk2-w4-s4-f0", "f0 needs sk1"),
    ("bn64-skauto-w4-s4-f0", "f0 needs sk1"),
    ("bn64-w4-s4-f0", "f0 needs sk1"),  # sk defaults to auto
])
def test_splitk_fixup_mode_is_validated(bad, why):
    with pytest.raises(ValueError, match=f"bad triton_splitk config '{bad}': {why}"):
        providers.parse_config("triton_splitk", bad, 4096, 4096, 132)


def test_splitk_fixup_modes_it_accepts():
    assert providers.parse_config("triton_splitk", "bn64-sk1-w4-s4-f0", 4096, 4096, 132) == (64, 1, 4, 4, 0, 0)
    assert providers.parse_config("triton_splitk", "bn32-sk8-w4-s4-f1", 4096, 4096, 132) == (32, 8, 4, 4, 1, 0)
    # the default fixup is the second-launch reduce, with any split
    assert providers.parse_config("triton_splitk", "bn64-sk4", 4096, 4096, 132)[4] == 2


def test_torch_blockwise_is_not_routed_k_it_refuses(monkeypatch):
    # scaled_mm's block-wise weight scales need K/128 a multiple of 4 (K = 256 refused on the H200)
    monkeypatch.setattr(dispatch, "load_table", lambda arch: None)
    assert _names(dispatch.plan("cuda", "sm90", 2048, 256, sms=132))[-1][1] == "triton_generic"
    assert _names(dispatch.plan("cuda", "sm90", 2048, 512, sms=132))[-1][1] == "torch_blockwise"
    why = providers.provider("torch_blockwise").serves("cuda", "sm90", 2048, 384, (128, 128),
                                                       torch.float8_e4m3fn)
    assert "K/128 = 3 is not a multiple of 4" in why


def test_committed_tables_parse_and_name_known_providers():
    from importlib import resources

    for entry in resources.files("radiance.gemm").joinpath("tables").iterdir():
        if entry.name.endswith(".json"):
            table = json.loads(entry.read_text())
            for key, rows in table["shapes"].items():
                n, k = (int(v) for v in key.split("x"))
                ms = [int(r[0]) for r in rows]
                assert ms == sorted(ms)
                for _, name, cfg in rows:
                    provider = providers.provider(name)  # raises on an unknown name
                    providers.parse_config(name, cfg or provider.default_config, n, k, 132)


def test_preshuffle_only_when_enabled_and_then_for_every_m(monkeypatch):
    aiter = providers.provider("aiter_preshuffle")
    fake = providers.Provider(**{**aiter.__dict__, "available": lambda: None})
    idx = providers.PROVIDER_INDEX["aiter_preshuffle"]
    monkeypatch.setattr(providers, "PROVIDERS",
                        providers.PROVIDERS[:idx] + (fake,) + providers.PROVIDERS[idx + 1:])
    monkeypatch.setattr(dispatch, "PROVIDERS", providers.PROVIDERS)
    monkeypatch.setattr(dispatch, "load_table", lambda arch: None)
    off = dispatch.plan("rocm", "gfx1201", 2048, 4096, sms=32)
    assert "aiter_preshuffle" not in [n for _, n in _names(off)] and not dispatch.wants_shuffled(off)
    monkeypatch.setenv("RADIANCE_PRESHUFFLE", "1")
    on = dispatch.plan("rocm", "gfx1201", 2048, 4096, sms=32)
    assert _names(on) == [(providers.M_ANY, "aiter_preshuffle")] and dispatch.wants_shuffled(on)
    # only genuine 128x128-block weights with N, K multiples of 128
    ragged = dispatch.plan("rocm", "gfx1201", 2000, 4096, sms=32)
    assert not dispatch.wants_shuffled(ragged)


def test_run_route_branches_on_m(monkeypatch):
    calls = []

    def spy(name):
        def run(a, b, sa, sb, out_dtype, params, counters):
            calls.append((name, a.shape[0], params))
            return a.new_zeros((a.shape[0], b.shape[0]), dtype=out_dtype)
        return run

    fakes = tuple(providers.Provider(**{**p.__dict__, "run": spy(p.name)}) for p in providers.PROVIDERS)
    monkeypatch.setattr(dispatch, "PROVIDERS", fakes)
    i_s, i_g = providers.PROVIDER_INDEX["triton_splitk"], providers.PROVIDER_INDEX["triton_generic"]
    route = [8, i_s, 64, 4, 4, 4, 1, 0, providers.M_ANY, i_g, 0, 128, 4, 3, 0, 0]
    for m in (1, 8, 9, 300):
        a = torch.zeros(m, 256, dtype=torch.float8_e4m3fn)
        dispatch.run_route(route, a, torch.zeros(128, 256, dtype=torch.float8_e4m3fn),
                           torch.ones(m, 2), torch.ones(1, 2), torch.bfloat16, torch.empty(0))
    assert [(c[0], c[1]) for c in calls] == [("triton_splitk", 1), ("triton_splitk", 8),
                                             ("triton_generic", 9), ("triton_generic", 300)]
    assert calls[0][2] == (64, 4, 4, 4, 1, 0)


def test_custom_op_fake_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(5, 256, dtype=torch.float8_e4m3fn)
        b = torch.empty(384, 256, dtype=torch.float8_e4m3fn)
        out = torch.ops.radiance_gemm.block_fp8_mm(a, b, torch.empty(5, 2), torch.empty(3, 2),
                                                   torch.empty(0, dtype=torch.int32),
                                                   [providers.M_ANY, 0, 128, 128, 0, 0, 0],
                                                   torch.bfloat16)
    assert out.shape == (5, 384) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("n,k,want", [(5120, 4096, 1), (2048, 4096, 2), (1024, 2048, 4),
                                      (512, 2048, 8), (2048, 256, 2), (51200, 5120, 1)])
def test_cuda_decode_auto_split_fills_about_two_blocks_per_sm(n, k, want):
    split, warps, rows, stages, *_ = providers.parse_config("cuda_decode", "skauto-w4-r1-s4", n, k, 132)
    assert (split, warps, rows, stages) == (want, 4, 1, 4)
    assert (n // 16) * split <= 2 * 132 or split == 1
    assert split <= k // 128  # never an empty K range


@pytest.mark.parametrize("n,k,stages,want", [(12288, 2048, 8, 1), (5120, 5120, 8, 3),
                                             (2048, 4096, 8, 8), (512, 2048, 4, 8),
                                             (51200, 5120, 8, 1), (2048, 256, 8, 1)])
def test_cuda_tma_auto_split_fills_one_wave(n, k, stages, want):
    split, got_stages, *_ = providers.parse_config("cuda_tma", f"skauto-s{stages}", n, k, 132)
    assert (split, got_stages) == (want, stages)
    assert split <= k // 256 or split == 1  # each K range at least two groups


@pytest.mark.parametrize("name,config,params,formatted", [
    ("cuda_tma", "sk4-s12", (4, 12, 0, 0, 0, 0), "sk4-s12"),
    ("cuda_tma", "sk4-s12-ov1", (4, 12, 0, 0, 0, 1), "sk4-s12-ov1"),
    ("cuda_tma", "sk4-s12-ov0", (4, 12, 0, 0, 0, 0), "sk4-s12"),
    ("cuda_decode", "sk4-w8-r2-s2", (4, 8, 2, 2, 0, 0), "sk4-w8-r2-s2"),
    ("cuda_decode", "sk4-w8-r2-s2-ov1", (4, 8, 2, 2, 0, 1), "sk4-w8-r2-s2-ov1"),
    ("cuda_decode", "sk2-w8-r8-s3-wg1", (2, 8, 8, 3, 1, 0), "sk2-w8-r8-s3-wg1"),
    ("cuda_decode", "sk2-w4-r4-s3-wg2", (2, 4, 4, 3, 2, 0), "sk2-w4-r4-s3-wg2"),
    # pf<G>: L2 prefetch depth, packed with ov into the last int (ov + 2 * pf)
    ("cuda_decode", "sk1-w8-r1-s2-ov1-pf64", (1, 8, 1, 2, 0, 129), "sk1-w8-r1-s2-ov1-pf64"),
    ("cuda_decode", "sk1-w8-r1-s2-pf8", (1, 8, 1, 2, 0, 16), "sk1-w8-r1-s2-pf8"),
    ("cuda_tma", "sk1-s8-pf4096-ov1", (1, 8, 0, 0, 0, 8193), "sk1-s8-ov1-pf4096"),
    ("cuda_tma", "sk1-s8-pf0", (1, 8, 0, 0, 0, 0), "sk1-s8"),
])
def test_cuda_config_round_trips(name, config, params, formatted):
    assert providers.parse_config(name, config, 4096, 4096, 132) == params
    assert providers.format_params(name, params) == formatted


@pytest.mark.parametrize("name,bad", [
    *(("cuda_tma", bad) for bad in ("sk2-s5", "sk0-s8", "sk2-w4-s8", "sk2-s8-ov2", "sk2-s8-pfauto",
                                    "sk2-s8-pf1048576")),
    *(("cuda_decode", bad) for bad in (
        "sk2-w8-r1-s4", "sk2-w4-r8-s2", "sk2-w4-r1-u2", "sk0-w4-r1-s2", "sk2-w8-r4-s2-wg1",
        "sk2-w4-r4-s6-wg1", "sk2-w4-r4-s4-wg2", "sk2-w8-r8-s3-wg2", "sk2-w4-r4-s2-wg3",
        "sk2-w8-r8-s3", "sk2-w8-r1-s2-ov3")),
])
def test_bad_cuda_config_raises(name, bad):
    with pytest.raises(ValueError, match=f"bad {name} config"):
        providers.parse_config(name, bad, 4096, 4096, 132)


def test_cuda_decode_auto_split_counts_block_columns_and_sm80_is_refused():
    # four row warps make a quarter of the block columns, so auto split goes four times higher
    assert providers.parse_config("cuda_decode", "skauto-w4-r4-s4", 2048, 4096, 132)[0] == 8
    assert providers.provider("cuda_decode").serves("cuda", "sm80", 4096, 4096, (128, 128),
                                                    torch.float8_e4m3fn).startswith("arch sm80")


def test_splitk_refuses_more_rows_than_its_block_before_launching():
    pytest.importorskip("triton")
    from radiance.gemm import triton_block_fp8

    a = torch.ones(17, 128).to(torch.float8_e4m3fn)
    b = torch.ones(64, 128).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="M <= 16"):
        triton_block_fp8.splitk_mm(a, b, torch.ones(17, 1), torch.ones(1, 1), torch.bfloat16)


def test_an_empty_batch_returns_an_empty_output_without_running_a_provider(monkeypatch):
    import dataclasses

    route = dispatch.plan("cpu", "cpu", 256, 512)

    def must_not_run(*args):
        raise AssertionError("a provider ran for M = 0")

    idx = route[1]
    patched = dataclasses.replace(providers.PROVIDERS[idx], run=must_not_run)
    monkeypatch.setattr(dispatch, "PROVIDERS",
                        providers.PROVIDERS[:idx] + (patched,) + providers.PROVIDERS[idx + 1:])
    a = torch.empty(0, 512, dtype=torch.float8_e4m3fn)
    b = torch.zeros(256, 512, dtype=torch.float8_e4m3fn)
    out = dispatch.run_route(route, a, b, torch.ones(0, 4), torch.ones(2, 4), torch.bfloat16, None)
    assert out.shape == (0, 256) and out.dtype == torch.bfloat16
