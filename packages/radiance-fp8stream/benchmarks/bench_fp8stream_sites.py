"""Per decode step: what the fp8 stream's epilogue sites cost, stock chain vs stream op.

For the layer plans of two models at tensor-parallel size 1 and M (tokens per step) in
{1, 8, 64}, each epilogue site the stream installs is timed both ways in the same run:
  stock   torch.compile of the reference chain (vLLM's native norm/act + dynamic FP8 quant,
          which is what vLLM's traced graph runs), one compiled function per shape;
  stream  the radiance.kernels op the stream calls (one kernel).
Per-site medians of CUDA-graph replays on random data are multiplied by the site counts of the
plan to give microseconds per step saved, and the kernels each side launches (counted with the
profiler) give kernels per step removed.

Plans (the sites ``radiance.fp8stream.rewrite`` installs; GDN inputs and MoE MLPs stay stock):
  qwen3-next-80b-a3b  48 layers (36 GatedDeltaNet, 12 full attention), hidden 2048, Gemma norms,
                      every MLP sparse MoE: 12 input sites (full-attention layers; K=2048) and
                      36 gdn_norm sites (value dim 32 x 128 = 4096, head dim 128).
  qwen3-32b (dense)   64 layers, hidden 5120, intermediate 25600, plain RMSNorm: 64 input,
                      64 mid (K=5120) and 64 act (N=25600) sites; at tp=1 the act row is
                      wider than the kernels serve (24576), so install() leaves it stock and
                      so does this plan.

Decode-time epilogue inputs were just written by the GEMM before them and are L2-resident, so
inputs are not rotated. Runs without vLLM; needs a CUDA GPU (prints why and exits otherwise).

    python bench_fp8stream_sites.py --out DIR [--ms 1,8,64] [--replays 50]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from radiance.kernels.benchmarking import graph_replay_us

GROUP = 128
EPS = 1e-6


@dataclass(frozen=True)
class Site:
    kind: str      # input / mid / act / gdn_norm
    op: str        # add_rms_quant / silu_mul_quant / gdn_norm_quant
    k: int         # row width the op reads (for act: N, the gate_up width is 2N)
    gemma: bool = False
    head_dim: int = 0


PLANS = {
    "qwen3-next-80b-a3b": {
        "layers": 48,
        "sites": [(Site("input", "add_rms_quant", 2048, gemma=True), 12),
                  (Site("gdn_norm", "gdn_norm_quant", 4096, head_dim=128), 36)],
    },
    "qwen3-32b": {
        "layers": 64,
        "sites": [(Site("input", "add_rms_quant", 5120), 64),
                  (Site("mid", "add_rms_quant", 5120), 64),
                  (Site("act", "silu_mul_quant", 25600), 64)],
    },
}


def _inputs(site: Site, m: int, gen: torch.Generator):
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(torch.bfloat16)

    if site.op == "add_rms_quant":
        w = rnd(site.k, scale=0.1) if site.gemma else (1 + rnd(site.k, scale=0.1).float()).bfloat16()
        return (rnd(m, site.k, scale=2.0), rnd(m, site.k, scale=4.0), w)
    if site.op == "silu_mul_quant":
        return (rnd(m, 2 * site.k, scale=2.0),)
    w = (1 + rnd(site.head_dim, scale=0.05).float()).bfloat16()
    return (rnd(m, site.k), rnd(m, site.k, scale=2.0), w)


def _chains(site: Site, fp8):
    from radiance.kernels import ops, reference

    if site.op == "add_rms_quant":
        def stock(y, r, w):
            return reference.add_rms_quant(y, r, w, EPS, gemma=site.gemma, group=GROUP, fp8_dtype=fp8)

        def stream(y, r, w):
            return ops.add_rms_quant(y, r, w, EPS, gemma=site.gemma, group=GROUP, fp8_dtype=fp8)
    elif site.op == "silu_mul_quant":
        def stock(gu):
            return reference.silu_mul_quant(gu, group=GROUP, fp8_dtype=fp8)

        def stream(gu):
            return ops.silu_mul_quant(gu, group=GROUP, fp8_dtype=fp8)
    else:
        def stock(x, z, w):
            return reference.gdn_norm_quant(x, z, w, EPS, group=GROUP, fp8_dtype=fp8)

        def stream(x, z, w):
            return ops.gdn_norm_quant(x, z, w, EPS, group=GROUP, fp8_dtype=fp8)
    return stock, stream


def _kernels(fn, args) -> int:
    """CUDA kernels one call launches."""
    from torch.profiler import ProfilerActivity, profile

    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _graph_median_us(fn, args, reps: int, replays: int) -> float:
    return graph_replay_us([lambda: fn(*args)] * reps, replays=replays)


def _measure(site: Site, m: int, gen, fp8, why_no_kernel, args) -> dict:
    inputs = _inputs(site, m, gen)
    stock, stream = _chains(site, fp8)
    compiled = torch.compile(stock, dynamic=False, fullgraph=True)
    eager_k = _kernels(stock, inputs)
    stock_k = _kernels(compiled, inputs)
    out = {"eager_kernels": eager_k, "stock_kernels": stock_k, "stock_compiled": stock_k < eager_k,
           "stock_us": _graph_median_us(compiled, inputs, args.reps, args.replays),
           "stream_kernels": None, "stream_us": None}
    if why_no_kernel is None:
        out["stream_kernels"] = _kernels(stream, inputs)
        out["stream_us"] = _graph_median_us(stream, inputs, args.reps, args.replays)
        got, want = stream(*inputs), compiled(*inputs)
        out["q_mismatch"] = int((got[0].view(torch.uint8) != want[0].view(torch.uint8)).sum())
        out["q_numel"] = got[0].numel()
    return out


def _env() -> dict:
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip,
            "python": platform.python_version()}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--ms", default="1,8,64")
    ap.add_argument("--reps", type=int, default=20, help="calls captured per graph")
    ap.add_argument("--replays", type=int, default=50)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("bench_fp8stream_sites: needs a CUDA GPU (torch.cuda.is_available() is False); nothing timed")
        return 0
    # One compiled function per shape; never let dynamo fall back to eager after its limit.
    torch._dynamo.config.cache_size_limit = 256
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.automatic_dynamic_shapes = False

    from radiance.kernels import ops, reference, registry

    fp8 = reference.platform_fp8_dtype()
    why_no_kernel = ops.unavailable_reason(0)
    if why_no_kernel:
        print(f"bench_fp8stream_sites: the stream's kernels are unavailable ({why_no_kernel}); "
              "timing the stock chains only")
    ms = [int(x) for x in args.ms.split(",")]
    gen = torch.Generator(device="cuda").manual_seed(0)
    site_rows, step_rows = [], []
    measured: dict = {}  # sites of the same op and shape are timed once
    for model, plan in PLANS.items():
        for m in ms:
            step = {"model": model, "M": m, "layers": plan["layers"], "stock_us": 0.0,
                    "stream_us": 0.0, "stock_kernels": 0, "stream_kernels": 0, "sites": 0}
            for site, count in plan["sites"]:
                key = (site.op, site.k, site.gemma, site.head_dim, m)
                # install() leaves a site stock when no kernel serves its shape: so does the plan
                served = registry.select(
                    site.op, device="cuda", device_index=torch.cuda.current_device(),
                    dtype="bfloat16", K=site.k, group=GROUP,
                    fp8=str(fp8).removeprefix("torch."))
                if key not in measured:
                    measured[key] = _measure(site, m, gen, fp8, why_no_kernel, args)
                    if not served:
                        measured[key].update(stream_us=measured[key]["stock_us"],
                                             stream_kernels=measured[key]["stock_kernels"],
                                             left_stock=served.reason)
                row = {"model": model, "M": m, "site": site.kind, "op": site.op, "K": site.k,
                       "count": count, **measured[key]}
                stock_k = row["stock_kernels"]
                if not row["stock_compiled"]:
                    print(f"WARNING: {model} M={m} {site.kind}: the stock chain launched as many "
                          f"kernels compiled as eager ({stock_k}); it may not have been compiled")
                site_rows.append(row)
                step["sites"] += count
                step["stock_us"] += count * row["stock_us"]
                step["stock_kernels"] += count * stock_k
                if row["stream_us"] is not None:
                    step["stream_us"] += count * row["stream_us"]
                    step["stream_kernels"] += count * row["stream_kernels"]
                if row.get("left_stock"):
                    print(f"  {model:20s} M={m:<3d} {site.kind:8s} left stock: {row['left_stock']}")
                print(f"  {model:20s} M={m:<3d} {site.kind:8s} x{count:<3d} stock {row['stock_us']:7.2f} us "
                      f"({stock_k} kernels)  stream "
                      + (f"{row['stream_us']:7.2f} us ({row['stream_kernels']} kernels)"
                         if row["stream_us"] is not None else "n/a"), flush=True)
            if why_no_kernel is None:
                step["saved_us"] = step["stock_us"] - step["stream_us"]
                step["kernels_removed"] = step["stock_kernels"] - step["stream_kernels"]
            else:
                step["saved_us"] = step["kernels_removed"] = None
            step_rows.append(step)

    env = _env()
    (args.out / "fp8stream_sites.json").write_text(json.dumps(
        {"env": env, "group": GROUP, "fp8": str(fp8), "kernel_unavailable": why_no_kernel,
         "sites": site_rows, "steps": step_rows}, indent=2))
    lines = [f"# fp8 stream: epilogue sites per decode step (tp=1)", "",
             f"GPU {env.get('gpu')} | torch {env['torch']} | triton {env['triton']} | "
             f"CUDA {env['cuda']} | {env['date']}", "",
             "Per-site medians of CUDA-graph replays on random data; stock = torch.compile of the "
             "reference chain (vLLM's native ops), stream = radiance.kernels op.", "",
             "| model | M | sites | stock us/step | stream us/step | saved us/step | "
             "stock kernels/step | kernels removed/step |",
             "|---|---|---|---|---|---|---|---|"]
    for s in step_rows:
        fmt = lambda v: "n/a" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))
        lines.append(f"| {s['model']} | {s['M']} | {s['sites']} | {s['stock_us']:.1f} | "
                     f"{fmt(s['stream_us'] if why_no_kernel is None else None)} | {fmt(s['saved_us'])} | "
                     f"{s['stock_kernels']} | {fmt(s['kernels_removed'])} |")
    lines += ["", "| model | M | site | op | K | count | stock us | stream us | stock kernels | "
              "stream kernels | q codes differing |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in site_rows:
        su = "n/a" if r["stream_us"] is None else f"{r['stream_us']:.2f}"
        mm = f"{r['q_mismatch']}/{r['q_numel']}" if "q_mismatch" in r else "n/a"
        lines.append(f"| {r['model']} | {r['M']} | {r['site']} | {r['op']} | {r['K']} | {r['count']} | "
                     f"{r['stock_us']:.2f} | {su} | {r['stock_kernels']} | {r['stream_kernels']} | {mm} |")
    table = "\n".join(lines) + "\n"
    (args.out / "fp8stream_sites.md").write_text(table)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(PLANS), figsize=(5 * len(PLANS), 4))
        for ax, model in zip(axes, PLANS):
            rows = [s for s in step_rows if s["model"] == model]
            x = range(len(rows))
            ax.bar([i - 0.2 for i in x], [s["stock_us"] for s in rows], 0.4, label="stock (compiled)")
            if why_no_kernel is None:
                ax.bar([i + 0.2 for i in x], [s["stream_us"] for s in rows], 0.4, label="fp8 stream")
            ax.set_xticks(list(x), [f"M={s['M']}" for s in rows])
            ax.set_ylabel("epilogue us per decode step")
            ax.set_title(model)
            ax.legend()
        fig.suptitle(f"{env.get('gpu')} | torch {env['torch']} | {env['date'][:10]}")
        fig.tight_layout()
        fig.savefig(args.out / "fp8stream_sites.png", dpi=120)
    except ImportError:
        print("matplotlib not installed: no plot written")
    print()
    print("\n".join(lines[:8 + len(step_rows)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
