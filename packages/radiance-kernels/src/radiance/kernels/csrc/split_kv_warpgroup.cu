// Split-KV paged attention, the partial pass on Hopper warpgroup MMAs (sm_90a): the same
// partials as split_kv_attention.cu (its header has the algebra, the numerics and the fp8
// relabelling), for verify batches whose rows outgrow mma.sync warps.
//
// Why a second kernel. A width-9 verify step of a model with 8 query heads a KV head has 72 rows a
// KV head. mma.sync warps run them as five 16-row tiles, each warp converting and multiplying the
// same fp8 K and V (split_kv_kernel.md, section 9: 150 M instructions, 16% DRAM); Triton's kernel
// runs them as a 128-row warpgroup block, 44% padding. Here the products are transposed so the
// rows are the MMA's N, which only needs a multiple of 8:
//   S^T [64 keys x N] = K [64 x head] . Q^T [head x N]     (A: K from registers, B: Q in shared memory)
//   O^T [head x N]   += V^T [head x 64] . P^T [64 x N]      (A: V from registers, B: P in shared memory)
// N = 8 NT query rows (NT 2, 4, 5, 6 or 9: 16 to 72 rows; a width-9 step is 72 at 8 heads a KV
// head, 36 in 40 at 4). One warpgroup a block; warp w holds keys [16w, 16w + 16) of S^T and head
// rows [16w, 16w + 16) of each 64-row block of O^T, so every K and V element is loaded and
// converted once a block. A-from-registers is what lets fp8 K and V widen in registers on their
// way in (the fp16 MMA takes no fp8 operand from shared memory); the ldmatrix loads and the fp8
// relabelling are split_kv_attention.cu's.
//
// Softmax across the warpgroup: a query row's keys are spread over the four warps, so each warp's
// column maxima meet in shared memory once a tile; the running maxima live there too (two copies,
// alternating tiles), so every warp applies the same factor to its rows of O^T. Each thread keeps
// its keys' share of the exp-sums, summed across the warpgroup once at the end. P goes to shared
// memory as the second product's B operand with stmatrix (transposed: rows are query rows, 64 keys
// = one 128-byte swizzled line), then a proxy fence, as wgmma reads shared memory through the
// async proxy.
//
// Query rows and P are stored K-major with the 128-byte swizzle (wgmma.cuh); the KV ring is
// split_kv_common.cuh's. At stages = 1 it is one tile's K and V buffers (SINGLE): tile t + 1's K
// rows are copied once every warp has read tile t's (the column-maxima barrier), tile t's V rows at
// the top of tile t, once every warp has read tile t - 1's, so a V copy has the first product and
// the softmax to land and a K copy the softmax and the second product. On bf16 KV at head 256 that
// halves the ring and fits two blocks an SM instead of one (0.88-0.95x the time at widths 1-9 at
// 128K x 1 on an H100); where two stages already fit two or more blocks, the shorter lead costs
// more than it frees (fp8 KV: 1.02-1.09x; split_kv_kernel.md, section 17). Shared memory at head
// 256, fp8, N = 72, two stages: 113 KB, two blocks an SM. That instance holds 144 + 36 fp32
// accumulators a thread, too many for every MMA group's A fragments in registers of their own: it
// retires each group before loading the next (wg_retire_each_group), 3-9% faster than the wgmmas
// ptxas otherwise serializes (C7512). Three other remedies measured slower: two fragment buffers a
// product (the next group's converted once the group before has retired; split_kv_kernel.md,
// section 11), two blocks each holding half of O^T, which compute S^T twice (section 10), and a
// block of two warpgroups, each computing S^T of its own tile and half of O^T over both, in
// lock-step (1.13-1.23x; section 13). Issuing the next tile's first product before this tile's
// softmax (FlashAttention-3's order in one warpgroup) was slower too, at head 128: 1.01-1.05x on
// bf16 KV, 1.09-1.38x on fp8 (section 14). An 8-row instance for plain decode (8 heads a KV head
// run unpadded, one block more an SM on fp8 KV) was 0.96-0.97x the time at single 32K sequences and
// up to 1.11x at 8 sequences (section 16), so a decode block stays 16 rows. The files are
// radiance-attn's.
#include "split_kv_common.cuh"
#include "wgmma.cuh"

