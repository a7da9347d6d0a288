"""Probe the launch axes the tuning harness does not sweep, at a few points, to choose its shapes.

    python benchmarks/probe_launch_shapes.py --out DIR --kernel-src STAGED_DIR [--budget-s 400] [--quick]

Every KV tile {16, 32, 64} x warps {2, 4, 8} x pipeline stages {1, 2, 3} x segments
{64, 128, 256, 512} of vLLM's split-KV kernel (BLOCK_M: the stock block for single-token
decode, the block holding a sequence's rows for verify batches), timed like the harness
(medians of CUDA-graph replays, KV rotated past L2) next to stock and the shipped table's launch.
The configs compile in parallel processes first; points are measured in order until the budget
is spent. Writes ``launch_shapes_probe.json``; what it found is in results/launch_shapes.md and
the harness's BASE_SHAPES / WIDE_SHAPES. ``--quick``: one class, one point, 128 segments, 2 stages
(a check that the probe runs).
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

try:
    from radiance.attn import tune
except ImportError:  # a GPU machine with the checkout but without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from radiance.attn import tune
from radiance.attn import policy
from radiance.attn.triton_launch import RadianceUnifiedAttention

POINTS = ((32768, 1, 1), (32768, 1, 9), (32768, 4, 4), (131072, 8, 1), (131072, 8, 9))
SEGMENTS = (64, 128, 256, 512)
STAGES = (1, 2, 3)
FIELDS = ("num_segments", "block_m", "block_q", "tile_size", "num_warps", "num_stages")


def block_m(k: tune.Klass, width: int) -> int:
    return tune.wide_block_m(k, width) or policy.stock_block_m(k.num_query_heads // k.num_kv_heads)


def launches(k: tune.Klass, bm: int, segments=SEGMENTS, stages=STAGES) -> list[policy.TritonLaunch]:
    tiles = (32, 64) if k.kv_dtype == "fp8" else (16, 32, 64)
    warps = (2, 4, 8) if bm <= 32 else (4, 8)
    bq = max(1, bm // (k.num_query_heads // k.num_kv_heads))
    return [policy.TritonLaunch(seg, bm, bq, tile, w, st, "probe")
            for seg, tile, w, st in itertools.product(segments, tiles, warps, stages)]


def key(c: policy.TritonLaunch) -> str:
    return f"s{c.num_segments}_m{c.block_m}_t{c.tile_size}_w{c.num_warps}_st{c.num_stages}"


def _compile(args) -> str:
    """Worker: build one launch (the harness's precompile step); '' or why it did not build."""
    src, klass, launch = args
    try:
        tune._precompile_task((src, klass, [launch], 1))
    except Exception as exc:  # noqa: BLE001 - the probe records which configs do not build
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return ""


def main(argv=None) -> int:
    ap = tune.probe_parser(__doc__, 400.0)
    ap.add_argument("--quick", action="store_true", help="one class, one point, 128 segments, 2 stages")
    args = ap.parse_args(argv)

    classes, points, axes = tune.CLASSES, POINTS, {}
    if args.quick:
        classes, points, axes = classes[:1], POINTS[:1], {"segments": (128,), "stages": (2,)}

    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    module, dev, arch, sms = tune.probe_device(args.kernel_src)
    work = {}
    for k in classes:
        for _, _, width in points:
            for c in launches(k, block_m(k, width), **axes):
                work.setdefault((k.name, key(c)), (args.kernel_src, asdict(k), {f: getattr(c, f) for f in FIELDS}))
    failed = {"/".join(kk): why for kk, why in tune.build_in_workers(_compile, work, args.jobs).items()}
    print(f"{len(work)} configs compiled in {time.time() - t0:.0f}s, {len(failed)} failed", flush=True)

    shipped = RadianceUnifiedAttention(module, arch=arch, num_sms=sms)
    runner = RadianceUnifiedAttention(module, arch=arch, num_sms=sms, table={})
    results = []
    for k, b, (ctx, seqs, width), sets, stock in tune.probe_points(module, classes, points, dev, t0 + args.budget_s,
                                                                  max_segments=max(SEGMENTS)):
        shipped_us, shipped_launch = tune.time_wrapper(shipped, b, sets)
        rs = [b.radiance_kwargs(kw) for kw in sets]
        cands = {}
        for c in launches(k, block_m(k, width), **axes):
            if f"{k.name}/{key(c)}" in failed or c.num_segments > policy.next_pow2(policy.cdiv(ctx, c.tile_size)):
                continue
            cands[key(c)] = tune.time_graph([lambda kw=kw, c=c: runner.launch(kw, c) for kw in rs])
        best = min(cands, key=cands.get)
        floor = b.floor_us(ctx, seqs)
        results.append({"class": k.name, "ctx": ctx, "seqs": seqs, "width": width, "floor_us": floor,
                        "stock_us": stock, "shipped_us": shipped_us,
                        "shipped": shipped_launch.describe() if shipped_launch else "stock",
                        "candidates": cands})
        print(f"{k.name} ctx={ctx} seqs={seqs} w={width}: floor {floor:.1f} stock {stock:.1f} shipped "
              f"{shipped_us:.1f} best {cands[best]:.1f} us ({best})", flush=True)
        (out / "launch_shapes_probe.json").write_text(json.dumps({"failed": failed, "results": results}, indent=1))
    print(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
