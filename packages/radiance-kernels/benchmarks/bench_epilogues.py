"""The three epilogue kernels vs torch.compile of their reference chains, on the GPU.

Times are medians of CUDA-graph replays: each graph holds CALLS calls on rotating input sets
(together larger than L2 where the size allows), divided by CALLS. At decode sizes (L2_MS) the
kernel and the compiled chain are also timed on two input sets, which stay in L2: what a decode
step sees when the previous kernel has just written the inputs; the rotated sets of M = 64 at
K >= 4096 fill L2, so the main column reads them from HBM there, while M <= 8 fits in L2 anyway.
At those sizes the "bytes only" column times a kernel that moves the op's bytes and does none of
its row math (bytes_pass.py) on the kernel's input sets: what launch and latency leave.
The baseline is the reference chain compiled once per (op, group, K) with M dynamic (what
vLLM's traced graph does), with the recompile limit raised and fullgraph=True, so what is timed
is compiled code, never eager.

    python benchmarks/bench_epilogues.py --out benchmarks/results/epilogues
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

import torch

from radiance.kernels.benchmarking import graph_replay_us

from bytes_pass import time_bytes_pass

OPS = ("add_rms_quant", "silu_mul_quant", "gdn_norm_quant")
KS = (2048, 4096, 5120, 8192)
MS = (8192, 2048, 512, 64, 8, 1)  # largest first: the dynamic-M compile sees the big hint first
L2_BYTES = 60 << 20
EPS = 1e-6
# Launch variants timed alongside the heuristic at M in VARIANT_MS, every K: (vectors per thread,
# threads per block (0: the row's vectors / vpt / split), rows per block, blocks per row). "no_pdl"
# is the heuristic's config launched without programmatic dependent launch. The split variants
# (a row over a cluster of 2, 4, 8 blocks, one vector a thread) are timed at SPLIT_MS.
VARIANTS = {"vpt1": (1, 0, 1, 1), "vpt2": (2, 0, 1, 1), "vpt2x2": (2, 0, 2, 1),
            "vpt4": (4, 0, 1, 1), "vpt4x2": (4, 0, 2, 1), "vpt8": (8, 0, 1, 1)}
SPLITS = {"split1": (1, 0, 1, 1), "split2": (1, 0, 1, 2), "split4": (1, 0, 1, 4),
          "split8": (1, 0, 1, 8)}
VARIANT_MS = (1, 8, 64, 512, 2048, 8192)
SPLIT_MS = (1, 8, 64)
L2_MS = (1, 8, 64)


def inputs(op, m, k, g):
    r = lambda *s, sc=1.0: (torch.randn(*s, generator=g, device="cuda") * sc).to(torch.bfloat16)
    if op == "add_rms_quant":
        return (r(m, k), r(m, k), (1 + r(k, sc=0.1).float()).to(torch.bfloat16), EPS)
    if op == "silu_mul_quant":
        return (r(m, 2 * k, sc=2.0),)
    return (r(m, k), r(m, k), (1 + r(128, sc=0.1).float()).to(torch.bfloat16), EPS)


def required_bytes(op, m, k, group):
    scale = 4 * m * (k // group if group else 1)
    if op == "add_rms_quant":
        return m * k * (2 + 2 + 2 + 1) + 2 * k + scale
    if op == "silu_mul_quant":
        return m * k * (4 + 1) + scale
    return m * k * (2 + 2 + 1) + 256 + scale


def rotating_sets(op, m, k, group, g):
    """Input sets for one point, together larger than L2 where the size allows (2 to 32)."""
    n = max(2, min(32, L2_BYTES // required_bytes(op, m, k, group) + 1))
    return [inputs(op, m, k, g) for _ in range(n)]


def graph_time_us(fn, sets, calls=None):
    calls = calls or max(len(sets), 20)
    return graph_replay_us([lambda a=sets[i % len(sets)]: fn(*a) for i in range(calls)])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ms", default=",".join(map(str, MS)), help="comma-separated M values to time")
    args = ap.parse_args()
    ms = sorted({int(m) for m in args.ms.split(",")}, reverse=True)  # largest first, as MS
    if not torch.cuda.is_available():
        print("bench_epilogues: no CUDA GPU, nothing to time")
        return 0
    from radiance.kernels import library, ops, reference
    lib = library.get()
    if lib is None:
        print(f"bench_epilogues: kernel library unavailable: {library.why_not()}")
        return 1
    raw = lib._lib
    import ctypes
    raw.radiance_set_pdl.argtypes = [ctypes.c_int]
    import torch._dynamo as dynamo
    dynamo.config.recompile_limit = 64
    dynamo.config.cache_size_limit = 64
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    results = []
    bytes_only = {}  # (op, K, M): the group's few scale bytes aside, the same pass for both groups
    for op_i, op in enumerate(OPS):
        for group in (0, 128):
            for k in KS:
                kern = lambda *a, _op=op, _g=group: getattr(ops, _op)(*a, group=_g)
                ref = lambda *a, _op=op, _g=group: getattr(reference, _op)(*a, group=_g)
                compiled = torch.compile(ref, fullgraph=True, dynamic=None)
                for m in ms:
                    per_set = required_bytes(op, m, k, group)
                    sets = rotating_sets(op, m, k, group, g)
                    nsets = len(sets)
                    if m > 1:
                        for a in sets:
                            dynamo.mark_dynamic(a[0], 0)
                            if op != "silu_mul_quant":
                                dynamo.mark_dynamic(a[1], 0)
                    before = dynamo.utils.counters["stats"]["unique_graphs"]
                    compiled(*sets[0])
                    row = {"op": op, "group": group, "K": k, "M": m, "bytes": per_set,
                           "rotated_bytes": per_set * nsets,
                           "compiled_new_graphs": dynamo.utils.counters["stats"]["unique_graphs"] - before}
                    row["kernel_us"] = graph_time_us(kern, sets)
                    row["compiled_us"] = graph_time_us(compiled, sets)
                    if m in L2_MS:
                        row["l2_kernel_us"] = graph_time_us(kern, sets[:2])
                        row["l2_compiled_us"] = graph_time_us(compiled, sets[:2])
                        if (op, k, m) not in bytes_only:
                            try:
                                bytes_only[op, k, m] = time_bytes_pass(op, sets, graph_time_us)
                            except Exception as e:  # a reference column: reported, never fatal
                                bytes_only[op, k, m] = (float("nan"), f"error: {e}")
                                print(f"bytes_pass {op} K={k} M={m}: {e}", flush=True)
                        row["bytes_only_us"], row["bytes_only_launch"] = bytes_only[op, k, m]
                    row["config"] = lib.launch_config(op_i, m, k, group)
                    variants = {**(VARIANTS if m in VARIANT_MS else {}),
                                **(SPLITS if m in SPLIT_MS else {})}
                    for name, (vpt, tpr, rpb, split) in variants.items():
                        t = tpr or (k // 8) // (vpt * split)
                        if lib.set_launch_config(op_i, vpt, t, rpb, split) != 0:
                            continue
                        try:
                            row[f"variant_{name}_us"] = graph_time_us(kern, sets)
                        finally:
                            lib.set_launch_config(op_i, 0, 0, 0, 1)
                    if m in VARIANT_MS:
                        raw.radiance_set_pdl(0)
                        try:
                            row["variant_no_pdl_us"] = graph_time_us(kern, sets)
                        finally:
                            raw.radiance_set_pdl(1)
                    row["kernel_tbps"] = per_set / row["kernel_us"] / 1e6
                    row["compiled_tbps"] = per_set / row["compiled_us"] / 1e6
                    row["speedup"] = row["compiled_us"] / row["kernel_us"]
                    checks = {"not_slower": row["kernel_us"] <= row["compiled_us"]}
                    if m <= 64:
                        checks["le_2us"] = row["kernel_us"] <= 2.0
                        if op == "add_rms_quant":
                            checks["le_0.6x"] = row["kernel_us"] <= 0.6 * row["compiled_us"]
                    if m == 8192 and k == 4096:
                        checks["ge_3.6TBps"] = row["kernel_tbps"] >= 3.6
                    row["checks"] = checks
                    results.append(row)
                    print(f"{op:15s} g{group:<3d} K={k:<5d} M={m:<5d} kernel {row['kernel_us']:8.2f} us "
                          f"compiled {row['compiled_us']:8.2f} us  x{row['speedup']:.2f}  "
                          f"{row['kernel_tbps']:.2f} TB/s  {'PASS' if all(checks.values()) else 'FAIL ' + str([c for c, v in checks.items() if not v])}",
                          flush=True)
                    del sets
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": getattr(__import__("importlib").import_module("triton"), "__version__", "absent")
            if __import__("importlib").util.find_spec("triton") else "absent",
            "date": datetime.datetime.now().isoformat(timespec="seconds")}
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    lines = [f"# Epilogue kernels vs torch.compile ({meta['gpu']}, torch {meta['torch']}, CUDA {meta['cuda']}, "
             f"Triton {meta['triton']}, {meta['date']})", "",
             "| op | group | K | M | rotated MB | kernel µs | compiled µs | speedup | kernel TB/s | compiled TB/s | "
             "inputs in L2: kernel / compiled µs | bytes only µs | launch | variants µs | checks |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        var = ", ".join(f"{k[8:-3]}={v:.2f}" for k, v in r.items() if k.startswith("variant_") and v)
        chk = " ".join(f"{c}:{'ok' if v else 'MISS'}" for c, v in r["checks"].items())
        l2 = f"{r['l2_kernel_us']:.2f} / {r['l2_compiled_us']:.2f}" if "l2_kernel_us" in r else ""
        only = f"{r['bytes_only_us']:.2f}" if "bytes_only_us" in r else ""
        lines.append(f"| {r['op']} | {r['group']} | {r['K']} | {r['M']} | {r['rotated_bytes'] / 1e6:.1f} | "
                     f"{r['kernel_us']:.2f} | {r['compiled_us']:.2f} | "
                     f"{r['speedup']:.2f} | {r['kernel_tbps']:.2f} | {r['compiled_tbps']:.2f} | {l2} | {only} | "
                     f"{r['config']} | {var} | {chk} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
        for ax, op in zip(axes, OPS):
            for group, ls in ((0, "-"), (128, "--")):
                for k in (2048, 8192):
                    rs = sorted((r for r in results if r["op"] == op and r["group"] == group and r["K"] == k),
                                key=lambda r: r["M"])
                    ms = [r["M"] for r in rs]
                    ax.plot(ms, [r["kernel_us"] for r in rs], ls, marker="o", label=f"kernel g{group} K{k}")
                    ax.plot(ms, [r["compiled_us"] for r in rs], ls, marker="x", label=f"compiled g{group} K{k}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(op)
            ax.set_xlabel("M")
            ax.set_ylabel("µs per call")
            ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / "time_vs_m.png", dpi=120)
    except ImportError as e:
        print(f"no plot: {e}")
    fails = [r for r in results if not all(r["checks"].values())]
    print(f"\n{len(results) - len(fails)}/{len(results)} points meet every target; table in {out / 'table.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
