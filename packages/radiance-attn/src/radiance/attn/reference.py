"""Reference paged causal attention: the specification the kernels' outputs are checked against.

Plain torch (fp32 unless asked for fp64), one sequence at a time: gather the sequence's keys and
values through its block table, mask causally (query ``i`` of a sequence with ``L`` keys and ``n``
queries sits at absolute position ``L - n + i``), softmax, weighted sum. Slow and obvious on
purpose.
"""

from __future__ import annotations

import torch


def unified_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, scale,
                      k_scale: float = 1.0, v_scale: float = 1.0, dtype=torch.float32):
    """Attention output ``[tokens, q_heads, head]``, computed in ``dtype`` (fp32, or fp64 for tests).

    q ``[tokens, q_heads, head]``; caches ``[blocks, block_size, kv_heads, head]`` (any float or
    fp8 dtype; fp8 is dequantized by ``k_scale``/``v_scale``); ``cu_seqlens_q`` ``[seqs+1]``,
    ``seq_lens`` ``[seqs]``, ``block_table`` ``[seqs, max_blocks]`` int32.
    """
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError("q must be [tokens, heads, head] and caches [blocks, block_size, kv_heads, head]")
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    q_heads = q.shape[1]
    if q_heads % kv_heads:
        raise ValueError(f"{q_heads} query heads do not group over {kv_heads} KV heads")
    group = q_heads // kv_heads
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    for s, seq_len in enumerate(lens):
        start, stop = cu[s], cu[s + 1]
        n = stop - start
        if n == 0:
            continue
        blocks = block_table[s, : (seq_len + block_size - 1) // block_size].long()
        k = k_cache[blocks].to(dtype).reshape(-1, kv_heads, k_cache.shape[3])[:seq_len] * k_scale
        v = v_cache[blocks].to(dtype).reshape(-1, kv_heads, v_cache.shape[3])[:seq_len] * v_scale
        k = k.repeat_interleave(group, dim=1)  # [L, q_heads, D]
        v = v.repeat_interleave(group, dim=1)
        qs = q[start:stop].to(dtype)  # [n, q_heads, D]
        scores = torch.einsum("nhd,lhd->hnl", qs, k) * scale
        pos = torch.arange(seq_len - n, seq_len, device=q.device)[:, None]
        keys = torch.arange(seq_len, device=q.device)[None, :]
        scores = scores.masked_fill(~(keys <= pos)[None], float("-inf"))
        out[start:stop] = torch.einsum("hnl,lhd->nhd", torch.softmax(scores, dim=-1), v)
    return out
