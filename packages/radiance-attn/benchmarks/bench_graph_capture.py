"""What an attention step captured into a CUDA graph costs at every context (graph_capture.py).

vLLM captures decode steps, and verify steps whose sequences share a width, as whole CUDA graphs
from sequences of one key (their own query tokens) and replays them at every context. At each
point (class x context x sequences x width) this times, as CUDA-graph replays at the point's real
sequence lengths (medians, KV rotated past L2, as the tuning harness times):

- ``stock``: vLLM's wrapper (its launch does not depend on the context);
- ``capture_ctx``: radiance's wrapper captured from the capture's sequences (``max_seqlen_k`` the
  width) with no max_model_len recorded: the launch radiance chose before graph_capture.py;
- ``max_model_len``: the same capture with ``--max-model-len`` recorded (what radiance does now);
- ``eager``: radiance's wrapper choosing at the real context (a step outside a full graph);

and each one's output against stock's (the largest row difference in bf16 ulps of that row's
largest value). Writes ``graph_capture.json``, ``.md`` and ``.png`` under ``--out``.

    python benchmarks/bench_graph_capture.py --kernel-src STAGED_DIR --out results/
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

from radiance.attn import graph_capture, tune
from radiance.attn.triton_launch import RadianceUnifiedAttention

VARIANTS = ("capture_ctx", "max_model_len", "eager")


def run(kernel_src: str, out: Path, max_model_len: int, ctxs, seqs_of, widths) -> list[dict]:
    import torch

    module, dev, arch, sms = tune.probe_device(kernel_src)
    manifest = module.RADIANCE_MANIFEST
    props = torch.cuda.get_device_properties(dev)
    import triton

    meta = {"gpu": props.name, "arch": arch, "sms": props.multi_processor_count, "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda or torch.version.hip,
            "vllm_kernel_from": manifest.get("vllm_version", "unknown"), "max_model_len": max_model_len,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    rows = []
    for k in tune.CLASSES:
        torch.cuda.empty_cache()
        b = tune.Bench(module, k, max(ctxs) * max(seqs_of), dev, max_query_tokens=max(seqs_of) * max(widths))
        wrappers = {v: RadianceUnifiedAttention(module, arch=arch, num_sms=sms) for v in VARIANTS}
        for ctx in ctxs:
            for seqs in seqs_of:
                for width in widths:
                    sets = b.point(ctx, seqs, width)
                    stock_sets = [b.stock_kwargs(kw, manifest) for kw in sets]
                    row = {"class": k.name, "ctx": ctx, "seqs": seqs, "width": width,
                           "floor_us": b.floor_us(ctx, seqs)}
                    row["stock_us"] = tune.time_graph([lambda kw=kw: module.unified_attention(**kw)
                                                       for kw in stock_sets])
                    want = stock_sets[0]["out"].clone()
                    for variant in VARIANTS:
                        # capture_ctx / max_model_len: the call vLLM captures (max_seqlen_k the
                        # width), replayed at ctx; eager: the real context, also when captured
                        bound = {"capture_ctx": None, "max_model_len": max_model_len, "eager": ctx}[variant]
                        graph_capture.note_max_model_len(bound)
                        r = wrappers[variant]
                        max_k = ctx if variant == "eager" else width
                        fns = [lambda kw=b.radiance_kwargs(kw): r(**dict(kw, max_seqlen_k=max_k)) for kw in sets]
                        row[f"{variant}_us"] = tune.time_graph(fns)
                        launch = r.last_decision[1] if r.last_decision else None
                        row[f"{variant}_launch"] = launch.describe() if launch is not None else "stock"
                        row[f"{variant}_ulps"] = tune.row_ulps(sets[0]["out"], want)
                    graph_capture.note_max_model_len(None)
                    rows.append(row)
                    print(f"{k.name:14s} {ctx:6d} x {seqs} w{width}: stock {row['stock_us']:7.1f}  " + "  ".join(
                        f"{v} {row[v + '_us']:7.1f}" for v in VARIANTS), flush=True)
        del b
        write(rows, meta, out)  # after every class: a run cut short keeps what it measured
    plot(rows, meta, out / "graph_capture.png")
    return rows


def write(rows: list[dict], meta: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "graph_capture.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / "graph_capture.md").write_text(table(rows, meta))


def table(rows: list[dict], meta: dict) -> str:
    lines = [f"# Attention steps captured into CUDA graphs, replayed at every context ({meta['gpu']}, {meta['date']})",
             "", f"torch {meta['torch']}, Triton {meta['triton']}, CUDA {meta['cuda']}, vLLM's kernel from "
             f"{meta['vllm_kernel_from']}. Medians of CUDA-graph replays at the point's sequence lengths, KV "
             "rotated past L2. stock: vLLM's wrapper. capture ctx: radiance's launch chosen from the capture's "
             "one-key sequences (before graph_capture.py). max_model_len: the same capture with max_model_len "
             f"{meta['max_model_len']} recorded (now). eager: radiance's launch for the real context. ulps: the "
             "largest row difference from stock's output, in bf16 ulps of the row's largest value.", "",
             "| class | ctx | seqs | width | floor µs | stock µs | capture ctx µs | max_model_len µs | eager µs "
             "| capture ctx / stock | max_model_len / stock | max_model_len / eager | ulps (worst) "
             "| max_model_len launch |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ulps = max(r[f"{v}_ulps"] for v in VARIANTS)
        lines.append(f"| {r['class']} | {r['ctx']} | {r['seqs']} | {r['width']} | {r['floor_us']:.1f} | "
                     f"{r['stock_us']:.1f} | {r['capture_ctx_us']:.1f} | {r['max_model_len_us']:.1f} | "
                     f"{r['eager_us']:.1f} | {r['capture_ctx_us'] / r['stock_us']:.2f} | "
                     f"{r['max_model_len_us'] / r['stock_us']:.2f} | {r['max_model_len_us'] / r['eager_us']:.2f} | "
                     f"{ulps:.2f} | {r['max_model_len_launch']} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], meta: dict, path: Path) -> None:
    plt = tune.pyplot()
    if plt is None:
        return
    fig, panels = tune.class_panels(plt, rows)
    for ax, name, mine in panels:
        for (seqs, width), style in zip(sorted({(r["seqs"], r["width"]) for r in mine}), ("-", "--", ":", "-.")):
            pts = [r for r in mine if (r["seqs"], r["width"]) == (seqs, width)]
            for variant, color in zip(VARIANTS, ("tab:red", "tab:blue", "tab:green")):
                ax.plot([r["ctx"] for r in pts], [r[f"{variant}_us"] / r["stock_us"] for r in pts], style, color=color,
                        marker="o", ms=3, label=f"{variant}, {seqs} seq x w{width}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("context (keys)")
    panels[0][0].set_ylabel("time / stock (CUDA-graph replay)")
    panels[-1][0].legend(fontsize=5)
    fig.suptitle(f"captured attention steps replayed at every context, {meta['gpu']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel-src", required=True, help="the folder stage_vllm_kernel.py wrote")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--max-model-len", type=int, default=131072)
    ints = lambda v: tuple(int(n) for n in v.split(","))  # noqa: E731
    p.add_argument("--ctx", type=ints, default=(2048, 8192, 32768, 131072))
    p.add_argument("--seqs", type=ints, default=(1, 8))
    p.add_argument("--widths", type=ints, default=(1, 4))
    a = p.parse_args(argv)
    run(a.kernel_src, a.out, a.max_model_len, a.ctx, a.seqs, a.widths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
