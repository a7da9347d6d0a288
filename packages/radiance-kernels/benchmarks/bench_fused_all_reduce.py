#!/usr/bin/env python3
"""Speed of ar_add_rms_quant's one-kernel path against the two-step paths, one process per GPU.

    python benchmarks/bench_fused_all_reduce.py --world-size 2 --out DIR

Needs at least ``--world-size`` GPUs (NCCL refuses two ranks on one GPU; exactness with ranks
sharing one GPU is ``peer_all_reduce_check.py``). Side by side, in one run, medians of CUDA-graph
replays (each graph holds CALLS calls on rotating inputs), bf16, per-token and group-128 scales,
M in {1, 8, 32, 128, 512, 2048}, K in {2048, 4096, 5120, 8192}:
- ``fused``: the one-kernel path (exchange over peer-mapped buffers + epilogue);
- ``nccl+kernel``: NCCL all-reduce, then the radiance ``add_rms_quant`` kernel;
- ``nccl+compiled``: NCCL all-reduce, then ``torch.compile`` of the reference epilogue.
NCCL reduces in place, so replaying it on the epilogue's own input would grow the values replay
after replay (to Inf, which changes the epilogue's path); each graph step therefore all-reduces
one buffer and runs the epilogue on a fresh random input of the same shape, in stream order after
it: the same serialized pair of kernels, on finite data. Where the fused path does not serve a
shape (M above its limit, the staging size) the row says so. Writes ``wsN.md``, ``wsN.json`` and
``wsN.png`` (time against M per K); the target is fused <= 0.5x ``nccl+kernel`` at M <= 32, and
the crossover M (where ``fused`` stops being faster) is reported per K.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
import tempfile

import torch

MS = (1, 8, 32, 128, 512, 2048)
KS = (2048, 4096, 5120, 8192)
GROUPS = (0, 128)
CALLS = 20
EPS = 1e-6


def _inputs(m, k, n, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    rnd = lambda *s, sc=1.0: (torch.randn(*s, generator=g, device=device) * sc).to(torch.bfloat16)
    return [(rnd(m, k), rnd(m, k), rnd(m, k)) for _ in range(n)], (1 + rnd(k, sc=0.1).float()).to(torch.bfloat16)


def _worker(rank, ws, store, args, result_path):
    import torch.distributed as dist

    from radiance.kernels import ops, reference
    from radiance.kernels.benchmarking import graph_replay_us
    from radiance.kernels.peer_all_reduce import PeerAllReduce

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=ws,
                            device_id=device)
    cpu = dist.new_group(backend="gloo")
    comm = PeerAllReduce(cpu, device)
    rows = []
    for group in GROUPS:
        for k in KS:
            compiled = torch.compile(
                lambda y, r, w, _g=group: reference.add_rms_quant(y, r, w, EPS, group=_g),
                fullgraph=True, dynamic=True)
            for m in MS:
                sets, w = _inputs(m, k, CALLS, device, seed=1000 * k + m + group)
                row = {"M": m, "K": k, "group": group}
                reason = comm.fused_reason(sets[0][0], sets[0][1], group) if comm.enabled else comm.reason
                row["fused_why_not"] = reason
                if reason is None:
                    row["fused_us"] = graph_replay_us([
                        lambda s=s: comm.ar_add_rms_quant(s[0], s[1], w, EPS, group=group)
                        for s in sets])

                def two_step(epilogue):
                    def call(s):
                        dist.all_reduce(s[2])        # the reduction, in place on its own buffer
                        return epilogue(s[0], s[1])  # the epilogue, after it, on finite data
                    return [lambda s=s: call(s) for s in sets]

                row["nccl_kernel_us"] = graph_replay_us(two_step(
                    lambda y, r: ops.add_rms_quant(y, r, w, EPS, group=group)))
                row["nccl_compiled_us"] = graph_replay_us(two_step(lambda y, r: compiled(y, r, w)))
                row["nccl_only_us"] = graph_replay_us([lambda s=s: dist.all_reduce(s[2]) for s in sets])
                rows.append(row)
                if rank == 0:
                    print(row, flush=True)
    gathered = [None] * ws
    dist.all_gather_object(gathered, rows, group=cpu)
    if comm.enabled:
        comm.close()
    if rank == 0:
        pathlib.Path(result_path).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def _report(ws, per_rank, meta, out: pathlib.Path) -> None:
    # A step costs what its slowest rank takes: the maximum over ranks of each median.
    rows = []
    for i, row in enumerate(per_rank[0]):
        merged = dict(row)
        for key in ("fused_us", "nccl_kernel_us", "nccl_compiled_us", "nccl_only_us"):
            vals = [r[i].get(key) for r in per_rank]
            merged[key] = max(vals) if all(v is not None for v in vals) else None
        if merged.get("fused_us") is not None:
            merged["fused_over_nccl_kernel"] = merged["fused_us"] / merged["nccl_kernel_us"]
            if merged["M"] <= 32:
                merged["meets_0.5x"] = merged["fused_over_nccl_kernel"] <= 0.5
        rows.append(merged)
    crossover = {}
    for group in GROUPS:
        for k in KS:
            slower = [r["M"] for r in rows if r["group"] == group and r["K"] == k
                      and (r.get("fused_us") is None or r["fused_us"] >= r["nccl_kernel_us"])]
            crossover[f"g{group}_K{k}"] = min(slower) if slower else None
    (out / f"ws{ws}.json").write_text(json.dumps({"meta": meta, "rows": rows, "crossover_M": crossover}, indent=1))
    f = lambda v: f"{v:.2f}" if v is not None else "-"
    lines = [f"# Fused all-reduce epilogue vs NCCL + epilogue, world size {ws}", "",
             f"{meta['gpu']} x{ws}, torch {meta['torch']}, CUDA {meta['cuda']}, NCCL {meta['nccl']}, "
             f"{meta['date']}. Medians of CUDA-graph replays, slowest rank; µs per call.", "",
             "| group | K | M | fused | NCCL + kernel | NCCL + compiled | NCCL alone | fused / (NCCL + kernel) | target |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f(r.get("fused_over_nccl_kernel"))
        target = "" if "meets_0.5x" not in r else ("ok" if r["meets_0.5x"] else "MISS")
        fused = f(r.get("fused_us")) if r.get("fused_us") is not None else f"({r['fused_why_not']})"
        lines.append(f"| {r['group']} | {r['K']} | {r['M']} | {fused} | {f(r['nccl_kernel_us'])} | "
                     f"{f(r['nccl_compiled_us'])} | {f(r['nccl_only_us'])} | {ratio} | {target} |")
    lines += ["", "Crossover M (the smallest measured M where the fused path is not faster): "
              + ", ".join(f"{k}: {v}" for k, v in crossover.items())]
    (out / f"ws{ws}.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(KS), figsize=(4 * len(KS), 4), sharey=True)
        for ax, k in zip(axes, KS):
            for group, ls in ((0, "-"), (128, "--")):
                rs = [r for r in rows if r["K"] == k and r["group"] == group]
                for key, label in (("fused_us", "fused"), ("nccl_kernel_us", "NCCL + kernel"),
                                   ("nccl_compiled_us", "NCCL + compiled")):
                    pts = [(r["M"], r[key]) for r in rs if r.get(key) is not None]
                    ax.plot(*zip(*pts), ls, marker="o", label=f"{label} g{group}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"K = {k}")
            ax.set_xlabel("M")
        axes[0].set_ylabel("µs per call")
        axes[0].legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / f"ws{ws}.png", dpi=120)
    except ImportError as exc:
        print(f"no plot: {exc}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--out", type=pathlib.Path, required=True)
    args = ap.parse_args()
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < args.world_size:
        print(f"bench_fused_all_reduce: needs {args.world_size} GPUs, this machine has {n}; "
              "nothing to time")
        return 0
    import torch.multiprocessing as mp

    ws = args.world_size
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        store, result = os.path.join(tmp, "store"), os.path.join(tmp, "result.json")
        mp.spawn(_worker, args=(ws, store, args, result), nprocs=ws, join=True)
        per_rank = json.loads(pathlib.Path(result).read_text())
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}
    _report(ws, per_rank, meta, args.out)
    print(f"table in {args.out / f'ws{ws}.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