namespace radiance {
namespace {

constexpr int kWgTile = 64;      // keys a KV tile: the first product's M
constexpr int kWgThreads = 128;  // one warpgroup

// Whether a product's MMA groups are retired one at a time: a group's four wgmmas pipelined, then
// a wait before the next group's fragments are loaded into the same registers. Only at head 256 x
// 72 rows, where the 144 + 36 accumulators a thread leave no room for every group's fragments in
// registers of their own and ptxas would serialize all 32 wgmmas of a tile (C7512: a wait after
// each; 26% of the warp stall samples at 8 x 128K); retired a group at a time there are 8 waits
// a tile and no spills on fp8 KV (split_kv_kernel.md, section 13). Elsewhere a group's MMAs run
// under the next group's fragment loads.
__host__ __device__ constexpr bool wg_retire_each_group(int head, int nt) { return head == 256 && nt == 9; }

__host__ __device__ constexpr bool wg_cols_ok(int nt) { return nt == 2 || (nt >= 4 && nt <= 6) || nt == 9; }
// Byte offsets from the block's 1024-byte-aligned base: Q^T operand [head / 64][N][128 B], P^T
// operand [N][128 B], each warp's column maxima [4][N], the running maxima [2][N], the query rows'
// score multipliers [N] (floats), block-table entries [max(stages, 2)][64], then the KV ring.
__host__ __device__ constexpr int wg_p_offset(int head, int nt) { return head * 2 * 8 * nt; }
__host__ __device__ constexpr int wg_red_offset(int head, int nt) { return wg_p_offset(head, nt) + 128 * 8 * nt; }
__host__ __device__ constexpr int wg_ring_offset(int head, int nt, int stages) {
  return (wg_red_offset(head, nt) + 7 * 8 * nt * 4 + (stages < 2 ? 2 : stages) * kWgTile * 4 + 127) / 128 * 128;
}
// 1024 bytes of slack align the base.
__host__ __device__ constexpr int wg_smem(int head, int mode, int nt, int stages) {
  return 1024 + wg_ring_offset(head, nt, stages) + stages * 2 * kWgTile * head * (mode_fp8(mode) ? 1 : 2);
}

#if !defined(RADIANCE_HIP)  // NVIDIA only: the kernel and its launch
#ifdef RADIANCE_WGMMA

RAD_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Four (two) 8 x 8 16-bit matrices from the mma fragment layout, each stored transposed: lane l
// names row l % 8 of matrix l / 8 of the stored form.
RAD_DEVICE void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
RAD_DEVICE void stmatrix_x2_trans(uint32_t addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n" ::"r"(addr), "r"(r0), "r"(r1)
               : "memory");
}

// d (64 x 8NT, this thread's fragments) = a (64 x 16: this warp's 16 rows, the mma.sync A fragment
// layout, in registers) . B (16 x 8NT, K-major in shared memory, descriptor b) + (add ? d : 0);
// fp32 accumulation, fp16 or bf16 operands. The instruction names N and lists every accumulator,
// so each column count has its own asm: RAD_WG_RS(N, accumulator placeholders, the next four
// placeholder numbers (a, then b and add), accumulator operands).
#define RAD_WG_D4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define RAD_WG_RS_TYPED(TYPE, N, DREGS, A0, A1, A2, A3, B, ADD, ...)                                     \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" ADD ", 0;\n wgmma.mma_async.sync.aligned.m64n" #N \
               "k16.f32." TYPE "." TYPE " {" DREGS "}, {%" A0 ", %" A1 ", %" A2 ", %" A3 "}, %" B           \
               ", p, 1, 1, 0;\n}\n"                                                                        \
               : __VA_ARGS__                                                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(add)                             \
               : "memory")
#define RAD_WG_RS(N, DREGS, A0, A1, A2, A3, B, ADD, ...)                    \
  do {                                                                      \
    if constexpr (BF16) {                                                   \
      RAD_WG_RS_TYPED("bf16", N, DREGS, A0, A1, A2, A3, B, ADD, __VA_ARGS__); \
    } else {                                                                \
      RAD_WG_RS_TYPED("f16", N, DREGS, A0, A1, A2, A3, B, ADD, __VA_ARGS__);  \
    }                                                                       \
  } while (0)

