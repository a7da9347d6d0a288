"""Two builds of the split-KV kernels set against each other: timed in one run, or compared bit for bit.

A change to the CUDA partial passes is judged against the build before it on the same machine in
the same run. ``time`` measures whichever ``radiance.kernels`` is importable (this checkout, or
another source tree put first on PYTHONPATH) and appends one JSON line a point; alternating the
two builds and then ``compare`` gives, per point, the new build's time over the base build's
(the faster of each side's repetitions):

    for i in 1 2; do
      PYTHONPATH=BASE/packages/radiance-kernels/src:$PYTHONPATH python benchmarks/ab_split_kv.py time \\
          --label base --out ab.jsonl --kernel-src STAGED_DIR
      python benchmarks/ab_split_kv.py time --label new --out ab.jsonl --kernel-src STAGED_DIR
    done
    python benchmarks/ab_split_kv.py compare ab.jsonl --base base --new new --md ab.md

A variant the sources build behind a preprocessor switch is the same tree with
``RADIANCE_KERNELS_EXTRA_FLAGS=-D...`` on the new side's ``time`` (radiance-kernels builds and
caches it apart).

Points: every row of ``results/split_kv_warpgroup_probe.json`` (the warpgroup pass) and
``results/split_kv_cuda_probe.json`` (the mma.sync pass), each with the launch that won there,
timed as the probes time them (medians of CUDA-graph replays, KV rotated past L2). What the
sm_90 table ships is timed beside them in every process; where that is radiance's Triton pass (the
same code in both builds), its new/base ratio is noise, and so is the spread of one build's
repetitions, which ``compare`` reports too. ``--form warpgroup`` (or ``mma_sync``) times one pass's
points only, for a change to the other pass alone. ``--decode 1,2`` times instead the warpgroup
pass at those widths, at 32K and 128K x 1 and 8 sequences of every class, at the segment count
and ring depth the sm_90 table ships there (named ``wg_n{rows}_st{stages}_s{segments}`` with the
query rows rounded up to eights), for a change to its narrow blocks. ``--ring 1,1x2`` times, in
the same process and alternated with each warpgroup point's launch, that launch at other ring
depths (and segment counts times a factor), labelled ``{label}-{variant}`` under the same launch
name, so ``compare --base new --new new-1`` sets one depth against the other. ``reduce-cost``
times what the reduce kernel adds to the shipped launches (each whole, and without its reduce);
run from two source trees with ``--label``, its whole times set a change to the reduce against
the reduce before it.

Whether a change keeps the outputs bit for bit: ``outputs FILE`` from each source tree, then
``same-bits BASE NEW``. Its cases: bf16 and fp8 KV, head 256 (16 query heads, 2 KV heads) and
head 128 (32, 8), widths 1, 4 and 9, over three sequences of 5,000, 37 and 2,051 keys (so some
segments hold no keys); each partial pass (Triton at 16 and 64 segments, the mma.sync pass at 16,
the warpgroup pass at 16 and 64), scratch and outputs poisoned with NaN first. A launch shape a
pass does not have is recorded as its refusal on both sides.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

try:
    from radiance.attn import tune
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from radiance.attn import tune
from radiance.attn import policy, split_kv_kernel
from radiance.attn.triton_launch import RadianceUnifiedAttention

RESULTS = Path(__file__).resolve().parent / "results"
PROBES = {"warpgroup": "split_kv_warpgroup_probe.json", "mma_sync": "split_kv_cuda_probe.json"}


def launch_of(name: str, width: int, group: int) -> policy.TritonLaunch:
    """The probes' launch names: wg_n{rows}_st{stages}_s{segments} (the warpgroup pass) and
    cuda_t{tile}_w{key warps}_st{stages}_s{segments} (the mma.sync pass, rows in tiles of 16)."""
    m = re.fullmatch(r"wg_n(\d+)_st(\d+)_s(\d+)", name)
    if m:
        rows, st, seg = map(int, m.groups())
        return policy.TritonLaunch(seg, rows, width, 64, 4, st, "ab", kernel="radiance", partial_pass="cuda_warpgroup")
    tile, warps, st, seg = map(int, re.fullmatch(r"cuda_t(\d+)_w(\d+)_st(\d+)_s(\d+)", name).groups())
    return policy.TritonLaunch(seg, 16 * -(-width * group // 16), width, tile, warps, st, "ab", kernel="radiance",
                               partial_pass="cuda")


DECODE_POINTS = tuple((ctx, seqs) for ctx in (32768, 131072) for seqs in (1, 8))


def decode_launch(shipped: policy.TritonLaunch | None, width: int, group: int) -> str:
    """The warpgroup launch name of a ``--decode`` point: the shipped launch's segments and ring
    depth (its stages where it is split, else 2), the point's query rows rounded up to eights."""
    seg = shipped.num_segments if shipped is not None and shipped.is_3d else 64
    stages = shipped.num_stages if shipped is not None and shipped.num_stages in (2, 3, 4) else 2
    return f"wg_n{8 * -(-width * group // 8)}_st{stages}_s{seg}"


