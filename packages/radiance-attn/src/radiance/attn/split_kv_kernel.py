"""radiance's own split-KV paged attention for decode and verify batches (Triton).

vLLM's unified-attention kernel turns every fp8 KV element into fp32, multiplies it by the
tensor scale and rounds it to bf16 before its bf16 dot. On the H200 that chain doubles the
kernel's instructions and it takes as long on fp8 KV as on bf16 for half the bytes
(``benchmarks/results/launch_shapes.md``). This kernel keeps the scales out of the tile loop:

* an e4m3 value is exactly an fp16 value (3 mantissa bits into 10; its exponent range, normals
  and subnormals, lies inside fp16's normal range), so K and V tiles go to fp16 with the
  hardware's packed conversion and feed an fp16 dot, unscaled;
* the query block is brought to fp16 once per program, multiplied by a power of two ``c`` that
  puts its largest magnitude in [2^14, 2^15): exact for every element above 2^-28 of the
  largest (fp16 keeps bf16's 8 significant bits there), no overflow for any bf16 input;
* ``k_scale / c`` joins the softmax scale on the fp32 scores, ``v_scale`` multiplies the
  partial output once, and the probabilities enter the PV dot as fp16 (2^-11 relative,
  where vLLM's bf16 probabilities carry 2^-8).

So on fp8 KV its scores and outputs are closer to the dequantized float64 reference than the
stock kernel's. Two-byte KV (the query's own dtype) runs the same loop with the query's dtype in
both dots, as vLLM's kernel does.

The launch is the policy's (``policy.TritonLaunch``): segments, BLOCK_M (``BLOCK_Q`` query
tokens x the heads sharing a KV head), KV tile, warps, stages. The grid is (sequence x q-block,
KV head, segment): q-blocks are counted per sequence from ``max_seqlen_q``, so no program searches
for its sequence. Segment ``s`` of a sequence with ``T`` KV tiles covers tiles
``[s * ceil(T / S), (s + 1) * ceil(T / S))``; each program stores its rows' running max (base 2),
exp-sum and unnormalized output (a program with no tiles for its rows stores max -inf and sum
0), and the reduce kernel rescales and sums each token's segments. Partials use the caller's
scratch in vLLM's layout ``[tokens, q_heads, S, head_padded]``.

Two launch options aim at the fp8 tile loop, which on the H200 is bound by latency, not by
instructions or bytes (Nsight Compute at 128K x 8 sequences: DRAM 59% busy, SM throughput 35%, 4
blocks an SM held back by registers and shared memory):

* ``table_ahead``: Triton's two-stage pipeline issues tile t+1's K/V copies at the end of tile
  t, behind a load of t+1's block-table entries that they depend on, so every tile waits for
  two memory round trips in a row. With it the entries are loaded one tile earlier (a
  loop-carried value), the copies depend on nothing in flight, and from three stages Triton
  keeps a second K/V buffer in flight (without it, only from five). A few more registers.
* ``max_registers`` (Triton's ``maxnreg``): a per-thread register cap, so more blocks fit an SM
  where registers, not shared memory, are the limit (ptxas spills what does not fit).
"""

from __future__ import annotations

import functools
import os

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - Triton is part of every GPU install of vLLM
    triton = None

LOG2E = 1.4426950408889634


def _kernels():
    if triton is None:
        raise RuntimeError("radiance split-KV attention needs Triton")
    return _partial, _reduce


