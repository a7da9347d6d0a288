"""radiance's split-KV kernel against vLLM's kernel at a few points, to decide where it serves.

    python benchmarks/probe_split_kv_kernel.py --out DIR --kernel-src STAGED_DIR [--budget-s 300]

At each point (every class of the tuning harness; context 4K/32K/128K x 1 and 8 sequences x
verify width 1/4/9) it times, like the harness (medians of CUDA-graph replays, KV rotated past
L2): stock (vLLM's wrapper), the shipped table's launch of vLLM's kernel, and radiance's kernel
(``radiance.attn.split_kv_kernel``) at every segments {16..128} x KV tile {32, 64} x warps
{4, 8} x stages {2, 3} for the stock block and the block holding a sequence's rows. It also
checks the fastest radiance launch, stock and the shipped launch against the fp32 reference
(the largest difference of each output row in bf16 ulps of the reference row's largest value).
Writes ``split_kv_probe.json``.

``--v-ab``: fp8 KV only, the stock block at 32K/128K x 1/8 sequences x width 1/4: each launch
timed with fp8 V converted where it is loaded (``_e4m3_to_fp16_in_registers``) and with Triton's
own conversion at the dot operand, alternating, to ``split_kv_v_ab.json``.

``--around``: at 32K/128K x 1/8 sequences x width 1/4/9, the shipped table's launch shape moved
to radiance's kernel and timed beside its neighbours, each at the table's segment count halved,
as is and doubled: software-pipeline stages 2-6 at the shipped tile and warps, and KV tile
{32, 64, 128} x warps {1, 2, 4, 8} at the shipped stages (one warp only for blocks of <= 32 rows and
tiles of <= 64 keys); two alternations, the faster of each.
Writes ``split_kv_around.json``.

``--latency``: at the same points, the shipped launch shape on radiance's kernel (and, for a
stock-size block, the one- and two-warp 32-key shapes) against the options aimed at its
latency-bound tile loop (``split_kv_kernel`` docstring): the block table one tile ahead (at the
shape's stages and at 3), and register caps that let one and two more blocks onto an SM (from
that shape's build: registers and shared memory), alone and with the table ahead at 2 and 3
stages; each at the shipped segment count, halved and doubled, two alternations, the faster kept.
Every variant's output is checked bit for bit against its start shape's at the same segment
count without the options (same math, same order). Records each build's registers, spills,
shared memory and blocks an SM.
Writes ``split_kv_latency.json``.

``--cuda``: at the same points, what radiance ships (its wrapper with the sm_90 table) against the
CUDA partial pass (radiance-kernels' ``split_kv_partial``, then the same reduce) at 16 or 32 keys
a warp x 1-8 key warps x stages {2, 3, 4} x the shipped segment count halved, as is and doubled,
wherever the kernel has the launch; all alternated twice, the faster of each kept, and the
fastest CUDA launch's output checked against the fp32 reference (largest row difference in bf16
ulps of the row's largest value). Writes
``split_kv_cuda_probe.{json,md,png}``. ``--cuda --warpgroup``: the same against its warpgroup form
(``split_kv_partial_warpgroup``: the fewest query rows of 16/32/40/48/72 that hold the point's,
stages {2, 3, 4} x the same segment counts) at widths 4, 6 and 9, written as
``split_kv_warpgroup_probe.{json,md,png}``. ``--replot JSON`` rewrites the table and plot of an
earlier run without a GPU.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

try:
    from radiance.attn import tune
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from radiance.attn import tune
from radiance.attn import policy, reference, split_kv_kernel, tables
from radiance.attn.triton_launch import RadianceUnifiedAttention

POINTS = tuple(itertools.product((4096, 32768, 131072), (1, 8), (1, 4, 9)))
SEGMENTS = (16, 32, 64, 128)
SHAPES = tuple(itertools.product((32, 64), (4, 8), (2, 3)))  # tile, warps, stages


def block_ms(k: tune.Klass, width: int) -> tuple[int, ...]:
    base = policy.stock_block_m(k.num_query_heads // k.num_kv_heads)
    wide = tune.wide_block_m(k, width)
    return (base,) if wide is None else (base, wide)


SHAPE_FIELDS = ("block_m", "block_q", "tile_size", "num_warps", "num_stages", "max_registers", "table_ahead")


def shape(c: policy.TritonLaunch) -> tuple:
    return tuple(getattr(c, f) for f in SHAPE_FIELDS)


def launches(k: tune.Klass, bm: int, ctx: int) -> list[policy.TritonLaunch]:
    qpkv = k.num_query_heads // k.num_kv_heads
    return [policy.TritonLaunch(seg, bm, max(1, bm // qpkv), tile, w, st, "probe", kernel="radiance")
            for seg, (tile, w, st) in itertools.product(SEGMENTS, SHAPES)
            if seg <= policy.next_pow2(policy.cdiv(ctx, tile))]


def run(b: tune.Bench, kw: dict, c: policy.TritonLaunch, v_in_registers=None):
    return split_kv_kernel.launch(kw["q"], kw["k"], kw["v"], kw["out"], kw["cu_seqlens_q"], kw["seqused_k"],
                           kw["block_table"], kw["max_seqlen_q"], kw["softmax_scale"], kw["k_descale"],
                           kw["v_descale"], c, b.segm_out, b.segm_max, b.segm_sum, v_in_registers=v_in_registers)


AROUND_POINTS = tuple(itertools.product((32768, 131072), (1, 8), (1, 4, 9)))
WARPGROUP_POINTS = tuple(itertools.product((32768, 131072), (1, 8), (4, 6, 9)))


def table_launch(k: tune.Klass, ctx: int, seqs: int, width: int, sms: int) -> policy.TritonLaunch | None:
    """The shipped table's launch shape at a point, on radiance's kernel (None: it cannot run it)."""
    geo = policy.Geometry(arch="sm_90", head_size=k.head_size, num_query_heads=k.num_query_heads,
                          num_kv_heads=k.num_kv_heads, num_tokens=seqs * width, num_seqs=seqs,
                          max_seqlen_q=width, max_seqlen_k=ctx, q_dtype="bf16", kv_dtype=k.kv_dtype,
                          num_sms=sms)
    c = policy.triton_launch(geo, tables.for_arch("sm_90"))
    if c is None or not c.is_3d:
        return None
    c = replace(c, kernel="radiance", num_stages=c.num_stages or 2, num_warps=c.num_warps or 4)
    return None if split_kv_kernel.launch_refusal(c, "bf16", k.kv_dtype, geo.q_per_kv) else c


def around(c: policy.TritonLaunch) -> dict[str, policy.TritonLaunch]:
    """The shipped launch ("shipped") and its neighbours, named st{stages}_t{tile}_w{warps}_s{segments}."""
    segs = sorted({min(256, max(4, s)) for s in (c.num_segments // 2, c.num_segments, c.num_segments * 2)})
    shapes = {(st, c.tile_size, c.num_warps) for st in (2, 3, 4, 5, 6)}
    # one warp only for blocks of <= 32 rows and tiles of <= 64 keys (a register file's worth)
    shapes |= {(c.num_stages, t, w) for t in (32, 64, 128) for w in (1, 2, 4, 8)
               if w > 1 or (c.block_m <= 32 and t <= 64)}
    out = {"shipped": c}
    for (st, t, w), seg in itertools.product(sorted(shapes), segs):
        out[f"st{st}_t{t}_w{w}_s{seg}"] = replace(c, num_stages=st, tile_size=t, num_warps=w, num_segments=seg)
    return out


def alternate(b: tune.Bench, rs: list[dict], variants: dict[str, policy.TritonLaunch]) -> dict[str, float]:
    """Each variant timed in two alternations over all of them; the faster time of each."""
    times = {}
    for _ in range(2):
        for name, v in variants.items():
            t = tune.time_graph([lambda kw=kw, v=v: run(b, kw, v) for kw in rs])
            times[name] = min(times.get(name, t), t)
    return times


def shipped_row(k: tune.Klass, b: tune.Bench, point: tuple, stock: float, c: policy.TritonLaunch,
                times: dict[str, float]) -> dict:
    """A point's record (the shipped launch as "shipped" in ``times``), printed as a line."""
    (ctx, seqs, width), floor = point, b.floor_us(point[0], point[1])
    best = min(times, key=times.get)
    print(f"{k.name} ctx={ctx} seqs={seqs} w={width}: floor {floor:.1f} shipped {times['shipped']:.1f} "
          f"({times['shipped'] / floor:.2f}x) best {times[best]:.1f} ({times[best] / floor:.2f}x, {best})", flush=True)
    return {"class": k.name, "ctx": ctx, "seqs": seqs, "width": width, "floor_us": floor, "stock_us": stock,
            "shipped": f"{c.describe()} stages={c.num_stages}", "shipped_us": times["shipped"], "best": best,
            "best_us": times[best], "times": times}


