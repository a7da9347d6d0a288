"""Run under TRITON_INTERPRET=1 (by test_split_kv_kernel.py): radiance's split-KV kernel vs the
reference on CPU tensors (fp16 queries: the interpreter's bf16 stores are not faithful). One JSON
line per case; with the argument ``reduce``, the reduce kernel's contract instead (one line)."""

import json
import sys

import torch

from radiance.attn import policy, reference, split_kv_kernel

CASES = (
    # name, q heads, kv heads, head, seqs, width, context lengths, kv dtype, segments, BLOCK_M, tile, q magnitude
    ("decode", 8, 2, 64, 2, 1, [200, 77], "fp16", 8, 16, 32, 1.0),
    ("verify", 8, 2, 64, 2, 4, [200, 163], "fp16", 4, 16, 16, 1.0),
    ("fp8_wide", 8, 2, 64, 1, 8, [250], "fp8", 4, 32, 32, 1.0),
    ("fp8_uneven", 8, 2, 64, 3, 3, [250, 40, 3], "fp8", 16, 16, 64, 1.0),
    ("fp8_group3_head80", 6, 2, 80, 2, 5, [130, 61], "fp8", 8, 16, 32, 1.0),
    ("fp8_large_q", 8, 2, 64, 2, 2, [180, 90], "fp8", 4, 16, 32, 1.0e4),
    ("fp8_tiny_q", 8, 2, 64, 2, 2, [180, 90], "fp8", 4, 16, 32, 1.0e-6),
)


# A batch padded the way vLLM pads one to a captured CUDA-graph size: PAD empty requests (no keys,
# the query offsets repeating the last) and PAD query rows past the real ones, left unwritten.
PAD = 3


def run_case(name, H, KVH, D, seqs, width, ctxs, kv, seg, bm, tile, qmag, table_ahead=False):
    torch.manual_seed(len(name) * 7 + seqs)
    BS, nblk = 16, 64
    kf, vf = torch.randn(nblk, BS, KVH, D), torch.randn(nblk, BS, KVH, D)
    T = seqs * width
    q = (torch.randn(T + PAD, H, D) * qmag).to(torch.float16)
    if kv == "fp8":
        k, v = (kf * 40).to(torch.float8_e4m3fn), (vf * 40).to(torch.float8_e4m3fn)
        ks, vs = 0.011, 0.023
        k_scale, v_scale = torch.tensor([ks]).expand(seqs + PAD, KVH), torch.tensor([vs]).expand(seqs + PAD, KVH)
        sm_scale = D**-0.5 if qmag <= 1 else D**-0.5 / qmag  # keep the softmax informative at any q size
    else:
        k, v, ks, vs, k_scale, v_scale, sm_scale = kf.half(), vf.half(), 1.0, 1.0, None, None, D**-0.5
    lens = torch.tensor(ctxs + [0] * PAD, dtype=torch.int32)
    cu = torch.tensor(list(range(0, T + 1, width)) + [T] * PAD, dtype=torch.int32)
    bt = torch.randperm(nblk).to(torch.int32)[: seqs * 16].view(seqs, 16)
    bt = torch.cat([bt, bt[:1].expand(PAD, 16)])  # the padding requests' rows: never read
    launch = policy.TritonLaunch(seg, bm, bm // (H // KVH), tile, 4, 2, "test", kernel="radiance",
                                 table_ahead=table_ahead)
    units = (T + PAD) * H * seg
    part = (torch.full((units * policy.next_pow2(D),), float("nan")), torch.full((units,), float("nan")),
            torch.full((units,), float("nan")))
    out = torch.full_like(q, float("nan"))
    assert split_kv_kernel.launch_refusal(launch, "fp16", kv, H // KVH) is None
    assert split_kv_kernel.call_refusal(q, k, v, out, k_scale, v_scale) is None
    split_kv_kernel.launch(q, k, v, out, cu, lens, bt, width, sm_scale, k_scale, v_scale, launch, *part)
    ref = reference.unified_attention(q[:T], k, v, cu[: seqs + 1], lens[:seqs], bt[:seqs], sm_scale, ks, vs,
                                      dtype=torch.float64)
    err = (out[:T].double() - ref).abs()
    row_max = ref.abs().amax(-1).clamp_min(1e-30)
    return out, {"name": name, "finite": bool(torch.isfinite(out[:T]).all()),
                 "padding_untouched": bool(out[T:].isnan().all()),
                 "row_ulps_fp16": (err.amax(-1) / (2.0**-10 * row_max)).max().item(), "ref_max": ref.abs().max().item()}


def reduce_contract():
    """The reduce alone on partials written here: a segment with max -inf is left out whatever its
    output slot holds (a partial pass stores none there), a NaN max reaches its row's output, and
    a token past the batch's (padding) is not written. Against float64 on the other rows."""
    _, reduce = split_kv_kernel._kernels()
    torch.manual_seed(5)
    T, H, S, D = 3, 2, 4, 16  # tokens 0-1 are the one sequence's, token 2 pads the batch
    maxes, sums, part = torch.randn(T, H, S) * 3, torch.rand(T, H, S) + 0.5, torch.randn(T, H, S, D)
    maxes[0, 0, 2:], sums[0, 0, 2:], part[0, 0, 2:] = float("-inf"), 0.0, float("nan")
    maxes[1, 1, 1] = float("nan")
    cu = torch.tensor([0, 2], dtype=torch.int32)
    out = torch.full((T, H, D), float("nan"), dtype=torch.float16)
    reduce[(T, H, 1)](out, part.flatten(), maxes.flatten(), sums.flatten(), cu, 1, out.stride(0), out.stride(1), H,
                      HEAD=D, HEAD_P=D, NUM_SEGMENTS=S, D_CHUNK=D)
    m, l, o = maxes.double(), sums.double(), part.double()
    ok = m != float("-inf")
    w = torch.where(ok, torch.exp2(m - m.amax(-1, keepdim=True)), 0.0)
    ref = (torch.where(ok[..., None], o, 0.0) * w[..., None]).sum(-2) / (w * l).sum(-1, keepdim=True)
    clean = [(0, 0), (0, 1), (1, 0)]
    err = max(((out[t, h].double() - ref[t, h]).abs().max() / (2.0**-10 * ref[t, h].abs().max())).item()
              for t, h in clean)
    return {"name": "reduce_contract", "finite": all(bool(torch.isfinite(out[t, h]).all()) for t, h in clean),
            "nan_max_row_nan": bool(out[1, 1].isnan().all()), "padding_untouched": bool(out[2].isnan().all()),
            "row_ulps_fp16": err}


def main():
    if sys.argv[1:] == ["reduce"]:
        print(json.dumps(reduce_contract()), flush=True)
        return
    for case in CASES:
        out, rec = run_case(*case)
        # The block table loaded one tile ahead changes where loads are issued, not what is
        # computed: the output must be the same bits (the padding rows stay NaN in both).
        ahead, _ = run_case(*case, table_ahead=True)
        print(json.dumps({**rec, "table_ahead_identical": bool(torch.equal(out[:-PAD], ahead[:-PAD]))}), flush=True)


if __name__ == "__main__":
    main()
