"""Run one of radiance's CUDA decode GEMMs (provider ``cuda_decode``, or ``cuda_tma`` on sm_90) a
few times on random data, for a profiler.

    ncu --clock-control none -k regex:block_fp8_mm --launch-skip 3 --launch-count 1 \\
        python benchmarks/profile_decode_gemm.py -N 5120 -K 4096 -M 1 --config skauto-w4-r1-s4
    ... profile_decode_gemm.py --provider cuda_tma --config skauto-s8
"""

from __future__ import annotations

import argparse
import sys

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-N", type=int, default=5120)
    ap.add_argument("-K", type=int, default=4096)
    ap.add_argument("-M", type=int, default=1)
    ap.add_argument("--provider", default="cuda_decode", choices=("cuda_decode", "cuda_tma"))
    ap.add_argument("--config", default=None, help="launch config (default: the provider's)")
    ap.add_argument("--calls", type=int, default=6)
    args = ap.parse_args()
    from radiance.gemm import providers, reference

    x = torch.randn(args.M, args.K, device="cuda")
    w = torch.randn(args.N, args.K, device="cuda") * 0.05
    q, sa = reference.quantize_activation(x)
    wq, sw = reference.quantize_weight(w)
    for _ in range(args.calls):
        providers.run(args.provider, q, wq, sa, sw, torch.bfloat16, args.config)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