if triton is not None:

    @triton.jit
    def _query_to_fp16(q):
        """(q * c as fp16, 1 / c) with c a power of two putting max|q| in [2^14, 2^15)."""
        qf = q.to(tl.float32)
        amax = tl.max(tl.max(tl.abs(qf), axis=1), axis=0)
        # floor(log2(amax)) from the exponent field; an all-zero block takes the largest c.
        exp = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        biased = tl.minimum(tl.maximum(127 + 14 - exp, 1), 253)
        c = (biased << 23).to(tl.float32, bitcast=True)
        inv_c = ((254 - biased) << 23).to(tl.float32, bitcast=True)  # 2^(127 - biased) = 1 / c
        return (qf * c).to(tl.float16), inv_c

    @triton.jit
    def _e4m3_to_fp16_in_registers(x):
        """e4m3 -> fp16 where the tile was loaded (NVIDIA sm_89+), four values a 32-bit register.

        Written as Triton's own ``x.to(tl.float16)``, the conversion is moved behind the
        shared-memory load of the dot operand, and V (whose dot operand pairs keys, which are a
        head apart in the cache) is then read from shared memory a byte at a time: 64 byte loads
        and 64 shifts and ors a thread a 64-key tile. Kept opaque (``is_pure=False``), the
        conversion stays on the loaded tile and the fp16 result reaches the dot through
        ``ldmatrix.trans``: ~35% fewer instructions in the tile loop, at the cost of an fp16 copy
        of the tile in shared memory.
        """
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            "=r,=r,r", [x.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False, pack=4)

    @triton.jit
    def _partial(
        q_ptr, k_ptr, v_ptr, block_table_ptr, seq_lens_ptr, cu_q_ptr,
        part_out_ptr, part_max_ptr, part_sum_ptr, k_scale_ptr, v_scale_ptr,
        scale_log2,
        q_stride_t, q_stride_h,
        k_stride_b, k_stride_s, k_stride_h,
        v_stride_b, v_stride_s, v_stride_h,
        bt_stride, num_q_heads, q_blocks_per_seq, num_segments,
        HEAD: tl.constexpr, HEAD_P: tl.constexpr, GROUP: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, TILE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        FP8_KV: tl.constexpr, NUM_STAGES: tl.constexpr, V_IN_REGISTERS: tl.constexpr,
        TABLE_AHEAD: tl.constexpr,
    ):
        pid = tl.program_id(0)
        kv_head = tl.program_id(1)
        seg = tl.program_id(2)
        seq = pid // q_blocks_per_seq
        q_block = pid - seq * q_blocks_per_seq
        q_start = tl.load(cu_q_ptr + seq)
        q_len = tl.load(cu_q_ptr + seq + 1) - q_start
        if q_block * BLOCK_Q >= q_len:
            return
        seq_len = tl.load(seq_lens_ptr + seq)
        context = seq_len - q_len
        num_tiles = tl.cdiv(seq_len, TILE)
        per_seg = tl.cdiv(num_tiles, num_segments)
        lo = seg * per_seg
        # The block's last row sees keys up to context + its position: tiles past it are skipped.
        block_keys = context + tl.minimum((q_block + 1) * BLOCK_Q, q_len)
        hi = tl.minimum(tl.minimum(lo + per_seg, num_tiles), tl.cdiv(block_keys, TILE))
        rows = tl.arange(0, BLOCK_M)
        pos = q_block * BLOCK_Q + rows // GROUP
        head = kv_head * GROUP + rows % GROUP
        row_ok = (pos < q_len) & (rows < BLOCK_Q * GROUP)
        unit = ((q_start + pos) * num_q_heads + head) * num_segments + seg
        if lo >= hi:  # no tiles here: the rows' partials say so (max -inf, sum 0) for the reduce
            tl.store(part_max_ptr + unit, tl.full([BLOCK_M], float("-inf"), tl.float32), mask=row_ok)
            tl.store(part_sum_ptr + unit, tl.zeros([BLOCK_M], tl.float32), mask=row_ok)
            return

        key_end = context + pos + 1  # causal: row sees keys [0, key_end)
        d = tl.arange(0, HEAD_P)
        d_ok = d < HEAD
        q = tl.load(q_ptr + (q_start + pos)[:, None] * q_stride_t + head[:, None] * q_stride_h + d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        if FP8_KV:
            q, inv_c = _query_to_fp16(q)
            qk_scale = scale_log2 * tl.load(k_scale_ptr) * inv_c
        else:
            qk_scale = scale_log2

        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_P], tl.float32)
        table_row = block_table_ptr + seq * bt_stride
        t_off = tl.arange(0, TILE)
        if TABLE_AHEAD:
            ahead = lo * TILE + t_off
            block_ahead = tl.load(table_row + ahead // BLOCK_SIZE, mask=ahead < seq_len, other=0)
        for t in tl.range(lo, hi, num_stages=NUM_STAGES):
            keys = t * TILE + t_off
            key_ok = keys < seq_len
            if TABLE_AHEAD:
                # requested now, used by the next iteration's K/V copies (module docstring)
                block = block_ahead.to(tl.int64)
                ahead = keys + TILE
                block_ahead = tl.load(table_row + ahead // BLOCK_SIZE, mask=ahead < seq_len, other=0)
            else:
                block = tl.load(table_row + keys // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
            slot = keys % BLOCK_SIZE
            kv_mask = key_ok[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + block[:, None] * k_stride_b + slot[:, None] * k_stride_s + kv_head * k_stride_h
                        + d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_ptr + block[:, None] * v_stride_b + slot[:, None] * v_stride_s + kv_head * v_stride_h
                        + d[None, :], mask=kv_mask, other=0.0)
            if FP8_KV:
                k = k.to(tl.float16)  # K pairs head elements, adjacent in the cache: no byte gathers
                v = _e4m3_to_fp16_in_registers(v) if V_IN_REGISTERS else v.to(tl.float16)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            s = tl.where(keys[None, :] < key_end[:, None], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            # A row with no visible key yet keeps max -inf; exponentiate against 0 so it stays 0.
            base = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - base[:, None])
            alpha = tl.math.exp2(m - base)
            l = l * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        if FP8_KV:
            acc = acc * tl.load(v_scale_ptr)
        tl.store(part_out_ptr + unit[:, None] * HEAD_P + d[None, :], acc, mask=row_ok[:, None])
        tl.store(part_max_ptr + unit, m, mask=row_ok)
        tl.store(part_sum_ptr + unit, l, mask=row_ok)

    @triton.jit
    def _reduce(
        out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, cu_q_ptr, num_seqs,
        out_stride_t, out_stride_h, num_q_heads,
        HEAD: tl.constexpr, HEAD_P: tl.constexpr, NUM_SEGMENTS: tl.constexpr, D_CHUNK: tl.constexpr,
    ):
        # One program a (token, head, D_CHUNK columns). Every partial pass stores every segment of
        # a real token's rows, "no keys" ones as max -inf and sum 0 (their outputs unstored), so
        # nothing here waits on the sequence's lengths: two memory round trips however many
        # segments there are, the token count with every segment's max and sum, then the output
        # slices of the segments that hold keys of a real row. Requesting every slice with the
        # rest (one trip) measured level on unpadded batches, but a query row past the batch's
        # tokens (a batch padded to a captured CUDA-graph size) then loads a real row's worth of
        # stale partials (1.2-3.8 µs more a launch at one sequence padded by seven), as does each
        # empty segment of a launch chosen for a longer context than it runs at (one captured
        # into a graph: graph_capture.py); split_kv_kernel.md, section 22. Fused into
        # the warpgroup pass (a group's last blocks combining its segments) the reduce measured
        # level with this kernel (section 18): the round trips stay, only the launch goes.
        token = tl.program_id(0)
        head = tl.program_id(1)
        real_tokens = tl.load(cu_q_ptr + num_seqs)
        unit0 = (token * num_q_heads + head) * NUM_SEGMENTS
        segs = tl.arange(0, NUM_SEGMENTS)
        d = tl.program_id(2) * D_CHUNK + tl.arange(0, D_CHUNK)
        maxes = tl.load(part_max_ptr + unit0 + segs)
        sums = tl.load(part_sum_ptr + unit0 + segs)
        # A segment holds keys this row sees unless its max is -inf; a NaN max (NaN inputs) counts,
        # so NaN reaches the output as in the reference. The others' outputs were never stored.
        ok = maxes != float("-inf")
        cols = tl.where(token < real_tokens, HEAD, 0)  # a padding row: nothing loaded, nothing stored
        part = tl.load(part_out_ptr + (unit0 + segs)[:, None] * HEAD_P + d[None, :],
                       mask=ok[:, None] & (d[None, :] < cols), other=0.0)
        top = tl.max(maxes, axis=0)
        weights = tl.where(ok, tl.math.exp2(maxes - top), 0.0)
        total = tl.sum(weights * tl.where(ok, sums, 0.0), axis=0)
        out = tl.sum(part * weights[:, None], axis=0) / total
        tl.store(out_ptr + token * out_stride_t + head * out_stride_h + d, out.to(out_ptr.dtype.element_ty),
                 mask=d < cols)


@functools.lru_cache(maxsize=None)
def _ptx_fp8_conversion(device_index) -> bool:
    """Whether the inline ``cvt.rn.f16x2.e4m3x2`` runs here: NVIDIA sm_89+, not the interpreter."""
    import torch

    return (torch.version.hip is None and torch.cuda.get_device_capability(device_index) >= (8, 9)
            and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"))


def launch_refusal(launch, q_dtype: str, kv_dtype: str, q_per_kv: int) -> str | None:
    """Why this kernel cannot run ``launch`` for a geometry of these dtypes ("bf16", "fp16",
    "fp8") and GQA ratio, or None. A property of the geometry: checked once per decision."""
    if q_dtype not in ("bf16", "fp16"):
        return f"{q_dtype} queries"
    if kv_dtype not in ("fp8", q_dtype):
        return f"{kv_dtype} KV with {q_dtype} queries"
    if launch.num_segments & (launch.num_segments - 1):
        return f"{launch.num_segments} segments is not a power of two"
    if launch.block_m < 16 or launch.tile_size < 16:
        return "BLOCK_M and the KV tile must be at least 16 for the dots"
    if launch.block_q * q_per_kv > launch.block_m:
        return "BLOCK_Q x queries per KV head exceeds BLOCK_M"
    return None


def warpgroup_refusal(launch, head: int, q_dtype, kv_dtype, q_per_kv: int, device) -> str | None:
    """Why radiance-kernels' warpgroup partial pass cannot run ``launch`` (torch dtypes, the GPU
    ``device``), or None: the library and an sm_90 device, its 64-key tile, a query block of at
    most its 72 rows, the shared memory it needs. A property of the launch shape, the geometry's
    head and dtypes and the GPU, not of the context: decided once for each (the wrapper asks once
    per geometry, and the context grows every step)."""
    import torch

    device = torch.device(device)
    return _warpgroup_refusal(launch.tile_size, launch.block_q * q_per_kv, launch.num_stages or 2, head, q_dtype,
                              kv_dtype, device.type, device.index)


@functools.lru_cache(maxsize=256)
def _warpgroup_refusal(tile: int, rows: int, stages: int, head: int, q_dtype, kv_dtype, device_type: str,
                       device_index) -> str | None:
    try:
        from radiance.kernels import split_kv_attention as wg
    except ImportError as exc:
        return f"radiance-kernels is not importable ({exc})"
    if tile != wg.WARPGROUP_TILE:
        return f"a {tile}-key tile (the warpgroup pass takes {wg.WARPGROUP_TILE})"
    n_tiles = next((n for n in wg.WARPGROUP_COLUMNS if 8 * n >= rows), None)
    if n_tiles is None:
        return f"{rows} query rows a block (the warpgroup pass takes up to {8 * wg.WARPGROUP_COLUMNS[-1]})"
    import torch

    device = torch.device(device_type, device_index) if device_index is not None else torch.device(device_type)
    why = wg.warpgroup_unsupported_reason(device)
    if why is not None:
        return why
    smem = torch.cuda.get_device_properties(device).shared_memory_per_block_optin
    return wg.warpgroup_launch_refusal(head, kv_dtype, q_dtype, n_tiles, stages, smem)


def call_refusal(q, k_cache, v_cache, out, k_scale, v_scale) -> str | None:
    """Why this kernel cannot take these tensors, or None: what a geometry does not say (the
    exact fp8 format, layouts, the scales). Checked per call, before any launch."""
    import torch

    if k_cache.dtype != v_cache.dtype or k_cache.shape != v_cache.shape:
        return "K and V caches differ in dtype or shape"
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if not fp8 and k_cache.dtype != q.dtype:
        return f"KV dtype {k_cache.dtype} with query dtype {q.dtype}"
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1 or q.stride(2) != 1 or out.stride(2) != 1:
        return "head dimension not contiguous"
    if fp8:
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            # vLLM passes the tensor scale expanded to [seqs, kv_heads]: every element one value.
            if s is None or s.dtype != torch.float32 or (s.numel() != 1 and any(st != 0 for st in s.stride())):
                return f"{name} is not one per-tensor float32 scale"
    return None


def warpgroup_call_refusal(q, k_cache, v_cache) -> str | None:
    """Why the warpgroup partial pass cannot take these tensors, or None: its 16-byte copies need
    q and the caches 16-byte aligned (vLLM's caches and query views are;
    ``split_kv_attention.unaligned``). Per call, after ``call_refusal``."""
    from radiance.kernels.split_kv_attention import unaligned

    return unaligned(q, k_cache, v_cache)


def launch(q, k_cache, v_cache, out, cu_seqlens_q, seq_lens, block_table, max_seqlen_q: int,
           softmax_scale: float, k_scale, v_scale, launch_cfg, part_out, part_max, part_sum,
           v_in_registers: bool | None = None, partial_pass: str | None = None):
    """Run one decode/verify batch; ``launch_refusal`` and ``call_refusal`` must have passed.
    Raises ValueError, before any launch, when the segment scratch is too small for the launch.
    Returns Triton's handle of the main kernel's build (``n_regs``, ``n_spills``,
    ``metadata.shared``; None in Triton's interpreter or with the CUDA partial pass).

    ``v_in_registers``: convert fp8 V tiles with the inline PTX conversion (see
    ``_e4m3_to_fp16_in_registers``); None: wherever that PTX runs (CUDA sm_89+, not Triton's
    interpreter).

    ``partial_pass`` (None: the launch's own, ``launch_cfg.partial_pass``): "triton" (``_partial``
    above); "cuda": radiance-kernels' ``split_kv_partial`` (the same algebra, mma.sync with the
    query rows padded to 16 instead of BLOCK_M, the KV tile's keys split over warps: ``num_warps``
    is its key warps (None: tile / 32, at least 1), each taking ``tile_size / num_warps`` keys (16
    or 32) of a tile, ``num_stages`` its ring depth, BLOCK_M unused); "cuda_warpgroup": its
    warpgroup-MMA form (``split_kv_partial_warpgroup``, sm_90: the query rows as the MMA's N,
    padded to 16, 32, 40, 48 or 72; ``tile_size`` must be its 64 keys; ``num_stages`` the ring
    depth, 1 for one tile's K and V buffers; BLOCK_M and ``num_warps`` unused). The same reduce
    follows.
    """
    import torch

    partial_pass = launch_cfg.partial_pass if partial_pass is None else partial_pass
    if partial_pass not in ("triton", "cuda", "cuda_warpgroup"):
        raise ValueError(f"partial_pass must be 'triton', 'cuda' or 'cuda_warpgroup', got {partial_pass!r}")
    if v_in_registers is None:
        v_in_registers = q.is_cuda and _ptx_fp8_conversion(q.device.index)

    _, reduce = _kernels()
    num_tokens, num_q_heads, head = q.shape
    units = num_tokens * num_q_heads * launch_cfg.num_segments
    head_p = 1 << (head - 1).bit_length()
    if part_out.numel() < units * head_p or part_max.numel() < units or part_sum.numel() < units:
        raise ValueError(f"split-KV scratch holds fewer than {units} partial rows of {head_p}")
    num_seqs = seq_lens.shape[0]
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    q_blocks = -(-int(max_seqlen_q) // launch_cfg.block_q)
    seg = launch_cfg.num_segments
    if partial_pass == "cuda":
        from radiance.kernels import split_kv_attention

        key_warps = launch_cfg.num_warps or max(1, launch_cfg.tile_size // 32)
        if launch_cfg.tile_size % key_warps:
            raise ValueError(f"a {launch_cfg.tile_size}-key tile does not split over {key_warps} key warps")

        split_kv_attention.split_kv_partial(
            q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, part_out, part_max, part_sum,
            softmax_scale=softmax_scale, q_blocks_per_seq=q_blocks, block_q=launch_cfg.block_q,
            num_segments=seg, key_warps=key_warps, keys_per_warp=launch_cfg.tile_size // key_warps,
            stages=launch_cfg.num_stages or 2,
            k_scale=k_scale if fp8 else None, v_scale=v_scale if fp8 else None)
        compiled = None
    elif partial_pass == "cuda_warpgroup":
        from radiance.kernels import split_kv_attention

        if launch_cfg.tile_size != split_kv_attention.WARPGROUP_TILE:
            raise ValueError(f"the warpgroup partial pass takes {split_kv_attention.WARPGROUP_TILE}-key tiles, "
                             f"not {launch_cfg.tile_size}")
        split_kv_attention.split_kv_partial_warpgroup(
            q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, part_out, part_max, part_sum,
            softmax_scale=softmax_scale, q_blocks_per_seq=q_blocks, block_q=launch_cfg.block_q,
            num_segments=seg, stages=launch_cfg.num_stages or 2,
            k_scale=k_scale if fp8 else None, v_scale=v_scale if fp8 else None)
        compiled = None
    else:
        compiled = _launch_triton_partial(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table,
                                          softmax_scale, k_scale, v_scale, launch_cfg, part_out,
                                          part_max, part_sum, v_in_registers, q_blocks, fp8, head_p)
    d_chunk = max(16, min(head_p, 4096 // seg))  # <= 32 fp32 partials a thread at 4 warps
    reduce[(num_tokens, num_q_heads, head_p // d_chunk)](
        out, part_out, part_max, part_sum, cu_seqlens_q, num_seqs, out.stride(0), out.stride(1), num_q_heads,
        HEAD=head, HEAD_P=head_p, NUM_SEGMENTS=seg, D_CHUNK=d_chunk, num_warps=4,
    )
    return compiled


def _launch_triton_partial(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, softmax_scale,
                           k_scale, v_scale, launch_cfg, part_out, part_max, part_sum, v_in_registers,
                           q_blocks, fp8, head_p):
    """The Triton partial pass (``_partial``); returns its build handle."""
    partial, _ = _kernels()
    _, num_q_heads, head = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    num_seqs = seq_lens.shape[0]
    seg = launch_cfg.num_segments
    extra = {}
    if launch_cfg.num_warps is not None:
        extra["num_warps"] = launch_cfg.num_warps
    if launch_cfg.max_registers is not None:
        extra["maxnreg"] = launch_cfg.max_registers
    compiled = partial[(num_seqs * q_blocks, num_kv_heads, seg)](
        q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q,
        part_out, part_max, part_sum,
        k_scale if fp8 else q, v_scale if fp8 else q,
        float(softmax_scale) * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0), num_q_heads, q_blocks, seg,
        HEAD=head, HEAD_P=head_p, GROUP=group,
        BLOCK_M=launch_cfg.block_m, BLOCK_Q=launch_cfg.block_q, TILE=launch_cfg.tile_size,
        BLOCK_SIZE=k_cache.shape[1], FP8_KV=fp8,
        NUM_STAGES=launch_cfg.num_stages or 2, V_IN_REGISTERS=bool(fp8 and v_in_registers),
        TABLE_AHEAD=launch_cfg.table_ahead, **extra,
    )
    return compiled
