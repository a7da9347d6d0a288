"""The partial pass of split-KV paged attention for decode and verify batches (CUDA, sm_89+).

``split_kv_partial`` launches ``split_kv_attention.cu``: for every (sequence, query block, KV head,
KV segment) the block's query rows' unnormalized output, running max (base 2) and exp-sum over
the segment's keys, into ``[tokens, q_heads, segments, head]`` partials that radiance-attn's
reduce kernel rescales and sums (radiance-attn's ``split_kv_kernel`` runs both; its
``reference.unified_attention`` is the specification the pair is checked against). The source
explains the numerics; this module checks arguments and launches.

``split_kv_partial_warpgroup`` writes the same partials with Hopper warpgroup MMAs
(``split_kv_warpgroup.cu``, sm_90 only): the products transposed so a block's query rows are the
MMA's N (8 x ``n_tiles`` rows, ``WARPGROUP_COLUMNS``), one warpgroup a block, 64-key tiles.

Segment ``s`` of a sequence with ``T`` tiles of ``keys_per_warp * key_warps`` keys covers tiles
``[s * ceil(T / S), (s + 1) * ceil(T / S))``. Every segment of every real token's rows is stored:
a block with no keys for its rows (a segment past the sequence, or past its query block's last
key) stores max -inf and sum 0 and no output, so the reduce reads all segments without knowing
the sequence's length.
"""

from __future__ import annotations

import torch

from radiance.kernels import library
from radiance.kernels.ops import check_code, stream_of

OP = "split_kv_partial"
HEADS = (128, 256)
KEY_WARPS = (1, 2, 4, 8)
KEYS_PER_WARP = (16, 32)  # a warp's slice of each KV tile
MAX_ROW_TILES = 5  # query rows a block: 16 a tile, up to 80 (a width-9 verify step x 8 heads)
WARPGROUP_COLUMNS = (2, 4, 5, 6, 9)  # the warpgroup form's query rows a block, in eights
WARPGROUP_TILE = 64  # its keys a KV tile (the segments' unit)
_MODE = {(torch.float8_e4m3fn, torch.bfloat16): 0, (torch.float8_e4m3fn, torch.float16): 1,
         (torch.bfloat16, torch.bfloat16): 2, (torch.float16, torch.float16): 3}
_reasons: dict[int, str | None] = {}
_warpgroup_reasons: dict[int, str | None] = {}


def unsupported_reason(device) -> str | None:
    """None when the kernel runs on ``device``, else why not (decided once per device)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if torch.version.hip is not None:
        return "NVIDIA only (mma.sync, ldmatrix, cp.async); ROCm has no build of it"
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _reasons:
        cc = torch.cuda.get_device_capability(index)
        lib = library.get(index) if cc >= (8, 9) else None
        if cc < (8, 9):
            _reasons[index] = f"needs sm_89+ (the fp8 pair conversion), device is sm_{cc[0]}{cc[1]}"
        elif lib is None:
            _reasons[index] = library.why_not(index)
        elif not lib.split_kv_supported():
            _reasons[index] = "the library reports no split-KV kernel for this device"
        else:
            _reasons[index] = None
    return _reasons[index]


def launch_refusal(head: int, kv_dtype: torch.dtype, q_dtype: torch.dtype, row_tiles: int, key_warps: int,
                   stages: int, smem_limit: int | None = None, keys_per_warp: int = 32) -> str | None:
    """Why the kernel has no launch of this shape, or None. ``smem_limit``: the device's per-block
    shared memory (bytes), checked when given. Pure arithmetic: no GPU needed."""
    if head not in HEADS:
        return f"head size {head} (the kernel has {' and '.join(map(str, HEADS))})"
    if (kv_dtype, q_dtype) not in _MODE:
        return f"{kv_dtype} KV with {q_dtype} queries"
    if not 1 <= row_tiles <= MAX_ROW_TILES:
        return f"{row_tiles} row tiles of 16 (1 to {MAX_ROW_TILES})"
    if key_warps not in KEY_WARPS:
        return f"{key_warps} key warps ({'/'.join(map(str, KEY_WARPS))})"
    if keys_per_warp not in KEYS_PER_WARP:
        return f"{keys_per_warp} keys a warp ({'/'.join(map(str, KEYS_PER_WARP))})"
    if not 2 <= stages <= 5:
        return f"{stages} stages (2 to 5)"
    threads = 32 * row_tiles * key_warps
    if threads > max_threads(head, row_tiles):
        return f"{threads} threads a block (at most {max_threads(head, row_tiles)} here)"
    need = smem_bytes(head, kv_dtype, row_tiles, key_warps, stages, keys_per_warp)
    if smem_limit is not None and need > smem_limit:
        return f"{need} bytes of shared memory, the device allows {smem_limit}"
    return None


def max_threads(head: int, row_tiles: int) -> int:
    """A block's thread limit (max_threads in the source, which explains the register budgets)."""
    return 256 if head == 256 or row_tiles == 1 else 512


