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
    for var in ("RADIANCE_GEMM_PROVIDER", "RADIANCE_GEMM_EXCLUDE", "RADIANCE_PRESHUFFLE"):
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
    route = dispatch.plan("cuda", "sm90", 2048, 4096, sms=132)
    assert _names(route) == [(4, "triton_splitk"), (64, "triton_generic"),
                             (providers.M_ANY, "torch_blockwise")]
    assert tuple(route[2:7]) == (32, 8, 4, 4, 1)
    # an unmeasured shape takes the nearest measured one's plan
    assert _names(dispatch.plan("cuda", "sm90", 2560, 4096, sms=132))[0][1] == "triton_splitk"
    rows = [r for r in registry.selections() if r["query"].get("N") == 2048 and r["query"]["M"] == "1-4"]
    assert rows[-1]["kernel"] == "triton_splitk[bn32-sk8-w4-s4-f1]"
    assert "table sm90" in rows[-1]["reason"]


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
                    providers.parse_config(name, cfg or providers.provider(name).default_config,
                                           n, k, 132)


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
    route = [8, i_s, 64, 4, 4, 4, 1, providers.M_ANY, i_g, 0, 128, 4, 3, 0]
    for m in (1, 8, 9, 300):
        a = torch.zeros(m, 256, dtype=torch.float8_e4m3fn)
        dispatch.run_route(route, a, torch.zeros(128, 256, dtype=torch.float8_e4m3fn),
                           torch.ones(m, 2), torch.ones(1, 2), torch.bfloat16, torch.empty(0))
    assert [(c[0], c[1]) for c in calls] == [("triton_splitk", 1), ("triton_splitk", 8),
                                             ("triton_generic", 9), ("triton_generic", 300)]
    assert calls[0][2] == (64, 4, 4, 4, 1)


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
    split, warps, rows, stages, _ = providers.parse_config("cuda_decode", "skauto-w4-r1-s4", n, k, 132)
    assert (split, warps, rows, stages) == (want, 4, 1, 4)
    assert (n // 16) * split <= 2 * 132 or split == 1
    assert split <= k // 128  # never an empty K range


def test_cuda_decode_config_round_trips():
    params = providers.parse_config("cuda_decode", "sk4-w8-r2-s2", 4096, 4096, 132)
    assert params == (4, 8, 2, 2, 0)
    assert providers.format_params("cuda_decode", params) == "sk4-w8-r2-s2"
    for bad in ("sk2-w8-r1-s4", "sk2-w4-r8-s2", "sk2-w4-r1-u2", "sk0-w4-r1-s2"):
        with pytest.raises(ValueError, match="bad cuda_decode config"):
            providers.parse_config("cuda_decode", bad, 4096, 4096, 132)
    # auto split counts block columns: four row warps make a quarter of the columns
    assert providers.parse_config("cuda_decode", "skauto-w4-r4-s4", 2048, 4096, 132)[0] == 8
    assert providers.provider("cuda_decode").serves("cuda", "sm80", 4096, 4096, (128, 128),
                                                    torch.float8_e4m3fn).startswith("arch sm80")
