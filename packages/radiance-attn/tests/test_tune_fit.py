"""The tuning harness's fit recovers a rule from measured candidates (synthetic timings, CPU)."""

import dataclasses
import math

import pytest

from radiance.attn import policy, tables, tune

KLASS = tune.CLASSES[0]  # head 256, 2 KV heads, bf16
GRID = {"ctx": (4096, 32768, 131072), "seqs": (1, 2, 8), "width": (1, 2, 4, 9)}


def _truth(wide_32="t64w4s2", wide_scales=None):
    return tune._rule(22.6, 1 / 3, 4, 0, 0.4, 8, 9, "rk_t64w8s2", {32: wide_32, 64: "t32w4", 128: "rk_t64w8s2"},
                      {128: 0.5} if wide_scales is None else wide_scales)


def _points(rule=None):
    truth = {"arch": "sm_90", "triton": {"default": rule or _truth(), "classes": []}}
    points = []
    for ctx in GRID["ctx"]:
        for seqs in GRID["seqs"]:
            for width in GRID["width"]:
                p = {"class": KLASS.name, "head_size": KLASS.head_size, "num_query_heads": KLASS.num_query_heads,
                     "num_kv_heads": KLASS.num_kv_heads, "kv_dtype": KLASS.kv_dtype, "ctx": ctx, "seqs": seqs,
                     "width": width}
                points.append(dict(p, stock_us=100.0, **_timed(truth, p)))
    return points


def _timed(truth: dict, p: dict) -> dict:
    """``p``'s candidates: the truth table's launch is fastest; every step away from it in
    segments, shape, kernel or block costs time."""
    best = policy.triton_launch(tune._geo(p, "sm_90"), truth)
    cands = {}
    for c in tune.candidate_launches(KLASS, p["ctx"], p["seqs"], p["width"]):
        t = 10.0 * (1 + 0.2 * abs(math.log2(c.num_segments / best.num_segments)))
        t *= 1.0 if (c.tile_size, c.num_warps, c.num_stages) == (best.tile_size, best.num_warps, best.num_stages) else 1.4
        t *= 1.0 if (c.kernel, c.partial_pass) == (best.kernel, best.partial_pass) else 1.3
        t *= 1.0 if c.block_m == best.block_m else 1.5
        cands[tune._key(c)] = t
    key = min(cands, key=cands.get)
    return {"candidates": cands, "best": key, "best_us": cands[key]}


def test_every_truth_launch_is_a_candidate():
    for p in _points():
        assert p["best_us"] == 10.0, p


def test_fit_recovers_shapes_block_and_split_scale():
    rule, score = tune.fit(_points(), "sm_90", 8, 9)
    assert score["unmeasured_choices"] == 0 and score["slower_than_stock_3pct"] == 0
    assert score["mean_regret_pct"] < 1.0, score
    assert (rule["tile_3d"], rule["warps_3d"], rule["stages_3d"], rule["kernel_3d"]) == (64, 8, 2, "radiance")
    assert rule["split"]["max"] == 256  # radiance's kernel is swept to 256 segments
    assert rule["wide"]["launch"]["128"] == {"tile": 64, "warps": 8, "stages": 2, "kernel": "radiance",
                                             "split_scale": 0.5}
    assert rule["wide"]["launch"]["64"] == {"tile": 32, "warps": 4}  # vLLM's kernel where it is faster
    assert rule["wide"]["min_fill"] <= 0.5  # width 9's 72 rows go to the 128-row block


def test_fit_recovers_a_widened_block_that_wants_more_segments():
    """A widened block whose best split is twice the rule's (head 128's 32-row block on bf16 KV on
    the H200: radiance's kernel, which is swept to 256 segments) gets a factor of 2, not the
    nearest of the factors below 1."""
    rule, score = tune.fit(_points(_truth("rk_t64w4s2", {32: 2, 128: 0.5})), "sm_90", 8, 9)
    assert score["unmeasured_choices"] == 0 and score["mean_regret_pct"] < 1.0, score
    assert rule["wide"]["launch"]["32"] == {"tile": 64, "warps": 4, "stages": 2, "kernel": "radiance",
                                            "split_scale": 2}
    assert rule["wide"]["launch"]["128"]["split_scale"] == 0.5