def ring_variant(c: policy.TritonLaunch, variant: str) -> policy.TritonLaunch:
    """``c`` at the ring depth ``variant`` names ("1", or "1x2": 1 stage, twice the segments)."""
    stages, _, factor = variant.partition("x")
    return dataclasses.replace(c, num_stages=int(stages), num_segments=c.num_segments * int(factor or 1))


def time_points(label: str, out: Path, kernel_src: str, reps: int, forms=tuple(PROBES),
                decode: tuple[int, ...] = (), rings: tuple[str, ...] = ()) -> int:
    import torch

    from radiance.kernels import library

    module, dev, arch, sms = tune.probe_device(kernel_src)
    lib = library.get(dev.index or 0)
    if lib is None:
        print(f"ab_split_kv: kernel library unavailable: {library.why_not(dev.index or 0)}")
        return 1
    shipped = RadianceUnifiedAttention(module, arch=arch, num_sms=sms)
    if decode:
        rows = [("warpgroup", {"class": k.name, "ctx": ctx, "seqs": seqs, "width": w, "best": None})
                for k in tune.CLASSES for ctx, seqs in DECODE_POINTS for w in decode]
    else:
        rows = [(form, r) for form, name in PROBES.items() if form in forms
                for r in json.loads((RESULTS / name).read_text())["results"]]
    by_class = defaultdict(list)
    for form, r in rows:
        by_class[r["class"]].append((form, r))
    with out.open("a") as f:
        for k in tune.CLASSES:
            if k.name not in by_class:
                continue
            torch.cuda.empty_cache()
            b = tune.Bench(module, k, max(r["ctx"] * r["seqs"] for _, r in by_class[k.name]), dev)
            for form, r in by_class[k.name]:
                sets = b.point(r["ctx"], r["seqs"], r["width"])
                rs = [b.radiance_kwargs(kw) for kw in sets]
                group = k.num_query_heads // k.num_kv_heads
                if r["best"] is None:  # a --decode point
                    r = dict(r, best=decode_launch(tune.time_wrapper(shipped, b, sets)[1], r["width"], group))
                c = launch_of(r["best"], r["width"], group)
                launches = {label: c}
                if form == "warpgroup":
                    variants = {f"{label}-{v}": ring_variant(c, v) for v in rings}
                    launches.update((lab, v) for lab, v in variants.items()
                                    if v.num_segments <= max(tune.RADIANCE_SEGMENTS))
                run = lambda kw, c: split_kv_kernel.launch(
                    kw["q"], kw["k"], kw["v"], kw["out"], kw["cu_seqlens_q"], kw["seqused_k"], kw["block_table"],
                    kw["max_seqlen_q"], kw["softmax_scale"], kw["k_descale"], kw["v_descale"], c, b.segm_out,
                    b.segm_max, b.segm_sum)
                times = defaultdict(list)
                for _ in range(reps):  # the launches alternated
                    for lab, c in launches.items():
                        times[lab].append(tune.time_graph([lambda kw=kw, c=c: run(kw, c) for kw in rs]))
                shipped_runs = [tune.time_wrapper(shipped, b, sets) for _ in range(reps)]
                ship = min(t for t, _ in shipped_runs)
                ship_launch = shipped_runs[0][1]
                for lab, ts in times.items():  # the shipped time once a process: on the point's own row
                    f.write(json.dumps({"label": lab, "library": Path(lib.path).parent.name, "form": form,
                                        "class": k.name, "ctx": r["ctx"], "seqs": r["seqs"], "width": r["width"],
                                        "launch": r["best"], "us": min(ts), "shipped_us": ship if lab == label else None,
                                        "shipped_pass": ship_launch.partial_pass if ship_launch else "stock",
                                        "gpu": torch.cuda.get_device_name(dev)}) + "\n")
                    print(f"{lab}: {form:9s} {k.name:14s} {r['ctx']:6d} x {r['seqs']} w{r['width']} {r['best']:22s} "
                          f"{min(ts):8.1f} us (shipped {ship:8.1f})", flush=True)
            del b
    return 0


