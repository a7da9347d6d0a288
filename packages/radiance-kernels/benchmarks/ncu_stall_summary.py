"""Where a kernel's warps wait: Nsight Compute's warp-state samples, summed over launches.

Profile with source counters and a fine sampling interval, export the SASS page, summarize:

    ncu --clock-control none -k regex:add_rms_quant_kernel --launch-skip 1 --launch-count 5 \\
        --warp-sampling-interval 0 --section WarpStateStats --section SourceCounters -o rep \\
        python benchmarks/profile_case.py --op add_rms_quant -K 8192 -M 64 --calls 8
    ncu -i rep.ncu-rep --page source --csv --print-source sass > rep.csv
    python benchmarks/ncu_stall_summary.py rep.csv

Prints the share of samples by stall reason and the instructions holding the most samples
(position in the kernel's SASS, which is the same in every launch of one instantiation).
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import sys


def summarize(path: str, top: int = 12) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    heads = [i for i, r in enumerate(rows) if r and r[0] == "Address"]
    if not heads:
        raise ValueError(f"{path}: no SASS table (export with --page source --csv --print-source sass)")
    h = rows[heads[0]]
    samples, src = h.index("Warp Stall Sampling (All Samples)"), h.index("Source")
    reason_cols = [i for i, c in enumerate(h) if c.startswith("stall_") and "Not Issued" not in c]
    by_inst, by_reason, total = collections.Counter(), collections.Counter(), 0.0
    for hi in heads:
        for pos, r in enumerate(rows[hi + 1:], 1):
            if not r or r[0] in ("Address", "Kernel Name"):
                break
            s = float(r[samples] or 0)
            total += s
            by_inst[pos, " ".join(r[src].split())] += s
            for c in reason_cols:
                by_reason[h[c][len("stall_"):]] += float(r[c] or 0)
    if not total:
        raise ValueError(f"{path}: no warp samples")
    reasons = sum(by_reason.values())
    out = [f"{total:.0f} samples over {len(heads)} SASS tables",
           "reasons: " + ", ".join(f"{k} {v / reasons:.0%}" for k, v in by_reason.most_common(9)),
           "", "| share | SASS # | instruction |", "|---:|---:|---|"]
    out += [f"| {s / total:.1%} | {pos} | `{text}` |" for (pos, text), s in by_inst.most_common(top)]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    for p in args.csv:
        print(f"## {p}\n\n{summarize(p, args.top)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
