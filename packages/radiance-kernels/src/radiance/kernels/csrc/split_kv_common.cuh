// What the two split-KV partial passes share (split_kv_attention.cu: mma.sync warps;
// split_kv_warpgroup.cu: Hopper warpgroup MMAs): the launch arguments, the cp.async KV ring with
// its block-table entries a tile ahead, the operand loads and conversions, and the query
// relabelling of the fp8 modes. split_kv_attention.cu's header explains the numerics.
#pragma once

#include "portability.h"

namespace radiance {
namespace {

struct SplitKvArgs {
  const uint8_t* q;
  const uint8_t* k;
  const uint8_t* v;
  const int* block_table;
  const int* seq_lens;
  const int* cu_q;
  float* part_out;
  float* part_max;
  float* part_sum;
  const float* k_scale;
  const float* v_scale;
  float scale_log2;
  int64_t q_st, q_sh;              // query strides (elements): token, head
  int64_t k_sb, k_ss, k_sh;        // cache strides (elements): block, slot, KV head
  int64_t v_sb, v_ss, v_sh;
  int64_t bt_stride;
  int num_q_heads, q_blocks_per_seq, num_segments, group, block_q, block_size;
  int kw, stages;  // key warps (split_kv_attention.cu; 1 in split_kv_warpgroup.cu), ring depth
};

// mode: 0 fp8 KV with bf16 queries, 1 fp8 KV with fp16 queries, 2 bf16, 3 fp16 (KV and queries).
__host__ __device__ constexpr bool mode_fp8(int mode) { return mode < 2; }
__host__ __device__ constexpr bool mode_bf16_query(int mode) { return mode == 0 || mode == 2; }

// Host side, both exports: checks what both passes need (the shapes, a query block of at most
// max_rows rows, the fp8 scales, non-negative strides) and fills `p`. Returns 0, or the
// invalid-value code.
inline int make_split_kv_args(const void* q, int64_t q_st, int64_t q_sh, const void* k, int64_t k_sb, int64_t k_ss,
                              int64_t k_sh, const void* v, int64_t v_sb, int64_t v_ss, int64_t v_sh,
                              const int* block_table, int64_t bt_stride, const int* seq_lens, const int* cu_q,
                              float* part_out, float* part_max, float* part_sum, const float* k_scale,
                              const float* v_scale, float scale_log2, int mode, int num_seqs, int num_kv_heads,
                              int num_q_heads, int q_blocks_per_seq, int num_segments, int block_q, int block_size,
                              int max_rows, int key_warps, int stages, SplitKvArgs* p) {
  const int bad = (int)rad_error_invalid_value;
  if (num_seqs < 1 || num_kv_heads < 1 || num_q_heads % num_kv_heads || q_blocks_per_seq < 1 ||
      num_segments < 1 || block_q < 1 || block_size < 1 || bt_stride < 1)
    return bad;
  const int group = num_q_heads / num_kv_heads;
  if (block_q * group > max_rows || (mode_fp8(mode) && (k_scale == nullptr || v_scale == nullptr))) return bad;
  if ((q_st | q_sh | k_sb | k_ss | k_sh | v_sb | v_ss | v_sh) < 0) return bad;
  *p = SplitKvArgs{static_cast<const uint8_t*>(q), static_cast<const uint8_t*>(k), static_cast<const uint8_t*>(v),
                   block_table, seq_lens, cu_q, part_out, part_max, part_sum, k_scale, v_scale, scale_log2,
                   q_st, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, bt_stride, num_q_heads, q_blocks_per_seq,
                   num_segments, group, block_q, block_size, key_warps, stages};
  return 0;
}

#if !defined(RADIANCE_HIP)

RAD_DEVICE uint32_t shared_address(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

RAD_DEVICE void copy16(uint32_t dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#endif
}
RAD_DEVICE void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
RAD_DEVICE void copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
// Waits until at most `pending` copy groups are in flight (pending = stages - 2, stages 2-5).
RAD_DEVICE void copy_wait_pending(int pending) {
  switch (pending) {
    case 0: copy_wait<0>(); break;
    case 1: copy_wait<1>(); break;
    case 2: copy_wait<2>(); break;
    default: copy_wait<3>(); break;
  }
}

RAD_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
RAD_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Four e4m3 values (low byte first) -> two pairs of fp16 values, exactly: `lo` from bytes 0-1, `hi`
// from bytes 2-3 (low half first). Taking the two 16-bit halves of one register lets the
// conversion read each half in place (F2FP ... R.H1), with no mask or shift to isolate it.
RAD_DEVICE void e4m3x4_to_f16x2(uint32_t four, uint32_t& lo, uint32_t& hi) {
  lo = hi = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.rn.f16x2.e4m3x2 %0, l; cvt.rn.f16x2.e4m3x2 %1, h; }"
      : "=r"(lo), "=r"(hi)
      : "r"(four));
#endif
}

RAD_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two fp32 values (lo first) as a 16-bit pair of the products' input type.
template <bool BF16>
RAD_DEVICE uint32_t pack2(float lo, float hi) {
  if constexpr (BF16) {
    return (uint32_t)rad_f32_to_bf16(lo) | ((uint32_t)rad_f32_to_bf16(hi) << 16);
  } else {
    return (uint32_t)rad_f32_to_f16(lo) | ((uint32_t)rad_f32_to_f16(hi) << 16);
  }
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of `row_bytes` rows.
RAD_DEVICE uint32_t swizzled(int row, int chunk, int row_bytes) {
  return (uint32_t)(row * row_bytes + ((chunk ^ (row & 7)) << 4));
}

// fp8 modes store query element d of each 16-element chunk at position qk_position(d) so that a
// standard A-fragment ldmatrix hands thread t the elements 4t..4t+3 its K fragment pairs with
// (see the top): position 2t + e holds element 4t + e, position 8 + 2t + e element 4t + 2 + e.
RAD_DEVICE int qk_position(int d) { return ((d & 2) << 2) | ((d >> 2) << 1) | (d & 1); }


// A query row's elements 16i..16i + 15 as they are stored (`src`: for thread i of the row's LPR
// threads; nullptr for a padding row: zeros), for query_chunk.
RAD_DEVICE void load_query_chunk(const uint8_t* src, uint4 (&raw)[2]) {
  raw[0] = raw[1] = make_uint4(0, 0, 0, 0);
  if (src != nullptr) {
    raw[0] = reinterpret_cast<const uint4*>(src)[0];
    raw[1] = reinterpret_cast<const uint4*>(src)[1];
  }
}

// Sixteen elements of a query row as the first product's operand, from `raw` (load_query_chunk's;
// the row's LPR threads are consecutive lanes of one warp), and the row's score multiplier. fp8
// modes widen the row to fp16 times the power of two c that puts its largest magnitude in [2^14,
// 2^15) (exact for every element above 2^-28 of that largest, no overflow for any bf16 or fp16
// input) and relabel it for the K fragments (qk_position); the multiplier then carries k_scale / c.
template <int MODE, int LPR>
RAD_DEVICE float query_chunk(const uint4 (&raw)[2], uint16_t (&out)[16], float scale_log2, float k_scale) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(raw);
  if constexpr (mode_fp8(MODE)) {
    float x[16], amax = 0.f;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      x[e] = mode_bf16_query(MODE) ? rad_bf16_to_f32(h[e]) : rad_f16_to_f32(h[e]);
      amax = fmaxf(amax, fabsf(x[e]));
    }
#pragma unroll
    for (int m = 1; m < LPR; m <<= 1) amax = fmaxf(amax, rad_shfl_xor(amax, m));
    // c = 2^(14 - floor(log2 amax)) from the exponent field (all-zero row: the largest c)
    const int e2 = (int)((rad_f2u(amax) >> 23) & 0xFF) - 127;
    const int biased = min(max(127 + 14 - e2, 1), 253);
    const float c = rad_u2f((uint32_t)biased << 23);
    const float inv_c = rad_u2f((uint32_t)(254 - biased) << 23);
#pragma unroll
    for (int e = 0; e < 16; ++e) out[qk_position(e)] = (uint16_t)rad_f32_to_f16(x[e] * c);
    return scale_log2 * k_scale * inv_c;
  } else {
#pragma unroll
    for (int e = 0; e < 16; ++e) out[e] = h[e];
    return scale_log2;
  }
}
// The same from the row's stored elements: load_query_chunk, then the above.
template <int MODE, int LPR>
RAD_DEVICE float query_chunk(const uint8_t* src, uint16_t (&out)[16], float scale_log2, float k_scale) {
  uint4 raw[2];
  load_query_chunk(src, raw);
  return query_chunk<MODE, LPR>(raw, out, scale_log2, k_scale);
}

