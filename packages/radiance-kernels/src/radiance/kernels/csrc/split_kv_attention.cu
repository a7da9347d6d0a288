// Split-KV paged attention, the partial pass (NVIDIA sm_89+): for decode and speculative-verify
// batches, each block computes one (sequence, query block, KV head, KV segment)'s unnormalized
// output, running max (base 2) and exp-sum for its rows, in the layout radiance-attn's reduce
// kernel sums (`[tokens, q_heads, segments, head]`). It is the CUDA counterpart of radiance-attn's
// Triton split-KV kernel and follows its algebra; see split_kv_partial below for the arguments.
//
// Rows: BLOCK_Q query tokens x the GROUP query heads sharing the KV head, row r = token r / GROUP,
// head r % GROUP, padded to MT tiles of 16 (the mma's M). Where the Triton kernel pads a verify
// batch's 72 rows to a 128-row block, this one runs 80.
//
// Warps: MT x KW. Warp (mt, ks) owns query rows [16 mt, 16 mt + 16) and keys [KPW ks, KPW ks +
// KPW) of every KV tile (TILE = KPW x KW keys, KPW 16 or 32), with its own running max, exp-sum
// and output; the KW key slices of a row tile are merged through shared memory at the end.
// Splitting keys over warps, not only rows, gives a single decode token (one row tile) several
// warps; 16 keys a warp halves the shared memory a warp's tile slice takes (16 KB at head 256 in
// bf16 and a 3-deep ring: 4 warps where 32 keys a warp fit 2), for the same bytes in flight.
// A warp holds its rows' whole output (128 fp32 values a thread at head 256, which takes 255
// registers; two warps splitting the head, each computing the scores, measured no faster).
//
// KV tiles stream through a ring of `stages` shared-memory buffers with cp.async (16 bytes a
// request; keys past the sequence are zero-filled, so a masked key's V row is 0, never stale
// bytes). Eight consecutive threads copy 128 contiguous bytes of a key row, so every request
// covers whole L2 sectors. The block-table entries of a tile are read a tile ahead of its copies,
// one per thread, and reach the copying threads through a shared ring beside the KV ring.
// Rows of 16-byte chunks are XOR-swizzled (chunk c of row r at c ^ (r & 7)): ldmatrix reads 8 rows
// at one column, and the copies' 8-chunk runs write 4 rows a wavefront, conflict-free.
//
// Numerics, fp8 (e4m3) KV: an e4m3 value is exactly an fp16 value, so K and V tiles widen to fp16
// with the packed hardware conversion and feed fp16 MMAs unscaled; each query row goes to fp16 once,
// multiplied by a power of two c putting its largest magnitude in [2^14, 2^15) (exact for every
// element above 2^-28 of the row's largest, no overflow for any bf16 or fp16 input); k_scale / c
// joins the softmax scale on the fp32 scores and v_scale multiplies the output once; probabilities
// enter the PV product as fp16. Two-byte KV (the query's dtype) runs the query's dtype in both
// products. fp32 accumulation throughout; exp2 of scores pre-multiplied by log2(e).
//
// fp8 operand layouts without a byte transpose:
//  - QK: ldmatrix on K rows treats byte pairs as 16-bit elements, so a thread's register holds 4
//    consecutive head elements where the fp16 B fragment wants 2 + 2 eight apart. The head axis is
//    a dot's reduction axis: relabelled identically on both sides it changes no product. The query
//    is stored in shared memory relabelled to match (qk_position), K is used as loaded.
//  - PV: ldmatrix.trans of 16-bit pairs gives a thread two keys x two head elements; one byte
//    permute splits them into the two head elements' key pairs, each one fp16 B fragment. The
//    output's head axis comes out interleaved (thread t of a 16-element chunk holds elements 4t to
//    4t + 3), which the store undoes.
#include "split_kv_common.cuh"

