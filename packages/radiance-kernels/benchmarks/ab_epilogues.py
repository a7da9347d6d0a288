"""Two builds of the epilogue kernels timed against each other in one run.

A change to the kernels is judged against the build before it on the same machine in the same
run: a fresh machine can move every time by several percent. `time` measures whichever
``radiance.kernels`` is importable (this checkout, or another source tree put first on
PYTHONPATH) and appends one JSON line a point; alternating the two builds a few times and then
`compare` gives, per point, the new build's time over the base build's (the fastest repetition
of each, so a slow outlier of either side drops out):

    for i in 1 2; do
      PYTHONPATH=BASE/src:$PYTHONPATH python benchmarks/ab_epilogues.py time --label base --out ab.jsonl
      python benchmarks/ab_epilogues.py time --label new --out ab.jsonl
    done
    python benchmarks/ab_epilogues.py compare ab.jsonl --base base --new new --md ab.md

Points: every op and grouping (`--ops` to choose fewer) at K 2048-8192 and M 1, 8, 64 and 8192
(`--ms` for others), timed as bench_epilogues.py times its main column (CUDA-graph replays over
rotating input sets). The kernel library is built per source hash, so both builds can share
RADIANCE_CACHE_DIR; `compare` tells the builds apart by a hash of the library file they ran (a JIT
cache entry or a source tree's prebuilt library) and refuses two labels that ran the same one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import statistics
import sys
from collections import defaultdict

AB_MS = (1, 8, 64, 8192)


def time_points(label: str, out: pathlib.Path, only: tuple[str, ...] = (),
                ms: tuple[int, ...] = AB_MS) -> int:
    import torch

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from bench_epilogues import KS, OPS, graph_time_us, required_bytes, rotating_sets

    from radiance.kernels import library, ops

    unknown = sorted(set(only) - set(OPS))
    if unknown:
        print(f"ab_epilogues: unknown op(s) {unknown}; choose from {list(OPS)}")
        return 2
    lib = library.get()
    if lib is None:
        print(f"ab_epilogues: kernel library unavailable: {library.why_not()}")
        return 1
    build = hashlib.sha256(pathlib.Path(lib.path).read_bytes()).hexdigest()[:16]
    g = torch.Generator(device="cuda").manual_seed(0)
    with out.open("a") as f:
        for op in [o for o in OPS if not only or o in only]:
            for group in (0, 128):
                for k in KS:
                    kern = lambda *a, _op=op, _g=group: getattr(ops, _op)(*a, group=_g)
                    for m in ms:
                        per_set = required_bytes(op, m, k, group)
                        sets = rotating_sets(op, m, k, group, g)
                        us = graph_time_us(kern, sets)
                        f.write(json.dumps({"label": label, "library": build,
                                            "op": op, "group": group, "K": k, "M": m, "us": us,
                                            "tbps": per_set / us / 1e6}) + "\n")
                        print(f"{label}: {op:15s} g{group:<3d} K={k:<5d} M={m:<5d} {us:8.2f} us", flush=True)
                        del sets
    return 0


def compare(path: pathlib.Path, base: str, new: str, md: pathlib.Path | None) -> int:
    if not path.exists():
        print(f"ab_epilogues: {path} does not exist (nothing was timed)")
        return 1
    best: dict[tuple, dict[str, float]] = defaultdict(dict)
    libraries: dict[str, set[str]] = defaultdict(set)
    for line in path.read_text().splitlines():
        r = json.loads(line)
        key = (r["op"], r["group"], r["K"], r["M"])
        libraries[r["label"]].add(r["library"])
        best[key][r["label"]] = min(best[key].get(r["label"], float("inf")), r["us"])
    if libraries[base] & libraries[new]:
        print(f"ab_epilogues: '{base}' and '{new}' ran the same library build")
        return 1
    rows = [(k, v[base], v[new]) for k, v in sorted(best.items()) if base in v and new in v]
    if not rows:
        print(f"ab_epilogues: no point timed under both '{base}' and '{new}'")
        return 1
    lines = [f"{new} / {base}: fastest repetition of each build, per point (µs)", "",
             f"| op | group | K | M | {base} | {new} | {new} / {base} |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {op} | {g} | {k} | {m} | {b:.2f} | {n:.2f} | {n / b:.3f} |" for (op, g, k, m), b, n in rows]
    lines += ["", "| op | group | M | points | ratio min | median | max |", "|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[float]] = defaultdict(list)
    for (op, g, _k, m), b, n in rows:
        groups[(op, g, m)].append(n / b)
    for (op, g, m), ratios in sorted(groups.items()):
        lines.append(f"| {op} | {g} | {m} | {len(ratios)} | {min(ratios):.3f} | "
                     f"{statistics.median(ratios):.3f} | {max(ratios):.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if md:
        md.write_text(text)
    return 0


def _m_values(text: str) -> tuple[int, ...]:
    ms = tuple(int(m) for m in text.split(","))  # argparse reports a ValueError as a usage error
    if any(m < 1 for m in ms):
        raise ValueError(text)
    return ms


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time", help="time the importable build, append to a JSON-lines file")
    t.add_argument("--label", required=True)
    t.add_argument("--out", required=True, type=pathlib.Path)
    t.add_argument("--ops", default="", help="comma-separated ops to time (default: all three)")
    t.add_argument("--ms", default=AB_MS, type=_m_values, help="comma-separated M values")
    c = sub.add_parser("compare", help="new / base per point from a JSON-lines file")
    c.add_argument("path", type=pathlib.Path)
    c.add_argument("--base", required=True)
    c.add_argument("--new", required=True)
    c.add_argument("--md", type=pathlib.Path)
    args = ap.parse_args()
    if args.cmd == "compare":
        return compare(args.path, args.base, args.new, args.md)
    import torch

    if not torch.cuda.is_available():
        print("ab_epilogues: no CUDA GPU, nothing to time")
        return 0
    only = tuple(o for o in args.ops.split(",") if o)
    return time_points(args.label, args.out, only, args.ms)


if __name__ == "__main__":
    sys.exit(main())