def smem_bytes(head: int, kv_dtype: torch.dtype, row_tiles: int, key_warps: int, stages: int,
               keys_per_warp: int = 32) -> int:
    """Shared memory of one block (split_kv_smem in the source): query rows, their scales, the
    block-table entries of the tiles in flight, and the KV ring or, after the loop, the key
    slices' merge, whichever is larger."""
    kv_bytes = 1 if kv_dtype == torch.float8_e4m3fn else 2
    tile = keys_per_warp * key_warps
    ring = stages * 2 * tile * head * kv_bytes
    merge = (key_warps - 1) * row_tiles * (head // 2 + 4) * 32 * 4
    return row_tiles * 16 * head * 2 + 512 + stages * tile * 4 + max(ring, merge)


def warpgroup_unsupported_reason(device) -> str | None:
    """None when the warpgroup form runs on ``device``, else why not (decided once per device)."""
    why = unsupported_reason(device)
    if why is not None:
        return why
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _warpgroup_reasons:
        if torch.cuda.get_device_capability(index) != (9, 0):
            _warpgroup_reasons[index] = "warpgroup MMAs (wgmma) need sm_90"
        elif not library.get(index).split_kv_warpgroup_supported():
            _warpgroup_reasons[index] = "the library reports no warpgroup split-KV kernel for this device"
        else:
            _warpgroup_reasons[index] = None
    return _warpgroup_reasons[index]


def warpgroup_launch_refusal(head: int, kv_dtype: torch.dtype, q_dtype: torch.dtype, n_tiles: int, stages: int,
                             smem_limit: int | None = None) -> str | None:
    """Why the warpgroup form has no launch of this shape, or None (pure arithmetic, as
    ``launch_refusal``)."""
    if head not in HEADS:
        return f"head size {head} (the kernel has {' and '.join(map(str, HEADS))})"
    if (kv_dtype, q_dtype) not in _MODE:
        return f"{kv_dtype} KV with {q_dtype} queries"
    if n_tiles not in WARPGROUP_COLUMNS:
        return f"{8 * n_tiles} query rows a block ({'/'.join(str(8 * n) for n in WARPGROUP_COLUMNS)})"
    if not 1 <= stages <= 5:
        return f"{stages} stages (1 to 5)"
    need = warpgroup_smem_bytes(head, kv_dtype, n_tiles, stages)
    if smem_limit is not None and need > smem_limit:
        return f"{need} bytes of shared memory, the device allows {smem_limit}"
    return None


def warpgroup_smem_bytes(head: int, kv_dtype: torch.dtype, n_tiles: int, stages: int) -> int:
    """Shared memory of one warpgroup block (wg_smem in the source): 1024 bytes of alignment slack,
    the query rows and probabilities as MMA operands, the column maxima, the query rows' score
    multipliers and the block-table entries (two slots at least; rounded up to 128 bytes), the KV
    ring."""
    kv_bytes = 1 if kv_dtype == torch.float8_e4m3fn else 2
    rows = 8 * n_tiles
    fixed = head * 2 * rows + 128 * rows + 7 * rows * 4 + max(stages, 2) * WARPGROUP_TILE * 4
    return 1024 + -(-fixed // 128) * 128 + stages * 2 * WARPGROUP_TILE * head * kv_bytes


def unaligned(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> str | None:
    """Which of q and the caches the 16-byte copies of both passes cannot take (its base address
    or a token/head/block stride not a multiple of 16 bytes), or None."""
    for name, t, dims in (("q", q, 2), ("K cache", k_cache, 3), ("V cache", v_cache, 3)):
        if t.data_ptr() % 16 or any((st * t.element_size()) % 16 for st in t.stride()[:dims]):
            return f"{name} is not 16-byte aligned"
    return None


def _check_tensors(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, part_out, part_max, part_sum) -> int:
    """Types, devices and the q / cache shapes; returns the query heads a KV head."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table),
                    ("seq_lens", seq_lens), ("cu_seqlens_q", cu_seqlens_q), ("part_out", part_out),
                    ("part_max", part_max), ("part_sum", part_sum)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError("q must be [tokens, heads, head] and both caches [blocks, block_size, kv_heads, head]")
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"K cache {k_cache.dtype} and V cache {v_cache.dtype} differ")
    tokens, q_heads, head = q.shape
    _, block_size, kv_heads, cache_head = k_cache.shape
    if cache_head != head or q_heads % kv_heads:
        raise ValueError(f"q [{tokens}, {q_heads}, {head}] does not fit caches of {kv_heads} heads of {cache_head}")
    group = q_heads // kv_heads
    return group


def _check_call(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, part_out, part_max, part_sum,
                q_blocks_per_seq, num_segments, k_scale, v_scale) -> None:
    """Layouts, the sequence tensors, the partials' sizes and the fp8 scales."""
    tokens, q_heads, head = q.shape
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("the head dimension of q and the caches must be contiguous")
    why = unaligned(q, k_cache, v_cache)
    if why is not None:
        raise ValueError(f"{why}: q and the caches must be 16-byte aligned (base and token/head/block strides)")
    seqs = seq_lens.numel()
    for name, t, shape in (("seq_lens", seq_lens, (seqs,)), ("cu_seqlens_q", cu_seqlens_q, (seqs + 1,))):
        if t.dtype != torch.int32 or tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous int32 of shape {shape}, got {t.dtype} {tuple(t.shape)}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] < seqs \
            or block_table.stride(1) != 1:
        raise ValueError("block_table must be int32 [seqs, max_blocks] with contiguous rows")
    if seqs < 1 or q_blocks_per_seq < 1 or num_segments < 1:
        raise ValueError(f"{seqs} sequences, {q_blocks_per_seq} query blocks, {num_segments} segments")
    units = tokens * q_heads * num_segments
    for name, t, n in (("part_out", part_out, units * head), ("part_max", part_max, units),
                       ("part_sum", part_sum, units)):
        if t.dtype != torch.float32 or not t.is_contiguous() or t.numel() < n:
            raise ValueError(f"{name} must be contiguous float32 with at least {n} values")
    if part_out.data_ptr() % 16:
        raise ValueError("part_out must be 16-byte aligned (the partial rows are stored 4 values a request)")
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8:
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or s.numel() < 1 or s.device != q.device:
                raise ValueError(f"fp8 KV needs {name} as a float32 tensor on {q.device}")


def split_kv_partial(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_table: torch.Tensor, seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     part_out: torch.Tensor, part_max: torch.Tensor, part_sum: torch.Tensor, *,
                     softmax_scale: float, q_blocks_per_seq: int, block_q: int, num_segments: int,
                     key_warps: int, stages: int = 2, row_tiles: int | None = None, keys_per_warp: int = 32,
                     k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> None:
    """Write the partials of one decode/verify batch (module docstring). Raises ValueError or
    TypeError, before any launch, for anything the kernel cannot take.

    q ``[tokens, q_heads, head]`` bf16/fp16; caches ``[blocks, block_size, kv_heads, head]`` fp8
    e4m3 or q's dtype (head contiguous); ``block_table`` ``[seqs, max_blocks]``, ``seq_lens``
    ``[seqs]``, ``cu_seqlens_q`` ``[seqs + 1]``, all int32; ``part_out`` fp32 holding
    ``tokens * q_heads * num_segments * head`` values, ``part_max`` / ``part_sum`` fp32 holding
    ``tokens * q_heads * num_segments``; fp8 KV: ``k_scale`` / ``v_scale`` float32 tensors whose
    first element is the per-tensor scale. A query block is ``block_q`` tokens of a sequence;
    ``row_tiles`` (default: the fewest that hold ``block_q`` x heads-per-KV-head rows) tiles of 16
    rows; the KV tile is ``keys_per_warp * key_warps`` keys (16 or 32 a warp).
    """
    group = _check_tensors(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, part_out, part_max, part_sum)
    if row_tiles is None:
        row_tiles = -(-block_q * group // 16)
    if block_q < 1 or block_q * group > 16 * row_tiles:
        raise ValueError(f"block_q {block_q} x {group} heads a KV head exceeds {row_tiles} tiles of 16 rows")
    smem_limit = torch.cuda.get_device_properties(q.device).shared_memory_per_block_optin if q.is_cuda else None
    _launch("split_kv_partial", OP,
            launch_refusal(q.shape[2], k_cache.dtype, q.dtype, row_tiles, key_warps, stages, smem_limit, keys_per_warp),
            unsupported_reason, (q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, part_out, part_max,
                                 part_sum), (softmax_scale, q_blocks_per_seq, num_segments, block_q, k_scale, v_scale),
            (row_tiles, keys_per_warp, key_warps, stages))


def split_kv_partial_warpgroup(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_table: torch.Tensor, seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor,
                               part_out: torch.Tensor, part_max: torch.Tensor, part_sum: torch.Tensor, *,
                               softmax_scale: float, q_blocks_per_seq: int, block_q: int, num_segments: int,
                               stages: int = 2, n_tiles: int | None = None, k_scale: torch.Tensor | None = None,
                               v_scale: torch.Tensor | None = None) -> None:
    """``split_kv_partial``'s partials from the warpgroup form (module docstring; sm_90): the same
    tensors and checks; a block's query rows are 8 x ``n_tiles`` (default: the fewest of
    ``WARPGROUP_COLUMNS`` that hold ``block_q`` x heads-per-KV-head rows), the KV tile is
    ``WARPGROUP_TILE`` keys, ``stages`` tiles in flight (1: one tile's K and V buffers, each tile's
    K rows copied once the tile before has been read, its V rows likewise)."""
    group = _check_tensors(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, part_out, part_max, part_sum)
    if block_q < 1:
        raise ValueError(f"block_q must be at least 1, got {block_q}")
    if n_tiles is None:
        n_tiles = next((n for n in WARPGROUP_COLUMNS if 8 * n >= block_q * group), WARPGROUP_COLUMNS[-1])
    if block_q * group > 8 * n_tiles:
        raise ValueError(f"block_q {block_q} x {group} heads a KV head exceeds {8 * n_tiles} query rows a block")
    smem_limit = torch.cuda.get_device_properties(q.device).shared_memory_per_block_optin if q.is_cuda else None
    _launch("split_kv_warpgroup", f"{OP} (warpgroup)",
            warpgroup_launch_refusal(q.shape[2], k_cache.dtype, q.dtype, n_tiles, stages, smem_limit),
            warpgroup_unsupported_reason, (q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, part_out,
                                           part_max, part_sum),
            (softmax_scale, q_blocks_per_seq, num_segments, block_q, k_scale, v_scale), (n_tiles, stages))


def _launch(export: str, label: str, refusal: str | None, unsupported, tensors: tuple, scalars: tuple,
            shape: tuple) -> None:
    """The checks both entry points share after their own shape arithmetic, then the launch:
    ``refusal`` (the shape's, or None), the tensors' layouts and the fp8 scales, the device
    (``unsupported``), and the export called with the shared arguments, ``shape`` and the stream."""
    q = tensors[0]
    _, q_blocks_per_seq, num_segments, _, k_scale, v_scale = scalars
    if refusal is not None:
        raise ValueError(f"radiance {label} has no launch for {refusal}")
    _check_call(*tensors, q_blocks_per_seq, num_segments, k_scale, v_scale)
    why = unsupported(q.device)
    if why is not None:
        raise RuntimeError(f"radiance {label} cannot run here: {why}")
    lib = library.get(q.device.index if q.device.index is not None else torch.cuda.current_device())
    code = getattr(lib, export)(*_arguments(*tensors, *scalars), *shape, stream_of(q.device))
    check_code(lib, code, OP)


def _arguments(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, part_out, part_max, part_sum,
               softmax_scale, q_blocks_per_seq, num_segments, block_q, k_scale, v_scale) -> tuple:
    """The C arguments both exports share, up to block_size."""
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    return (q.data_ptr(), q.stride(0), q.stride(1),
            k_cache.data_ptr(), *k_cache.stride()[:3], v_cache.data_ptr(), *v_cache.stride()[:3],
            block_table.data_ptr(), block_table.stride(0), seq_lens.data_ptr(), cu_seqlens_q.data_ptr(),
            part_out.data_ptr(), part_max.data_ptr(), part_sum.data_ptr(),
            k_scale.data_ptr() if fp8 else None, v_scale.data_ptr() if fp8 else None,
            float(softmax_scale) * 1.4426950408889634,
            q.shape[2], _MODE[(k_cache.dtype, q.dtype)], seq_lens.numel(), k_cache.shape[2], q.shape[1],
            q_blocks_per_seq, num_segments, block_q, k_cache.shape[1])