def around_probe(args, classes, out: Path, t0: float) -> None:
    """The shipped launch against its neighbours (see the module docstring)."""
    module, dev, arch, sms = tune.probe_device(args.kernel_src)
    failed = _build_all(((k, v, width) for k in classes for ctx, seqs, width in AROUND_POINTS
                         for c in [table_launch(k, ctx, seqs, width, sms)] if c for v in around(c).values()),
                        args.jobs, t0)
    rows = []
    for k, b, (ctx, seqs, width), sets, stock in tune.probe_points(module, classes, AROUND_POINTS, dev,
                                                                  t0 + args.budget_s):
        c = table_launch(k, ctx, seqs, width, sms)
        if c is None:
            continue
        rs = [b.radiance_kwargs(kw) for kw in sets]
        times = alternate(b, rs, {n: v for n, v in around(c).items() if (k.name, shape(v)) not in failed})
        rows.append(shipped_row(k, b, (ctx, seqs, width), stock, c, times))
        (out / "split_kv_around.json").write_text(json.dumps({"failed": {str(kk): v for kk, v in failed.items()},
                                                              "results": rows}, indent=1))


def cuda_variants(k: tune.Klass, width: int, segments: int, smem_limit: int,
                  warpgroup: bool = False) -> dict[str, policy.TritonLaunch]:
    """The CUDA partial pass's launches at a point, named cuda_t{tile}_w{key warps}_st{stages}_s{segments}
    (16 or 32 keys a warp); ``warpgroup``: its warpgroup form's instead, wg_n{rows}_st{stages}_s{segments}."""
    import torch

    from radiance.kernels import split_kv_attention as skv

    kv = torch.float8_e4m3fn if k.kv_dtype == "fp8" else torch.bfloat16
    group = k.num_query_heads // k.num_kv_heads
    seg_choices = sorted({min(256, max(4, s)) for s in (segments // 2, segments, 2 * segments)})
    out = {}
    if warpgroup:
        n_tiles = next((n for n in skv.WARPGROUP_COLUMNS if 8 * n >= width * group), None)
        for st, seg in itertools.product((2, 3, 4), seg_choices):
            if n_tiles is None or skv.warpgroup_launch_refusal(k.head_size, kv, torch.bfloat16, n_tiles, st, smem_limit):
                continue
            out[f"wg_n{8 * n_tiles}_st{st}_s{seg}"] = policy.TritonLaunch(
                seg, 8 * n_tiles, width, skv.WARPGROUP_TILE, 4, st, "probe", kernel="radiance",
                partial_pass="cuda_warpgroup")
        return out
    row_tiles = -(-width * group // 16)
    for kpw, kw, st, seg in itertools.product(skv.KEYS_PER_WARP, skv.KEY_WARPS, (2, 3, 4), seg_choices):
        if skv.launch_refusal(k.head_size, kv, torch.bfloat16, row_tiles, kw, st, smem_limit, kpw):
            continue
        out[f"cuda_t{kpw * kw}_w{kw}_st{st}_s{seg}"] = policy.TritonLaunch(seg, 16 * row_tiles, width, kpw * kw, kw, st,
                                                                            "probe", kernel="radiance", partial_pass="cuda")
    return out


def run_cuda(b: tune.Bench, kw: dict, c: policy.TritonLaunch):
    return split_kv_kernel.launch(kw["q"], kw["k"], kw["v"], kw["out"], kw["cu_seqlens_q"], kw["seqused_k"],
                                  kw["block_table"], kw["max_seqlen_q"], kw["softmax_scale"], kw["k_descale"],
                                  kw["v_descale"], c, b.segm_out, b.segm_max, b.segm_sum)


def cuda_probe(args, classes, out: Path, t0: float) -> None:
    """The shipped wrapper against the CUDA partial pass or (``--warpgroup``) its warpgroup form
    (see the module docstring)."""
    import torch

    module, dev, arch, sms = tune.probe_device(args.kernel_src)
    smem_limit = torch.cuda.get_device_properties(dev).shared_memory_per_block_optin
    shipped = RadianceUnifiedAttention(module, arch=arch, num_sms=sms)
    rows = []
    record = {"gpu": torch.cuda.get_device_name(dev), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "results": rows}
    stem = "split_kv_warpgroup_probe" if args.warpgroup else "split_kv_cuda_probe"
    points = WARPGROUP_POINTS if args.warpgroup else AROUND_POINTS
    for k, b, (ctx, seqs, width), sets, stock in tune.probe_points(module, classes, points, dev, t0 + args.budget_s):
        rs = [b.radiance_kwargs(kw) for kw in sets]
        _, launch = tune.time_wrapper(shipped, b, sets)
        segments = launch.num_segments if launch is not None and launch.is_3d else 64
        variants = cuda_variants(k, width, segments, smem_limit, args.warpgroup)
        if not variants:
            continue
        times = {}
        for _ in range(2):
            times["shipped"] = min(times.get("shipped", float("inf")), tune.time_wrapper(shipped, b, sets)[0])
            for name, v in variants.items():
                t = tune.time_graph([lambda kw=kw, v=v: run_cuda(b, kw, v) for kw in rs])
                times[name] = min(times.get(name, t), t)
        best = min(variants, key=times.get)
        kw0 = rs[0]
        ref = reference.unified_attention(kw0["q"], kw0["k"], kw0["v"], kw0["cu_seqlens_q"], kw0["seqused_k"],
                                          kw0["block_table"], kw0["softmax_scale"], 1.0, 1.0)
        o_ship, o_cuda = torch.full_like(kw0["q"], float("nan")), torch.full_like(kw0["q"], float("nan"))
        shipped(**dict(kw0, out=o_ship))
        run_cuda(b, dict(kw0, out=o_cuda), variants[best])
        torch.cuda.synchronize()
        floor = b.floor_us(ctx, seqs)
        rows.append({"class": k.name, "ctx": ctx, "seqs": seqs, "width": width, "floor_us": floor, "stock_us": stock,
                     "shipped": launch.describe() if launch else "stock", "shipped_us": times["shipped"],
                     "best": best, "best_us": times[best],
                     "ulps_vs_ref": {"shipped": tune.row_ulps(o_ship, ref), "cuda": tune.row_ulps(o_cuda, ref)}, "times": times})
        print(f"{k.name} ctx={ctx} seqs={seqs} w={width}: floor {floor:.1f} shipped {times['shipped']:.1f} "
              f"({times['shipped'] / floor:.2f}x) cuda {times[best]:.1f} ({times[best] / floor:.2f}x, {best}) "
              f"ulps shipped {rows[-1]['ulps_vs_ref']['shipped']:.2f} cuda {rows[-1]['ulps_vs_ref']['cuda']:.2f}",
              flush=True)
        (out / f"{stem}.json").write_text(json.dumps(record, indent=1))
    (out / f"{stem}.md").write_text(cuda_table(rows, record["gpu"], record["when"]))
    cuda_plot(rows, record["gpu"], out / f"{stem}.png")


def cuda_plot(rows: list[dict], gpu: str, path: Path) -> None:
    """Each point's fastest CUDA launch over the shipped launch, by class; below 1: the CUDA pass wins."""
    plt = tune.pyplot()
    if plt is None:
        return
    fig, panels = tune.class_panels(plt, rows)
    for ax, name, mine in panels:
        for width, marker in zip(sorted({r["width"] for r in mine}), "os^Dv"):
            pts = [r for r in mine if r["width"] == width]
            ax.scatter([f"{r['ctx'] // 1024}K x{r['seqs']}" for r in pts], [r["best_us"] / r["shipped_us"] for r in pts],
                       marker=marker, label=f"width {width}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(name, fontsize=9)
        ax.tick_params(axis="x", labelsize=7, rotation=45)
    panels[0][0].set_ylabel("CUDA pass / shipped (time)")
    panels[0][0].legend(fontsize=7)
    form = "warpgroup form" if any(r["best"].startswith("wg_") for r in rows) else "mma.sync warps"
    fig.suptitle(f"split-KV partial pass: CUDA ({form}) vs shipped, {gpu}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cuda_table(rows: list[dict], gpu: str, when: str) -> str:
    """The CUDA probe's records as a markdown table, with counts within 2x of the floor."""
    form = "its warpgroup form" if any(r["best"].startswith("wg_") for r in rows) else "mma.sync warps"
    lines = [f"# The CUDA partial pass ({form}) against what radiance ships ({gpu}, {when})",
             "", "Medians of CUDA-graph replays, KV rotated past L2, two alternations, the faster kept. "
             "floor: the KV bytes at 4.25 TB/s. ulps: the largest row difference from the fp32 reference, "
             "in bf16 ulps of the row's largest value.", "",
             "| class | ctx | seqs | width | floor us | shipped us (x floor) | CUDA us (x floor) | launch | CUDA / shipped "
             "| ulps shipped / CUDA |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f = r["floor_us"]
        lines.append(f"| {r['class']} | {r['ctx']} | {r['seqs']} | {r['width']} | {f:.1f} | {r['shipped_us']:.1f} "
                     f"({r['shipped_us'] / f:.2f}) | {r['best_us']:.1f} ({r['best_us'] / f:.2f}) | {r['best']} | "
                     f"{r['best_us'] / r['shipped_us']:.3f} | {r['ulps_vs_ref']['shipped']:.2f} / "
                     f"{r['ulps_vs_ref']['cuda']:.2f} |")
    within = lambda key: sum(r[key] <= 2 * r["floor_us"] for r in rows)  # noqa: E731
    lines += ["", f"within 2x of the floor: shipped {within('shipped_us')}, CUDA {within('best_us')}, "
              f"best of both {sum(min(r['shipped_us'], r['best_us']) <= 2 * r['floor_us'] for r in rows)} "
              f"(of {len(rows)})"]
    return "\n".join(lines) + "\n"


# H200 (sm_90) per-SM limits the occupancy arithmetic of the latency probe uses.
SM_REGISTERS, SM_SHARED, SM_WARPS, SM_BLOCKS = 65536, 228 * 1024, 64, 32


def blocks_per_sm(registers: int, warps: int, shared: int) -> int:
    """Blocks of a kernel an SM holds: registers are allocated 256 a warp (8 a thread), and the
    driver reserves 1 KiB of shared memory a block."""
    by_registers = SM_REGISTERS // (-(-registers // 8) * 8 * 32 * warps)
    return min(by_registers, SM_SHARED // (shared + 1024), SM_WARPS // warps, SM_BLOCKS)


def register_caps(registers: int, warps: int, shared: int) -> list[int]:
    """Register caps that fit one and two more blocks an SM, where shared memory lets them in."""
    caps, now = [], blocks_per_sm(registers, warps, shared)
    for blocks in (now + 1, now + 2):
        cap = SM_REGISTERS // (blocks * 32 * warps) // 8 * 8
        if 24 <= cap < registers and blocks_per_sm(cap, warps, shared) == blocks:
            caps.append(cap)
    return caps


def latency_starts(c: policy.TritonLaunch) -> dict[str, policy.TritonLaunch]:
    """Launch shapes the latency options are tried on, by name prefix: the shipped one ("") and,
    for a stock-size block, the one- and two-warp 32-key shapes (the fit's other choices there)."""
    out = {"": c}
    if c.block_m <= 16:
        for warps in (1, 2):
            alt = replace(c, tile_size=32, num_warps=warps)
            if shape(alt) != shape(c):
                out[f"t32w{warps}_"] = alt
    return out


def latency_variants(c: policy.TritonLaunch, caps: list[int], prefix: str = "") -> dict[str, policy.TritonLaunch]:
    """Launch ``c`` with the block table one tile ahead at 2 and 3 stages, and under each register
    cap without it and with it at 2 and 3 stages; each at ``c``'s segment count, halved and
    doubled. Named {prefix}{variant}_s{segments}."""
    segs = sorted({min(256, max(4, s)) for s in (c.num_segments // 2, c.num_segments, c.num_segments * 2)})
    shapes = {"base": {}, "ahead": {"table_ahead": True}, "ahead_st3": {"table_ahead": True, "num_stages": 3}}
    for cap in caps:
        shapes[f"r{cap}"] = {"max_registers": cap}
        shapes[f"r{cap}_ahead"] = {"max_registers": cap, "table_ahead": True}
        shapes[f"r{cap}_ahead_st3"] = {"max_registers": cap, "table_ahead": True, "num_stages": 3}
    return {f"{prefix}{name}_s{seg}": replace(c, num_segments=seg, **change)
            for (name, change), seg in itertools.product(shapes.items(), segs)}


def latency_probe(args, classes, out: Path, t0: float) -> None:
    """The shipped launch against the latency options (see the module docstring)."""
    import torch

    module, dev, arch, sms = tune.probe_device(args.kernel_src)
    ships = {(k.name, ctx, seqs, width): c for k in classes for ctx, seqs, width in AROUND_POINTS
             for c in [table_launch(k, ctx, seqs, width, sms)] if c}
    by_name = {k.name: k for k in classes}
    failed = _build_all(((by_name[n], v, w) for (n, _, _, w), c in ships.items()
                         for p, s in latency_starts(c).items() for v in latency_variants(s, [], p).values()),
                        args.jobs, t0)
    # Each start shape's registers and shared memory, from its build, give its caps.
    builds = {}
    for (name, _, _, width), c in ships.items():
        for start in latency_starts(c).values():
            if (name, shape(start)) not in builds and (name, shape(start)) not in failed:
                b = tune.Bench(None, by_name[name], max_tokens=2048, device=dev, rotate_bytes=0)
                h = run(b, b.point(1024, 1, width)[0], start)
                builds[(name, shape(start))] = {"registers": h.n_regs, "spills": h.n_spills,
                                                "shared": h.metadata.shared, "warps": start.num_warps}
                del b
    caps = {kk: register_caps(v["registers"], v["warps"], v["shared"]) for kk, v in builds.items()}

    def variants(name: str, c: policy.TritonLaunch) -> dict[str, policy.TritonLaunch]:
        out = {"shipped": c}
        for p, start in latency_starts(c).items():
            if (name, shape(start)) in builds:
                out.update(latency_variants(start, caps[(name, shape(start))], p))
        return out

    failed |= _build_all(((by_name[n], v, w) for (n, _, _, w), c in ships.items()
                          for v in variants(n, c).values() if v.max_registers is not None), args.jobs, t0)
    rows = []
    for k, b, (ctx, seqs, width), sets, stock in tune.probe_points(module, classes, AROUND_POINTS, dev,
                                                                  t0 + args.budget_s):
        c = ships.get((k.name, ctx, seqs, width))
        if c is None or (k.name, shape(c)) not in builds:
            continue
        rs = [b.radiance_kwargs(kw) for kw in sets]
        used, differ, refs = {}, [], {}
        # Same math, same order: the options move loads, stages and spills only, so each variant's
        # output must equal, bit for bit, that of its start shape at the same segment count
        # without them (a different tile, warp count or segment count sums in another order).
        for name, v in variants(k.name, c).items():
            if (k.name, shape(v)) in failed:
                continue
            o = torch.empty_like(rs[0]["q"])
            h = run(b, dict(rs[0], out=o), v)
            used[name] = {"registers": h.n_regs, "spills": h.n_spills, "shared": h.metadata.shared,
                          "blocks_per_sm": blocks_per_sm(h.n_regs, v.num_warps, h.metadata.shared)}
            group = (v.block_m, v.tile_size, v.num_warps, v.num_segments)
            ref = refs.get(group)
            if ref is None:
                plain = replace(v, table_ahead=False, max_registers=None, num_stages=c.num_stages)
                ref = refs[group] = o if plain == v else torch.empty_like(o)
                if plain != v:
                    run(b, dict(rs[0], out=ref), plain)
            if not torch.equal(o, ref):
                differ.append(name)
        times = alternate(b, rs, {n: v for n, v in variants(k.name, c).items() if n in used})
        rows.append(dict(shipped_row(k, b, (ctx, seqs, width), stock, c, times), builds=used, outputs_differ=differ))
        if differ:
            print(f"  OUTPUTS DIFFER from the same shape's without the options: {', '.join(differ)}", flush=True)
        (out / "split_kv_latency.json").write_text(json.dumps(
            {"failed": {str(kk): v for kk, v in failed.items()}, "builds": {str(kk): v for kk, v in builds.items()},
             "results": rows}, indent=1))


def v_ab(out: Path) -> None:
    """Same-run A/B of the fp8 V conversion (see the module docstring)."""
    import torch

    dev = torch.device("cuda")
    shapes = ((64, 4, 2), (64, 8, 2), (32, 4, 2))
    rows = []
    for k in (c for c in tune.CLASSES if c.kv_dtype == "fp8"):
        torch.cuda.empty_cache()
        b = tune.Bench(None, k, 131072 * 8, dev)
        qpkv = k.num_query_heads // k.num_kv_heads
        for ctx, seqs, width in itertools.product((32768, 131072), (1, 8), (1, 4)):
            sets = b.point(ctx, seqs, width)
            best = {}
            for mode in (True, False, True, False):
                for seg, (tile, w, st) in itertools.product((16, 32, 64, 128, 256), shapes):
                    c = policy.TritonLaunch(seg, 16, 16 // qpkv, tile, w, st, "ab", kernel="radiance")
                    t = tune.time_graph([lambda kw=kw, c=c, b=b, mode=mode: run(b, kw, c, mode) for kw in sets])
                    key = (mode, tune._key(c))
                    best[key] = min(best.get(key, t), t)  # the better of the two alternations
            by_mode = {m: min((t, kk) for (mm, kk), t in best.items() if mm == m) for m in (True, False)}
            rows.append({"class": k.name, "ctx": ctx, "seqs": seqs, "width": width, "floor_us": b.floor_us(ctx, seqs),
                         "in_registers_us": by_mode[True][0], "in_registers": by_mode[True][1],
                         "at_operand_us": by_mode[False][0], "at_operand": by_mode[False][1]})
            r = rows[-1]
            print(f"{k.name} ctx={ctx} seqs={seqs} w={width}: V in registers {r['in_registers_us']:.1f} us "
                  f"({r['in_registers']}), at the operand {r['at_operand_us']:.1f} us ({r['at_operand']}), "
                  f"ratio {r['in_registers_us'] / r['at_operand_us']:.3f}", flush=True)
        del b
    (out / "split_kv_v_ab.json").write_text(json.dumps(rows, indent=1))


def _compile(args) -> str:
    """Worker: run each launch once on a tiny batch (fills Triton's cache); '' or why not."""
    klass, fields, widths = args
    try:
        import torch

        k = tune.Klass(**klass)
        b = tune.Bench(None, k, max_tokens=2048, device=torch.device("cuda"), rotate_bytes=0)
        c = policy.TritonLaunch(**fields)
        for w in widths:
            for seqs in (1, 2):
                run(b, b.point(1024, seqs, w)[0], c)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the probe records which configs do not build
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    return ""


def _build_all(items, jobs: int, t0: float) -> dict:
    """Build each distinct (class, launch shape) of ``items`` ((klass, launch, width) triples) in
    worker processes, at the widths it will serve; returns {(class name, shape): why it failed}."""
    work = {}
    for k, c, width in items:
        fields = dict(zip(SHAPE_FIELDS, shape(c)), num_segments=16, kernel="radiance")
        work.setdefault((k.name, shape(c)), (asdict(k), fields, set()))[2].add(width)
    failed = tune.build_in_workers(_compile, {kk: (a, f, sorted(w)) for kk, (a, f, w) in work.items()}, jobs)
    print(f"{len(work)} configs compiled in {time.time() - t0:.0f}s, {len(failed)} failed {failed}", flush=True)
    return failed


def main(argv=None) -> int:
    ap = tune.probe_parser(__doc__, 300.0)
    ap.add_argument("--v-ab", action="store_true", help="only the fp8 V conversion A/B")
    ap.add_argument("--around", action="store_true", help="only the shipped launch against its neighbours")
    ap.add_argument("--latency", action="store_true",
                    help="only the shipped launch against the block table one tile ahead and register caps")
    ap.add_argument("--cuda", action="store_true", help="only the shipped wrapper against the CUDA partial pass")
    ap.add_argument("--warpgroup", action="store_true",
                    help="with --cuda: the warpgroup form at widths 4, 6 and 9 (split_kv_warpgroup_probe.*)")
    ap.add_argument("--replot", metavar="JSON", help="rewrite an earlier --cuda run's table and plot into --out")
    ap.add_argument("--classes", help="comma list of class names (default: all)")
    args = ap.parse_args(argv)
    if args.replot:
        record = json.loads(Path(args.replot).read_text())
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = Path(args.replot).stem
        (out / f"{stem}.md").write_text(cuda_table(record["results"], record["gpu"], record["when"]))
        cuda_plot(record["results"], record["gpu"], out / f"{stem}.png")
        return 0
    classes = [c for c in tune.CLASSES if not args.classes or c.name in args.classes.split(",")]
    import torch

    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.v_ab:
        v_ab(out)
        print(f"done in {time.time() - t0:.0f}s")
        return 0
    if args.cuda:
        cuda_probe(args, classes, out, t0)
        print(f"done in {time.time() - t0:.0f}s")
        return 0
    if args.around or args.latency:
        (latency_probe if args.latency else around_probe)(args, classes, out, t0)
        print(f"done in {time.time() - t0:.0f}s")
        return 0
    module, dev, arch, sms = tune.probe_device(args.kernel_src)
    failed = _build_all(((k, c, width) for k in classes for _, _, width in POINTS for bm in block_ms(k, width)
                         for c in launches(k, bm, 1024)), args.jobs, t0)

    shipped = RadianceUnifiedAttention(module, arch=arch, num_sms=sms)
    results = []
    for k, b, (ctx, seqs, width), sets, stock in tune.probe_points(module, classes, POINTS, dev,
                                                                  t0 + args.budget_s):
        shipped_us, shipped_launch = tune.time_wrapper(shipped, b, sets)
        rs = [b.radiance_kwargs(kw) for kw in sets]
        cands = {}
        for bm in block_ms(k, width):
            for c in launches(k, bm, ctx):
                if (k.name, shape(c)) in failed:
                    continue
                cands[tune._key(c)] = (tune.time_graph([lambda kw=kw, c=c, b=b: run(b, kw, c) for kw in rs]), c)
        best = min(cands, key=lambda x: cands[x][0])
        # exactness at the first rotation: stock, shipped launch, fastest radiance launch vs fp32 reference
        kw0 = rs[0]
        scale = 1.0  # the harness's fp8 KV carries unit scales
        ref = reference.unified_attention(kw0["q"], kw0["k"], kw0["v"], kw0["cu_seqlens_q"], kw0["seqused_k"],
                                          kw0["block_table"], kw0["softmax_scale"], scale, scale)
        o_stock, o_ship, o_rad = (torch.empty_like(kw0["q"]) for _ in range(3))
        module.unified_attention(**dict(b.stock_kwargs(sets[0], module.RADIANCE_MANIFEST), out=o_stock))
        shipped(**dict(kw0, out=o_ship))
        run(b, dict(kw0, out=o_rad), cands[best][1])
        torch.cuda.synchronize()
        floor = b.floor_us(ctx, seqs)
        rec = {"class": k.name, "ctx": ctx, "seqs": seqs, "width": width, "floor_us": floor,
               "stock_us": stock, "shipped_us": shipped_us,
               "shipped": shipped_launch.describe() if shipped_launch else "stock",
               "best": best, "best_us": cands[best][0],
               "ulps_vs_ref": {"stock": tune.row_ulps(o_stock, ref), "shipped": tune.row_ulps(o_ship, ref),
                               "radiance": tune.row_ulps(o_rad, ref)},
               "candidates": {kk: v[0] for kk, v in cands.items()}}
        results.append(rec)
        print(f"{k.name} ctx={ctx} seqs={seqs} w={width}: floor {floor:.1f} stock {stock:.1f} shipped "
              f"{shipped_us:.1f} ({shipped_us / floor:.2f}x) radiance {cands[best][0]:.1f} "
              f"({cands[best][0] / floor:.2f}x, {best}) ulps {json.dumps({a: round(v, 2) for a, v in rec['ulps_vs_ref'].items()})}",
              flush=True)
        (out / "split_kv_probe.json").write_text(
            json.dumps({"failed": {str(kk): v for kk, v in failed.items()}, "results": results}, indent=1))
    print(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