def test_fit_recovers_a_fixed_number_of_blocks_a_launch():
    """Where the best split fills a fixed number of blocks whatever the context (head 256 fp8 KV at
    >= 32K on the H200: seqs x KV heads x segments = 256), ``coef * (tiles / programs) ** exp``
    cannot follow it; the programs' own exponent can."""
    truth = tune._rule(256.0, 0.0, 4, 0, 0.4, 8, 9, "rk_t64w8s2", {32: "t64w4s2", 64: "t32w4", 128: "rk_t64w8s2"},
                       {128: 0.5}, programs_exp=1.0)
    points = _points(truth)
    rule, score = tune.fit(points, "sm_90", 8, 9)
    assert score["unmeasured_choices"] == 0 and score["mean_regret_pct"] < 1.0, score
    assert rule["split"].get("programs_exp", rule["split"]["exp"]) != rule["split"]["exp"]
    fitted = {"arch": "sm_90", "triton": {"default": rule, "classes": []}}
    truth_table = {"arch": "sm_90", "triton": {"default": truth, "classes": []}}
    for p in points:
        geo = tune._geo(p, "sm_90")
        assert policy.triton_launch(geo, fitted).num_segments == policy.triton_launch(geo, truth_table).num_segments


def test_fit_picks_the_warpgroup_pass_where_it_is_fastest():
    truth = tune._rule(22.6, 1 / 3, 4, 0, 0.4, 8, 9, "rk_t64w8s2", {32: "wg_s3", 64: "t32w4", 128: "wg_s2"},
                       {128: 0.5})
    points = _points(truth)
    rule, score = tune.fit(points, "sm_90", 8, 9)
    assert score["unmeasured_choices"] == 0 and score["mean_regret_pct"] < 1.0, score
    # 8 warps: the Triton pass's, should the warpgroup pass not run where the table is used
    assert rule["wide"]["launch"]["128"] == {**tune.WARPGROUP, "warps": 8, "stages": 2, "split_scale": 0.5}
    assert rule["wide"]["launch"]["32"] == {**tune.WARPGROUP, "stages": 3}
    table = {"arch": "sm_90", "triton": {"default": rule, "classes": []}}
    tables.validate(table)
    w9 = next(p for p in points if (p["ctx"], p["seqs"], p["width"]) == (131072, 8, 9))
    launch = policy.triton_launch(tune._geo(w9, "sm_90"), table)
    assert (launch.partial_pass, launch.block_m, launch.block_q) == ("cuda_warpgroup", 128, 9)
    assert tune._key(launch).endswith("_wg_rk") and w9["candidates"][tune._key(launch)] == 10.0


def test_the_sweep_leaves_out_what_the_warpgroup_pass_refuses(monkeypatch):
    """On a machine without the warpgroup pass (here: no GPU) its candidates are recorded as
    refused with the reason and not timed; every other candidate is."""
    pytest.importorskip("radiance.kernels.split_kv_attention")  # without it, the reason is its absence
    import torch

    timed = []
    monkeypatch.setattr(tune, "time_graph", lambda fns: timed.append(len(fns)) or 5.0)

    class FakeBench:
        def radiance_kwargs(self, kw):
            return kw

    launches = tune.candidate_launches(KLASS, 32768, 8, 9)
    refused, unbuilt = {}, {}
    cands = tune.time_candidates(None, KLASS, FakeBench(), [{"q": torch.zeros(1)}], launches, unbuilt, refused)
    triton_pass = [c for c in launches if c.partial_pass == "triton"]
    assert len(cands) == len(triton_pass) == len(timed) and not unbuilt
    assert set(cands) == {tune._key(c) for c in triton_pass}
    assert refused and all("needs a CUDA GPU" in why for why in refused.values())
    assert all(key.endswith("_wg_rk") for _, key in refused)