namespace radiance {
namespace {

// Shared memory of one block: query rows, their score multipliers, the block-table entries of
// the tiles in flight, the KV ring (reused after the loop for the key-slice merge).
__host__ __device__ constexpr int query_bytes(int head, int mt) { return mt * 16 * head * 2 + 512; }
__host__ __device__ constexpr int entry_bytes(int kpw, int kw, int stages) { return stages * kpw * kw * 4; }
__host__ __device__ constexpr int merge_bytes(int head, int mt, int kw) {
  return (kw - 1) * mt * (head / 2 + 4) * 32 * 4;
}
__host__ __device__ constexpr int ring_bytes(int head, int mode, int kpw, int kw, int stages) {
  return stages * 2 * kpw * kw * head * (mode_fp8(mode) ? 1 : 2);
}
__host__ __device__ constexpr int split_kv_smem(int head, int mode, int mt, int kpw, int kw, int stages) {
  return query_bytes(head, mt) + entry_bytes(kpw, kw, stages) +
         (ring_bytes(head, mode, kpw, kw, stages) > merge_bytes(head, mt, kw) ? ring_bytes(head, mode, kpw, kw, stages)
                                                                              : merge_bytes(head, mt, kw));
}
// Threads a block may have: 8 key warps at most; head 256 keeps 256 (its 128 fp32 accumulators a
// thread need the registers of 256); head 128 takes 512 where two or more row tiles can fill
// them, and a single head-128 row tile stays at 256 so ptxas does not cap it at 128 registers.
__host__ __device__ constexpr int max_threads(int head, int mt) { return head == 256 || mt == 1 ? 256 : 512; }

#if !defined(RADIANCE_HIP)

// d += a (16 x 16, row) b (16 x 8, col), fp32 accumulation; BF16 picks the input type.
template <bool BF16>
RAD_DEVICE void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <int HEAD, int MODE, int MT, int KPW>
__global__ void __launch_bounds__(max_threads(HEAD, MT))
    split_kv_partial_kernel(const SplitKvArgs p) {
  constexpr bool FP8 = mode_fp8(MODE);
  constexpr bool DOT_BF16 = MODE == 2;
  constexpr int RB = HEAD * (FP8 ? 1 : 2);  // bytes a key row
  constexpr int QB = HEAD * 2;              // bytes a query row
  constexpr int ROWS = MT * 16;
  constexpr int NT = HEAD / 8;              // output n8 tiles a row tile
  constexpr int NJ = KPW / 8;               // key n8 tiles a warp's slice
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* const sq = smem;
  float* const row_scale = reinterpret_cast<float*>(smem + ROWS * QB);
  int* const entries = reinterpret_cast<int*>(smem + query_bytes(HEAD, MT));  // [stages][tile]
  uint8_t* const ring = smem + query_bytes(HEAD, MT) + entry_bytes(KPW, p.kw, p.stages);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int kw = p.kw, tile = KPW * kw, stages = p.stages;
  const int mt = warp % MT, ks = warp / MT;
  rad_wait_prior_grids();  // everything below reads what earlier kernels wrote
  const SplitKvBlock blk(p, tile);
  if (blk.lo >= blk.hi) {
    blk.store_no_keys(p);
    return;
  }
  const int q_block = blk.q_block, kv_head = blk.kv_head, seg = blk.seg;
  const int q_start = blk.q_start, q_len = blk.q_len, context = blk.context, lo = blk.lo, hi = blk.hi;

  // ---- the KV ring (split_kv_common.cuh) ----
  const KvRing<HEAD, RB> kv(p, blk, ring, entries, tile);
  int next_tile = kv.start();

  // ---- query rows into shared memory (16 elements a thread), and their score multipliers ----
  {
    constexpr int LPR = HEAD / 16;  // threads a query row
    const int i = threadIdx.x % LPR;
    const float k_scale = FP8 ? *p.k_scale : 1.f;
    for (int r = threadIdx.x / LPR; r < ROWS; r += blockDim.x / LPR) {
      alignas(16) uint16_t out[16];
      const float scale = query_chunk<MODE, LPR>(blk.query(p, r, i), out, p.scale_log2, k_scale);
      uint8_t* row = sq;
      *reinterpret_cast<uint4*>(row + swizzled(r, 2 * i, QB)) = *reinterpret_cast<const uint4*>(out);
      *reinterpret_cast<uint4*>(row + swizzled(r, 2 * i + 1, QB)) = *reinterpret_cast<const uint4*>(out + 8);
      if (i == 0) row_scale[r] = scale;
    }
  }

  // ---- the warp's rows: causal key limits (0 for padding rows: every key masked) ----
  int key_end[2];
  float qk_scale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = mt * 16 + g + 8 * h;
    const int pos = q_block * p.block_q + r / p.group;
    key_end[h] = (r < p.block_q * p.group && pos < q_len) ? context + pos + 1 : 0;
  }

