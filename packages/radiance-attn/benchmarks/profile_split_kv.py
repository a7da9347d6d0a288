"""Run radiance's split-KV kernel alone at one point, for a profiler (Nsight Compute / Systems).

    ncu --clock-control none -k "regex:_partial|_reduce" --launch-skip 6 --launch-count 2 \\
        python benchmarks/profile_split_kv.py --class h256_kv2_fp8 --ctx 32768 --seqs 1 --width 1

The launch is the shipped table's for that geometry (or ``--segments/--tile/--warps/--block-m``),
on the tuning harness's inputs (random KV, unit fp8 scales); it runs ``--reps`` times. ``--cuda``
runs radiance-kernels' CUDA partial pass instead of the Triton one (``--warps`` its key warps,
``--tile`` / ``--warps`` keys a warp, ``--stages`` its ring depth; the kernel is
``split_kv_partial_kernel``); ``--warpgroup`` its warpgroup form (64-key tiles, ``--stages``;
``split_kv_warpgroup_kernel``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

try:
    from radiance.attn import tune
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from radiance.attn import tune
from radiance.attn import policy, split_kv_kernel, tables


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--class", dest="klass", default="h256_kv2_fp8", choices=[c.name for c in tune.CLASSES])
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--seqs", type=int, default=1)
    ap.add_argument("--width", type=int, default=1)
    ap.add_argument("--segments", type=int)
    ap.add_argument("--tile", type=int)
    ap.add_argument("--warps", type=int)
    ap.add_argument("--block-m", type=int)
    ap.add_argument("--stages", type=int)
    ap.add_argument("--cuda", action="store_true", help="the CUDA partial pass")
    ap.add_argument("--warpgroup", action="store_true", help="the CUDA partial pass's warpgroup form (64-key tiles)")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    import torch

    k = next(c for c in tune.CLASSES if c.name == args.klass)
    b = tune.Bench(None, k, args.ctx * args.seqs, torch.device("cuda"), rotate_bytes=0)
    kw = b.radiance_kwargs(b.point(args.ctx, args.seqs, args.width)[0])
    geo = tune._geo({"head_size": k.head_size, "num_query_heads": k.num_query_heads, "num_kv_heads": k.num_kv_heads,
                     "kv_dtype": k.kv_dtype, "seqs": args.seqs, "width": args.width, "ctx": args.ctx}, "sm_90")
    qpkv = k.num_query_heads // k.num_kv_heads
    launch = policy.triton_launch(dataclasses.replace(geo, num_sms=132), tables.for_arch("sm_90"))
    if launch is None:  # the table keeps stock here: profile a plain 64-segment launch
        launch = policy.TritonLaunch(64, 16, max(1, 16 // qpkv), 64, 4, 2, "profile")
    bm = args.block_m or launch.block_m
    if args.cuda:  # the query rows padded to 16, not to BLOCK_M
        bm = 16 * -(-args.width * qpkv // 16)
    launch = dataclasses.replace(launch, kernel="radiance", num_segments=args.segments or launch.num_segments,
                                 tile_size=args.tile or launch.tile_size, num_warps=args.warps or launch.num_warps,
                                 block_m=bm, block_q=max(1, bm // qpkv),
                                 num_stages=args.stages or launch.num_stages)
    if args.cuda:  # num_warps: the key warps (None: tile / 32)
        launch = dataclasses.replace(launch, block_q=args.width, num_warps=args.warps)
    if args.warpgroup:
        launch = dataclasses.replace(launch, block_q=args.width, tile_size=64)
    print(f"{k.name} ctx={args.ctx} seqs={args.seqs} width={args.width}: {launch.describe()}", flush=True)
    for _ in range(args.reps):
        split_kv_kernel.launch(kw["q"], kw["k"], kw["v"], kw["out"], kw["cu_seqlens_q"], kw["seqused_k"],
                               kw["block_table"], kw["max_seqlen_q"], kw["softmax_scale"], kw["k_descale"],
                               kw["v_descale"], launch, b.segm_out, b.segm_max, b.segm_sum,
                               partial_pass="cuda_warpgroup" if args.warpgroup else "cuda" if args.cuda else "triton")
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
