"""Full exactness grid on the GPU, written as a report (markdown + JSON) instead of asserts, so
one run gives every diagnostic even when something is off.

    python benchmarks/exactness_report.py --out benchmarks/results/exactness
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import itertools
import json
import pathlib
import sys

import torch

HERE = pathlib.Path(__file__).resolve().parent


def _load_test_module():
    spec = importlib.util.spec_from_file_location("gpu_exactness", HERE.parent / "tests" / "test_gpu_exactness.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="M <= 512 only")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("exactness_report: no CUDA GPU, nothing to do")
        return 0
    t = _load_test_module()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ms = [m for m in t.MS if not args.quick or m <= 512]
    rows = []
    cases = []
    for dtype, group in itertools.product((torch.bfloat16, torch.float16), (0, 128)):
        for gemma, residual in itertools.product((False, True), (True, False)):
            cases.append(("add_rms_quant", dtype, group, dict(gemma=gemma, residual=residual)))
        cases.append(("silu_mul_quant", dtype, group, {}))
        cases.append(("gdn_norm_quant", dtype, group, {}))
    seed = 0
    for op, dtype, group, kw in cases:
        for m, k in itertools.product(ms, t.KS):
            seed += 1
            try:
                st = t.run_case(op, m, k, dtype, group, seed=seed, **kw)
                err = None
            except Exception as e:  # recorded, the grid goes on
                st, err = {}, f"{type(e).__name__}: {e}"
            rows.append({"op": op, "dtype": str(dtype).split(".")[-1], "group": group,
                         **kw, "M": m, "K": k, **st, "error": err})
    for op in ("add_rms_quant", "silu_mul_quant", "gdn_norm_quant"):
        for group in (0, 128):
            try:
                st, err = t.run_case(op, 8, 4096, torch.bfloat16, group, seed=7, inject_nonfinite=True), None
            except Exception as e:
                st, err = {}, f"{type(e).__name__}: {e}"
            rows.append({"op": op, "dtype": "bfloat16", "group": group, "nonfinite": True,
                         "M": 8, "K": 4096, **st, "error": err})
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": datetime.datetime.now().isoformat(timespec="seconds")}
    (out / "exactness.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    # summary per (op, dtype, group, variant)
    keyf = lambda r: (r["op"], r["dtype"], r["group"], r.get("gemma"), r.get("residual"), r.get("nonfinite", False))
    groups = {}
    for r in rows:
        groups.setdefault(keyf(r), []).append(r)
    lines = [f"# Exactness: kernels vs reference ({meta['gpu']}, torch {meta['torch']}, CUDA {meta['cuda']}, {meta['date']})", "",
             "| op | dtype | group | gemma | residual | nonfinite | cases | errors | diff codes | fraction | diff rows | max dist | scale mism. | residual mism. | unwritten | untraced |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    worst = 0.0
    for key, rs in groups.items():
        ok = [r for r in rs if not r["error"]]
        codes = sum(r["codes"] for r in ok) or 1
        dc = sum(r["diff_codes"] for r in ok)
        worst = max(worst, dc / codes)
        lines.append("| " + " | ".join(map(str, key)) + f" | {len(rs)} | {len(rs) - len(ok)} | {dc} | {dc / codes:.2e} | "
                     f"{sum(r['diff_rows'] for r in ok)} | {max([r['max_code_distance'] for r in ok] or [0])} | "
                     f"{sum(r['scale_mismatches'] for r in ok)} | {sum(r['residual_mismatches'] for r in ok)} | "
                     f"{sum(r['unwritten_bytes'] for r in ok)} | "
                     f"{sum(r['untraced_codes'] for r in ok) if key[0] == 'gdn_norm_quant' else ''} |")
    errs = [r for r in rows if r["error"]]
    if errs:
        lines += ["", "## Errors", ""] + [f"- {r['op']} M={r['M']} K={r['K']} {r['dtype']} g{r['group']}: {r['error']}" for r in errs[:50]]
    (out / "exactness.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"worst code-difference fraction {worst:.2e}; errors {len(errs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