  float acc[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  const uint32_t q_base = shared_address(sq);

  for (int t = lo; t < hi; ++t) {
    copy_wait_pending(stages - 2);
    __syncthreads();  // tile t landed everywhere; tile t - 1's buffer is free
    if (t == lo) {
      qk_scale[0] = row_scale[mt * 16 + g];
      qk_scale[1] = row_scale[mt * 16 + g + 8];
    }
    if (next_tile < hi) kv.issue(next_tile);
    // tile next_tile + 1's entries: loaded now, kept after this tile's products hid the latency
    const int ahead = kv.entry(next_tile + 1);
    ++next_tile;
    copy_commit();

    const uint32_t k_base = shared_address(kv.stage(t)), v_base = k_base + tile * RB;
    const int key0 = KPW * ks;  // the warp's first key in the tile

    // S = Q K^T over the warp's KPW keys: NJ n8 tiles
    float s[NJ][4];
#pragma unroll
    for (int j = 0; j < NJ; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    if constexpr (FP8) {
#pragma unroll
      for (int u = 0; u < HEAD / 64; ++u) {  // 64 head elements: 4 k16 steps
        uint32_t a[4][4];
#pragma unroll
        for (int st = 0; st < 4; ++st)
          ldmatrix_x4(a[st], q_base + swizzled(mt * 16 + (lane & 15), 2 * (4 * u + st) + (lane >> 4), QB));
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          uint32_t b[4];
          ldmatrix_x4(b, k_base + swizzled(key0 + 8 * j + (lane & 7), 4 * u + (lane >> 3), RB));
#pragma unroll
          for (int st = 0; st < 4; ++st) {
            uint32_t b0, b1;
            e4m3x4_to_f16x2(b[st], b0, b1);
            mma16816<false>(s[j], a[st], b0, b1);
          }
        }
      }
    } else {
#pragma unroll
      for (int st = 0; st < HEAD / 16; ++st) {
        uint32_t a[4];
        ldmatrix_x4(a, q_base + swizzled(mt * 16 + (lane & 15), 2 * st + (lane >> 4), QB));
#pragma unroll
        for (int j = 0; j < NJ; j += 2) {
          uint32_t b[4];
          ldmatrix_x4(b, k_base + swizzled(key0 + 8 * (j + (lane >> 4)) + (lane & 7), 2 * st + ((lane >> 3) & 1), RB));
          mma16816<DOT_BF16>(s[j], a, b[0], b[1]);
          mma16816<DOT_BF16>(s[j + 1], a, b[2], b[3]);
        }
      }
    }

    // online softmax over the warp's keys (thread: rows g and g + 8, keys 8j + 2tq + {0, 1})
    const int kabs0 = t * tile + key0 + 2 * tq;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const float x = kabs0 + 8 * j + (e & 1) < key_end[h] ? s[j][e] * qk_scale[h] : -INFINITY;
        s[j][e] = x;
        tile_max[h] = fmaxf(tile_max[h], x);
      }
    float alpha[2], base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], rad_shfl_xor(tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], rad_shfl_xor(tile_max[h], 2));
      const float m_new = fmaxf(row_max[h], tile_max[h]);
      // a row with no visible key yet keeps max -inf: exponentiate against 0 so it stays 0
      base[h] = m_new == -INFINITY ? 0.f : m_new;
      alpha[h] = row_max[h] == m_new ? 1.f : fast_exp2(row_max[h] - base[h]);
      row_max[h] = m_new;
      row_sum[h] *= alpha[h];
    }
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = fast_exp2(s[j][e] - base[e >> 1]);
        row_sum[e >> 1] += s[j][e];
      }
    // Past the first tiles a row's max rarely moves: skip the rescale (a multiply by exactly 1)
    // when no row of the warp's moved.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        acc[n][0] *= alpha[0];
        acc[n][1] *= alpha[0];
        acc[n][2] *= alpha[1];
        acc[n][3] *= alpha[1];
      }
    }

    // O += P V over the warp's keys, 16 at a time