def _every_candidate_takes_5us(monkeypatch):
    """A bench for extend_point whose every candidate times 5 µs (the warpgroup pass refusing none)."""
    import torch

    from radiance.attn import split_kv_kernel

    monkeypatch.setattr(split_kv_kernel, "warpgroup_refusal", lambda *a: None)
    monkeypatch.setattr(tune, "time_graph", lambda fns: 5.0)

    class FakeBench:
        def point(self, ctx, seqs, width):
            return [{"q": torch.zeros(1)}]

        def radiance_kwargs(self, kw):
            return kw

    return FakeBench()


def test_extending_a_merged_point_times_what_it_lacks_and_its_best_again(monkeypatch):
    """--extend: a point swept before the warpgroup shapes existed gets them timed, and its best
    launch again beside them; the rest of its candidates stay as measured."""
    bench = _every_candidate_takes_5us(monkeypatch)
    every = tune.candidate_launches(KLASS, 32768, 8, 9)
    before = {tune._key(c): 10.0 + i for i, c in enumerate(every) if c.partial_pass == "triton"}
    old_best = min(before, key=before.get)
    p = {"ctx": 32768, "seqs": 8, "width": 9, "candidates": dict(before), "best": old_best, "best_us": 10.0}
    n = tune.extend_point(p, None, KLASS, bench, {}, {})
    wg = {tune._key(c) for c in every if c.partial_pass == "cuda_warpgroup"}
    assert wg and set(p["extended"]) == wg | {old_best} and n == len(wg) + 1
    assert p["candidates"][old_best] == 5.0 and p["best_us"] == 5.0
    assert all(p["candidates"][key] == t for key, t in before.items() if key != old_best)


def test_candidates_cover_each_shape_and_skip_empty_segments():
    cands = tune.candidate_launches(KLASS, 4096, 1, 9)
    keys = {tune._key(c) for c in cands}
    assert len(keys) == len(cands)
    shapes = {(c.tile_size, c.num_warps, c.num_stages, c.kernel, c.partial_pass)
              for c in cands if c.block_m == 16 and c.num_segments > 1}
    assert shapes == {(s["tile"], s["warps"], s["stages"], s.get("kernel", "vllm"), s.get("partial_pass", "triton"))
                      for s in tune.BASE_SHAPES.values()}
    assert (32, 1, 2, "radiance", "triton") in shapes and (64, 4, 2, "vllm", "triton") in shapes
    assert {(c.tile_size, c.num_warps, c.num_stages, c.kernel, c.partial_pass) for c in cands if c.block_m == 128} == {
        (32, 8, None, "vllm", "triton"), (64, 8, 2, "vllm", "triton"), (64, 8, 2, "radiance", "triton"),
        (64, 8, 3, "radiance", "triton"), (64, 8, 1, "radiance", "cuda_warpgroup"),
        (64, 8, 2, "radiance", "cuda_warpgroup"), (64, 8, 3, "radiance", "cuda_warpgroup")}
    # the warpgroup pass pads a block to a multiple of 8 rows, not to BLOCK_M: its BLOCK_Q is the
    # width (72 rows), where the Triton pass's is BLOCK_M's (16 tokens, 128 rows)
    assert {c.block_q for c in cands if c.block_m == 128} == {9, 16}
    assert all(c.block_q == 9 for c in cands if c.partial_pass == "cuda_warpgroup" and c.block_m == 128)
    assert not any(c.kernel == "radiance" and c.num_segments == 1 for c in cands)  # split-KV only
    # 4096 tokens are 64 tiles of 64: no 128-segment split with that tile; 128 tiles of 32: up to 128
    assert all(c.num_segments <= 64 for c in cands if c.tile_size == 64)
    assert max(c.num_segments for c in cands if c.tile_size == 32 and c.kernel == "radiance") == 128