// What a block covers: its (sequence, query block, KV head, segment) from the grid, the
// sequence's query rows and context, and tiles [lo, hi) of `tile` keys: segment `seg` of the
// sequence's tiles, cut where the block's last row stops seeing keys (lo >= hi: no tiles; the
// block stores its rows' partials as empty, store_no_keys).
// Reads what earlier kernels wrote: call after rad_wait_prior_grids.
struct SplitKvBlock {
  int seq, q_block, kv_head, seg, q_start, q_len, seq_len, context, lo, hi;
  int rows;  // the block's query rows (row r: token r / group, head r % group); the rest pad
  RAD_DEVICE SplitKvBlock(const SplitKvArgs& p, int tile) {
    seq = (int)blockIdx.x / p.q_blocks_per_seq;
    q_block = (int)blockIdx.x - seq * p.q_blocks_per_seq;
    kv_head = (int)blockIdx.y;
    seg = (int)blockIdx.z;
    q_start = p.cu_q[seq];
    q_len = p.cu_q[seq + 1] - q_start;
    seq_len = p.seq_lens[seq];
    context = seq_len - q_len;
    lo = hi = rows = 0;
    if (q_block * p.block_q >= q_len) return;
    rows = min(p.block_q, q_len - q_block * p.block_q) * p.group;
    const int num_tiles = (seq_len + tile - 1) / tile;
    const int per_seg = (num_tiles + p.num_segments - 1) / p.num_segments;
    lo = seg * per_seg;
    const int block_keys = context + min((q_block + 1) * p.block_q, q_len);
    hi = min(min(lo + per_seg, num_tiles), (block_keys + tile - 1) / tile);
  }
  // A block with no tiles (lo >= hi) still stores its rows' partials as "no keys here" (max -inf,
  // sum 0; the output is not stored, the reduce does not read it then): the reduce combines every
  // segment a token has without reading the sequence's lengths first, one memory round trip.
  RAD_DEVICE void store_no_keys(const SplitKvArgs& p) const {
    for (int r = (int)threadIdx.x; r < rows; r += (int)blockDim.x) {
      const int64_t token = q_start + q_block * p.block_q + r / p.group, head = kv_head * p.group + r % p.group;
      const int64_t unit = (token * p.num_q_heads + head) * p.num_segments + seg;
      p.part_max[unit] = -INFINITY;
      p.part_sum[unit] = 0.f;
    }
  }
  // Elements 16i.. of query row r (nullptr for a padding row), for query_chunk.
  RAD_DEVICE const uint8_t* query(const SplitKvArgs& p, int r, int i) const {
    if (r >= rows) return nullptr;
    const int64_t token = q_start + q_block * p.block_q + r / p.group, head = kv_head * p.group + r % p.group;
    return p.q + (token * p.q_st + head * p.q_sh + 16 * i) * 2;
  }
};