template <int NT, bool BF16>
RAD_DEVICE void wgmma_rs(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t b, int add) {
  if constexpr (NT == 2) {
    RAD_WG_RS(16, "%0, %1, %2, %3, %4, %5, %6, %7",
              "8", "9", "10", "11", "12", "13",
              RAD_WG_D4(0), RAD_WG_D4(1));
  } else if constexpr (NT == 4) {
    RAD_WG_RS(32, "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15",
              "16", "17", "18", "19", "20", "21",
              RAD_WG_D4(0), RAD_WG_D4(1), RAD_WG_D4(2), RAD_WG_D4(3));
  } else if constexpr (NT == 5) {
    RAD_WG_RS(40, "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
              "%12, %13, %14, %15, %16, %17, %18, %19",
              "20", "21", "22", "23", "24", "25",
              RAD_WG_D4(0), RAD_WG_D4(1), RAD_WG_D4(2), RAD_WG_D4(3), RAD_WG_D4(4));
  } else if constexpr (NT == 6) {
    RAD_WG_RS(48,
              "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
              "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23",
              "24", "25", "26", "27", "28", "29",
              RAD_WG_D4(0), RAD_WG_D4(1), RAD_WG_D4(2), RAD_WG_D4(3), RAD_WG_D4(4),
              RAD_WG_D4(5));
  } else if constexpr (NT == 9) {
    RAD_WG_RS(72,
              "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
              "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
              "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35",
              "36", "37", "38", "39", "40", "41",
              RAD_WG_D4(0), RAD_WG_D4(1), RAD_WG_D4(2), RAD_WG_D4(3), RAD_WG_D4(4),
              RAD_WG_D4(5), RAD_WG_D4(6), RAD_WG_D4(7), RAD_WG_D4(8));
  } else {
    static_assert(NT == 2, "no wgmma_rs instance for this column count");
  }
}
#undef RAD_WG_RS
#undef RAD_WG_RS_TYPED
#undef RAD_WG_D4

#endif  // RADIANCE_WGMMA

// A fragments of the first product's group `grp` (head elements 64 grp .. + 63, four k16 steps):
// warp w's 16 keys of the tile's K rows at `k_s`, fp8 widened in registers.
template <bool FP8, int RB>
RAD_DEVICE void load_k_fragments(uint32_t (&a)[4][4], uint32_t k_s, int grp, int warp, int lane) {
  if constexpr (FP8) {
#pragma unroll
    for (int c = 0; c < 4; c += 2) {  // 16-byte chunks: one k16 step each
      uint32_t r[4];
      ldmatrix_x4(r, k_s + swizzled(16 * warp + (lane & 15), 4 * grp + c + (lane >> 4), RB));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        e4m3x4_to_f16x2(r[2 * h], a[c + h][0], a[c + h][2]);
        e4m3x4_to_f16x2(r[2 * h + 1], a[c + h][1], a[c + h][3]);
      }
    }
  } else {
#pragma unroll
    for (int st = 0; st < 4; ++st)
      ldmatrix_x4(a[st], k_s + swizzled(16 * warp + (lane & 15), 2 * (4 * grp + st) + (lane >> 4), RB));
  }
}

// A fragments of the second product's 64-row block `mb` of O^T (four k16 steps of 16 keys): warp
// w's 16 head elements of the tile's V rows at `v_s`, transposed, fp8 widened in registers.
template <bool FP8, int RB>
RAD_DEVICE void load_v_fragments(uint32_t (&a)[4][4], uint32_t v_s, int mb, int warp, int lane) {
  if constexpr (FP8) {
#pragma unroll
    for (int kp = 0; kp < 2; ++kp) {  // 32 keys: two k16 steps of one ldmatrix
      uint32_t r[4];
      ldmatrix_x4_trans(r, v_s + swizzled(32 * kp + lane, 4 * mb + warp, RB));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // keys 2tq, 2tq + 1 (and + 8) of head elements 2g (low half) and 2g + 1 (high half): A
        // rows g and g + 8 are this 16-element chunk's elements 2g and 2g + 1
        const uint32_t lo_keys = __byte_perm(r[2 * h], 0, 0x3120);
        const uint32_t hi_keys = __byte_perm(r[2 * h + 1], 0, 0x3120);
        e4m3x4_to_f16x2(lo_keys, a[2 * kp + h][0], a[2 * kp + h][1]);
        e4m3x4_to_f16x2(hi_keys, a[2 * kp + h][2], a[2 * kp + h][3]);
      }
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      ldmatrix_x4_trans(a[ks], v_s + swizzled(16 * ks + (lane & 7) + 8 * (lane >> 4),
                                              8 * mb + 2 * warp + ((lane >> 3) & 1), RB));
  }
}

