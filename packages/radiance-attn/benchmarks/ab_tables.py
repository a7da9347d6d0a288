"""Two attention tables timed against each other through radiance's wrapper, in one run.

A refitted table (a new rule form, or the same sweep fitted again) is judged against the table it
would replace on the GPU at hand: at every point of the sweep's grid where the two tables launch
differently, the wrapper runs with each table, alternated, ``--reps`` times (medians of CUDA-graph
replays, KV rotated past L2, as ``tune`` times them); the faster of each table's repetitions is
kept. Points where the two launch the same are not timed (the ratio there is 1 by construction).

    python benchmarks/ab_tables.py --base src/radiance/attn/tables/sm90.json --new NEW.json \\
        --kernel-src STAGED_DIR --out ab_tables.jsonl --md ab_tables.md

Both tables are used as they are, whatever arch they name: a table fitted on another card of the
same arch can be checked here before the card it was fitted for is at hand (``--md`` names the
card that ran it).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

try:
    from radiance.attn import kernel_source, policy, tune
except ImportError:  # a GPU machine with the checkout but without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from radiance.attn import kernel_source, policy, tune


def differing_points(base: dict, new: dict, arch: str) -> list[tuple]:
    """(class, ctx, seqs, width, base launch, new launch) wherever the two tables differ."""
    out = []
    for k in tune.CLASSES:
        for ctx in tune.FULL_GRID["ctx"]:
            for seqs in tune.FULL_GRID["seqs"]:
                for width in tune.FULL_GRID["width"]:
                    geo = tune._geo(dict(asdict(k), ctx=ctx, seqs=seqs, width=width), arch)
                    a, b = policy.triton_launch(geo, base), policy.triton_launch(geo, new)
                    if tune._key(a) != tune._key(b):
                        out.append((k, ctx, seqs, width, a, b))
    return out


def summarize(rows: list[dict]) -> list[str]:
    """Markdown: new over base per class and width (geometric mean, range), and the points past 3%."""
    by = defaultdict(list)
    for r in rows:
        by[(r["class"], r["width"])].append(r["new_us"] / r["base_us"])
    lines = ["| class | width | points | new / base (geo. mean) | range |", "|---|---:|---:|---:|---|"]
    for (cls, width), v in sorted(by.items()):
        lines.append(f"| {cls} | {width} | {len(v)} | {statistics.geometric_mean(v):.3f} | {min(v):.3f}-{max(v):.3f} |")
    allr = [r["new_us"] / r["base_us"] for r in rows]
    if allr:
        lines += ["", f"All {len(allr)} points: {statistics.geometric_mean(allr):.3f} (geometric mean); "
                  f"{sum(x > 1.03 for x in allr)} slower by more than 3%, {sum(x < 0.97 for x in allr)} faster by more "
                  "than 3%.", ""]
    slow = [r for r in rows if r["new_us"] > 1.03 * r["base_us"]]
    if slow:
        lines += ["| class | ctx | seqs | width | base µs | new µs | base launch | new launch |",
                  "|---|---:|---:|---:|---:|---:|---|---|"]
        lines += [f"| {r['class']} | {r['ctx']} | {r['seqs']} | {r['width']} | {r['base_us']:.1f} | {r['new_us']:.1f} "
                  f"| {r['base_launch']} | {r['new_launch']} |" for r in slow]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the table in use")
    ap.add_argument("--new", required=True, help="the table to judge")
    ap.add_argument("--kernel-src", required=True, help="directory written by stage_vllm_kernel.py")
    ap.add_argument("--out", required=True, help="JSON lines, one a point")
    ap.add_argument("--md", help="write the summary here too")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=400.0, help="stop starting points after this many seconds")
    ap.add_argument("--jobs", type=int, default=8)
    args = ap.parse_args(argv)
    base, new = (json.loads(Path(p).read_text()) for p in (args.base, args.new))
    torch = tune._torch()
    if not torch.cuda.is_available():
        print("ab_tables: needs a CUDA/ROCm GPU; nothing measured")
        return 2
    t0 = time.time()
    module = kernel_source.load(args.kernel_src)
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    arch = base["arch"]
    work = differing_points(base, new, arch)
    # longest contexts first: a budget cut leaves out the short ones
    work.sort(key=lambda w: (-w[1], w[0].name, w[2], w[3]))
    by_point = {(k.name, ctx, seqs, width): (a, b) for k, ctx, seqs, width, a, b in work}
    pre = tune.precompile(args.kernel_src, [(k, ctx, seqs, width) for k, ctx, seqs, width, _, _ in work], args.jobs,
                          launches=lambda k, ctx, seqs, width: [c for c in by_point[(k.name, ctx, seqs, width)] if c])
    print(f"{len(work)} points differ; precompiled in {pre:.0f}s", flush=True)
    wrappers = {name: tune.RadianceUnifiedAttention(module, arch=arch, num_sms=props.multi_processor_count, table=t)
                for name, t in (("base", base), ("new", new))}
    grid = tune.FULL_GRID
    benches, rows = {}, []
    with open(args.out, "a") as fh:
        for k, ctx, seqs, width, _, _ in work:
            if time.time() - t0 > args.budget_s:
                break
            if k.name not in benches:
                benches.clear()
                torch.cuda.empty_cache()
                benches[k.name] = tune.Bench(module, k, max(grid["ctx"]) * max(grid["seqs"]), device)
            b = benches[k.name]
            sets = b.point(ctx, seqs, width)
            times, launches = defaultdict(list), {}
            for _ in range(args.reps):
                for name, w in wrappers.items():
                    us, launch = tune.time_wrapper(w, b, sets)
                    times[name].append(us)
                    launches[name] = launch.describe() if launch is not None else "stock wrapper"
            row = {"class": k.name, "ctx": ctx, "seqs": seqs, "width": width, "base_us": min(times["base"]),
                   "new_us": min(times["new"]), "base_reps": times["base"], "new_reps": times["new"],
                   "base_launch": launches["base"], "new_launch": launches["new"], "gpu": props.name}
            rows.append(row)
            fh.write(json.dumps(row) + "\n")
            print(f"  {k.name:14s} ctx={ctx:6d} seqs={seqs} w={width}: base {row['base_us']:7.1f} new "
                  f"{row['new_us']:7.1f} us ({row['new_us'] / row['base_us']:.3f})", flush=True)
    lines = [f"# Two attention tables through radiance's wrapper on {props.name}", "",
             f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, "
             f"{len(rows)} of the {len(work)} points where the tables launch differently (best of {args.reps} "
             "repetitions each, alternated).", "", *summarize(rows)]
    print("\n".join(lines))
    if args.md:
        Path(args.md).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