def test_fit_finds_a_shape_that_wins_only_at_its_own_split_count():
    """A shape fastest only at a split count far from the starting rule's is found (the base shape
    and the split constants are searched together), not lost to a shape indifferent to the split."""
    fast = tune._rule(4.0, 0.5, 4, 0, 1.01, 8, 9, "rk_t32w1s2")
    start = tune._rule(16.0, 1 / 3, 4, 0, 1.01, 8, 9, "rk_t32w1s2")
    points = []
    for p in _points():
        geo = tune._geo(p, "sm_90")
        own = policy.triton_launch(geo, {"arch": "sm_90", "triton": {"default": fast, "classes": []}})
        other = policy.triton_launch(geo, {"arch": "sm_90", "triton": {"default": start, "classes": []}})
        cands = {}
        for c in tune.candidate_launches(KLASS, p["ctx"], p["seqs"], p["width"]):
            if (c.tile_size, c.num_warps, c.kernel) == (32, 1, "radiance") and c.block_m == own.block_m:
                t = 8.0 * (1 + 0.6 * abs(math.log2(c.num_segments / own.num_segments)))
            else:  # every other shape: 10 us at any split count
                t = 10.0 * (1 + 0.01 * abs(math.log2(c.num_segments / other.num_segments)))
            cands[tune._key(c)] = t
        key = min(cands, key=cands.get)
        points.append(dict(p, candidates=cands, best=key, best_us=cands[key]))
    rule, score = tune.fit(points, "sm_90", 8, 9)
    assert (rule["tile_3d"], rule["warps_3d"], rule["kernel_3d"]) == (32, 1, "radiance")
    assert (rule["split"]["coef"], rule["split"]["exp"]) == (4.0, 0.5)
    assert score["mean_regret_pct"] < 1.0, score


def test_fit_finds_a_widened_blocks_shape_that_wins_only_at_its_own_split_factor():
    """A widened block's shape fastest only at twice the split count of the block's other shapes
    (the warpgroup pass against the Triton shapes) is found with its factor: the fit searches a
    block's shape and factor together, not the shape at the factor the block had before."""
    fast = _truth(wide_scales={128: 2})
    fast["wide"]["launch"]["128"] = {**tune.WIDE_SHAPES[128]["wg_s2"], "split_scale": 2}
    other = _truth()
    points = []
    for p in _points():
        geo = tune._geo(p, "sm_90")
        own = policy.triton_launch(geo, {"arch": "sm_90", "triton": {"default": fast, "classes": []}})
        rest = policy.triton_launch(geo, {"arch": "sm_90", "triton": {"default": other, "classes": []}})
        cands = dict(p["candidates"])
        for c in tune.candidate_launches(KLASS, p["ctx"], p["seqs"], p["width"]):
            if c.block_m != 128 or own.block_m != 128:
                continue
            if c.partial_pass == "cuda_warpgroup" and c.num_stages == 2:
                t = 8.0 * (1 + 0.6 * abs(math.log2(c.num_segments / own.num_segments)))
            else:  # the block's other shapes: 10 us, a little better near the rule's split count
                t = 10.0 * (1 + 0.01 * abs(math.log2(c.num_segments / rest.num_segments)))
            cands[tune._key(c)] = t
        key = min(cands, key=cands.get)
        points.append(dict(p, candidates=cands, best=key, best_us=cands[key]))
    assert any(p["best"].endswith("_wg_rk") for p in points)
    rule, score = tune.fit(points, "sm_90", 8, 9)
    assert rule["wide"]["launch"]["128"] == {**tune.WARPGROUP, "warps": 8, "stages": 2, "split_scale": 2}
    assert score["mean_regret_pct"] < 1.0, score