#pragma unroll
    for (int kh = 0; kh < KPW / 16; ++kh) {
      const uint32_t a[4] = {pack2<DOT_BF16>(s[2 * kh][0], s[2 * kh][1]), pack2<DOT_BF16>(s[2 * kh][2], s[2 * kh][3]),
                             pack2<DOT_BF16>(s[2 * kh + 1][0], s[2 * kh + 1][1]),
                             pack2<DOT_BF16>(s[2 * kh + 1][2], s[2 * kh + 1][3])};
      const int vrow = key0 + 16 * kh + (lane & 7) + 8 * ((lane >> 3) & 1);
      if constexpr (FP8) {
#pragma unroll
        for (int c = 0; c < HEAD / 16; c += 2) {  // two 16-element chunks: four n8 tiles
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_base + swizzled(vrow, c + (lane >> 4), RB));
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t lo_keys = __byte_perm(b[2 * h], 0, 0x3120);      // keys 2tq, 2tq+1
            const uint32_t hi_keys = __byte_perm(b[2 * h + 1], 0, 0x3120);  // keys 2tq+8, 2tq+9
            uint32_t lo0, lo1, hi0, hi1;
            e4m3x4_to_f16x2(lo_keys, lo0, lo1);
            e4m3x4_to_f16x2(hi_keys, hi0, hi1);
            mma16816<false>(acc[2 * (c + h)], a, lo0, hi0);
            mma16816<false>(acc[2 * (c + h) + 1], a, lo1, hi1);
          }
        }
      } else {
#pragma unroll
        for (int c = 0; c < NT; c += 2) {  // two 8-element chunks: two n8 tiles
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_base + swizzled(vrow, c + (lane >> 4), RB));
          mma16816<DOT_BF16>(acc[c], a, b[0], b[1]);
          mma16816<DOT_BF16>(acc[c + 1], a, b[2], b[3]);
        }
      }
    }
    kv.keep(next_tile, ahead);  // read after the next iteration's barrier
  }
  rad_release_dependents();

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += rad_shfl_xor(row_sum[h], 1);
    row_sum[h] += rad_shfl_xor(row_sum[h], 2);
  }
  if constexpr (FP8) {
    const float vs = *p.v_scale;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[n][e] *= vs;
  }

  // ---- merge the key slices of each row tile (slice 0 keeps the result) ----
  if (kw > 1) {
    copy_wait<0>();
    __syncthreads();  // every warp is past the loop: the ring is free
    float* const merge = reinterpret_cast<float*>(ring);
    constexpr int SLOT = (NT * 4 + 4) * 32;  // floats a (slice, row tile): values lane-minor
    if (ks > 0) {
      float* m = merge + ((ks - 1) * MT + mt) * SLOT;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) m[(4 * n + e) * 32 + lane] = acc[n][e];
      m[(4 * NT + 0) * 32 + lane] = row_max[0];
      m[(4 * NT + 1) * 32 + lane] = row_max[1];
      m[(4 * NT + 2) * 32 + lane] = row_sum[0];
      m[(4 * NT + 3) * 32 + lane] = row_sum[1];
    }
    __syncthreads();
    if (ks > 0) return;
    for (int other = 1; other < kw; ++other) {
      const float* m = merge + ((other - 1) * MT + mt) * SLOT;
      float wa[2], wb[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float om = m[(4 * NT + h) * 32 + lane];
        const float top = fmaxf(row_max[h], om);
        wa[h] = top == -INFINITY ? 0.f : fast_exp2(row_max[h] - top);
        wb[h] = top == -INFINITY ? 0.f : fast_exp2(om - top);
        row_sum[h] = row_sum[h] * wa[h] + m[(4 * NT + 2 + h) * 32 + lane] * wb[h];
        row_max[h] = top;
      }
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = acc[n][e] * wa[e >> 1] + m[(4 * n + e) * 32 + lane] * wb[e >> 1];
    }
  }

  // ---- store the row tile's partials ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = mt * 16 + g + 8 * h;
    const int pos = q_block * p.block_q + r / p.group;
    if (r >= p.block_q * p.group || pos >= q_len) continue;
    const int head = kv_head * p.group + r % p.group;
    const int64_t unit = ((int64_t)(q_start + pos) * p.num_q_heads + head) * p.num_segments + seg;
    float* out = p.part_out + unit * HEAD;
    if constexpr (FP8) {
#pragma unroll
      for (int c = 0; c < HEAD / 16; ++c)
        *reinterpret_cast<float4*>(out + 16 * c + 4 * tq) =
            make_float4(acc[2 * c][2 * h], acc[2 * c + 1][2 * h], acc[2 * c][2 * h + 1], acc[2 * c + 1][2 * h + 1]);
    } else {
#pragma unroll
      for (int n = 0; n < NT; ++n)
        *reinterpret_cast<float2*>(out + 8 * n + 2 * tq) = make_float2(acc[n][2 * h], acc[n][2 * h + 1]);
    }
    if (tq == 0) {
      p.part_max[unit] = row_max[h];
      p.part_sum[unit] = row_sum[h];
    }
  }
}

