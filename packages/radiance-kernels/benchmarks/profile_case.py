"""Run one epilogue op a few times on random data, for a profiler to attach to.

    ncu --clock-control none -k regex:add_rms_quant --launch-skip 3 --launch-count 1 \\
        python benchmarks/profile_case.py --op add_rms_quant --group 128 -K 4096 -M 8192
"""

from __future__ import annotations

import argparse
import sys

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="add_rms_quant",
                    choices=("add_rms_quant", "silu_mul_quant", "gdn_norm_quant"))
    ap.add_argument("--group", type=int, default=0)
    ap.add_argument("-K", type=int, default=4096)
    ap.add_argument("-M", type=int, default=8192)
    ap.add_argument("--calls", type=int, default=6)
    args = ap.parse_args()
    from radiance.kernels import ops

    m, k = args.M, args.K
    r = lambda *s: torch.randn(*s, device="cuda").to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(k, device="cuda")).to(torch.bfloat16)
    for _ in range(args.calls):
        if args.op == "add_rms_quant":
            ops.add_rms_quant(r(m, k), r(m, k), w, 1e-6, group=args.group)
        elif args.op == "silu_mul_quant":
            ops.silu_mul_quant(r(m, 2 * k), group=args.group)
        else:
            ops.gdn_norm_quant(r(m, k), r(m, k), w[:128].contiguous(), 1e-6, group=args.group)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