// Thread t of warp w holds S^T and O^T fragments at rows 16w + t / 4 (+ 8) and columns 8j + 2(t % 4)
// (+ 1), j < NT: s[j][e + 2h] is row +8h, column +e.
template <int HEAD, int MODE, int NT, bool SINGLE>
__global__ void __launch_bounds__(kWgThreads) split_kv_warpgroup_kernel(const SplitKvArgs p) {
#ifdef RADIANCE_WGMMA  // sm_90a; elsewhere the launch is refused before it is made
  constexpr bool FP8 = mode_fp8(MODE);
  constexpr bool DOT_BF16 = MODE == 2;
  constexpr int N = 8 * NT;
  constexpr int RB = HEAD * (FP8 ? 1 : 2);  // bytes a key row in the ring
  constexpr int MB = HEAD / 64;             // 64-row blocks of O^T
  constexpr bool RETIRE_EACH_GROUP = wg_retire_each_group(HEAD, NT);
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* const smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
  uint8_t* const sq = smem;
  uint8_t* const sp = smem + wg_p_offset(HEAD, NT);
  float* const red = reinterpret_cast<float*>(smem + wg_red_offset(HEAD, NT));  // [4][N]
  float* const cmax = red + 4 * N;                                              // [2][N]
  float* const row_scale = cmax + 2 * N;                                        // [N]
  int* const entries = reinterpret_cast<int*>(row_scale + N);
  uint8_t* const ring = smem + wg_ring_offset(HEAD, NT, p.stages);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int tile = kWgTile, stages = p.stages;
  rad_wait_prior_grids();  // everything below reads what earlier kernels wrote
  const SplitKvBlock blk(p, tile);
  if (blk.lo >= blk.hi) {
    blk.store_no_keys(p);
    return;
  }
  const int q_block = blk.q_block, kv_head = blk.kv_head, seg = blk.seg;
  const int q_start = blk.q_start, context = blk.context, lo = blk.lo, hi = blk.hi;
  const int rows = blk.rows;  // real columns; the rest pad

  // The loads of the block table's first entries, of the query rows (16 elements a thread) and of
  // k_scale are issued together, the entries first (the first copies wait for them): the three
  // are independent, so their round trips overlap instead of following one another (issued after
  // the ring's start, the query's and k_scale's took 16% of the stall samples of a 4-tile block).
  const KvRing<HEAD, RB, kWgThreads, kWgTile, SINGLE> kv(p, blk, ring, entries, tile);
  int first_entries[5];
  kv.load_first_entries(first_entries);
  constexpr int LPR = HEAD / 16;  // threads a query row
  constexpr int Q_ROWS_A_PASS = kWgThreads / LPR, Q_PASSES = (N + Q_ROWS_A_PASS - 1) / Q_ROWS_A_PASS;
  const int qi = threadIdx.x % LPR;
  uint4 q_raw[Q_PASSES][2];
#pragma unroll
  for (int pass = 0; pass < Q_PASSES; ++pass) {
    const int r = threadIdx.x / LPR + pass * Q_ROWS_A_PASS;
    load_query_chunk(r < N ? blk.query(p, r, qi) : nullptr, q_raw[pass]);
  }
  const float k_scale = FP8 ? *p.k_scale : 1.f;
  int next_tile = kv.start(first_entries);

  // ---- query rows as the first product's B operand, their multipliers ----
  {
#pragma unroll
    for (int pass = 0; pass < Q_PASSES; ++pass) {
      const int r = threadIdx.x / LPR + pass * Q_ROWS_A_PASS;
      if (r >= N) break;  // whole warps: a warp's 32 / LPR rows are all real or all past N
      alignas(16) uint16_t out[16];
      const float scale = query_chunk<MODE, LPR>(q_raw[pass], out, p.scale_log2, k_scale);
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // 8-element chunk 2 qi + half of the row
        const int chunk = 2 * qi + half;
        uint8_t* dst = sq + (chunk >> 3) * (N * 128) + r * 128 + (((chunk & 7) ^ (r & 7)) << 4);
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(out + 8 * half);
      }
      if (qi == 0) row_scale[r] = scale;
    }
    for (int c = threadIdx.x; c < N; c += kWgThreads) cmax[c] = -INFINITY;
    fence_proxy_async();  // the query rows are read by wgmma (the async proxy)
  }

  const uint32_t p_s = shared_address(sp);
  // The operands' descriptors: a step's is the base's plus its byte offset / 16 (the start
  // address field, bits 0-13, holds every shared-memory address / 16 without carrying out).
  const uint64_t q_desc = swizzled_tile_descriptor(shared_address(sq)), p_desc = swizzled_tile_descriptor(p_s);
  float o[MB][NT][4];
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int j = 0; j < NT; ++j) o[mb][j][0] = o[mb][j][1] = o[mb][j][2] = o[mb][j][3] = 0.f;
  float sum[NT][2];  // this thread's keys' share of each of its columns' exp-sums
