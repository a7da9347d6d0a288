"""The CUDA decode GEMMs' L2 prefetch (`pf` config field) against the same launches without it, in
one run, at M <= 16 on every shape of bench_block_fp8_gemm.py.

For each (shape, M): the launch the shipped dispatch table picks, and a few strong launches of
both CUDA kernels, each with the next kernel released early (ov1) and late, and each with
l2_prefetch at 0 and at the depths given; every variant's output must equal its pf0 twin bit for
bit (the prefetch changes no result). Timed like the benchmark (medians of CUDA-graph replays,
one call per rotating weight copy, copies > 2x L2) in `--rounds` alternations, the fastest kept.
Writes l2_prefetch_ab.json and l2_prefetch_ab.md under --out.

    python ab_l2_prefetch.py --out results/h200
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_block_fp8_gemm import COPY_BW, time_graph, time_weight_read, unique_shapes  # noqa: E402

CUDA = ("cuda_decode", "cuda_tma")
# Launches timed at every point beside the table's, both kernels' strongest at M <= 16 in the
# committed results.json.
EXTRA = {"cuda_decode": ("sk1-w8-r1-s2", "skauto-w8-r1-s2"), "cuda_tma": ("skauto-s8", "sk1-s8")}


def strip(config: str) -> str:
    return "-".join(p for p in config.split("-") if not p.startswith(("ov", "pf")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--m", default="1,2,4,8,16")
    ap.add_argument("--pf", default="16,4096", help="prefetch depths (groups a row) besides 0")
    ap.add_argument("--shapes", default="")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("ab_l2_prefetch: no GPU here; nothing measured")
        return 0
    import triton

    from radiance.gemm import dispatch, providers, reference
    from radiance.gemm.platform import device_platform, sm_count

    plat, arch = device_platform("cuda")
    sms = sm_count("cuda")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size or 50 * 2**20
    table = json.loads((Path(dispatch.__file__).parent / "tables" / f"{arch}.json").read_text())
    depths = [int(v) for v in args.pf.split(",")]
    m_values = [int(v) for v in args.m.split(",")]
    shapes = unique_shapes()
    if args.shapes:
        keep = {tuple(map(int, v.split("x"))) for v in args.shapes.split(",")}
        shapes = {nk: w for nk, w in shapes.items() if nk in keep}
    meta = {"gpu": torch.cuda.get_device_name(0), "arch": arch, "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "rounds": args.rounds, "depths": depths}
    rows, t0 = [], time.time()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for (n, k) in shapes:
        chosen_by_m = {e[0]: (e[1], e[2]) for e in table["shapes"][f"{n}x{k}"]}
        copies = max(2, math.ceil(2 * l2 / (n * k)))
        wq, sw = reference.quantize_weight(torch.randn(n, k, device="cuda", generator=gen) * 0.05)
        wqs = [wq] + [wq.clone() for _ in range(copies - 1)]
        sws = [sw] + [sw.clone() for _ in range(copies - 1)]
        floor_us = n * k / COPY_BW * 1e6
        read_us = time_weight_read(wqs)[0] * 1e6
        counters = torch.zeros(triton.cdiv(n, 16), dtype=torch.int32, device="cuda")
        for m in m_values:
            chosen = min((mm, v) for mm, v in chosen_by_m.items() if mm >= m)[1]
            # the table's launch as parsed, so field order, ov0/pf0 and a resolved skauto compare equal
            table_launch = ((chosen[0], providers.parse_config(chosen[0], chosen[1], n, k, sms))
                            if chosen[0] in CUDA else None)
            q, sa = reference.quantize_activation(torch.randn(m, k, device="cuda", generator=gen), 128)
            sa_g = reference.group_scales(sa.t().contiguous().t(), m, sa.shape[1])
            launches = {(chosen[0], strip(chosen[1]))} if chosen[0] in CUDA else set()
            launches |= {(name, c) for name, cs in EXTRA.items() for c in cs}
            configs = [(name, f"{base}-ov{ov}" + (f"-pf{d}" if d else ""))
                       for name, base in sorted(launches) for ov in (0, 1) for d in (0, *depths)]
            plain_out, timed = {}, {}
            for name, cfg in configs:
                p = providers.provider(name)
                if p.serves(plat, arch, n, k, (128, 128), torch.float8_e4m3fn):
                    continue
                try:
                    params = providers.parse_config(name, cfg, n, k, sms)
                except ValueError:  # a launch this shape cannot take (e.g. too few rows)
                    continue
                out = p.run(q, wqs[0], sa_g, sws[0], torch.bfloat16, params, counters)
                twin = (name, strip(cfg), "ov" + cfg.split("-ov")[1][0])
                if "-pf" not in cfg:
                    plain_out[twin] = out.clone()
                elif not torch.equal(out, plain_out[twin]):
                    raise SystemExit(f"{n}x{k} M={m} {name} {cfg}: output differs from its pf0 twin")
                timed[(name, cfg)] = (p, params)
            best = {key: float("inf") for key in timed}
            for _ in range(args.rounds):
                for key, (p, params) in timed.items():
                    us = time_graph(lambda i, p=p, params=params: p.run(
                        q, wqs[i], sa_g, sws[i], torch.bfloat16, params, counters), copies) * 1e6
                    best[key] = min(best[key], us)
            for (name, cfg), us in best.items():
                rows.append({"N": n, "K": k, "M": m, "provider": name, "config": cfg, "us": us,
                             "floor_us": floor_us, "read_us": read_us,
                             "table": (name, timed[(name, cfg)][1]) == table_launch})
        del wqs, sws
        torch.cuda.empty_cache()
        print(f"  {n}x{k} done ({time.time() - t0:.0f}s)", flush=True)
        (args.out / "l2_prefetch_ab.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    (args.out / "l2_prefetch_ab.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "l2_prefetch_ab.md").write_text(summary(rows, meta))
    print(summary(rows, meta))
    return 0


def summary(rows, meta) -> str:
    """Per point: the table's launch, the best launch without prefetch, the best with it (all
    against the weight-read floor)."""
    points = sorted({(r["N"], r["K"], r["M"]) for r in rows}, key=lambda p: (p[0] * p[1], p))
    lines = [f"# L2 prefetch A/B ({meta['gpu']}, torch {meta['torch']}, CUDA {meta['cuda']}, "
             f"{meta['date']})", "",
             "| N x K | M | floor us | read us | table us | best pf0 us (config) | best pf us (config) "
             "| best pf / best pf0 | best x floor |", "|---|---|---|---|---|---|---|---|---|"]
    within = {"table": 0, "pf0": 0, "any": 0}
    for n, k, m in points:
        rs = [r for r in rows if (r["N"], r["K"], r["M"]) == (n, k, m)]
        tab = next((r for r in rs if r["table"]), None)
        b0 = min((r for r in rs if "-pf" not in r["config"]), key=lambda r: r["us"])
        b1 = min((r for r in rs if "-pf" in r["config"]), key=lambda r: r["us"])
        floor = rs[0]["floor_us"]
        best = min(b0["us"], b1["us"])
        within["table"] += bool(tab and tab["us"] <= 1.5 * floor)
        within["pf0"] += b0["us"] <= 1.5 * floor
        within["any"] += best <= 1.5 * floor
        table_us = f"{tab['us']:.2f}" if tab else "-"
        lines.append(f"| {n}x{k} | {m} | {floor:.2f} | {rs[0]['read_us']:.2f} | {table_us} | "
                     f"{b0['us']:.2f} ({b0['provider']} {b0['config']}) | {b1['us']:.2f} "
                     f"({b1['provider']} {b1['config']}) | {b1['us'] / b0['us']:.3f} | "
                     f"{best / floor:.2f} |")
    lines += ["", f"points within 1.5x of the floor: the table's launch {within['table']}, best "
              f"without prefetch {within['pf0']}, best of all {within['any']} (of {len(points)})"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