def test_precompile_builds_only_the_launches_asked_for(monkeypatch):
    built = {}
    monkeypatch.setattr(tune, "build_in_workers", lambda fn, tasks, jobs: built.update(tasks) or {})
    truth = {"arch": "sm_90", "triton": {"default": _truth(), "classes": []}}
    work = [(KLASS, 32768, 1, 1), (KLASS, 32768, 8, 9)]
    chosen = [policy.triton_launch(tune._geo(dict(vars(KLASS), ctx=c, seqs=s, width=w), "sm_90"), truth)
              for _, c, s, w in work]
    tune.precompile("staged", work, 2, launches=lambda k, ctx, seqs, width: [
        policy.triton_launch(tune._geo(dict(vars(k), ctx=ctx, seqs=seqs, width=width), "sm_90"), truth)])
    asked = [launch for (_, _, launches, _) in built.values() for launch in launches]
    assert sorted(map(str, asked)) == sorted(str({f: getattr(c, f) for f in tune._LAUNCH_FIELDS}) for c in chosen)
    built.clear()
    tune.precompile("staged", work, 2)  # default: every candidate of each point Triton builds
    assert sum(len(ls) for (_, _, ls, _) in built.values()) == len(
        {tune._key(c) for _, c_, s, w in work for c in tune.candidate_launches(KLASS, c_, s, w)
         if c.partial_pass == "triton"})


def test_register_cap_and_table_ahead_go_from_a_shape_to_the_table_and_back(monkeypatch):
    shape = {"tile": 32, "warps": 4, "stages": 2, "kernel": "radiance", "registers": 96, "table_ahead": True}
    monkeypatch.setitem(tune.BASE_SHAPES, "rk_t32w4s2r96ta", shape)
    rule = tune._rule(16.0, 1 / 3, 4, 0, 0.8, 8, 9, "rk_t32w4s2r96ta")
    assert (rule["registers_3d"], rule["table_ahead_3d"]) == (96, True)
    table = {"arch": "sm_90", "triton": {"default": rule, "classes": []}}
    tables.validate(table)
    p = {"head_size": KLASS.head_size, "num_query_heads": KLASS.num_query_heads, "num_kv_heads": KLASS.num_kv_heads,
         "kv_dtype": KLASS.kv_dtype, "ctx": 32768, "seqs": 1, "width": 1}
    launch = policy.triton_launch(tune._geo(p, "sm_90"), table)
    assert (launch.max_registers, launch.table_ahead, launch.kernel) == (96, True, "radiance")
    # the table's launch is one the sweep timed, under its own key (not the uncapped shape's)
    keys = {tune._key(c) for c in tune.candidate_launches(KLASS, 32768, 1, 1)}
    assert tune._key(launch) in keys and tune._key(launch).endswith("_r96_ta_rk")
    assert tune._key(dataclasses.replace(launch, max_registers=None, table_ahead=False)) in keys


def test_class_rules_are_fitted_per_context_band_and_the_table_tells_them_apart():
    """Each class gets a rule below the band edge and one from it, matched on max_seqlen_k: a
    shape fastest only at long contexts serves them without costing the short ones."""
    assert tune.context_bands(tune.FULL_GRID["ctx"]) == [{"max": 23170}, {"min": 23170}]
    assert tune.context_bands((4096, 16384)) == [{}]  # no long context swept: one rule
    bands = tune.context_bands(GRID["ctx"])
    short = _truth()
    long = tune._rule(22.6, 1 / 3, 4, 0, 0.4, 8, 9, "rk_t32w4s2", {32: "t64w4s2", 64: "t32w4", 128: "rk_t64w8s2"},
                      {128: 0.5})
    truth = {"arch": "sm_90", "triton": {"default": short, "classes": [{"match": {"max_seqlen_k": bands[1]},
                                                                         "rule": long}]}}
    tables.validate(truth)
    points = [dict(p, **_timed(truth, p)) for p in _points()]
    table, fits = tune.fit_table(points, [KLASS], "sm_90", 8, 9, {})
    short, long = (f"{KLASS.name}{tune._band_name(b)}" for b in bands)
    assert [c["match"]["max_seqlen_k"] for c in table["triton"]["classes"]] == bands
    short_rule, long_rule = (c["rule"] for c in table["triton"]["classes"])
    assert (short_rule["tile_3d"], short_rule["warps_3d"]) == (64, 8)
    assert (long_rule["tile_3d"], long_rule["warps_3d"]) == (32, 4)
    # two rules follow the points far closer than the one default rule fitted over all of them
    regret = sum(fits[n]["points"] * math.log1p(fits[n]["mean_regret_pct"] / 100) for n in (short, long))
    assert regret < len(points) * math.log1p(fits["default"]["mean_regret_pct"] / 100) / 2
    for p in (p for p in points if p["width"] == 1):  # the stock block: the band's base shape
        launch = policy.triton_launch(tune._geo(p, "sm_90"), table)
        assert launch.tile_size == (32 if p["ctx"] >= bands[1]["min"] else 64), p


