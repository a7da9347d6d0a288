"""add_rms_quant's split decode rows: every block summing the whole row against the blocks
exchanging their parts of it, on the GPU.

A decode row of add_rms_quant split over S blocks needs the row's sum of squares in each block.
The blocks either push their parts to each other through the cluster ("exchange") or each block
reads the other slices and adds the whole row itself ("whole", add_rms_quant.cuh), leaving only
a per-token row max to cross blocks. Both are timed here for every split the launch override
allows, at M 1-128 and K 2048-8192, as bench_epilogues.py times its main column (CUDA-graph
replays over rotating input sets), beside the unsplit row and the launch the heuristic picks.

    python benchmarks/bench_split_row_sum.py --out benchmarks/results/split_row_sum
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

import torch

MS = (1, 8, 16, 32, 64, 128)
SPLITS = (2, 4, 8)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ks", default="2048,4096,5120,8192")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_split_row_sum: no CUDA GPU, nothing to time")
        return 0
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from bench_epilogues import graph_time_us, rotating_sets

    from radiance.kernels import library, ops
    lib = library.get()
    if lib is None:
        print(f"bench_split_row_sum: kernel library unavailable: {library.why_not()}")
        return 1
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for group in (0, 128):
        kern = lambda *a, _g=group: ops.add_rms_quant(*a, group=_g)
        for k in (int(x) for x in args.ks.split(",")):
            nvec = k // 8
            for m in MS:
                sets = rotating_sets("add_rms_quant", m, k, group, g)
                row = {"group": group, "K": k, "M": m, "heuristic": lib.launch_config(0, m, k, group),
                       "heuristic_us": graph_time_us(kern, sets)}
                for s in (1,) + SPLITS:
                    if nvec % s or (nvec // s) % 32:
                        continue
                    if lib.set_launch_config(0, 1, nvec // s, 1, s) != 0:
                        continue
                    previous = lib.set_split_row_sum(0)
                    try:
                        for whole in ((1,) if s == 1 else (0, 1)):
                            lib.set_split_row_sum(whole)
                            name = "s1" if s == 1 else f"s{s}_{'whole' if whole else 'exchange'}"
                            row[name] = graph_time_us(kern, sets)
                    finally:
                        lib.set_launch_config(0, 0, 0, 0, 1)
                        lib.set_split_row_sum(previous)
                rows.append(row)
                print(json.dumps(row), flush=True)
                del sets
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    cols = ["s1"] + [f"s{s}_{w}" for s in SPLITS for w in ("exchange", "whole")]
    lines = [f"# add_rms_quant split rows: exchanged vs whole-row sums ({meta['gpu']}, torch {meta['torch']}, "
             f"CUDA {meta['cuda']}, {meta['date']})", "",
             "µs per call, median of CUDA-graph replays over rotating input sets. sS: S blocks a row, one "
             "16-byte vector a thread; `exchange`: the blocks push their parts of the row sum through the "
             "cluster; `whole`: each block adds the whole row. best x / best w: the fastest split of each "
             "kind (s1 included in both).", "",
             "| group | K | M | heuristic | heuristic µs | " + " | ".join(cols) + " | best x | best w |",
             "|---" * (7 + len(cols)) + "|"]
    for r in rows:
        bx = min(r.get(c, float("inf")) for c in cols if not c.endswith("whole"))
        bw = min(r.get(c, float("inf")) for c in cols if not c.endswith("exchange"))
        cells = [f"{r[c]:.2f}" if c in r else "-" for c in cols]
        lines.append(f"| {r['group']} | {r['K']} | {r['M']} | {r['heuristic']} | {r['heuristic_us']:.2f} | "
                     + " | ".join(cells) + f" | {bx:.2f} | {bw:.2f} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
