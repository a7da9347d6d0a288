"""The tuning harness's fit recovers a rule from measured candidates (synthetic timings, CPU)."""

import dataclasses
import math

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
                best = policy.triton_launch(tune._geo(p, "sm_90"), truth)
                cands = {}
                for c in tune.candidate_launches(KLASS, ctx, seqs, width):
                    # the truth's launch is fastest; every step away from it in segments, shape,
                    # kernel or block costs time
                    t = 10.0 * (1 + 0.2 * abs(math.log2(c.num_segments / best.num_segments)))
                    t *= 1.0 if (c.tile_size, c.num_warps, c.num_stages) == (best.tile_size, best.num_warps,
                                                                            best.num_stages) else 1.4
                    t *= 1.0 if c.kernel == best.kernel else 1.3
                    t *= 1.0 if c.block_m == best.block_m else 1.5
                    cands[tune._key(c)] = t
                key = min(cands, key=cands.get)
                points.append(dict(p, stock_us=100.0, candidates=cands, best=key, best_us=cands[key]))
    return points


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


def test_candidates_cover_each_shape_and_skip_empty_segments():
    cands = tune.candidate_launches(KLASS, 4096, 1, 9)
    keys = {tune._key(c) for c in cands}
    assert len(keys) == len(cands)
    shapes = {(c.tile_size, c.num_warps, c.num_stages, c.kernel) for c in cands if c.block_m == 16 and c.num_segments > 1}
    assert shapes == {(s["tile"], s["warps"], s["stages"], s.get("kernel", "vllm")) for s in tune.BASE_SHAPES.values()}
    assert (32, 1, 2, "radiance") in shapes and (64, 4, 2, "vllm") in shapes
    assert {(c.tile_size, c.num_warps, c.num_stages, c.kernel) for c in cands if c.block_m == 128} == {
        (32, 8, None, "vllm"), (64, 8, 2, "vllm"), (64, 8, 2, "radiance"), (64, 8, 3, "radiance")}
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
    tune.precompile("staged", work, 2)  # default: every candidate of each point
    assert sum(len(ls) for (_, _, ls, _) in built.values()) == len(
        {tune._key(c) for _, c_, s, w in work for c in tune.candidate_launches(KLASS, c_, s, w)})


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