def test_the_rules_fitted_in_processes_are_the_serial_fit_s():
    points = _points()
    serial = tune.fit_table(points, [KLASS], "sm_90", 8, 9, {})
    assert tune.fit_table(points, [KLASS], "sm_90", 8, 9, {}, jobs=3) == serial


def test_a_match_range_must_be_numeric_bounds():
    bad = {"arch": "sm_90", "triton": {"default": _truth(), "classes": [
        {"match": {"max_seqlen_k": {"above": 5}}, "rule": _truth()}]}}
    with pytest.raises(ValueError, match="match range"):
        tables.validate(bad)


def test_extending_only_the_matching_lacking_candidates(monkeypatch):
    """--extend-only: of the candidates a point lacks, only the matching ones are timed (with its
    best again); the other lacking ones stay unmeasured."""
    import re

    bench = _every_candidate_takes_5us(monkeypatch)
    every = tune.candidate_launches(KLASS, 32768, 8, 9)
    before = {tune._key(c): 10.0 + i for i, c in enumerate(every) if c.partial_pass == "triton"}
    old_best = min(before, key=before.get)
    p = {"ctx": 32768, "seqs": 8, "width": 9, "candidates": dict(before), "best": old_best, "best_us": 10.0}
    tune.extend_point(p, None, KLASS, bench, {}, {}, None, re.compile("_st1_wg_rk$"))
    one_stage = {tune._key(c) for c in every if c.partial_pass == "cuda_warpgroup" and c.num_stages == 1}
    assert one_stage and set(p["extended"]) == one_stage | {old_best}
    assert not any(key.endswith("_wg_rk") and key not in one_stage for key in p["candidates"])


def test_extending_with_retime_times_the_matching_candidates_again(monkeypatch):
    """--retime: after a change to the warpgroup pass, its merged candidates are timed again with
    the ones the point lacks; the others keep their times."""
    import re

    bench = _every_candidate_takes_5us(monkeypatch)
    every = tune.candidate_launches(KLASS, 32768, 8, 9)
    before = {tune._key(c): 10.0 + i for i, c in enumerate(every)}
    old_best = min(before, key=before.get)
    p = {"ctx": 32768, "seqs": 8, "width": 9, "candidates": dict(before), "best": old_best, "best_us": 10.0}
    tune.extend_point(p, None, KLASS, bench, {}, {}, re.compile("_wg_rk$"))
    wg = {key for key in before if key.endswith("_wg_rk")}
    assert wg and set(p["extended"]) == wg | {old_best}
    assert all(p["candidates"][key] == 5.0 for key in wg)
    assert all(p["candidates"][key] == t for key, t in before.items() if key not in wg | {old_best})


def test_row_ulps_measures_each_row_against_its_own_scale():
    torch = pytest.importorskip("torch")
    ref = torch.tensor([[[1.0, -0.5], [0.001, 0.0005]]], dtype=torch.bfloat16)  # (token, head, dim)
    assert tune.row_ulps(ref, ref) == 0.0
    out = ref.clone()
    out[0, 0, 1] += 2.0**-7  # one ulp of the first row's largest value (1.0)
    assert tune.row_ulps(out, ref) == pytest.approx(1.0)
    out = ref.clone()
    out[0, 1, 0] += 0.001  # a small row off by its own size: ~128 ulps of its scale, not 0.13 of 1.0
    assert tune.row_ulps(out, ref) == pytest.approx(128.0, rel=0.01)
