"""The split-KV attention partial pass's host side: launch arithmetic and argument checks (no GPU).
Its numerics run on the GPU in radiance-attn's tests/test_gpu_split_kv.py (with the reduce)."""

import pytest
import torch

from radiance.kernels import split_kv_attention as skv

FP8, BF16, F16 = torch.float8_e4m3fn, torch.bfloat16, torch.float16


def test_launch_refusal_reasons():
    assert skv.launch_refusal(256, FP8, BF16, 5, 1, 2) is None  # a width-9 verify block, 160 threads
    assert skv.launch_refusal(128, F16, F16, 3, 4, 3) is None
    assert "head size 64" in skv.launch_refusal(64, FP8, BF16, 1, 1, 2)
    assert "KV with" in skv.launch_refusal(128, BF16, F16, 1, 1, 2)
    assert "row tiles" in skv.launch_refusal(128, FP8, BF16, 6, 1, 2)
    assert "key warps" in skv.launch_refusal(128, FP8, BF16, 1, 3, 2)
    assert "keys a warp" in skv.launch_refusal(128, FP8, BF16, 1, 2, 2, keys_per_warp=64)
    assert skv.launch_refusal(256, BF16, BF16, 1, 4, 3, keys_per_warp=16) is None
    assert "stages" in skv.launch_refusal(128, FP8, BF16, 1, 1, 6)
    assert "320 threads" in skv.launch_refusal(256, FP8, BF16, 5, 2, 2)
    assert skv.launch_refusal(128, FP8, BF16, 5, 2, 2) is None  # head 128 takes 512 threads
    # two bf16 stages of 256 keys x 256 elements (K and V): 512 KiB, beyond any GPU's block limit
    assert "shared memory" in skv.launch_refusal(256, BF16, BF16, 1, 8, 2, smem_limit=227 * 1024)


def test_smem_bytes():
    # query rows (16 x 256 x 2) + 512 + 2 stages x 64 table entries + a ring of 2 stages x K and V x
    # 64 keys x 256 fp8 bytes
    assert skv.smem_bytes(256, FP8, 1, 2, 2) == 8192 + 512 + 2 * 64 * 4 + 65536
    # four key warps' merge of a 16 x 128 tile can outgrow the ring
    assert skv.smem_bytes(128, FP8, 2, 4, 2) == 2 * 4096 + 512 + 2 * 128 * 4 + max(2 * 2 * 128 * 128,
                                                                                   3 * 2 * 68 * 32 * 4)
    # 16 keys a warp: half the tile, half the ring and entries, the same merge
    assert skv.smem_bytes(256, BF16, 1, 4, 3, 16) == 8192 + 512 + 3 * 64 * 4 + 3 * 2 * 64 * 512


def _decode_call():
    """CPU tensors of a two-sequence decode step (head 256, 16 query heads over 2 fp8 KV heads)."""
    q = torch.zeros(2, 16, 256, dtype=BF16)
    k = torch.zeros(8, 16, 2, 256, dtype=FP8)
    bt = torch.zeros(2, 4, dtype=torch.int32)
    lens = torch.full((2,), 64, dtype=torch.int32)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    part = torch.zeros(2 * 16 * 4 * 256), torch.zeros(2 * 16 * 4), torch.zeros(2 * 16 * 4)
    return q, k, bt, lens, cu, part, torch.ones(1)


def test_host_checks_before_launch():
    q, k, bt, lens, cu, part, scale = _decode_call()
    args = dict(softmax_scale=0.1, q_blocks_per_seq=1, block_q=1, num_segments=4, key_warps=2,
                k_scale=scale, v_scale=scale)
    with pytest.raises(ValueError, match="block_q 3 x 8 heads"):
        skv.split_kv_partial(q, k, k, bt, lens, cu, *part, **dict(args, block_q=3, row_tiles=1))
    with pytest.raises(ValueError, match="part_out"):
        skv.split_kv_partial(q, k, k, bt, lens, cu, part[0][:100], *part[1:], **args)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        skv.split_kv_partial(q, k, k, bt, lens, cu[:2], *part, **args)
    with pytest.raises(TypeError, match="differ"):
        skv.split_kv_partial(q, k, k.to(BF16), bt, lens, cu, *part, **args)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        skv.split_kv_partial(q, k, k, bt, lens, cu, *part, **args)


def test_warpgroup_launch_refusal_and_smem():
    assert skv.warpgroup_launch_refusal(256, FP8, BF16, 9, 2) is None  # a width-9 verify block
    assert skv.warpgroup_launch_refusal(128, F16, F16, 9, 5) is None
    assert "24 query rows" in skv.warpgroup_launch_refusal(256, FP8, BF16, 3, 2)
    assert skv.warpgroup_launch_refusal(128, FP8, BF16, 5, 2) is None  # width 9 at 4 heads a KV head: 36 rows
    assert "head size 64" in skv.warpgroup_launch_refusal(64, FP8, BF16, 4, 2)
    assert "stages" in skv.warpgroup_launch_refusal(256, FP8, BF16, 4, 0)
    assert "stages" in skv.warpgroup_launch_refusal(256, FP8, BF16, 4, 6)
    # one stage: one tile's K and V buffers, the block-table entries still in two slots
    fixed = 16 * 512 + 16 * 128 + 7 * 16 * 4 + 2 * 64 * 4
    assert skv.warpgroup_smem_bytes(256, BF16, 2, 1) == 1024 + -(-fixed // 128) * 128 + 2 * 64 * 512
    # query rows (72 x 256 x 2), P (72 x 128), 7 x 72 floats, 2 x 64 entries, rounded to 128, then
    # two stages of K and V (64 keys x 256 fp8 bytes), after 1024 bytes of alignment slack:
    # 113 KB, two blocks on a 228 KB multiprocessor
    fixed = 72 * 512 + 72 * 128 + 7 * 72 * 4 + 2 * 64 * 4
    assert skv.warpgroup_smem_bytes(256, FP8, 9, 2) == 1024 + -(-fixed // 128) * 128 + 2 * 2 * 64 * 256
    assert "shared memory" in skv.warpgroup_launch_refusal(256, BF16, BF16, 9, 3, smem_limit=227 * 1024)


def test_warpgroup_host_checks_before_launch():
    q, k, bt, lens, cu, part, scale = _decode_call()
    args = dict(softmax_scale=0.1, q_blocks_per_seq=1, block_q=1, num_segments=4, k_scale=scale, v_scale=scale)
    with pytest.raises(ValueError, match="block_q 5 x 8 heads a KV head exceeds 32"):
        skv.split_kv_partial_warpgroup(q, k, k, bt, lens, cu, *part, **dict(args, block_q=5, n_tiles=4))
    with pytest.raises(ValueError, match="56 query rows"):
        skv.split_kv_partial_warpgroup(q, k, k, bt, lens, cu, *part, **dict(args, n_tiles=7))
    with pytest.raises(ValueError, match="fp8 KV needs v_scale"):
        skv.split_kv_partial_warpgroup(q, k, k, bt, lens, cu, *part, **dict(args, v_scale=None))
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        skv.split_kv_partial_warpgroup(q, k, k, bt, lens, cu, *part, **args)
