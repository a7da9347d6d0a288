"""Run under TRITON_INTERPRET=1 (by test_exactness.py): radiance's launch vs stock vs reference.

Triton's interpreter runs vLLM's real kernel source on CPU tensors (fp16: the interpreter's
bf16 stores are not faithful). Prints one JSON line per case.
"""

import json
import sys

import torch

from radiance.attn import kernel_source, reference, tables
from radiance.attn.triton_launch import RadianceUnifiedAttention


def run_case(m, seqs, width, ctxs, table, kv="fp16"):
    torch.manual_seed(seqs * 100 + width)
    H, KVH, D, BS = 8, 2, 64, 16
    nblk = 64
    k = torch.randn(nblk, BS, KVH, D, dtype=torch.float16)
    v = torch.randn(nblk, BS, KVH, D, dtype=torch.float16)
    ks = vs = 1.0
    if kv == "fp8":
        ks, vs = 0.011, 0.023
        k, v = (k * 40).to(torch.float8_e4m3fn), (v * 40).to(torch.float8_e4m3fn)
    T = seqs * width
    q = torch.randn(T, H, D, dtype=torch.float16)
    lens = torch.tensor(ctxs, dtype=torch.int32)
    cu = torch.arange(0, T + 1, width, dtype=torch.int32)
    bt = torch.randperm(nblk).to(torch.int32)[: seqs * 16].view(seqs, 16)
    k_scale, v_scale = torch.tensor([ks]).expand(seqs, KVH), torch.tensor([vs]).expand(seqs, KVH)
    base = dict(q=q, k=k, v=v, cu_seqlens_q=cu, max_seqlen_q=width, seqused_k=lens, max_seqlen_k=int(lens.max()),
                softmax_scale=D**-0.5, causal=True, window_size=(-1, -1), block_table=bt, softcap=0,
                q_descale=None, k_descale=k_scale, v_descale=v_scale, kv_quant_mode=1 if kv == "fp8" else 0)
    stock_out = torch.empty_like(q)
    m.unified_attention(**base, out=stock_out, seq_threshold_3D=64, num_par_softmax_segments=16,
                        softmax_segm_output=torch.empty(64 * H * 16 * D), softmax_segm_max=torch.empty(64 * H * 16),
                        softmax_segm_expsum=torch.empty(64 * H * 16))
    r = RadianceUnifiedAttention(m, arch="sm_90", num_sms=132, table=table)
    rad_out = torch.empty_like(q)
    r(**base, out=rad_out, seq_threshold_3D=64, num_par_softmax_segments=16,
      softmax_segm_output=torch.empty(T * H * 128 * D), softmax_segm_max=torch.empty(T * H * 128),
      softmax_segm_expsum=torch.empty(T * H * 128))
    ref = reference.unified_attention(q, k, v, cu, lens, bt, D**-0.5, ks, vs)
    geo, launch, reason = r.last_decision
    return {"seqs": seqs, "width": width, "kv": kv, "kernel": launch.kernel if launch else "stock",
            "launch": launch.describe() if launch else reason,
            "segments": launch.num_segments if launch else 0, "block_m": launch.block_m if launch else 0,
            "tile": launch.tile_size if launch else 0,
            "stock_vs_ref": (stock_out.float() - ref).abs().max().item(),
            "rad_vs_ref": (rad_out.float() - ref).abs().max().item(),
            "rad_vs_stock": (rad_out.float() - stock_out.float()).abs().max().item(),
            "ref_max": ref.abs().max().item()}


def main():
    m = kernel_source.load(sys.argv[1])
    table = tables.copy_of(tables.SM90_PROVISIONAL)
    # widen at >= 60% fill: width 8 x qpkv 4 = 32 rows fills a 32-row block; width 4 (16 rows) stays stock
    table["triton"]["default"]["wide"] = {"block_m": [32, 64], "min_fill": 0.6,
                                          "launch": {"32": {"tile": 16, "warps": 4}, "64": {"tile": 32, "warps": 4}}}
    # the stock block's split launches take the fitted sm_90 shape: 64-token tiles (4 KV blocks
    # of 16 a tile, each token's block looked up on its own), 2 pipeline stages
    table["triton"]["default"].update(tile_3d=64, warps_3d=4, stages_3d=2)
    for seqs, width, ctxs in ((2, 1, [200, 77]), (2, 4, [200, 163]), (1, 8, [250])):
        print(json.dumps(run_case(m, seqs, width, ctxs, table)), flush=True)
    # the same launches on radiance's own split-KV kernel, fp16 and fp8 KV
    table["triton"]["default"]["kernel_3d"] = "radiance"
    for seqs, width, ctxs, kv in ((2, 1, [200, 77], "fp16"), (2, 4, [200, 163], "fp8"), (2, 1, [150, 61], "fp8")):
        print(json.dumps(run_case(m, seqs, width, ctxs, table, kv)), flush=True)


if __name__ == "__main__":
    main()