template <int HEAD, int MODE, int MT, int KPW>
rad_error_t launch_split_kv(dim3 grid, const SplitKvArgs& p, int smem, rad_stream_t stream) {
  auto kernel = split_kv_partial_kernel<HEAD, MODE, MT, KPW>;
  static int opted_in[64] = {};
  if (const rad_error_t e = opt_in_dynamic_smem(kernel, smem, opted_in)) return e;
  return rad_launch(kernel, grid, dim3(32 * MT * p.kw), stream, p, 1, (size_t)smem);
}

template <int HEAD, int MODE, int KPW>
rad_error_t launch_split_kv_rows(int mt, dim3 grid, const SplitKvArgs& p, int smem, rad_stream_t stream) {
  switch (mt) {
    case 1: return launch_split_kv<HEAD, MODE, 1, KPW>(grid, p, smem, stream);
    case 2: return launch_split_kv<HEAD, MODE, 2, KPW>(grid, p, smem, stream);
    case 3: return launch_split_kv<HEAD, MODE, 3, KPW>(grid, p, smem, stream);
    case 4: return launch_split_kv<HEAD, MODE, 4, KPW>(grid, p, smem, stream);
    default: return launch_split_kv<HEAD, MODE, 5, KPW>(grid, p, smem, stream);
  }
}

template <int HEAD, int MODE>
rad_error_t launch_split_kv_slice(int kpw, int mt, dim3 grid, const SplitKvArgs& p, int smem, rad_stream_t stream) {
  return kpw == 16 ? launch_split_kv_rows<HEAD, MODE, 16>(mt, grid, p, smem, stream)
                   : launch_split_kv_rows<HEAD, MODE, 32>(mt, grid, p, smem, stream);
}

template <int HEAD>
rad_error_t launch_split_kv_mode(int mode, int kpw, int mt, dim3 grid, const SplitKvArgs& p, int smem,
                                 rad_stream_t stream) {
  switch (mode) {
    case 0: return launch_split_kv_slice<HEAD, 0>(kpw, mt, grid, p, smem, stream);
    case 1: return launch_split_kv_slice<HEAD, 1>(kpw, mt, grid, p, smem, stream);
    case 2: return launch_split_kv_slice<HEAD, 2>(kpw, mt, grid, p, smem, stream);
    default: return launch_split_kv_slice<HEAD, 3>(kpw, mt, grid, p, smem, stream);
  }
}

#endif  // !RADIANCE_HIP

}  // namespace
}  // namespace radiance

// Whether this device runs radiance_split_kv_partial: NVIDIA sm_89+ (the fp8 pair conversion).
RAD_EXPORT int radiance_split_kv_supported(void) {
#ifdef RADIANCE_HIP
  return 0;
#else
  return radiance::device_compute_capability() >= 89 ? 1 : 0;
#endif
}

// Shared memory bytes a launch takes (0 for shapes it has no instance of): callers check it
// against the device's limit before launching.
RAD_EXPORT int radiance_split_kv_smem(int head, int mode, int m_tiles, int keys_per_warp, int key_warps,
                                      int stages) {
  if ((head != 128 && head != 256) || mode < 0 || mode > 3 || m_tiles < 1 || m_tiles > 5 ||
      (keys_per_warp != 16 && keys_per_warp != 32) ||
      (key_warps != 1 && key_warps != 2 && key_warps != 4 && key_warps != 8) || stages < 2 || stages > 5 ||
      32 * m_tiles * key_warps > radiance::max_threads(head, m_tiles))
    return 0;
  return radiance::split_kv_smem(head, mode, m_tiles, keys_per_warp, key_warps, stages);
}