// The KV ring of a block: `stages` buffers of a tile's K rows then V rows (`RB` bytes a row,
// swizzled), filled with cp.async, TPR consecutive threads a key row so a request run covers 128
// contiguous bytes; keys past the sequence are zero-filled (a masked key's V row is 0, never stale
// bytes). Thread i < tile reads row i's block-table entry for tile t into
// entries[(t - lo) % stages] one tile before t's copies read it from there.
//
// The copies are issued by the threads that also run the tile's math, so their address
// arithmetic is on the critical path (the warpgroup pass spent ~40% of its instructions a tile
// here: a division a key row, a runtime-bounded row loop, three ring-slot divisions). THREADS and
// TILE, where the kernel fixes them (0: read from the launch), make the row loop a fixed unrolled
// count; the ring slot is a multiply by ceil(2^32 / stages) (exact for t - lo < 2^30, stages
// 2-5); a power-of-two block size (vLLM's are) takes a shift and a mask for the key's block and
// slot, any other size the division.
//
// SINGLE (the warpgroup pass at stages = 1): one tile's K rows and V rows, each copied when its
// buffer frees (issue_k / issue_v: the kernel issues tile t + 1's K rows once every warp has
// read tile t's, and tile t's V rows once every warp has read tile t - 1's), so a block takes
// half a two-stage ring's shared memory. The block-table entries keep two slots.
template <int HEAD, int RB, int THREADS = 0, int TILE = 0, bool SINGLE = false>
struct KvRing {
  static constexpr int RC = RB / 16;           // 16-byte chunks a key row
  static constexpr int TPR = RC < 8 ? RC : 8;  // copying threads a key row
  const SplitKvArgs& p;
  const int* table;
  uint8_t* ring;
  int* entries;
  int tile, stages, lo, hi, seq_len, kv_head;
  uint32_t stage_magic;  // ceil(2^32 / stages)
  int bs_shift;          // log2(block_size) for a power of two, else -1

