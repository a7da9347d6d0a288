"""The policy reproduces the gfx1201 rules (seed measurements) and keeps arches apart."""

import math

import pytest

from radiance.attn import policy, tables
from radiance.attn.policy import Geometry

GFX = tables.for_arch("gfx1201")
SPLIT = GFX["aiter"]["decode_3d"]["verify"]["split"]


def geo(**kw):
    base = dict(arch="gfx1201", head_size=256, num_query_heads=12, num_kv_heads=2, num_tokens=9,
                num_seqs=1, max_seqlen_q=9, max_seqlen_k=32768, q_dtype="fp8", kv_dtype="fp8")
    base.update(kw)
    return Geometry(**base)


def seed_split(max_seqlen_k, tile, programs):
    # the rule as stated: 16 * cbrt(tiles / programs), floored to a power of two, clamped
    tiles = max(1, -(-max_seqlen_k // tile))
    want = 16.0 * (tiles / max(1, programs)) ** (1 / 3)
    seg = 2 ** int(math.floor(math.log2(max(1.0, want))))
    return max(4, min(128, seg, 2 ** math.ceil(math.log2(tiles))))


@pytest.mark.parametrize("ctx", [1, 16, 33, 4096, 32768, 131072, 1 << 20])
@pytest.mark.parametrize("programs", [1, 2, 6, 24, 100, 4096])
@pytest.mark.parametrize("tile", [16, 32])
def test_split_rule_matches_stated_rule(ctx, programs, tile):
    tiles = -(-ctx // tile)
    assert policy.split_count(tiles, programs, SPLIT) == seed_split(ctx, tile, programs)


def test_split_rule_edges():
    assert policy.split_count(1, 1, SPLIT) == 4  # lower clamp wins over next_pow2(tiles)=1
    assert policy.split_count(3, 1, SPLIT) == 4
    assert policy.split_count(100, 1, SPLIT) == 64  # 16*cbrt(100)=74 -> 64; next_pow2(100)=128
    assert policy.split_count(10**7, 1, SPLIT) == 128  # upper clamp
    assert policy.split_count(2048, 6, SPLIT) == 64  # 16*cbrt(341)=111.6 -> 64
    # power-of-two floor, never rounding up: 16*cbrt(8)=32 exactly
    assert policy.split_count(8 * 7, 7, SPLIT) == 32
    unsplit = dict(SPLIT, unsplit_below=8)
    assert policy.split_count(64, 64, unsplit) == 16  # 16*cbrt(1)=16 >= 8: split
    assert policy.split_count(64, 64 * 1000, unsplit) == 1


def test_split_rule_with_its_own_programs_exponent():
    # exp 0, programs_exp 1: a fixed number of blocks a launch (256), whatever the context
    blocks = {"coef": 256, "exp": 0, "programs_exp": 1, "min": 4, "max": 256}
    assert [policy.split_count(tiles, 2, blocks) for tiles in (512, 1024, 2048)] == [128, 128, 128]
    assert [policy.split_count(2048, programs, blocks) for programs in (2, 4, 16, 24)] == [128, 64, 16, 8]
    assert policy.split_count(64, 1, blocks) == 64  # still no more segments than tiles
    assert policy.split_count(2048, 1000, blocks) == 4  # nor fewer than min
    # 100 * 1024**0.25 / 8**0.75 = 119.0 -> 64
    assert policy.split_count(1024, 8, {"coef": 100, "exp": 0.25, "programs_exp": 0.75, "min": 4, "max": 256}) == 64
    # absent, it is exp: the stated rule
    assert policy.split_count(2048, 6, dict(SPLIT, programs_exp=1 / 3)) == policy.split_count(2048, 6, SPLIT)


@pytest.mark.parametrize("width,seqs,qpkv,expect", [
    (9, 1, 6, 64),  # 54 rows: 84% of 64 -> widen
    (9, 8, 6, 64),  # the same rows a sequence, whatever the batch
    (6, 8, 6, None),  # 36 rows: 56% full -> stock (seed: 20% slower wide)
    (1, 8, 6, None),  # all-decode never widens
    (11, 1, 6, None),  # 66 rows > 64: no allowed block holds them
])
def test_wide_block_m_fill_gate(width, seqs, qpkv, expect):
    g = geo(num_query_heads=2 * qpkv, num_tokens=width * seqs, num_seqs=seqs, max_seqlen_q=width)
    wide = GFX["aiter"]["decode_3d"]["verify"]["wide"]
    assert policy.wide_block_m(g, wide) == expect


def test_no_widening_when_the_stock_block_holds_every_row():
    # 2 tokens x 8 queries per KV head = 16 rows: the stock 16-row block already reads the KV once,
    # so even a permissive fill threshold must not pad it to 32 (measured on sm_90: slower).
    wide = {"block_m": [32, 64, 128], "min_fill": 0.4}
    assert policy.wide_block_m(geo(num_query_heads=16, num_kv_heads=2, num_tokens=2, max_seqlen_q=2), wide) is None
    # 9 tokens: 72 rows, the 128-row block is 56% full and allowed at 0.4
    assert policy.wide_block_m(geo(num_query_heads=16, num_kv_heads=2, num_tokens=9, max_seqlen_q=9), wide) == 128


def test_wide_block_m_exact_threshold():
    wide = GFX["aiter"]["decode_3d"]["verify"]["wide"]
    # qpkv 8: width 7 -> 56 rows = 87.5% (widen); qpkv 4: width 13 -> 52 rows = 81% (widen),
    # width 12 -> 48 rows = 75% (stock)
    assert policy.wide_block_m(geo(num_query_heads=16, num_tokens=7, max_seqlen_q=7), wide) == 64
    assert policy.wide_block_m(geo(num_query_heads=8, num_tokens=13, max_seqlen_q=13), wide) == 64
    assert policy.wide_block_m(geo(num_query_heads=8, num_tokens=12, max_seqlen_q=12), wide) is None
    # head sizes other than the measured one keep the stock block
    assert policy.wide_block_m(geo(head_size=128, num_query_heads=16, num_tokens=7, max_seqlen_q=7), wide) is None


STOCK_3D = ({"TILE_SIZE": 64, "NUM_SEGMENTS_PER_SEQ": 16, "num_warps": 2, "waves_per_eu": 2, "num_stages": 2},
            {"TILE_SIZE": 64, "NUM_SEGMENTS_PER_SEQ": 16, "num_warps": 2, "waves_per_eu": 2, "num_stages": 1})


def test_aiter_decode_constants_and_drafter_pass():
    # the drafter's all-decode pass: fp8 constants, AITER's split count untouched, no BLOCK_M
    g = geo(num_tokens=4, num_seqs=4, max_seqlen_q=1)
    attn, red, bm = policy.aiter_decode_3d(g, *STOCK_3D, num_2d_programs=8)
    assert bm is None
    assert attn == {"TILE_SIZE": 16, "NUM_SEGMENTS_PER_SEQ": 16, "num_warps": 4, "waves_per_eu": 6, "num_stages": 1}
    assert red == {"TILE_SIZE": 16, "NUM_SEGMENTS_PER_SEQ": 16, "num_warps": 8, "waves_per_eu": 2, "num_stages": 1}


def test_aiter_verify_widened():
    # width 9, qpkv 6 -> 54 rows: BLOCK_M 64, tile 32, 4 warps; split from the widened grid
    g = geo(num_tokens=9, num_seqs=1, max_seqlen_q=9)
    attn, red, bm = policy.aiter_decode_3d(g, *STOCK_3D, num_2d_programs=(9 // 2 + 1) * 2)
    assert bm == 64
    assert (attn["TILE_SIZE"], red["TILE_SIZE"], attn["num_warps"]) == (32, 32, 4)
    programs = (9 // (64 // 6) + 1) * 2
    assert attn["NUM_SEGMENTS_PER_SEQ"] == red["NUM_SEGMENTS_PER_SEQ"] == seed_split(32768, 32, programs)


def test_aiter_verify_not_widened_keeps_tile_16_warps_2():
    g = geo(num_tokens=48, num_seqs=8, max_seqlen_q=6)
    attn, red, bm = policy.aiter_decode_3d(g, *STOCK_3D, num_2d_programs=96)
    assert bm is None
    assert (attn["TILE_SIZE"], attn["num_warps"]) == (16, 2)
    assert attn["NUM_SEGMENTS_PER_SEQ"] == seed_split(32768, 16, 96)


def test_aiter_bf16_decode_and_other_heads_untouched():
    g = geo(q_dtype="bf16", kv_dtype="bf16")
    assert policy.aiter_decode_3d(g, *STOCK_3D, num_2d_programs=4) == (STOCK_3D[0], STOCK_3D[1], None)
    g = geo(head_size=128, num_query_heads=12)
    attn, _, bm = policy.aiter_decode_3d(g, *STOCK_3D, num_2d_programs=4)
    assert bm is None and attn["NUM_SEGMENTS_PER_SEQ"] == 16 and attn["TILE_SIZE"] == 16


STOCK_2D = {"BLOCK_M": 64, "BLOCK_Q": 10, "TILE_SIZE": 32, "num_warps": 2, "num_stages": 1, "waves_per_eu": 6}


def test_aiter_prefill_by_head_size():
    g512 = geo(head_size=512, num_query_heads=16, num_kv_heads=2, q_dtype="fp8", max_seqlen_q=4096, num_tokens=4096)
    c = policy.aiter_prefill_2d(g512, STOCK_2D)
    assert (c["TILE_SIZE"], c["BLOCK_M"], c["num_warps"], c["BLOCK_Q"]) == (16, 32, 4, 4)
    g256 = geo(head_size=256, q_dtype="fp8", max_seqlen_q=4096, num_tokens=4096)
    c = policy.aiter_prefill_2d(g256, STOCK_2D)
    assert c["BLOCK_M"] == 64 and c["TILE_SIZE"] == 16 and c["waves_per_eu"] == 1  # 256: stock BLOCK_M
    small = policy.aiter_prefill_2d(geo(max_seqlen_q=64, num_tokens=64), STOCK_2D)
    assert small == dict(STOCK_2D, BLOCK_Q=64 // 6)  # fp8 small prefill: AITER's config
    bf = policy.aiter_prefill_2d(geo(q_dtype="bf16", kv_dtype="bf16", max_seqlen_q=64, num_tokens=64), STOCK_2D)
    assert (bf["TILE_SIZE"], bf["num_warps"], bf["num_stages"], bf["waves_per_eu"]) == (16, 4, 1, 1)


def test_tables_are_per_arch(tmp_path, monkeypatch, caplog):
    import json

    other = {"arch": "sm_90", "triton": {"default": {"split": {"coef": 1, "exp": 1, "min": 4, "max": 8}}, "classes": []}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(other))
    monkeypatch.setenv("RADIANCE_ATTN_TABLE", str(path))
    tables.load_file.cache_clear()
    assert tables.for_arch("sm_90")["triton"]["default"]["split"]["max"] == 8
    # a table for sm_90 never moves a gfx1201 shape, and says so once per arch it is asked for
    g = geo(num_tokens=9, max_seqlen_q=9)
    with caplog.at_level("WARNING", logger="vllm.radiance.attn"):
        assert policy.aiter_decode_3d(g, *STOCK_3D, num_2d_programs=10) == policy.aiter_decode_3d(
            g, *STOCK_3D, num_2d_programs=10, table=tables.load_file(str(tables.table_file("gfx1201"))))
        assert tables.for_arch("gfx1201")["arch"] == "gfx1201"
        assert tables.for_arch("sm_80") is None
        assert policy.triton_launch(geo(arch="sm_80", q_dtype="bf16", kv_dtype="bf16")) is None
    assert [r.getMessage() for r in caplog.records if r.name == "vllm.radiance.attn"] == [
        f"radiance-attn: RADIANCE_ATTN_TABLE={path} is a table for sm_90, ignored on gfx1201; "
        "the shipped gfx1201.json serves gfx1201",
        f"radiance-attn: RADIANCE_ATTN_TABLE={path} is a table for sm_90, ignored on sm_80; "
        "no table serves sm_80: its attention stays stock"]


def test_bad_table_and_bad_geometry_rejected(tmp_path):
    with pytest.raises(ValueError):
        tables.validate({"arch": "x", "triton": {"default": {"split": {"coef": 1}}}})
    with pytest.raises(ValueError):
        tables.validate({"arch": "x", "triton": {"default": {"split": {"coef": 1, "exp": 1, "min": 4, "max": 8},
                                                             "wide": {"block_m": [48]}}}})
    for bad in ({"programs_exp": -1}, {"programs_exp": "1"}, {"coef": 0}, {"exp": None}):
        split = dict({"coef": 1, "exp": 1, "min": 4, "max": 8}, **bad)
        with pytest.raises(ValueError, match="split"):
            tables.validate({"arch": "x", "triton": {"default": {"split": split}}})
    tables.validate({"arch": "x", "triton": {"default": {"split": {"coef": 256, "exp": 0, "programs_exp": 1,
                                                                   "min": 4, "max": 8}}}})
    with pytest.raises(ValueError):
        geo(num_query_heads=7, num_kv_heads=2)
    with pytest.raises(ValueError):
        geo(kv_dtype="int8")
    with pytest.raises(ValueError):
        geo(num_seqs=0)


def sm90(**kw):
    base = dict(arch="sm_90", head_size=256, num_query_heads=16, num_kv_heads=2, num_tokens=4, num_seqs=1,
                max_seqlen_q=4, max_seqlen_k=32768, q_dtype="bf16", kv_dtype="bf16", num_sms=132)
    base.update(kw)
    return Geometry(**base)


def test_triton_launch_verify_split_and_grid():
    table = tables.SM90_PROVISIONAL
    launch = policy.triton_launch(sm90(), table)
    # width 4 x qpkv 8 = 32 rows: 50% of 64 -> stock 16-row block, split from the 16-row grid
    assert (launch.block_m, launch.block_q, launch.tile_size) == (16, 2, 16)
    programs = (4 // 2 + 1) * 2
    assert launch.num_segments == seed_split(32768, 16, programs)
    assert launch.grid(4, 1, 2) == (3, 2, launch.num_segments)
    wide = policy.triton_launch(sm90(num_tokens=7, max_seqlen_q=7), table)  # 56 rows: widen
    assert (wide.block_m, wide.block_q, wide.tile_size, wide.num_warps) == (64, 8, 32, 4)
    assert wide.grid(7, 1, 2)[0] == 7 // 8 + 1


def test_verify_max_query_len_is_the_serving_rules():
    split = {"coef": 16, "exp": 1 / 3, "min": 4, "max": 128}
    table = {"arch": "sm_90", "triton": {
        "default": {"max_query_len": 9, "max_seqs": 8, "split": split},
        "classes": [{"match": {"head_size": 128}, "rule": {"max_query_len": 4, "max_seqs": 8, "split": split}}]}}
    assert policy.verify_max_query_len(table, sm90()) == 9
    assert policy.verify_max_query_len(table, sm90(head_size=128, num_query_heads=16)) == 4
    # more sequences than the rule serves: still its class's bound (the batch is verify-shaped)
    assert policy.verify_max_query_len(table, sm90(head_size=128, num_seqs=64, num_tokens=64)) == 4
    assert policy.verify_max_query_len(table) == 9  # no geometry: the default rule
    assert policy.verify_max_query_len(None) == policy.DEFAULT_MAX_QUERY_LEN == 16
    # the bound triton_launch applies: a width-5 batch of the head-128 class is prefill-shaped
    assert policy.triton_launch(sm90(head_size=128, num_tokens=5, max_seqlen_q=5), table) is None
    assert policy.triton_launch(sm90(head_size=128, num_tokens=4, max_seqlen_q=4), table) is not None


def test_triton_launch_stock_cases():
    table = tables.SM90_PROVISIONAL
    assert policy.triton_launch(sm90(num_tokens=4096, max_seqlen_q=4096), table) is None  # prefill
    assert policy.triton_launch(sm90(num_seqs=64, num_tokens=64, max_seqlen_q=1), table) is None  # unmeasured
    # scratch too small for any split: a verify batch with the stock block is exactly stock
    tiny = sm90(scratch_bytes=4 * 16 * 256 * 4)
    assert policy.triton_launch(tiny, table) is None
    # decode with little scratch: fewer segments, never more than fit
    g = sm90(num_tokens=1, max_seqlen_q=1, scratch_bytes=1 * 16 * 256 * 4 * 8)
    assert policy.triton_launch(g, table).num_segments == 8


def test_lds_clamp_on_gfx1201():
    # head 512: a 64-row block of bf16 is 64 KiB alone -- the clamp halves it
    assert not policy.lds_fits("gfx1201", 64, 32, 512)
    assert policy.lds_fits("gfx1201", 32, 32, 512)
    assert policy.lds_fits("sm_90", 128, 32, 256)
    table = tables.for_arch("gfx1201")
    g = Geometry(arch="gfx1201", head_size=512, num_query_heads=16, num_kv_heads=2, num_tokens=7, num_seqs=1,
                 max_seqlen_q=7, max_seqlen_k=8192)
    wide_table = {"arch": "gfx1201", "triton": {"default": dict(table["triton"]["default"],
                  wide=dict(table["triton"]["default"]["wide"], head_sizes=[512])), "classes": []}}
    launch = policy.triton_launch(g, wide_table)
    assert policy.lds_fits("gfx1201", launch.block_m, launch.tile_size, 512)


def test_triton_launch_shapes_from_the_table():
    split = {"coef": 16, "exp": 1 / 3, "min": 4, "max": 128}
    rule = {"max_query_len": 9, "max_seqs": 8, "split": split, "tile_3d": 64, "warps_3d": 8, "stages_3d": 2,
            "wide": {"block_m": [32, 128], "min_fill": 0.4,
                     "launch": {"32": {"tile": 32, "warps": 4},
                                "128": {"tile": 64, "warps": 8, "stages": 2, "split_scale": 0.25}}}}
    table = {"arch": "sm_90", "triton": {"default": rule, "classes": []}}
    decode = policy.triton_launch(sm90(num_tokens=1, max_seqlen_q=1), table)
    assert (decode.tile_size, decode.num_warps, decode.num_stages) == (64, 8, 2)
    assert decode.num_segments == seed_split(32768, 64, 2)  # the tiles counted in the table's tile
    # a widened block's launch is its own entry: no stages inherited from the 3D keys
    w4 = policy.triton_launch(sm90(), table)  # 4 x 8 = 32 rows
    assert (w4.block_m, w4.tile_size, w4.num_warps, w4.num_stages) == (32, 32, 4, None)
    # 9 x 8 = 72 rows: the 128-row block, with a quarter of the coefficient
    w9 = policy.triton_launch(sm90(num_tokens=9, max_seqlen_q=9), table)
    assert (w9.block_m, w9.tile_size, w9.num_warps, w9.num_stages) == (128, 64, 8, 2)
    programs = (9 // 16 + 1) * 2
    want = policy.split_count(32768 // 64, programs, dict(split, coef=16 * 0.25))
    assert w9.num_segments == want < policy.split_count(32768 // 64, programs, split)
    # fp8 KV keeps a tile of at least 32 whatever the table says
    fp8 = policy.triton_launch(sm90(num_tokens=1, max_seqlen_q=1, kv_dtype="fp8"),
                               {"arch": "sm_90", "triton": {"default": dict(rule, tile_3d=16), "classes": []}})
    assert fp8.tile_size == 32


def test_triton_launch_kernel_from_the_table():
    split = {"coef": 16, "exp": 1 / 3, "min": 4, "max": 256}
    rule = {"max_query_len": 9, "max_seqs": 8, "split": split, "tile_3d": 64, "warps_3d": 4, "stages_3d": 2,
            "kernel_3d": "radiance",
            "wide": {"block_m": [32, 128], "min_fill": 0.4,
                     "launch": {"32": {"tile": 64, "warps": 4, "stages": 2},
                                "128": {"tile": 64, "warps": 8, "stages": 2, "kernel": "radiance"}}}}
    table = {"arch": "sm_90", "triton": {"default": rule, "classes": []}}
    tables.validate(table)
    decode = policy.triton_launch(sm90(num_tokens=1, max_seqlen_q=1), table)
    assert decode.kernel == "radiance" and decode.num_segments > 1
    assert "radiance kernel" in decode.describe()
    # a widened block takes its own entry's kernel, never the 3D key's
    assert policy.triton_launch(sm90(), table).kernel == "vllm"  # 32 rows
    assert policy.triton_launch(sm90(num_tokens=9, max_seqlen_q=9), table).kernel == "radiance"  # 72 rows
    # radiance's kernel is split-KV only: an unsplit launch is vLLM's 2D kernel
    unsplit = dict(rule, split=dict(split, unsplit_below=1 << 20))
    one = policy.triton_launch(sm90(num_tokens=1, max_seqlen_q=1),
                               {"arch": "sm_90", "triton": {"default": unsplit, "classes": []}})
    assert one.num_segments == 1 and one.kernel == "vllm"
    with pytest.raises(ValueError, match="kernel"):
        tables.validate({"arch": "x", "triton": {"default": dict(rule, kernel_3d="flash")}})


def test_triton_launch_register_cap_and_table_ahead_from_the_table():
    split = {"coef": 16, "exp": 1 / 3, "min": 4, "max": 256}
    rule = {"max_query_len": 9, "max_seqs": 8, "split": split, "tile_3d": 32, "warps_3d": 4, "stages_3d": 2,
            "kernel_3d": "radiance", "registers_3d": 96, "table_ahead_3d": True,
            "wide": {"block_m": [32, 128], "min_fill": 0.4,
                     "launch": {"32": {"tile": 64, "warps": 4, "stages": 2, "registers": 128},
                                "128": {"tile": 64, "warps": 8, "stages": 3, "kernel": "radiance",
                                        "table_ahead": True}}}}
    table = {"arch": "sm_90", "triton": {"default": rule, "classes": []}}
    tables.validate(table)
    decode = policy.triton_launch(sm90(num_tokens=1, max_seqlen_q=1), table)
    assert (decode.max_registers, decode.table_ahead) == (96, True)
    assert "registers<=96" in decode.describe() and "one tile ahead" in decode.describe()
    # a widened block's options are its own entry's, never the 3D keys'
    w4 = policy.triton_launch(sm90(), table)  # 32 rows, vLLM's kernel
    assert (w4.kernel, w4.max_registers, w4.table_ahead) == ("vllm", 128, False)
    w9 = policy.triton_launch(sm90(num_tokens=9, max_seqlen_q=9), table)  # 72 rows
    assert (w9.kernel, w9.max_registers, w9.table_ahead, w9.num_stages) == ("radiance", None, True, 3)
    # an unsplit launch runs vLLM's 2D kernel: no table ahead, no 3D register cap
    unsplit = dict(rule, split=dict(split, unsplit_below=1 << 20))
    one = policy.triton_launch(sm90(num_tokens=1, max_seqlen_q=1),
                               {"arch": "sm_90", "triton": {"default": unsplit, "classes": []}})
    assert (one.kernel, one.max_registers, one.table_ahead) == ("vllm", None, False)
    with pytest.raises(ValueError, match="registers"):
        tables.validate({"arch": "x", "triton": {"default": dict(rule, registers_3d=300)}})
    with pytest.raises(ValueError, match="registers"):
        tables.validate({"arch": "x", "triton": {"default": dict(rule, registers_3d=96.5)}})
    with pytest.raises(ValueError, match="table_ahead"):
        tables.validate({"arch": "x", "triton": {"default": dict(rule, kernel_3d="vllm")}})


def test_triton_launch_warpgroup_pass_from_the_table():
    split = {"coef": 16, "exp": 1 / 3, "min": 4, "max": 256}
    wg = {"tile": 64, "warps": 4, "stages": 2, "kernel": "radiance", "partial_pass": "cuda_warpgroup"}
    rule = {"max_query_len": 16, "max_seqs": 8, "split": split, "tile_3d": 64, "warps_3d": 4, "stages_3d": 2,
            "kernel_3d": "radiance", "table_ahead_3d": True,
            "wide": {"block_m": [32, 64, 128], "min_fill": 0.4,
                     "launch": {"32": {"tile": 64, "warps": 4, "stages": 2, "kernel": "radiance"},
                                "64": dict(wg, table_ahead=True), "128": wg}}}
    table = {"arch": "sm_90", "triton": {"default": rule, "classes": []}}
    tables.validate(table)
    # the stock block's split launch: the Triton pass, BLOCK_Q from BLOCK_M
    w1 = policy.triton_launch(sm90(num_tokens=1, max_seqlen_q=1), table)
    assert (w1.partial_pass, w1.block_q, w1.table_ahead) == ("triton", 2, True)
    # a width-6 step at 8 heads a KV head: BLOCK_M 64, but the warpgroup pass runs its 48 rows
    w6 = policy.triton_launch(sm90(num_tokens=6, max_seqlen_q=6), table)
    assert (w6.partial_pass, w6.block_m, w6.block_q, w6.table_ahead) == ("cuda_warpgroup", 64, 6, False)
    assert "radiance kernel (cuda_warpgroup)" in w6.describe()
    w9 = policy.triton_launch(sm90(num_tokens=18, num_seqs=2, max_seqlen_q=9), table)
    assert (w9.block_m, w9.block_q) == (128, 9)
    # a longer step than BLOCK_M holds keeps BLOCK_M's tokens (two q-blocks)
    w16 = policy.triton_launch(sm90(num_tokens=16, max_seqlen_q=16), table)
    assert (w16.block_m, w16.block_q) == (128, 16)
    assert policy.triton_launch(sm90(), table).partial_pass == "triton"  # width 4: 32 rows, the Triton pass
    # an unsplit launch is vLLM's 2D kernel, whatever the entry names
    unsplit = dict(rule, split=dict(split, unsplit_below=1 << 20))
    one = policy.triton_launch(sm90(num_tokens=9, max_seqlen_q=9),
                               {"arch": "sm_90", "triton": {"default": unsplit, "classes": []}})
    assert (one.num_segments, one.kernel, one.partial_pass, one.block_q) == (1, "vllm", "triton", 16)
    with pytest.raises(ValueError, match="partial_pass"):
        tables.validate({"arch": "x", "triton": {"default": dict(rule, partial_pass_3d="cuda_mma")}})
    with pytest.raises(ValueError, match="radiance's kernel only"):
        tables.validate({"arch": "x", "triton": {"default": dict(rule, kernel_3d="vllm", table_ahead_3d=False,
                                                                  partial_pass_3d="cuda_warpgroup")}})