#pragma unroll
  for (int j = 0; j < NT; ++j) sum[j][0] = sum[j][1] = 0.f;
  const int first_end = context + q_block * p.block_q + 1;  // keys the block's first row sees

  for (int t = lo; t < hi; ++t) {
    int ahead;
    if constexpr (SINGLE) {
      copy_wait<0>();
      __syncthreads();  // tile t's K rows landed everywhere; tile t - 1's V rows are read
      if (t > lo) kv.issue_v(t);
      copy_commit();
      ahead = kv.entry(t + 2);
    } else {
      copy_wait_pending(stages - 2);
      __syncthreads();  // tile t landed everywhere; tile t - 1's buffer is free
      if (next_tile < hi) kv.issue(next_tile);
      ahead = kv.entry(next_tile + 1);
      ++next_tile;
      copy_commit();
    }
    const uint32_t k_s = shared_address(kv.stage(t)), v_s = k_s + tile * RB;
    const int par = (t - lo) & 1;

    // S^T = K Q^T: warp w's 16 keys as A, 16 head elements a step, a group of four steps (64 head
    // elements) a commit. A group's A fragments are all converted before its MMAs are issued (a
    // register written between two wgmmas of a group makes ptxas serialize them), each group into
    // registers of its own, so the next group's are converted while this one runs; where those
    // do not fit, each group retires first (wg_retire_each_group).
    float s[NT][4];
#pragma unroll
    for (int grp = 0; grp < MB; ++grp) {
      uint32_t a[4][4];
      load_k_fragments<FP8, RB>(a, k_s, grp, warp, lane);
      wgmma_fence();
#pragma unroll
      for (int st = 0; st < 4; ++st)
        wgmma_rs<NT, DOT_BF16>(s, a[st], q_desc + ((grp * (N * 128) + st * 32) >> 4), grp + st > 0);
      wgmma_commit();
      if constexpr (RETIRE_EACH_GROUP) wgmma_wait<0>();
    }
    wgmma_wait<0>();
    fence_accumulators(s);
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) fence_accumulators(o[mb]);

    // scores: scaled; causally masked on the tiles that reach past the first row's keys (padding
    // columns are left unmasked: nothing of them is stored). The column maxima's shuffles run over
    // all columns at once, so their latencies overlap.
    const int key = t * tile + 16 * warp + g;
    float cm[NT][2];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float2 sc = FP8 ? *reinterpret_cast<const float2*>(row_scale + 8 * j + 2 * tq)
                            : make_float2(p.scale_log2, p.scale_log2);
      s[j][0] *= sc.x;
      s[j][1] *= sc.y;
      s[j][2] *= sc.x;
      s[j][3] *= sc.y;
    }
    if ((t + 1) * tile > first_end) {  // the block's last tiles only
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * j + 2 * tq + e;
          const int end = col < rows ? first_end + col / p.group : 0x7FFFFFFF;
          if (key >= end) s[j][e] = -INFINITY;
          if (key + 8 >= end) s[j][e + 2] = -INFINITY;
        }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      cm[j][0] = fmaxf(s[j][0], s[j][2]);
      cm[j][1] = fmaxf(s[j][1], s[j][3]);
    }
#pragma unroll
    for (int m = 4; m < 32; m <<= 1)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        cm[j][0] = fmaxf(cm[j][0], rad_shfl_xor(cm[j][0], m));
        cm[j][1] = fmaxf(cm[j][1], rad_shfl_xor(cm[j][1], m));
      }
    if (g == 0)
