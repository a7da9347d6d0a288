"""Whether a change to the split-KV kernels keeps their outputs bit for bit: fixed-seed cases
through ``split_kv_kernel.launch``, saved by one source tree and compared with another's.

    PYTHONPATH=BASE/packages/radiance-attn/src:BASE/packages/radiance-kernels/src:$PYTHONPATH \\
        python benchmarks/outputs_of_build.py save base.pt
    python benchmarks/outputs_of_build.py save new.pt
    python benchmarks/outputs_of_build.py compare base.pt new.pt

Cases: bf16 and fp8 KV, head 256 (16 query heads, 2 KV heads) and head 128 (32, 8), widths 1, 4
and 9, over the GPU tests' three sequences (5,000, 37 and 2,051 keys, so some segments hold no
keys); each partial pass (Triton at 16 and 64 segments, the mma.sync pass at 16, the warpgroup
pass at 16 and 64), scratch and outputs poisoned with NaN first. A launch shape a pass does not
have is recorded as its refusal on both sides.
"""

import argparse
import sys
from pathlib import Path

try:
    from radiance.attn import policy, split_kv_kernel
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from radiance.attn import policy, split_kv_kernel

PASSES = (("triton", 16), ("triton", 64), ("cuda", 16), ("cuda_warpgroup", 16), ("cuda_warpgroup", 64))


def _launch(partial_pass: str, segments: int, width: int, group: int) -> policy.TritonLaunch:
    rows = width * group
    if partial_pass == "cuda_warpgroup":  # the MMA's N: 8 x n_tiles columns
        n_tiles = next(n for n in (2, 4, 5, 6, 9) if 8 * n >= rows)
        return policy.TritonLaunch(segments, 8 * n_tiles, width, 64, 4, 2, "t", kernel="radiance")
    if partial_pass == "cuda":  # row tiles of 16, two key warps of 16 keys
        return policy.TritonLaunch(segments, 16 * -(-rows // 16), width, 32, 2, 2, "t", kernel="radiance")
    return policy.TritonLaunch(segments, max(16, 1 << (rows - 1).bit_length()), width, 32, 4, 2, "t", kernel="radiance")


def save(path: Path) -> int:
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
                for partial_pass, segments in PASSES:
                    launch = _launch(partial_pass, segments, width, q_heads // kv_heads)
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


def compare(base: Path, new: Path) -> int:
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("path", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("base", type=Path)
    c.add_argument("new", type=Path)
    args = ap.parse_args(argv)
    return save(args.path) if args.cmd == "save" else compare(args.base, args.new)


if __name__ == "__main__":
    sys.exit(main())