  RAD_DEVICE KvRing(const SplitKvArgs& args, const SplitKvBlock& b, uint8_t* ring_, int* entries_, int tile_)
      : p(args), table(args.block_table + (int64_t)b.seq * args.bt_stride), ring(ring_), entries(entries_),
        tile(TILE ? TILE : tile_), stages(args.stages), lo(b.lo), hi(b.hi), seq_len(b.seq_len), kv_head(b.kv_head),
        stage_magic(0xFFFFFFFFu / (uint32_t)entry_slots(args.stages) + 1u),
        bs_shift(log2_of_power_of_two(args.block_size)) {}

  static RAD_DEVICE int entry_slots(int stages) { return SINGLE ? 2 : stages; }
  static RAD_DEVICE int log2_of_power_of_two(int x) {  // -1 for any other x
    if (x & (x - 1)) return -1;
    int s = 0;
    while ((x >> s) > 1) ++s;
    return s;
  }

  RAD_DEVICE int slot_of(int t) const {  // (t - lo) % stages (% 2 when SINGLE)
    const uint32_t x = (uint32_t)(t - lo);
    if constexpr (SINGLE) return (int)(x & 1u);
    return (int)(x - __umulhi(x, stage_magic) * (uint32_t)stages);
  }
  RAD_DEVICE int entry(int t) const {
    const int key = t * tile + (int)threadIdx.x;
    if ((int)threadIdx.x >= tile || t >= hi || key >= seq_len) return 0;
    return table[bs_shift >= 0 ? key >> bs_shift : key / p.block_size];
  }
  RAD_DEVICE void keep(int t, int e) const {
    if ((int)threadIdx.x < tile) entries[slot_of(t) * tile + threadIdx.x] = e;
  }
  // Tile t's K rows; its V rows follow at + tile * RB.
  RAD_DEVICE uint8_t* stage(int t) const { return SINGLE ? ring : ring + slot_of(t) * 2 * tile * RB; }
  RAD_DEVICE void issue(int t) const { issue_rows<true, true>(t); }
  RAD_DEVICE void issue_k(int t) const { issue_rows<true, false>(t); }
  RAD_DEVICE void issue_v(int t) const { issue_rows<false, true>(t); }
  template <bool K, bool V>
  RAD_DEVICE void issue_rows(int t) const {
    const int slot = slot_of(t);
    const uint32_t kbase = shared_address(stage(t)), vbase = kbase + tile * RB;
    const int* ent = entries + slot * tile;
    const int copy_sub = (int)threadIdx.x % TPR;
    const int rows_a_pass = THREADS ? THREADS / TPR : (int)blockDim.x / TPR;
    const uint8_t* const k_head = p.k + p.k_sh * kv_head * (RB / HEAD);
    const uint8_t* const v_head = p.v + p.v_sh * kv_head * (RB / HEAD);
    const int block_mask = p.block_size - 1;
    if constexpr (THREADS > 0 && TILE > 0) {
      static_assert(TILE % (THREADS / TPR) == 0, "the copying threads cover a tile in whole passes");
#pragma unroll
      for (int pass = 0; pass < TILE / (THREADS / TPR); ++pass)
        issue_row<K, V>(t, (int)threadIdx.x / TPR + pass * (THREADS / TPR), copy_sub, kbase, vbase, ent, k_head,
                        v_head, block_mask);
    } else {
      for (int row = (int)threadIdx.x / TPR; row < tile; row += rows_a_pass)
        issue_row<K, V>(t, row, copy_sub, kbase, vbase, ent, k_head, v_head, block_mask);
    }
  }
  template <bool K, bool V>
  RAD_DEVICE void issue_row(int t, int row, int copy_sub, uint32_t kbase, uint32_t vbase, const int* ent,
                            const uint8_t* k_head, const uint8_t* v_head, int block_mask) const {
    const int key = t * tile + row;
    const bool valid = key < seq_len;
    // A key past the sequence has entry 0 (entry()) and slot 0: its source address is block 0's
    // first row, inside the cache, and the copy reads none of it (zero-fill).
    const uint32_t slot = !valid ? 0u : bs_shift >= 0 ? (uint32_t)(key & block_mask) : (uint32_t)(key % p.block_size);
    const uint64_t e = (uint32_t)ent[row];  // block numbers are non-negative
    const uint8_t* ksrc = k_head + (e * p.k_sb + slot * p.k_ss) * (RB / HEAD);
    const uint8_t* vsrc = v_head + (e * p.v_sb + slot * p.v_ss) * (RB / HEAD);
#pragma unroll
    for (int c = 0; c < RC / TPR; ++c) {
      const int chunk = copy_sub + c * TPR;
      if constexpr (K) copy16(kbase + swizzled(row, chunk, RB), ksrc + 16 * chunk, valid);
      if constexpr (V) copy16(vbase + swizzled(row, chunk, RB), vsrc + 16 * chunk, valid);
    }
  }
  // The first `stages` tiles' entries (two when SINGLE), their loads in flight together, for
  // start(first).
  RAD_DEVICE void load_first_entries(int (&first)[5]) const {
#pragma unroll
    for (int s = 0; s < 5; ++s) first[s] = s < entry_slots(stages) ? entry(lo + s) : 0;
  }
  // The first `stages` tiles' entries into place, then stages - 1 tiles' copies, one commit group
  // each (SINGLE: the first tile's K and V rows, one group). Returns the next tile to issue.
  RAD_DEVICE int start() const {
    int first[5];
    load_first_entries(first);
    return start(first);
  }
  RAD_DEVICE int start(const int (&first)[5]) const {
#pragma unroll
    for (int s = 0; s < 5; ++s)
      if (s < entry_slots(stages)) keep(lo + s, first[s]);
    __syncthreads();
    if constexpr (SINGLE) {
      if (lo < hi) issue(lo);
      copy_commit();
      return lo + 1;
    }
    int next = lo;
    for (int s = 0; s < stages - 1; ++s) {
      if (next < hi) issue(next);
      ++next;
      copy_commit();
    }
    return next;
  }
};

#endif  // !RADIANCE_HIP

}  // namespace
}  // namespace radiance