#pragma unroll
      for (int j = 0; j < NT; ++j)
        *reinterpret_cast<float2*>(red + warp * N + 8 * j + 2 * tq) = make_float2(cm[j][0], cm[j][1]);
    __syncthreads();  // every warp's column maxima are in (and, so, every warp's K fragments)
    if constexpr (SINGLE) {
      if (t + 1 < hi) kv.issue_k(t + 1);
      copy_commit();
    }

    // new running maxima (the same in every warp), probabilities to shared memory, sums
    const float* old_max = cmax + par * N;
    float* new_max = cmax + (par ^ 1) * N;
    float alpha[NT][2];
    uint32_t pk_even[2];  // the even j's packed probabilities, stored with the odd j's
    bool moved = false;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      uint32_t pk[2];
      const int c0 = 8 * j + 2 * tq;
      const float2 r0 = *reinterpret_cast<const float2*>(red + c0), r1 = *reinterpret_cast<const float2*>(red + N + c0);
      const float2 r2 = *reinterpret_cast<const float2*>(red + 2 * N + c0);
      const float2 r3 = *reinterpret_cast<const float2*>(red + 3 * N + c0);
      const float2 old2 = *reinterpret_cast<const float2*>(old_max + c0);
      const float tops[2] = {fmaxf(fmaxf(r0.x, r1.x), fmaxf(r2.x, r3.x)), fmaxf(fmaxf(r0.y, r1.y), fmaxf(r2.y, r3.y))};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = c0 + e;
        const float m_old = e ? old2.y : old2.x;
        const float m_new = fmaxf(tops[e], m_old);
        // a column with no visible key yet keeps max -inf: exponentiate against 0 so it stays 0
        const float base = m_new == -INFINITY ? 0.f : m_new;
        alpha[j][e] = m_old == m_new ? 1.f : fast_exp2(m_old - base);
        moved |= alpha[j][e] != 1.f;
        if (warp == 0 && g == 0) new_max[col] = m_new;
        s[j][e] = fast_exp2(s[j][e] - base);
        s[j][e + 2] = fast_exp2(s[j][e + 2] - base);
        sum[j][e] = sum[j][e] * alpha[j][e] + (s[j][e] + s[j][e + 2]);
      }
      pk[0] = pack2<DOT_BF16>(s[j][0], s[j][1]);  // key row g: columns 2tq, 2tq + 1
      pk[1] = pack2<DOT_BF16>(s[j][2], s[j][3]);  // key row g + 8
      // P^T [query row][64 keys]: matrix (j, h) holds keys 16w + 8h .. + 7 of columns 8j .. 8j + 7;
      // x4 stores (j, 0), (j, 1), (j + 1, 0), (j + 1, 1): lane l names column 8(j + l / 16) + l % 8
      // and the 16-byte chunk 2w + (l / 8) % 2 of its line.
      if (j % 2 == 1 || j == NT - 1) {
        const int jj = j & ~1;
        const int col = 8 * (jj + (lane >> 4)) + (lane & 7);
        const uint32_t addr = p_s + col * 128 + (((2 * warp + ((lane >> 3) & 1)) ^ (col & 7)) << 4);
        if (j % 2 == 1) {
          stmatrix_x4_trans(addr, pk_even[0], pk_even[1], pk[0], pk[1]);
        } else {
          stmatrix_x2_trans(addr, pk[0], pk[1]);
        }
      }
      pk_even[0] = pk[0];
      pk_even[1] = pk[1];
    }
    // Past the first tiles a column's max rarely moves: skip the rescale (a multiply by exactly 1)
    // when none of the warp's (all N of them) moved; every warp decides the same.
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          o[mb][j][0] *= alpha[j][0];
          o[mb][j][1] *= alpha[j][1];
          o[mb][j][2] *= alpha[j][0];
          o[mb][j][3] *= alpha[j][1];
        }
    }
    if constexpr (SINGLE) copy_wait<1>();  // tile t's V rows (tile t + 1's K rows may still fly)
    fence_proxy_async();
    __syncthreads();  // P is in shared memory (SINGLE: and tile t's V rows)

    // O^T += V^T P^T: warp w's 16 head rows of each 64-row block as A, 16 keys a step; one
    // 64-row block a group, its fragments loaded as the first product's are.
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
      uint32_t a[4][4];
      load_v_fragments<FP8, RB>(a, v_s, mb, warp, lane);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_rs<NT, DOT_BF16>(o[mb], a[ks], p_desc + ks * 2, 1);
      wgmma_commit();
      if constexpr (RETIRE_EACH_GROUP) wgmma_wait<0>();
    }
    // Retired here, not under the next tile's first product: with the PV groups in flight across
    // the loop's back edge, ptxas serializes every wgmma (C7513).
    wgmma_wait<0>();
    kv.keep(SINGLE ? t + 2 : next_tile, ahead);  // read after the next iteration's barrier
  }