// The partial pass of split-KV paged attention (see the top). q [tokens, q_heads, head] (strides
// q_st, q_sh elements; head contiguous); k, v caches [blocks, block_size, kv_heads, head] (strides
// in elements; head contiguous), fp8 e4m3 (mode 0, 1) or the query's dtype (mode 2 bf16, 3
// fp16); block_table [seqs, bt_stride] int32; seq_lens [seqs]; cu_q [seqs + 1] query starts;
// part_out [tokens, q_heads, segments, head] fp32, part_max / part_sum [tokens, q_heads,
// segments]; k_scale / v_scale: one float each (fp8 modes); scale_log2: softmax scale x log2(e).
// Grid: (seqs x q_blocks_per_seq, kv_heads, segments); a query block is block_q tokens of a
// sequence x `group` heads, at most 16 m_tiles rows; key_warps x keys_per_warp (16 or 32) keys a
// KV tile (the unit the segments split, which the reduce must use too); stages KV tiles in flight.
// Returns 0, or the invalid-value code (nothing launched) for anything it cannot run.
RAD_EXPORT int radiance_split_kv_partial(const void* q, int64_t q_st, int64_t q_sh, const void* k,
                                         int64_t k_sb, int64_t k_ss, int64_t k_sh, const void* v,
                                         int64_t v_sb, int64_t v_ss, int64_t v_sh,
                                         const int* block_table, int64_t bt_stride, const int* seq_lens,
                                         const int* cu_q, float* part_out, float* part_max,
                                         float* part_sum, const float* k_scale, const float* v_scale,
                                         float scale_log2, int head, int mode, int num_seqs,
                                         int num_kv_heads, int num_q_heads, int q_blocks_per_seq,
                                         int num_segments, int block_q, int block_size, int m_tiles,
                                         int keys_per_warp, int key_warps, int stages, void* stream) {
#ifdef RADIANCE_HIP
  (void)q, (void)q_st, (void)q_sh, (void)k, (void)k_sb, (void)k_ss, (void)k_sh, (void)v, (void)v_sb;
  (void)v_ss, (void)v_sh, (void)block_table, (void)bt_stride, (void)seq_lens, (void)cu_q;
  (void)part_out, (void)part_max, (void)part_sum, (void)k_scale, (void)v_scale, (void)scale_log2;
  (void)head, (void)mode, (void)num_seqs, (void)num_kv_heads, (void)num_q_heads;
  (void)q_blocks_per_seq, (void)num_segments, (void)block_q, (void)block_size, (void)m_tiles;
  (void)keys_per_warp, (void)key_warps, (void)stages, (void)stream;
  return (int)rad_error_invalid_value;
#else
  using namespace radiance;
  const int bad = (int)rad_error_invalid_value;
  const int smem = radiance_split_kv_smem(head, mode, m_tiles, keys_per_warp, key_warps, stages);
  if (!radiance_split_kv_supported() || smem == 0 || smem > device_smem_optin()) return bad;
  SplitKvArgs p;
  if (const int e = make_split_kv_args(q, q_st, q_sh, k, k_sb, k_ss, k_sh, v, v_sb, v_ss, v_sh, block_table,
                                       bt_stride, seq_lens, cu_q, part_out, part_max, part_sum, k_scale, v_scale,
                                       scale_log2, mode, num_seqs, num_kv_heads, num_q_heads, q_blocks_per_seq,
                                       num_segments, block_q, block_size, 16 * m_tiles, key_warps, stages, &p))
    return e;
  const dim3 grid((unsigned)(num_seqs * q_blocks_per_seq), (unsigned)num_kv_heads, (unsigned)num_segments);
  rad_stream_t s = static_cast<rad_stream_t>(stream);
  return (int)(head == 256 ? launch_split_kv_mode<256>(mode, keys_per_warp, m_tiles, grid, p, smem, s)
                           : launch_split_kv_mode<128>(mode, keys_per_warp, m_tiles, grid, p, smem, s));
#endif
}