def reduce_cost(out: Path, kernel_src: str, reps: int = 3, seqs_of: tuple[int, ...] = (1, 8),
                label: str | None = None, pad: int = 0) -> int:
    """What the reduce kernel adds to the shipped launch: at 32K and 128K x ``seqs_of`` sequences
    x widths 1, 4, 9 of every class, the sm_90 table's launch timed whole and with its reduce
    kernel left out (the partial pass alone), alternated ``reps`` times, the faster of each kept;
    one JSON line a point (with ``label``, to set two source trees' runs against each other).
    ``pad``: that many empty requests appended to each batch, as a CUDA-graph-padded batch has."""
    import torch

    module, dev, arch, sms = tune.probe_device(kernel_src)
    shipped = RadianceUnifiedAttention(module, arch=arch, num_sms=sms)
    kernels = split_kv_kernel._kernels

    class _NoReduce:
        def __getitem__(self, grid):
            return lambda *a, **k: None

    points = [(ctx, seqs, w) for ctx, seqs in DECODE_POINTS if seqs in seqs_of for w in (1, 4, 9)]
    with out.open("a") as f:
        for k in tune.CLASSES:
            torch.cuda.empty_cache()
            b = tune.Bench(module, k, max(c * s for c, s, _ in points), dev,
                           max_query_tokens=9 * (max(s for _, s, _ in points) + pad))
            for ctx, seqs, w in points:
                sets = b.point(ctx, seqs, w, pad_seqs=pad)
                rs = [b.radiance_kwargs(kw) for kw in sets]
                shipped(**rs[0])  # one call: the launch the wrapper decides on (it is timed below)
                c = shipped.last_decision[1]
                if c is None or c.kernel != "radiance":  # vLLM's own reduce: not this kernel's
                    print(f"{k.name:14s} {ctx:6d} x {seqs} w{w}: skipped, the shipped launch is "
                          f"{'stock' if c is None else c.describe()}", flush=True)
                    continue
                fns = [lambda kw=kw: shipped.launch(kw, c) for kw in rs]
                times = defaultdict(list)
                try:
                    for _ in range(reps):
                        split_kv_kernel._kernels = kernels
                        times["full_us"].append(tune.time_graph(fns))
                        split_kv_kernel._kernels = lambda: (kernels()[0], _NoReduce())
                        times["partial_us"].append(tune.time_graph(fns))
                finally:
                    split_kv_kernel._kernels = kernels
                row = {**({"label": label} if label else {}),
                       "class": k.name, "ctx": ctx, "seqs": seqs, "pad_seqs": pad, "width": w, "launch": c.describe(),
                       **{what: min(ts) for what, ts in times.items()}, "floor_us": b.floor_us(ctx, seqs),
                       "gpu": torch.cuda.get_device_name(dev)}
                f.write(json.dumps(row) + "\n")
                print(f"{k.name:14s} {ctx:6d} x {seqs} w{w} whole {row['full_us']:7.1f} us, partial pass "
                      f"{row['partial_us']:7.1f} us, reduce {row['full_us'] - row['partial_us']:5.1f} us", flush=True)
            del b
    return 0


OUTPUT_PASSES = (("triton", 16), ("triton", 64), ("cuda", 16), ("cuda_warpgroup", 16), ("cuda_warpgroup", 64))