#pragma unroll
  for (int mb = 0; mb < MB; ++mb) fence_accumulators(o[mb]);
  rad_release_dependents();

  // ---- column exp-sums across the warpgroup; the maxima from the last tile's copy ----
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = sum[j][e];
      v += rad_shfl_xor(v, 4);
      v += rad_shfl_xor(v, 8);
      v += rad_shfl_xor(v, 16);
      if (g == 0) red[warp * N + 8 * j + 2 * tq + e] = v;
    }
  __syncthreads();
  const float* final_max = cmax + ((hi - lo) & 1) * N;
  const float vs = FP8 ? *p.v_scale : 1.f;

  // ---- store: O^T column c is query row c; this thread's head elements of each 64-row block ----
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * j + 2 * tq + e;
      if (col >= rows) continue;
      const int pos = q_block * p.block_q + col / p.group;
      const int head = kv_head * p.group + col % p.group;
      const int64_t unit = ((int64_t)(q_start + pos) * p.num_q_heads + head) * p.num_segments + seg;
      float* out = p.part_out + unit * HEAD;
#pragma unroll
      for (int mb = 0; mb < MB; ++mb) {
        if constexpr (FP8) {  // A rows g, g + 8 were head elements 2g, 2g + 1 of the warp's 16
          *reinterpret_cast<float2*>(out + 64 * mb + 16 * warp + 2 * g) =
              make_float2(o[mb][j][e] * vs, o[mb][j][e + 2] * vs);
        } else {
          out[64 * mb + 16 * warp + g] = o[mb][j][e];
          out[64 * mb + 16 * warp + g + 8] = o[mb][j][e + 2];
        }
      }
      if (warp == 0 && g == 0) {
        p.part_max[unit] = final_max[col];
        p.part_sum[unit] = red[col] + red[N + col] + red[2 * N + col] + red[3 * N + col];
      }
    }
#endif  // RADIANCE_WGMMA
}

template <int HEAD, int MODE, int NT, bool SINGLE>
rad_error_t launch_split_kv_warpgroup_ring(dim3 grid, const SplitKvArgs& p, int smem, rad_stream_t stream) {
  auto kernel = split_kv_warpgroup_kernel<HEAD, MODE, NT, SINGLE>;
  static int opted_in[64] = {};
  if (const rad_error_t e = opt_in_dynamic_smem(kernel, smem, opted_in)) return e;
  return rad_launch(kernel, grid, dim3(kWgThreads), stream, p, 1, (size_t)smem);
}

template <int HEAD, int MODE, int NT>
rad_error_t launch_split_kv_warpgroup(dim3 grid, const SplitKvArgs& p, int smem, rad_stream_t stream) {
  return p.stages == 1 ? launch_split_kv_warpgroup_ring<HEAD, MODE, NT, true>(grid, p, smem, stream)
                       : launch_split_kv_warpgroup_ring<HEAD, MODE, NT, false>(grid, p, smem, stream);
}

template <int HEAD, int MODE>
rad_error_t launch_split_kv_warpgroup_cols(int nt, dim3 grid, const SplitKvArgs& p, int smem, rad_stream_t stream) {
  switch (nt) {
    case 2: return launch_split_kv_warpgroup<HEAD, MODE, 2>(grid, p, smem, stream);
    case 4: return launch_split_kv_warpgroup<HEAD, MODE, 4>(grid, p, smem, stream);
    case 5: return launch_split_kv_warpgroup<HEAD, MODE, 5>(grid, p, smem, stream);
    case 6: return launch_split_kv_warpgroup<HEAD, MODE, 6>(grid, p, smem, stream);
    default: return launch_split_kv_warpgroup<HEAD, MODE, 9>(grid, p, smem, stream);
  }
}

template <int HEAD>
rad_error_t launch_split_kv_warpgroup_mode(int mode, int nt, dim3 grid, const SplitKvArgs& p, int smem,
                                           rad_stream_t stream) {
  switch (mode) {
    case 0: return launch_split_kv_warpgroup_cols<HEAD, 0>(nt, grid, p, smem, stream);
    case 1: return launch_split_kv_warpgroup_cols<HEAD, 1>(nt, grid, p, smem, stream);
    case 2: return launch_split_kv_warpgroup_cols<HEAD, 2>(nt, grid, p, smem, stream);
    default: return launch_split_kv_warpgroup_cols<HEAD, 3>(nt, grid, p, smem, stream);
  }
}

