"""Tuning harness: sweep the split-KV kernels (vLLM's Triton unified attention and radiance's own)
on the GPU at hand, fit the rule.

    python -m radiance.attn.tune --out DIR --kernel-src STAGED_DIR [--quick]
    (also the ``radiance-attn`` console script, and benchmarks/bench_unified_attention.py)

``STAGED_DIR`` comes from ``benchmarks/stage_vllm_kernel.py`` run where vLLM is installed: the
kernel runs standalone, so the GPU machine needs no vLLM. For each measured point (context x
sequences x verify width, per head/KV-head/KV-dtype class) it times, as medians of CUDA-graph
replays on random data with KV rotated through more than the L2 size:
  * stock: the installed vLLM's own wrapper with its backend's constants (16 segments, split
    only for single-token decode, 3D threshold MIN_LAUNCH_GRID_SIZE_2D // kv_heads);
  * every candidate launch: split count x BLOCK_M (stock block, and the block that holds all
    of a sequence's rows) x launch shape and kernel (KV tile, warps, pipeline stages, vLLM's
    kernel or radiance's: BASE_SHAPES, WIDE_SHAPES);
then fits the policy's rule to the candidates, per class and context band (fewest points slower
than stock by >3%, then least total log-regret against the best candidate), writes
``DIR/tables/<arch>.json``, and re-measures radiance's own wrapper with the fitted table against
stock at every point, with the KV-read floor (the batch's KV bytes at 4.25 TB/s) and an
exactness check of radiance vs stock.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import itertools
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

from radiance.attn import kernel_source, policy, split_kv_kernel, tables
from radiance.attn.triton_launch import RadianceUnifiedAttention, build_errors, detect_arch

COPY_BW = 4.25e12  # bytes/s, H200 copy rate measured here
L2_ROTATE_BYTES = 160 << 20  # rotate KV through > 3x the H200's 50 MB L2 where the size allows
SEGMENTS = (1, 4, 8, 16, 32, 64, 128)
# radiance's kernel reduces each row's segments in two memory round trips whatever their count (split_kv_kernel.py), so
# its sweep goes one power of two further.
RADIANCE_SEGMENTS = (4, 8, 16, 32, 64, 128, 256)
# Launch shapes (KV tile, warps, software-pipeline stages, kernel) swept with each split count.
# benchmarks/probe_launch_shapes.py timed every tile {16, 32, 64} x warps {2, 4, 8} x stages
# {1, 2, 3} x segments {64..512} of vLLM's kernel at five head-256 bf16 points on the H200
# (results/launch_shapes.md): a 64-token tile with 2 stages was the fastest launch at all five,
# 1.20-1.48x faster than stock's tile; 2 stages beat 1 and 3 everywhere; segments past 128 never
# won; 128-row blocks need 8 warps (4 ran 2.5-3x slower); the table fitted from the full sweep
# chose no other shape. benchmarks/probe_split_kv_kernel.py timed radiance's kernel over tile
# {32, 64} x warps {4, 8} x stages {2, 3} at 72 points (results/split_kv_kernel.md); the shapes
# below ("rk_") are the ones that won there, with those its --around probe found faster than the
# shipped launch (fewer warps on 32-key tiles at fp8 KV, 128-key tiles for 64-row blocks; stages
# 3-6 won at a few single-sequence points only). The fit picks shape and kernel per class.
# "wg_": radiance's kernel with radiance-kernels' warpgroup partial pass (sm_90; 64-key tiles, one
# warpgroup a block, ``stages`` tiles in flight), which probe_split_kv_kernel.py --cuda --warpgroup
# measured 0.75-0.94x the shipped time for head 256 on fp8 KV at widths 4-9 (H100,
# split_kv_kernel.md section 10); a GPU without it refuses these shapes and the sweep leaves them out.
# The pass runs one warpgroup whatever "warps" says: the entry's warps are for the Triton pass,
# which runs the launch where the warpgroup pass cannot (8 for 128-row blocks, as above).
# "wg_s1": its one-stage ring (a tile's K and V buffers, each refilled as soon as it is read: half
# the shared memory of two stages), which on an H100 took 0.92-0.98x the two-stage time for head
# 256 on bf16 KV by width (0.88-0.89x at width 9 from 32K x 8 and 128K x 1: two blocks an SM
# instead of one), and 1.02-1.09x on fp8 KV (split_kv_kernel.md section 17); the H200 fit runs
# every head-256 bf16 block on it (section 20).
# 32-row blocks also get radiance's 4-warp 32-key and 128-key tiles: in the 05:29 UTC H200 sweep
# head 128's width-6 steps (24 rows, a 32-row block, 64-key tiles) ran slower than its width-9
# steps (36 rows in a 64-row block, 32- or 128-key tiles) at 20 of 20 bf16 and 15 of 20 fp8 points.
WARPGROUP = {"tile": 64, "warps": 4, "kernel": "radiance", "partial_pass": "cuda_warpgroup"}
BASE_SHAPES = {
    "t64w4s2": {"tile": 64, "warps": 4, "stages": 2},
    "t64w8s2": {"tile": 64, "warps": 8, "stages": 2},
    "rk_t64w4s2": {"tile": 64, "warps": 4, "stages": 2, "kernel": "radiance"},
    "rk_t64w8s2": {"tile": 64, "warps": 8, "stages": 2, "kernel": "radiance"},
    "rk_t32w4s2": {"tile": 32, "warps": 4, "stages": 2, "kernel": "radiance"},
    "rk_t32w2s2": {"tile": 32, "warps": 2, "stages": 2, "kernel": "radiance"},
    "rk_t32w1s2": {"tile": 32, "warps": 1, "stages": 2, "kernel": "radiance"},
    "rk_t32w2s2_ta": {"tile": 32, "warps": 2, "stages": 2, "kernel": "radiance", "table_ahead": True},
    "rk_t64w4s3_ta": {"tile": 64, "warps": 4, "stages": 3, "kernel": "radiance", "table_ahead": True},
    "wg_s2": {**WARPGROUP, "stages": 2},
    "wg_s1": {**WARPGROUP, "stages": 1},
}
WIDE_SHAPES = {
    32: {"t64w4s2": {"tile": 64, "warps": 4, "stages": 2},
         "rk_t64w4s2": {"tile": 64, "warps": 4, "stages": 2, "kernel": "radiance"},
         "rk_t32w2s2": {"tile": 32, "warps": 2, "stages": 2, "kernel": "radiance"},
         "rk_t64w4s2_ta": {"tile": 64, "warps": 4, "stages": 2, "kernel": "radiance", "table_ahead": True},
         "rk_t32w2s2_r128": {"tile": 32, "warps": 2, "stages": 2, "kernel": "radiance", "registers": 128},
         "rk_t32w4s2": {"tile": 32, "warps": 4, "stages": 2, "kernel": "radiance"},
         "rk_t128w4s2": {"tile": 128, "warps": 4, "stages": 2, "kernel": "radiance"},
         "rk_t128w4s2_ta": {"tile": 128, "warps": 4, "stages": 2, "kernel": "radiance", "table_ahead": True},
         "wg_s2": {**WARPGROUP, "stages": 2}, "wg_s3": {**WARPGROUP, "stages": 3},
         "wg_s1": {**WARPGROUP, "stages": 1}},
    64: {"t32w4": {"tile": 32, "warps": 4}, "t64w4s2": {"tile": 64, "warps": 4, "stages": 2},
         "rk_t32w4s2": {"tile": 32, "warps": 4, "stages": 2, "kernel": "radiance"},
         "rk_t64w4s2": {"tile": 64, "warps": 4, "stages": 2, "kernel": "radiance"},
         "rk_t128w4s2": {"tile": 128, "warps": 4, "stages": 2, "kernel": "radiance"},
         "rk_t128w4s2_ta": {"tile": 128, "warps": 4, "stages": 2, "kernel": "radiance", "table_ahead": True},
         "wg_s2": {**WARPGROUP, "stages": 2}, "wg_s3": {**WARPGROUP, "stages": 3},
         "wg_s1": {**WARPGROUP, "stages": 1}},
    128: {"t32w8": {"tile": 32, "warps": 8}, "t64w8s2": {"tile": 64, "warps": 8, "stages": 2},
          "rk_t64w8s2": {"tile": 64, "warps": 8, "stages": 2, "kernel": "radiance"},
          "rk_t64w8s3": {"tile": 64, "warps": 8, "stages": 3, "kernel": "radiance"},
          "rk_t64w8s3_ta": {"tile": 64, "warps": 8, "stages": 3, "kernel": "radiance", "table_ahead": True},
          "wg_s2": {**WARPGROUP, "warps": 8, "stages": 2}, "wg_s3": {**WARPGROUP, "warps": 8, "stages": 3},
          "wg_s1": {**WARPGROUP, "warps": 8, "stages": 1}},
}


def _segments(shape: dict) -> tuple[int, ...]:
    return RADIANCE_SEGMENTS if shape.get("kernel") == "radiance" else SEGMENTS[1:]


@dataclass(frozen=True)
class Klass:
    name: str
    head_size: int
    num_query_heads: int
    num_kv_heads: int
    kv_dtype: str


CLASSES = (
    Klass("h256_kv2_bf16", 256, 16, 2, "bf16"),
    Klass("h128_kv8_bf16", 128, 32, 8, "bf16"),
    Klass("h256_kv2_fp8", 256, 16, 2, "fp8"),
    Klass("h128_kv8_fp8", 128, 32, 8, "fp8"),
)
# Each class's rule is fitted per context band, the table telling them apart by max_seqlen_k: one
# rule's split count and shapes fitted over 4K-128K at once trade the short contexts against the
# long ones. On the H200 (split_kv_kernel.md, section 11) a rule below 32K and one from 32K took
# 194 of 240 points at >= 32K within 2x of the KV-read floor where one rule took 188, at the same
# time overall (0.998x). The band edge is the geometric mean of the swept contexts either side of
# CONTEXT_BAND_FROM.
CONTEXT_BAND_FROM = 32768
FULL_GRID = {"ctx": (4096, 16384, 32768, 65536, 131072), "seqs": (1, 2, 4, 8), "width": (1, 2, 4, 6, 9)}
QUICK_GRID = {"ctx": (4096, 32768, 131072), "seqs": (1, 8), "width": (1, 4, 9)}
BLOCK = 16


def _torch():
    import torch

    return torch


def _kv_torch_dtype(name):
    torch = _torch()
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}[name]


def wide_block_m(k: Klass, width: int) -> int | None:
    """The block holding all of a verify sequence's rows, where it is wider than stock's (<= 128)."""
    qpkv = k.num_query_heads // k.num_kv_heads
    wide = policy.next_pow2(width * qpkv)
    return wide if width > 1 and policy.stock_block_m(qpkv) < wide <= 128 else None


def candidate_launches(k: Klass, ctx: int, seqs: int, width: int) -> list[policy.TritonLaunch]:
    """Every launch measured at one point: split count x {stock block, all-rows block} x shape."""
    qpkv = k.num_query_heads // k.num_kv_heads
    base = policy.stock_block_m(qpkv)
    wide = wide_block_m(k, width)
    out = [policy.TritonLaunch(1, base, max(1, base // qpkv), 32, None, None, "candidate")]  # stock's 2D launch
    for shape in BASE_SHAPES.values():
        for seg in _segments(shape):
            if seg <= policy.next_pow2(policy.cdiv(ctx, shape["tile"])):
                out.append(shape_launch(shape, seg, base, qpkv, width))
    if wide is not None:
        for shape in WIDE_SHAPES[wide].values():
            segs = _segments(shape) if shape.get("kernel") == "radiance" else SEGMENTS
            for seg in segs:
                if seg == 1 or seg <= policy.next_pow2(policy.cdiv(ctx, shape["tile"])):
                    out.append(shape_launch(shape, seg, wide, qpkv, width))
    return out


def shape_launch(shape: dict, seg: int, block_m: int, qpkv: int, width: int) -> policy.TritonLaunch:
    """A launch shape of BASE_SHAPES / WIDE_SHAPES (the keys of a table's launch entry) at a
    split count and block, for verify steps of ``width`` tokens (the policy's launch for it)."""
    partial = shape.get("partial_pass", "triton")
    block_q = (policy.warpgroup_block_q(block_m, qpkv, width) if partial == "cuda_warpgroup"
               else max(1, block_m // qpkv))
    return policy.TritonLaunch(seg, block_m, block_q, shape["tile"], shape["warps"],
                               shape.get("stages"), "candidate", kernel=shape.get("kernel", "vllm"),
                               max_registers=shape.get("registers"), table_ahead=shape.get("table_ahead", False),
                               partial_pass=partial)


class Bench:
    """Inputs for one class, allocated once; per point views, block tables and rotations."""

    def __init__(self, module, k: Klass, max_tokens: int, device, rotate_bytes=L2_ROTATE_BYTES,
                 max_segments: int = max(RADIANCE_SEGMENTS), max_query_tokens: int = 9 * 8):
        torch = _torch()
        self.m, self.k, self.device = module, k, device
        self.dtype = _kv_torch_dtype(k.kv_dtype)
        elem = torch.empty((), dtype=self.dtype).element_size()
        self.token_bytes = 2 * k.num_kv_heads * k.head_size * elem
        pool_tokens = max(max_tokens, rotate_bytes // self.token_bytes)
        self.num_blocks = policy.cdiv(pool_tokens, BLOCK)
        shape = (self.num_blocks, BLOCK, k.num_kv_heads, k.head_size)
        gen = torch.Generator(device=device).manual_seed(0)
        self.kc = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16).to(self.dtype)
        self.vc = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16).to(self.dtype)
        self.perm = torch.randperm(self.num_blocks, device=device, generator=gen).to(torch.int32)
        self.rotate_bytes = rotate_bytes
        # Segment scratch sized for the largest split launch of the sweep.
        units = max_query_tokens * k.num_query_heads * max_segments
        self.segm_out = torch.empty(units * policy.next_pow2(k.head_size), device=device, dtype=torch.float32)
        self.segm_max = torch.empty(units, device=device, dtype=torch.float32)
        self.segm_sum = torch.empty(units, device=device, dtype=torch.float32)

    def point(self, ctx: int, seqs: int, width: int, pad_seqs: int = 0):
        """Keyword-argument sets (one per rotation) for the wrappers, all with the same shape.

        ``pad_seqs``: requests appended the way vLLM pads a batch to a captured CUDA-graph size
        (no keys, no query tokens: the query offsets repeat the last, while the query and output
        keep ``width`` rows for each, which no kernel should write)."""
        torch = _torch()
        k = self.k
        tokens = seqs * width
        batch_tokens = seqs * ctx
        rot = max(1, min(8, self.num_blocks * BLOCK // batch_tokens, math.ceil(self.rotate_bytes / (batch_tokens * self.token_bytes))))
        gen = torch.Generator(device=self.device).manual_seed(ctx * 131 + seqs * 17 + width)
        q = torch.randn(tokens + pad_seqs * width, k.num_query_heads, k.head_size, generator=gen, device=self.device,
                        dtype=torch.bfloat16)
        cu = torch.arange(0, tokens + 1, width, device=self.device, dtype=torch.int32)
        cu = torch.cat([cu, cu[-1:].expand(pad_seqs)])
        lens = torch.cat([torch.full((seqs,), ctx, device=self.device, dtype=torch.int32),
                          torch.zeros(pad_seqs, device=self.device, dtype=torch.int32)])
        nb = ctx // BLOCK
        # vLLM's backend passes the layer's tensor scale expanded to [seqs, kv_heads]
        one = torch.ones(1, device=self.device, dtype=torch.float32).expand(seqs + pad_seqs, k.num_kv_heads)
        sets = []
        for r in range(rot):
            bt = self.perm[r * seqs * nb : (r + 1) * seqs * nb].view(seqs, nb)
            bt = torch.cat([bt, bt[:1].expand(pad_seqs, nb)])
            sets.append(
                dict(q=q, k=self.kc, v=self.vc, out=torch.empty_like(q), cu_seqlens_q=cu, max_seqlen_q=width,
                     seqused_k=lens, max_seqlen_k=ctx, softmax_scale=k.head_size**-0.5, causal=True,
                     window_size=(-1, -1), block_table=bt, softcap=0, q_descale=None, k_descale=one,
                     v_descale=one, kv_quant_mode=1 if k.kv_dtype == "fp8" else 0)
            )
        return sets

    def floor_us(self, ctx: int, seqs: int) -> float:
        return seqs * ctx * self.token_bytes / COPY_BW * 1e6

    def stock_kwargs(self, kw: dict, manifest: dict) -> dict:
        """The arguments vLLM's Triton backend passes: its 16-segment scratch and 3D threshold."""
        consts = manifest.get("backend_constants", {})
        segments = int(consts.get("NUM_PAR_SOFTMAX_SEGMENTS", 16))
        threshold = int(consts.get("MIN_LAUNCH_GRID_SIZE_2D", 128)) // self.k.num_kv_heads
        rows = threshold * self.k.num_query_heads * segments
        d = policy.next_pow2(self.k.head_size)
        return dict(kw, seq_threshold_3D=threshold, num_par_softmax_segments=segments,
                    softmax_segm_output=self.segm_out[: rows * d].view(threshold, self.k.num_query_heads, segments, d),
                    softmax_segm_max=self.segm_max[:rows].view(threshold, self.k.num_query_heads, segments),
                    softmax_segm_expsum=self.segm_sum[:rows].view(threshold, self.k.num_query_heads, segments))

    def radiance_kwargs(self, kw: dict) -> dict:
        return dict(kw, seq_threshold_3D=0, num_par_softmax_segments=16, softmax_segm_output=self.segm_out,
                    softmax_segm_max=self.segm_max, softmax_segm_expsum=self.segm_sum)


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or None (said) where matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        print(f"no plot: matplotlib not importable ({exc})")
        return None
    return plt


def class_panels(plt, rows: list[dict]):
    """One panel a class, side by side, y shared: (figure, [(axes, class name, the class's rows)])."""
    classes = list(dict.fromkeys(r["class"] for r in rows))
    fig, axes = plt.subplots(1, len(classes), figsize=(4 * len(classes), 3.6), sharey=True, squeeze=False)
    return fig, [(ax, name, [r for r in rows if r["class"] == name]) for ax, name in zip(axes[0], classes)]


def row_ulps(out, ref) -> float:
    """The largest difference of any output row (token, head) from ``ref``'s, in bf16 ulps of that
    row's own largest value in ``ref``: a small row cannot hide behind a large one."""
    err = (out.float() - ref.float()).abs().amax(-1)
    return (err / (2.0**-7 * ref.float().abs().amax(-1).clamp_min(1e-6))).max().item()


def time_graph(fns, reps: int = 10) -> float:
    """Median microseconds per call of ``fns`` (one call each, in order) from CUDA-graph replays."""
    torch = _torch()
    for fn in fns:
        fn()  # compile / load
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for fn in fns:
            fn()
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(fns))
    del graph
    return statistics.median(times)


_LAUNCH_FIELDS = ("num_segments", "block_m", "block_q", "tile_size", "num_warps", "num_stages", "kernel",
                  "max_registers", "table_ahead", "partial_pass")


def time_stock(module, b: "Bench", sets: list[dict]) -> float:
    """Stock at one point: vLLM's wrapper with its backend's segments and 3D threshold."""
    stock_sets = [b.stock_kwargs(kw, module.RADIANCE_MANIFEST) for kw in sets]
    return time_graph([lambda kw=kw: module.unified_attention(**kw) for kw in stock_sets])


def time_candidates(runner: RadianceUnifiedAttention, k: Klass, b: "Bench", sets: list[dict], launches,
                    unbuilt: dict, refused: dict) -> dict[str, float]:
    """``{_key(launch): µs}`` of each launch at one point, launched directly (no policy). A launch
    whose build fails on this GPU is recorded in ``unbuilt`` (its whole build group is left out
    from then on), one a partial pass has no instance of here in ``refused``."""
    cands = {}
    rs = [b.radiance_kwargs(kw) for kw in sets]
    for c in launches:
        build = (k.name, _build_group(c))
        if build in unbuilt:
            continue
        why = _pass_refusal(c, k, rs[0]["q"].device)
        if why is not None:
            refused[(k.name, _key(dataclasses.replace(c, num_segments=0)))] = why
            continue
        try:  # the eager warm-up call builds the kernel, before any graph capture
            cands[_key(c)] = time_graph([lambda kw=kw, c=c: runner.launch(kw, c) for kw in rs])
        except build_errors() as exc:
            unbuilt[build] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
    return cands


def _needs_timing(p: dict, key: str, retime, only=None) -> bool:
    """Whether --extend times candidate ``key`` of merged point ``p``: one it lacks (of those
    ``only`` matches, a compiled regex, where given), its best, and any whose key ``retime`` (a
    compiled regex, or None) matches (code changed since it was timed)."""
    lacking = key not in p["candidates"] and (only is None or only.search(key) is not None)
    return lacking or key == p["best"] or (retime is not None and retime.search(key) is not None)


def extend_point(p: dict, runner: RadianceUnifiedAttention, k: Klass, b: "Bench", unbuilt: dict,
                 refused: dict, retime=None, only=None) -> int:
    """Time the candidates a merged point lacks (a launch shape added since it was swept), those
    ``retime`` matches, and its best one again, so the choice between them rests on times of one
    run; updates the point's candidates and best, records what was timed in ``p["extended"]``;
    returns how many."""
    launches = [c for c in candidate_launches(k, p["ctx"], p["seqs"], p["width"])
                if _needs_timing(p, _key(c), retime, only)]
    new = time_candidates(runner, k, b, b.point(p["ctx"], p["seqs"], p["width"]), launches, unbuilt, refused)
    p["candidates"] = {**p["candidates"], **new}
    p["best"] = min(p["candidates"], key=p["candidates"].get)
    p["best_us"] = p["candidates"][p["best"]]
    p["extended"] = sorted(new)
    return len(new)


def _pass_refusal(c: policy.TritonLaunch, k: Klass, device) -> str | None:
    """Why the warpgroup partial pass has no instance of ``c`` on ``device`` (the sweep's queries
    are bf16), or None; the other passes build through Triton, whose failures time_candidates catches."""
    if c.partial_pass != "cuda_warpgroup":
        return None
    torch = _torch()
    return split_kv_kernel.warpgroup_refusal(c, k.head_size, torch.bfloat16, _kv_torch_dtype(k.kv_dtype),
                                             k.num_query_heads // k.num_kv_heads, device)


def time_wrapper(wrapper: RadianceUnifiedAttention, b: "Bench", sets: list[dict]):
    """(µs, launch) of radiance's wrapper at one point, on the scratch radiance's backend sizes."""
    rs = [b.radiance_kwargs(kw) for kw in sets]
    us = time_graph([lambda kw=kw: wrapper(**kw) for kw in rs])
    return us, wrapper.last_decision[1]


def probe_parser(doc: str, budget_s: float) -> argparse.ArgumentParser:
    """The command line the probes in benchmarks/ share."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--kernel-src", help="vLLM's staged kernel (stage_vllm_kernel.py); every GPU run needs it")
    ap.add_argument("--budget-s", type=float, default=budget_s)
    ap.add_argument("--jobs", type=int, default=15)
    return ap


def probe_device(kernel_src):
    """What a probe in benchmarks/ runs on: vLLM's staged kernel module, the GPU, its arch, SMs."""
    if kernel_src is None:
        raise SystemExit("--kernel-src: the folder stage_vllm_kernel.py wrote (vLLM's kernel) is required here")
    torch = _torch()
    device = torch.device("cuda")
    return (kernel_source.load(kernel_src), device, detect_arch(device),
            torch.cuda.get_device_properties(device).multi_processor_count)


def probe_points(module, classes, points, device, deadline: float, **bench_kw):
    """The probes' walk: per class one Bench, per (ctx, seqs, width) point its argument sets and
    stock's time; stops at ``deadline`` (time.time()). Yields (klass, bench, point, sets, stock_us)."""
    torch = _torch()
    for k in classes:
        if time.time() > deadline:
            return
        torch.cuda.empty_cache()
        b = Bench(module, k, max(c * s for c, s, _ in points), device, **bench_kw)
        for ctx, seqs, width in points:
            if time.time() > deadline:
                return
            sets = b.point(ctx, seqs, width)
            yield k, b, (ctx, seqs, width), sets, time_stock(module, b, sets)
        del b


def build_in_workers(fn, tasks: dict, jobs: int) -> dict:
    """Run ``fn(args)`` for each ``tasks`` value in spawned processes (each builds kernels into
    Triton's cache); returns ``{key: why}`` for the tasks whose ``fn`` returned an error string."""
    import multiprocessing as mp

    failed = {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(fn, v): k for k, v in tasks.items()}
        for f in as_completed(futures):
            if f.result():
                failed[futures[f]] = f.result()
    return failed


def _precompile_task(args):
    """Worker: compile launch configs by running each once on a tiny batch (fills the cache)."""
    src, klass, launches, width = args
    import torch

    module = kernel_source.load(src)
    k = Klass(**klass)
    device = torch.device("cuda")
    b = Bench(module, k, max_tokens=2 * 512, device=device, rotate_bytes=0)
    runner = RadianceUnifiedAttention(module, arch="any", num_sms=1, table={})
    unbuilt = []
    for launch in launches:
        for seqs in (1, 2):
            for kw in b.point(512, seqs, width)[:1]:
                try:
                    runner.launch(b.radiance_kwargs(kw), policy.TritonLaunch(**launch))
                except build_errors() as exc:  # the sweep skips it (main)
                    unbuilt.append(f"{launch}: {type(exc).__name__}")
                    continue
                if launch["num_segments"] == 1 and launch["block_m"] == policy.stock_block_m(k.num_query_heads // k.num_kv_heads):
                    module.unified_attention(**b.stock_kwargs(kw, module.RADIANCE_MANIFEST))
    torch.cuda.synchronize()
    return "; ".join(unbuilt)


def _build_group(c: policy.TritonLaunch) -> str:
    """Candidates one build serves: radiance's kernel takes the segment count at run time, vLLM's
    as a constexpr (a build per count)."""
    return _key(c if c.kernel != "radiance" else dataclasses.replace(c, num_segments=0))


def precompile(src: str, work: list, jobs: int, launches=None) -> float:
    """Compile every distinct launch of ``work`` in parallel processes; returns seconds spent.
    ``launches(k, ctx, seqs, width)``: the launches of a point (default: every candidate).

    vLLM's kernel takes the segment count as a constexpr (a build per count); radiance's takes it
    at run time in the main kernel, so one task builds a shape's main kernel once and each
    count's small reduce kernel after it.
    """
    t0 = time.time()
    tasks = {}
    for k, ctx, seqs, width in work:
        for c in (launches or candidate_launches)(k, ctx, seqs, width):
            if c.partial_pass == "cuda_warpgroup":
                continue  # radiance-kernels' library, built once; its reduce is the Triton pass's
            group = _build_group(c)
            task = tasks.setdefault((k.name, group), (src, asdict(k), {}, width))
            task[2][_key(c)] = {f: getattr(c, f) for f in _LAUNCH_FIELDS}
    if jobs <= 1 or not tasks:
        return 0.0
    build_in_workers(_precompile_task, {kk: (a, k, list(ls.values()), w) for kk, (a, k, ls, w) in tasks.items()}, jobs)
    return time.time() - t0


def context_bands(contexts) -> list[dict]:
    """The max_seqlen_k ranges the class rules are fitted for: [{"max": e}, {"min": e}], or [{}]
    (one rule) when the swept contexts do not reach both sides of CONTEXT_BAND_FROM."""
    below = [c for c in contexts if c < CONTEXT_BAND_FROM]
    above = [c for c in contexts if c >= CONTEXT_BAND_FROM]
    if not below or not above:
        return [{}]
    edge = round(math.sqrt(max(below) * min(above)))
    return [{"max": edge}, {"min": edge}]


def _band_name(band: dict) -> str:
    return "".join(f" ctx>={v}" if k == "min" else f" ctx<{v}" for k, v in band.items())


def fit_table(points: list[dict], classes, arch: str, max_seqs: int, max_q: int, meta: dict,
              jobs: int = 1) -> tuple[dict, dict]:
    """The arch's table fitted to measured points: a rule per class and context band (matched on
    head size, KV heads, KV dtype and a max_seqlen_k range), the default fitted over every point;
    returns (validated table, each rule's fit score by name). ``jobs`` > 1 fits the rules in that
    many processes (each fit is independent; minutes of CPU in one process at 400 points)."""
    tasks, matches = {}, {}
    bands = context_bands({p["ctx"] for p in points})
    for k in classes:
        for band in bands:
            match = {"head_size": k.head_size, "num_kv_heads": k.num_kv_heads, "kv_dtype": k.kv_dtype}
            match.update({"max_seqlen_k": band} if band else {})
            pts = [p for p in points if p["class"] == k.name and tables.matches(match, _geo(p, arch))]
            if pts:
                tasks[k.name + _band_name(band)] = (pts, arch, max_seqs, max_q)
                matches[k.name + _band_name(band)] = match
    if points:
        tasks["default"] = (points, arch, max_seqs, max_q)
    if jobs > 1 and len(tasks) > 1:
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=mp.get_context("spawn")) as pool:
            fitted = dict(zip(tasks, pool.map(fit, *zip(*tasks.values()))))
    else:
        fitted = {name: fit(*task) for name, task in tasks.items()}
    rules = {name: (matches[name], rule) for name, (rule, _) in fitted.items() if name != "default"}
    fits = {name: score for name, (_, score) in fitted.items() if name != "default"}
    default, fits["default"] = fitted.get("default", (None, {}))
    table = rule_table(arch, rules, default, meta)
    tables.validate(table)
    return table, fits


def rule_table(arch: str, rules: dict, default: dict, meta: dict) -> dict:
    return {"arch": arch, "provisional": False, "source": meta,
            "triton": {"default": default, "classes": [{"match": m, "rule": r} for m, r in rules.values()]}}


# What a point keeps from the sweep (the rest is the final comparison's, redone with the new table).
_SWEPT = ("class", "head_size", "num_query_heads", "num_kv_heads", "kv_dtype", "ctx", "seqs", "width", "stock_us",
          "candidates", "best", "best_us", "floor_us")


def earlier_meta(path: str) -> dict:
    meta = json.loads(Path(path).read_text())["meta"]
    out = {"date": meta.get("date"), "classes": [c["name"] for c in meta.get("classes", [])]}
    if meta.get("merged"):  # that run's own merged sweeps: where each class was measured
        out["merged"] = meta["merged"]
    return out


def _rule(coef, exp, lo, unsplit, fill, max_seqs, max_q, base_shape="t64w4s2", wide_shapes=None, wide_scales=None,
          programs_exp=None):
    wide_shapes, wide_scales = wide_shapes or {}, wide_scales or {}
    launch = {}
    for bm, shapes in WIDE_SHAPES.items():
        name = wide_shapes.get(bm, next(iter(shapes)))
        launch[str(bm)] = dict(shapes[name])
        if wide_scales.get(bm, 1) != 1:
            launch[str(bm)]["split_scale"] = wide_scales[bm]
    shape = BASE_SHAPES[base_shape]
    rule = {"max_query_len": max_q, "max_seqs": max_seqs,
            "split": {"coef": coef, "exp": exp, "min": lo, "max": max(_segments(shape)), "unsplit_below": unsplit,
                      **({} if programs_exp is None or programs_exp == exp else {"programs_exp": programs_exp})},
            "wide": {"block_m": sorted(WIDE_SHAPES), "min_fill": fill, "launch": launch}}
    for key in ("tile", "warps", "stages", "kernel", "registers", "table_ahead", "partial_pass"):
        if key in shape:
            rule[f"{key}_3d"] = shape[key]
    return rule


def _score(points: list[dict], geos: list[policy.Geometry], arch: str, rule: dict) -> tuple:
    table = {"arch": arch, "triton": {"default": rule, "classes": []}}
    slow, regret, missing = 0, 0.0, 0
    for p, geo in zip(points, geos):
        t = _time_of(p, policy.triton_launch(geo, table))
        if t is None:
            missing += 1
            continue
        slow += t > 1.03 * p["stock_us"]
        regret += math.log(t / p["best_us"])
    return missing, slow, regret


def fit(points: list[dict], arch: str, max_seqs: int, max_q: int) -> tuple[dict, dict]:
    """Fit the rule's constants to measured points by coordinate search; returns (rule, score).

    Objective, in order: choices that were not measured, points slower than stock by >3%, total
    log-regret against the best measured candidate. Two rounds over (base launch shape x split
    coefficient and exponent: a shape's best split count moves with its tile and warps, so the two
    are searched together), (split coefficient x the tiles' and the programs' exponents, apart, the
    coefficient over a wider range: a fixed number of blocks a launch is coef 256, exponents 0 and
    1), (wider blocks' shapes x BLOCK_M fill threshold: a wider block pays off
    only with its own shape), (each wider block's shape x its factor on the split coefficient, in
    steps of sqrt(2): searched apart from the shape, a shape the fill search chose kept the
    factor fitted to the one before it), then (split coef, exponent, lower bound, unsplit threshold) keep it to a few
    thousand policy evaluations per point set (a minute or two for the sweep's 400 points in one
    process; fit_table fits the class rules in parallel).
    """
    params = {"coef": 16.0, "exp": 1 / 3, "pexp": None, "lo": 4, "unsplit": 0, "fill": 0.8,
              "base": next(iter(BASE_SHAPES)),
              **{f"w{bm}": next(iter(shapes)) for bm, shapes in WIDE_SHAPES.items()},
              **{f"s{bm}": 1 for bm in WIDE_SHAPES}}
    coefs, exps = tuple(2 ** (i / 2) for i in range(2, 15)), (0.25, 1 / 3, 0.5)
    # the programs' own exponent (None: exp's): 1 with exp 0 is a fixed number of blocks a launch
    wide_coefs, pexps = tuple(2 ** (i / 2) for i in range(2, 21)), (None, 0.5, 0.75, 1.0)
    # 1 first: a tie keeps the earlier value, so a block no point uses keeps its factor of 1
    scales = (1, 2 ** -0.5, 0.5, 2 ** -1.5, 0.25, 2 ** 0.5, 2, 2 ** 1.5, 4)
    grids = [
        {"base": tuple(BASE_SHAPES), "coef": coefs, "exp": exps},
        {"coef": wide_coefs, "exp": (0.0, *exps), "pexp": pexps},
        {**{f"w{bm}": tuple(shapes) for bm, shapes in WIDE_SHAPES.items()},
         "fill": (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.01)},
        *({f"w{bm}": tuple(shapes), f"s{bm}": scales} for bm, shapes in WIDE_SHAPES.items()),
        {"coef": wide_coefs, "exp": (0.0, *exps), "lo": (4, 8), "unsplit": (0, 2, 4, 8)},
    ]

    geos = [_geo(p, arch) for p in points]  # the same for every trial rule

    def make(t):
        return _rule(t["coef"], t["exp"], t["lo"], t["unsplit"], t["fill"], max_seqs, max_q, t["base"],
                     {bm: t[f"w{bm}"] for bm in WIDE_SHAPES}, {bm: t[f"s{bm}"] for bm in WIDE_SHAPES}, t["pexp"])

    best = None
    for _ in range(2):
        for grid in grids:
            names = list(grid)
            for values in itertools.product(*(grid[n] for n in names)):
                trial = dict(params, **dict(zip(names, values)))
                rule = make(trial)
                score = _score(points, geos, arch, rule)
                if best is None or score < best[0]:
                    best = (score, rule, trial)
            params = best[2]
    (missing, slow, regret), rule, _ = best
    return rule, {"points": len(points), "unmeasured_choices": missing, "slower_than_stock_3pct": slow,
                  "mean_regret_pct": 100 * (math.exp(regret / max(1, len(points) - missing)) - 1)}


def _geo(p: dict, arch: str) -> policy.Geometry:
    return policy.Geometry(arch=arch, head_size=p["head_size"], num_query_heads=p["num_query_heads"],
                           num_kv_heads=p["num_kv_heads"], num_tokens=p["seqs"] * p["width"], num_seqs=p["seqs"],
                           max_seqlen_q=p["width"], max_seqlen_k=p["ctx"], q_dtype="bf16", kv_dtype=p["kv_dtype"])


def _key(launch: policy.TritonLaunch | None) -> str:
    if launch is None:
        return "stock"
    key = f"s{launch.num_segments}_m{launch.block_m}_t{launch.tile_size}_w{launch.num_warps}_st{launch.num_stages}"
    key += f"_r{launch.max_registers}" if launch.max_registers is not None else ""
    key += "_ta" if launch.table_ahead else ""
    key += "_wg" if launch.partial_pass == "cuda_warpgroup" else ""
    return key + "_rk" if launch.kernel == "radiance" else key


def _time_of(p: dict, launch) -> float | None:
    if launch is None:
        return p["stock_us"]
    return p["candidates"].get(_key(launch))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="radiance-attn tune", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="results directory (table, plot, JSON, fitted table)")
    ap.add_argument("--kernel-src", required=True, help="directory written by stage_vllm_kernel.py")
    ap.add_argument("--quick", action="store_true", help="small grid, bf16 KV only")
    ap.add_argument("--budget-s", type=float, default=270.0, help="stop sweeping new points after this many seconds (the fit and the stock comparison follow)")
    ap.add_argument("--jobs", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)),
                    help="worker processes for the kernel builds and the fit")
    ap.add_argument("--classes", help="comma list of class names to sweep (default: all)")
    ap.add_argument("--merge", action="append", default=[], metavar="JSON",
                    help="bench_unified_attention.json of an earlier run on this GPU: its classes' swept "
                         "candidates join the fit and the final comparison instead of being swept again")
    ap.add_argument("--extend", default="", metavar="CLASSES",
                    help="comma list of --merge'd classes whose points get the candidates they lack timed "
                         "(a new launch shape), keeping the ones measured before")
    ap.add_argument("--retime", metavar="REGEX",
                    help="with --extend: also time again the merged candidates whose key matches (e.g. "
                         "'_wg_rk$', the warpgroup pass, after a change to it)")
    ap.add_argument("--extend-only", metavar="REGEX",
                    help="with --extend: of the candidates a point lacks, time only those whose key matches "
                         "(e.g. '_st1_wg_rk$', one new launch shape)")
    ap.add_argument("--fit-only", action="store_true",
                    help="sweep nothing: fit the --merge'd points and time the fitted table against stock")
    args = ap.parse_args(argv)
    if args.fit_only and not args.merge:
        ap.error("--fit-only needs --merge")
    extend = set(filter(None, args.extend.split(",")))
    if extend and not args.merge:
        ap.error("--extend needs --merge")
    if args.retime and not extend:
        ap.error("--retime needs --extend")
    if args.extend_only and not extend:
        ap.error("--extend-only needs --extend")
    retime = re.compile(args.retime) if args.retime else None
    only = re.compile(args.extend_only) if args.extend_only else None
    if extend - {c.name for c in CLASSES}:
        ap.error(f"unknown classes {sorted(extend - {c.name for c in CLASSES})}")
    torch = _torch()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("radiance-attn tune: needs a CUDA/ROCm GPU; nothing measured")
        return 2
    t_start = time.time()
    module = kernel_source.load(args.kernel_src)
    manifest = module.RADIANCE_MANIFEST
    device = torch.device("cuda")
    arch = detect_arch(device)
    props = torch.cuda.get_device_properties(device)
    grid = QUICK_GRID if args.quick else FULL_GRID
    fp8_ok = torch.version.hip is not None or torch.cuda.get_device_capability(device) >= (8, 9)
    classes = [c for c in CLASSES if (c.kv_dtype == "bf16" or (fp8_ok and not args.quick))]
    if not fp8_ok:
        print("fp8 KV skipped: this GPU has no fp8 dot support in Triton")
    if args.classes:
        wanted = set(args.classes.split(","))
        unknown = wanted - {c.name for c in CLASSES}
        if unknown:
            ap.error(f"unknown classes {sorted(unknown)}")
        classes = [c for c in classes if c.name in wanted]
    if args.fit_only or (extend and not args.classes):
        classes = []  # nothing swept anew: --extend alone only adds candidates to merged points
    merged = []
    for path in args.merge:
        earlier = json.loads(Path(path).read_text())
        if earlier["meta"].get("gpu") != props.name:
            ap.error(f"{path} was measured on {earlier['meta'].get('gpu')}, not {props.name}")
        merged += [dict({k: v for k, v in p.items() if k in _SWEPT}, merged=True) for p in earlier["points"]
                   if p["class"] not in {c.name for c in classes}]
    classes_all = classes + [c for c in CLASSES if c not in classes and any(p["class"] == c.name for p in merged)]
    work = [(k, c, s, w) for k in classes for c in grid["ctx"] for s in grid["seqs"] for w in grid["width"]]
    import triton

    meta = {"gpu": props.name, "arch": arch, "sms": props.multi_processor_count, "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda or torch.version.hip,
            "vllm_kernel_from": manifest.get("vllm_version", "unknown"),
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "python": platform.python_version(), "grid": {k: list(v) for k, v in grid.items()},
            "classes": [asdict(c) for c in classes_all],
            "merged": {"from": [earlier_meta(p) for p in args.merge], "points": len(merged)} if merged else None}
    print(f"radiance-attn tune on {props.name} ({arch}), kernel from vLLM {meta['vllm_kernel_from']}, "
          f"{len(work)} points, {args.jobs} workers")
    if work:
        print(f"precompiled in {precompile(str(args.kernel_src), work, args.jobs):.0f}s")

    points, skipped = [], 0
    unbuilt: dict[tuple, str] = {}  # (class, build) that does not build on this GPU: left out
    refused: dict[tuple, str] = {}  # (class, launch) a partial pass has no instance of here: left out
    runner = RadianceUnifiedAttention(module, arch=arch, num_sms=props.multi_processor_count, table={})
    by_class = {}
    for k, ctx, seqs, width in work:
        if time.time() - t_start > args.budget_s:
            skipped += 1
            continue
        if k.name not in by_class:
            by_class.clear()
            torch.cuda.empty_cache()
            max_tokens = max(grid["ctx"]) * max(grid["seqs"])
            by_class[k.name] = Bench(module, k, max_tokens, device)
        b = by_class[k.name]
        sets = b.point(ctx, seqs, width)
        stock_us = time_stock(module, b, sets)
        cands = time_candidates(runner, k, b, sets, candidate_launches(k, ctx, seqs, width), unbuilt, refused)
        best_key = min(cands, key=cands.get)
        points.append({"class": k.name, "head_size": k.head_size, "num_query_heads": k.num_query_heads,
                       "num_kv_heads": k.num_kv_heads, "kv_dtype": k.kv_dtype, "ctx": ctx, "seqs": seqs,
                       "width": width, "stock_us": stock_us, "candidates": cands,
                       "best": best_key, "best_us": cands[best_key], "floor_us": b.floor_us(ctx, seqs)})
        print(f"  {k.name:14s} ctx={ctx:6d} seqs={seqs} w={width}: stock {stock_us:8.1f} us, "
              f"best {cands[best_key]:8.1f} us ({best_key}), floor {b.floor_us(ctx, seqs):7.1f} us", flush=True)
    # longest contexts first (a class at a time), so a budget cut leaves out short contexts, not the
    # >= 32K points the 2x-of-the-floor target is about
    to_extend = sorted((p for p in merged if p["class"] in extend), key=lambda p: (p["class"], -p["ctx"]))
    if to_extend:  # build the added launch shapes in parallel first, as the sweep does
        by_point = {(p["class"], p["ctx"], p["seqs"], p["width"]): p for p in to_extend}
        pre = precompile(str(args.kernel_src), [(next(c for c in CLASSES if c.name == p["class"]), p["ctx"], p["seqs"],
                                                 p["width"]) for p in to_extend], args.jobs,
                         launches=lambda k, ctx, seqs, width: [
                             c for c in candidate_launches(k, ctx, seqs, width)
                             if _needs_timing(by_point[(k.name, ctx, seqs, width)], _key(c), retime, only)])
        print(f"precompiled the added candidates in {pre:.0f}s")
    added = 0
    for p in to_extend:
        if time.time() - t_start > args.budget_s:
            skipped += 1
            continue
        k = next(c for c in CLASSES if c.name == p["class"])
        if k.name not in by_class:
            by_class.clear()
            torch.cuda.empty_cache()
            by_class[k.name] = Bench(module, k, max(grid["ctx"]) * max(grid["seqs"]), device)
        added += extend_point(p, runner, k, by_class[k.name], unbuilt, refused, retime, only)
        print(f"  {k.name:14s} ctx={p['ctx']:6d} seqs={p['seqs']} w={p['width']}: {len(p['extended'])} candidates "
              f"timed, best {p['best_us']:8.1f} us ({p['best']})", flush=True)
    if extend:
        meta["extended"] = {"classes": sorted(extend), "candidates_timed": added, "retimed": args.retime,
                            "only": args.extend_only}
    if skipped:
        print(f"budget {args.budget_s:.0f}s reached: {skipped} points not measured")
    for (name, key), why in sorted(unbuilt.items()):
        print(f"not built here, left out: {name} {key} ({why})")
    for (name, key), why in sorted(refused.items()):
        print(f"no instance here, left out: {name} {key} ({why})")
    meta["unbuilt"] = {f"{name} {key}": why for (name, key), why in sorted(unbuilt.items())}
    meta["refused"] = {f"{name} {key}": why for (name, key), why in sorted(refused.items())}
    points += merged
    classes = classes_all

    # ---- fit -----------------------------------------------------------------------------------
    table, fits = fit_table(points, classes, arch, max(grid["seqs"]), max(grid["width"]), meta, jobs=args.jobs)
    tdir = out / "tables"
    tdir.mkdir(exist_ok=True)
    table_path = tdir / tables.table_file(arch).name
    table_path.write_text(json.dumps(table, indent=1) + "\n")
    if not work:  # nothing swept, so nothing built yet: build what the fitted table launches
        by_name = {c.name: c for c in CLASSES}
        chosen = [(by_name[p["class"]], p["ctx"], p["seqs"], p["width"]) for p in points]
        pre = precompile(str(args.kernel_src), chosen, args.jobs, launches=lambda k, ctx, seqs, width: [
            c for c in [policy.triton_launch(_geo(dict(asdict(k), ctx=ctx, seqs=seqs, width=width), arch), table)]
            if c is not None])
        print(f"precompiled the table's launches in {pre:.0f}s")

    # ---- radiance (fitted table, own wrapper) vs stock, exactness --------------------------------
    rad = RadianceUnifiedAttention(module, arch=arch, num_sms=props.multi_processor_count, table=table)
    for p in points:
        k = next(c for c in classes if c.name == p["class"])
        if k.name not in by_class:
            by_class.clear()
            torch.cuda.empty_cache()
            by_class[k.name] = Bench(module, k, max(grid["ctx"]) * max(grid["seqs"]), device)
        b = by_class[k.name]
        sets = b.point(p["ctx"], p["seqs"], p["width"])
        if p.get("merged"):  # swept in an earlier run: stock is timed again here, beside radiance
            p["stock_us"] = time_stock(module, b, sets)
        p["radiance_us"], launch = time_wrapper(rad, b, sets)  # the timed calls' own launch
        p["radiance"] = launch.describe() if launch is not None else "stock wrapper"
        p["stock"] = "split-KV 16 segments" if p["width"] == 1 else "unsplit 2D, BLOCK_M 16"
        kw0 = sets[0]
        s_out, r_out = torch.empty_like(kw0["q"]), torch.empty_like(kw0["q"])
        module.unified_attention(**dict(b.stock_kwargs(kw0, manifest), out=s_out))
        rad(**dict(b.radiance_kwargs(kw0), out=r_out))
        torch.cuda.synchronize()
        err = (r_out.float() - s_out.float()).abs()
        diff = err.max().item()
        scale = s_out.float().abs().max().item()
        p["max_abs_diff"] = diff
        # bf16 rounding of the output: half an ulp at the output's magnitude is 2^-9 relative;
        # two differently-ordered fp32 sums may round to neighbouring bf16 values, so allow 2 ulps.
        p["exact_within_bf16"] = diff <= 2 * 2.0**-7 * max(scale, 1e-6)
        p["row_ulps_max"] = row_ulps(r_out, s_out)
        p["vs_stock"] = p["stock_us"] / p["radiance_us"]
        p["vs_floor"] = p["radiance_us"] / p["floor_us"]
    write_results(out, points, meta, fits, table_path, time.time() - t_start, skipped)
    return 0


def write_results(out: Path, points, meta, fits, table_path, elapsed, skipped) -> None:
    long_ctx = [p for p in points if p["ctx"] >= 32768]
    within2 = sum(p["vs_floor"] <= 2.0 for p in long_ctx)
    slower = [p for p in points if p["radiance_us"] > 1.03 * p["stock_us"]]
    inexact = [p for p in points if not p["exact_within_bf16"]]
    rows_ulps = [p["row_ulps_max"] for p in points if "row_ulps_max" in p]
    summary = {"points": len(points), "not_measured_budget": skipped, "elapsed_s": round(elapsed, 1),
               "ctx_ge_32k_within_2x_floor": f"{within2}/{len(long_ctx)}",
               "slower_than_stock_by_3pct": len(slower), "not_exact_within_bf16": len(inexact),
               "worst_row_ulps": round(max(rows_ulps), 3) if rows_ulps else None,
               "points_any_row_over_2_ulps": sum(u > 2 for u in rows_ulps),
               "fits": fits, "table": str(Path(table_path).relative_to(out))}
    (out / "bench_unified_attention.json").write_text(json.dumps({"meta": meta, "summary": summary, "points": points}, indent=1) + "\n")
    lines = [f"# vLLM Triton unified attention: stock vs radiance on {meta['gpu']} ({meta['arch']})", "",
             f"torch {meta['torch']}, Triton {meta['triton']}, CUDA/HIP {meta['cuda']}, kernel from vLLM "
             f"{meta['vllm_kernel_from']}, {meta['date']}. Medians of CUDA-graph replays, random data, KV "
             f"rotated past L2. Floor: the batch's KV bytes read once at {COPY_BW / 1e12:.2f} TB/s.", "",
             f"Summary: {json.dumps(summary)}", "",
             "exact: the largest difference within 2 bf16 ulps of the output's largest value; row ulps: "
             "the largest difference of any (token, head) row in ulps of that row's own largest value.", "",
             "| class | ctx | seqs | width | stock µs | radiance µs | speedup | floor µs | radiance/floor | exact | row ulps | radiance launch |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|:-:|---:|---|"]
    for p in points:
        lines.append(f"| {p['class']} | {p['ctx']} | {p['seqs']} | {p['width']} | {p['stock_us']:.1f} | "
                     f"{p['radiance_us']:.1f} | {p['vs_stock']:.2f}x | {p['floor_us']:.1f} | {p['vs_floor']:.2f} | "
                     f"{'yes' if p['exact_within_bf16'] else 'NO'} | {p.get('row_ulps_max', float('nan')):.2f} | "
                     f"{p['radiance']} |")
    (out / "bench_unified_attention.md").write_text("\n".join(lines) + "\n")
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(1, 2, figsize=(13, 5))
        for cls in sorted({p["class"] for p in points}):
            ps = [p for p in points if p["class"] == cls]
            ax[0].scatter([p["ctx"] for p in ps], [p["stock_us"] / p["floor_us"] for p in ps], marker="x", alpha=0.5, label=f"{cls} stock")
            ax[0].scatter([p["ctx"] for p in ps], [p["vs_floor"] for p in ps], marker="o", alpha=0.7, label=f"{cls} radiance")
            ax[1].scatter([p["width"] + 0.1 * p["seqs"] for p in ps], [p["vs_stock"] for p in ps], alpha=0.7, label=cls)
        ax[0].set(xscale="log", yscale="log", xlabel="context", ylabel="time / KV-read floor", title="distance to the KV-read floor")
        ax[0].axhline(2.0, color="k", lw=0.8, ls="--")
        ax[1].set(yscale="log", xlabel="verify width (+0.1 x seqs)", ylabel="stock / radiance", title="speedup over stock")
        ax[1].axhline(1 / 1.03, color="r", lw=0.8, ls="--")
        ax[0].legend(fontsize=6)
        ax[1].legend(fontsize=6)
        fig.suptitle(f"{meta['gpu']}: vLLM unified attention, stock vs radiance")
        fig.tight_layout()
        fig.savefig(out / "bench_unified_attention.png", dpi=110)
    print()
    print(f"{'class':14s} {'ctx':>6s} {'seqs':>4s} {'w':>2s} {'stock':>9s} {'radiance':>9s} {'x':>6s} {'/floor':>7s}")
    for p in points:
        print(f"{p['class']:14s} {p['ctx']:6d} {p['seqs']:4d} {p['width']:2d} {p['stock_us']:9.1f} "
              f"{p['radiance_us']:9.1f} {p['vs_stock']:6.2f} {p['vs_floor']:7.2f}")
    print(json.dumps(summary, indent=1))
    print(f"fitted table: {table_path} (copy to src/radiance/attn/tables/ to ship it)")


if __name__ == "__main__":
    sys.exit(main())