def _outputs_launch(partial_pass: str, segments: int, width: int, group: int) -> policy.TritonLaunch:
    """A launch of ``partial_pass`` at ``segments`` that covers ``width`` tokens of ``group`` heads."""
    rows = width * group
    if partial_pass == "cuda_warpgroup":  # the MMA's N: 8 x n_tiles columns
        from radiance.kernels import split_kv_attention

        n_tiles = next(n for n in split_kv_attention.WARPGROUP_COLUMNS if 8 * n >= rows)
        return policy.TritonLaunch(segments, 8 * n_tiles, width, 64, 4, 2, "t", kernel="radiance")
    if partial_pass == "cuda":  # row tiles of 16, two key warps of 16 keys
        return policy.TritonLaunch(segments, 16 * -(-rows // 16), width, 32, 2, 2, "t", kernel="radiance")
    return policy.TritonLaunch(segments, max(16, 1 << (rows - 1).bit_length()), width, 32, 4, 2, "t", kernel="radiance")


def save_outputs(path: Path) -> int:
    """Fixed-seed cases through ``split_kv_kernel.launch``, saved for ``same-bits`` (module docstring)."""
    import torch

    dev = torch.device("cuda")
    outputs = {}
    for kv in ("bf16", "fp8"):
        for head, q_heads, kv_heads in ((256, 16, 2), (128, 32, 8)):
            for width in (1, 4, 9):
                gen = torch.Generator(device=dev).manual_seed(1000 * width + head)
                seqs, block_size, blocks = 3, 16, 1200
                lens = torch.tensor([5000, 37, 2051], dtype=torch.int32, device=dev)
                k = torch.randn((blocks, block_size, kv_heads, head), generator=gen, device=dev)
                v = torch.randn((blocks, block_size, kv_heads, head), generator=gen, device=dev)
                if kv == "fp8":
                    k, v = (k * 40).to(torch.float8_e4m3fn), (v * 40).to(torch.float8_e4m3fn)
                    k_scale = torch.tensor([0.013], device=dev).expand(seqs, kv_heads)
                    v_scale = torch.tensor([0.007], device=dev).expand(seqs, kv_heads)
                else:
                    k, v, k_scale, v_scale = k.bfloat16(), v.bfloat16(), None, None
                tokens = seqs * width
                q = torch.randn(tokens, q_heads, head, generator=gen, device=dev).bfloat16()
                cu = torch.arange(0, tokens + 1, width, dtype=torch.int32, device=dev)
                table = torch.randperm(blocks, generator=gen, device=dev).to(torch.int32)[: seqs * 320].view(seqs, 320)
                for partial_pass, segments in OUTPUT_PASSES:
                    launch = _outputs_launch(partial_pass, segments, width, q_heads // kv_heads)
                    units = tokens * q_heads * segments
                    part = [torch.full((n,), float("nan"), device=dev) for n in (units * head, units, units)]
                    out = torch.full_like(q, float("nan"))
                    key = f"{kv} head {head} width {width} {partial_pass} {segments} segments"
                    try:
                        split_kv_kernel.launch(q, k, v, out, cu, lens, table, width, head**-0.5, k_scale, v_scale,
                                               launch, *part, partial_pass=partial_pass)
                        outputs[key] = out.cpu()
                    except ValueError as exc:
                        outputs[key] = f"refused: {exc}"
    torch.save(outputs, path)
    print(f"{len(outputs)} cases, {sum(isinstance(o, str) for o in outputs.values())} refused -> {path}")
    return 0


def same_bits(base: Path, new: Path) -> int:
    """Case by case, whether two ``outputs`` files hold the same bits, and how far apart if not."""
    import torch

    a, b = torch.load(base), torch.load(new)
    if a.keys() != b.keys():
        print("the two files hold different cases")
        return 1
    same = 0
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, str) or isinstance(y, str):
            print(f"{key}: {x if x == y else f'{x!r} / {y!r}'}")
            continue
        bits_x, bits_y = x.view(torch.int16), y.view(torch.int16)
        differ = bits_x != bits_y
        if not differ.any():
            same += 1
            continue
        ulps = (bits_x.int() - bits_y.int()).abs()[differ]
        print(f"{key}: {int(differ.sum())} of {x.numel()} elements differ, by {int(ulps.max())} bf16 ulp at most")
    print(f"bit-identical: {same} of {sum(not isinstance(o, str) for o in a.values())} cases that ran")
    return 0


def compare(path: Path, base: str, new: str, md: Path | None) -> int:
    best = defaultdict(dict)
    runs = defaultdict(list)  # (key, label): each process's time of the point
    same_code = {}  # key: whether the shipped launch is code both builds share (False: unknown)
    gpu = None
    libs = defaultdict(set)
    for line in path.read_text().splitlines():
        r = json.loads(line)
        key = (r["form"], r["class"], r["ctx"], r["seqs"], r["width"], r["launch"])
        for what in ("us", "shipped_us"):
            if r[what] is not None:  # a --ring variant's row has no shipped time of its own
                best[key][(r["label"], what)] = min(best[key].get((r["label"], what), float("inf")), r[what])
        runs[(key, r["label"])].append(r["us"])
        same_code[key] = same_code.get(key, True) and r.get("shipped_pass") in ("triton", "stock")
        libs[r["label"]].add(r["library"])
        gpu = r.get("gpu", gpu)
    what = "launches of one build" if libs[base] == libs[new] else "build"
    lines = [f"# Split-KV partial passes: {new} {what} against {base}, timed in one run ({gpu})", "",
             f"Libraries: {base} {sorted(libs[base])}, {new} {sorted(libs[new])}. Each point's launch is the one "
             "its probe chose; the faster of each build's repetitions (medians of CUDA-graph replays, KV rotated "
             "past L2). shipped: the sm_90 table's launch through radiance's wrapper (the Triton pass, or a "
             "radiance-kernels pass where the table ships one: there it changes with the build).", "",
             f"| pass | class | ctx | seqs | width | launch | {base} µs | {new} µs | {new}/{base} | shipped {new}/{base} |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ratios = defaultdict(list)
    noise = []
    for key in sorted(best):
        v = best[key]
        if (base, "us") not in v or (new, "us") not in v:
            continue
        ratio = v[(new, "us")] / v[(base, "us")]
        ship = v[(new, "shipped_us")] / v[(base, "shipped_us")] if (new, "shipped_us") in v else None
        ratios[(key[0], key[1], key[4])].append(ratio)
        if same_code[key] and ship is not None:
            noise.append(ship)
        form, cls, ctx, seqs, width, launch = key
        lines.append(f"| {form} | {cls} | {ctx} | {seqs} | {width} | {launch} | {v[(base, 'us')]:.1f} | "
                     f"{v[(new, 'us')]:.1f} | {ratio:.3f} | {'-' if ship is None else f'{ship:.3f}'} |")
    lines += ["", f"## Geometric means of {new}/{base} per pass, class and width", "",
              "| pass | class | width | points | geo. mean | range |", "|---|---|---|---|---|---|"]
    for (form, cls, width), rs in sorted(ratios.items()):
        gm = statistics.geometric_mean(rs)
        lines.append(f"| {form} | {cls} | {width} | {len(rs)} | {gm:.3f} | {min(rs):.3f}-{max(rs):.3f} |")
    lines += ["", "Noise:"]
    for label in (base, new):
        spread = [max(ts) / min(ts) for (_, lb), ts in runs.items() if lb == label and len(ts) > 1]
        if spread:
            lines.append(f"- {label}'s repetitions (slowest over fastest process, a point): geometric mean "
                         f"{statistics.geometric_mean(spread):.3f}, largest {max(spread):.3f} "
                         f"over {len(spread)} points.")
    if noise:
        lines.append(f"- the shipped launch where both builds run the same code (the Triton pass), {new}/{base}: "
                     f"geometric mean {statistics.geometric_mean(noise):.3f}, range {min(noise):.3f}-{max(noise):.3f} "
                     f"over {len(noise)} points.")
    text = "\n".join(lines) + "\n"
    print(text)
    if md is not None:
        md.write_text(text)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time")
    t.add_argument("--label", required=True)
    t.add_argument("--out", required=True, type=Path)
    t.add_argument("--kernel-src", required=True)
    t.add_argument("--reps", type=int, default=2)
    t.add_argument("--form", choices=tuple(PROBES), action="append",
                   help="time only this pass's points (repeatable; default: both)")
    t.add_argument("--decode", type=lambda v: tuple(int(w) for w in v.split(",")), default=(),
                   help="widths (e.g. 1,2): the warpgroup pass's narrow blocks instead of the probes' points")
    t.add_argument("--ring", type=lambda v: tuple(v.split(",")), default=(),
                   help="ring variants of each warpgroup launch (e.g. 1,1x2: 1 stage; 1 stage, twice the segments)")
    r = sub.add_parser("reduce-cost")
    r.add_argument("--out", required=True, type=Path)
    r.add_argument("--kernel-src", required=True)
    r.add_argument("--seqs", type=lambda v: tuple(int(n) for n in v.split(",")), default=(1, 8),
                   help="sequence counts to time (default 1,8)")
    r.add_argument("--label", help="recorded on every line")
    r.add_argument("--pad", type=int, default=0, help="empty requests appended to each batch (CUDA-graph padding)")
    o = sub.add_parser("outputs")
    o.add_argument("path", type=Path)
    sb = sub.add_parser("same-bits")
    sb.add_argument("base", type=Path)
    sb.add_argument("new", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("jsonl", type=Path)
    c.add_argument("--base", default="base")
    c.add_argument("--new", default="new")
    c.add_argument("--md", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "time":
        return time_points(args.label, args.out, args.kernel_src, args.reps, tuple(args.form or PROBES),
                           args.decode, args.ring)
    if args.cmd == "reduce-cost":
        return reduce_cost(args.out, args.kernel_src, seqs_of=args.seqs, label=args.label, pad=args.pad)
    if args.cmd == "outputs":
        return save_outputs(args.path)
    if args.cmd == "same-bits":
        return same_bits(args.base, args.new)
    return compare(args.jsonl, args.base, args.new, args.md)


if __name__ == "__main__":
    sys.exit(main())