#endif  // !RADIANCE_HIP

}  // namespace
}  // namespace radiance

// Whether this device runs radiance_split_kv_warpgroup: NVIDIA sm_90 (the library is built for
// sm_90a there, where wgmma exists).
RAD_EXPORT int radiance_split_kv_warpgroup_supported(void) {
#ifdef RADIANCE_HIP
  return 0;
#else
  return radiance::device_compute_capability() == 90 ? 1 : 0;
#endif
}

// Shared memory bytes a launch takes (0 for shapes it has no instance of): callers check it
// against the device's limit before launching.
RAD_EXPORT int radiance_split_kv_warpgroup_smem(int head, int mode, int n_tiles, int stages) {
  if ((head != 128 && head != 256) || mode < 0 || mode > 3 || !radiance::wg_cols_ok(n_tiles) || stages < 1 ||
      stages > 5)
    return 0;
  return radiance::wg_smem(head, mode, n_tiles, stages);
}

// The partial pass on warpgroup MMAs (see the top); the arguments are radiance_split_kv_partial's
// (split_kv_attention.cu) with n_tiles (2, 4, 5, 6 or 9) x 8 query rows a block instead of its
// warp shape: block_q x (num_q_heads / num_kv_heads) <= 8 n_tiles, and the KV tile is 64 keys (the
// unit the segments split, which the reduce must use too). Returns 0, or the invalid-value code
// (nothing launched) for anything it cannot run.
RAD_EXPORT int radiance_split_kv_warpgroup(const void* q, int64_t q_st, int64_t q_sh, const void* k, int64_t k_sb,
                                           int64_t k_ss, int64_t k_sh, const void* v, int64_t v_sb, int64_t v_ss,
                                           int64_t v_sh, const int* block_table, int64_t bt_stride,
                                           const int* seq_lens, const int* cu_q, float* part_out, float* part_max,
                                           float* part_sum, const float* k_scale, const float* v_scale,
                                           float scale_log2, int head, int mode, int num_seqs, int num_kv_heads,
                                           int num_q_heads, int q_blocks_per_seq, int num_segments, int block_q,
                                           int block_size, int n_tiles, int stages, void* stream) {
#ifdef RADIANCE_HIP
  (void)q, (void)q_st, (void)q_sh, (void)k, (void)k_sb, (void)k_ss, (void)k_sh, (void)v, (void)v_sb;
  (void)v_ss, (void)v_sh, (void)block_table, (void)bt_stride, (void)seq_lens, (void)cu_q;
  (void)part_out, (void)part_max, (void)part_sum, (void)k_scale, (void)v_scale, (void)scale_log2;
  (void)head, (void)mode, (void)num_seqs, (void)num_kv_heads, (void)num_q_heads;
  (void)q_blocks_per_seq, (void)num_segments, (void)block_q, (void)block_size, (void)n_tiles;
  (void)stages, (void)stream;
  return (int)rad_error_invalid_value;
#else
  using namespace radiance;
  const int bad = (int)rad_error_invalid_value;
  const int smem = radiance_split_kv_warpgroup_smem(head, mode, n_tiles, stages);
  if (!radiance_split_kv_warpgroup_supported() || smem == 0 || smem > device_smem_optin()) return bad;
  SplitKvArgs p;
  if (const int e = make_split_kv_args(q, q_st, q_sh, k, k_sb, k_ss, k_sh, v, v_sb, v_ss, v_sh, block_table,
                                       bt_stride, seq_lens, cu_q, part_out, part_max, part_sum, k_scale, v_scale,
                                       scale_log2, mode, num_seqs, num_kv_heads, num_q_heads, q_blocks_per_seq,
                                       num_segments, block_q, block_size, 8 * n_tiles, 1, stages, &p))
    return e;
  const dim3 grid((unsigned)(num_seqs * q_blocks_per_seq), (unsigned)num_kv_heads, (unsigned)num_segments);
  rad_stream_t s = static_cast<rad_stream_t>(stream);
  return (int)(head == 256 ? launch_split_kv_warpgroup_mode<256>(mode, n_tiles, grid, p, smem, s)
                           : launch_split_kv_warpgroup_mode<128>(mode, n_tiles, grid, p, smem, s));
#endif
}
