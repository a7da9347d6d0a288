// Block-FP8 GEMM for decode sizes on sm_90, the weight streamed by the tensor memory accelerator.
//
// The product of block_fp8_mm.cu (see there for the semantics and why the weight is the MMA's
// 64-row A operand): c[m, n] = sum_g (sum_{k in g} a[m, k] b[n, k]) sa[m, g] sb[n / 128, g] for
// M <= 16, each group's sums promoted to fp32 and scaled, in the reference's order.
//
// Why a third kernel. The two kernels there move the weight with 16-byte cp.async copies, four per
// thread per group, each warp through its own ring. Here one thread requests whole tiles: the
// weight's [64 rows x 128 columns] of a group (8 KiB, one instruction) and the activations'
// [8 or 16 tokens x 128 columns] of the same group, into a ring of S stages in shared memory,
// each stage counted in by a transaction barrier; the warpgroup's MMA (wgmma m64nNk32 e4m3, both
// operands from shared memory) reads the tiles where they landed. The S weight tiles of the ring
// are requested before waiting for the previous kernel (PDL): the weight does not depend on it;
// the activation tiles follow the wait.
//
// Measured on the H200 (radiance-gemm benchmarks/results/tma_ab.md and table.md, same runs):
// the ring alone streams at 1.04-1.12x a read-only pass at M = 1, about what the cp.async kernel
// reaches, so at M <= 8 this kernel takes 0.96-1.32x its time from 19 to 66 MB and 0.88-1.05x
// from 131 MB; at M = 16, where the mma.sync kernel issues sm_90's widened f16 MMAs for two token
// tiles, the native fp8 MMA makes it 1-9% faster at 7 of the 10 shapes from 19 MB. Below 8 MB it
// takes up to 2x the time: 64-row blocks leave a small N few blocks to spread the weight over.
//
// Layout: the TMA writes both tiles with the 128-byte swizzle (the 16-byte chunk c of row j at
// chunk c ^ (j % 8) of the row's 128-byte line; tiles 1024-byte aligned, where the pattern
// repeats), which the wgmma descriptors name; a group's four k32 steps are the descriptors'
// start addresses 32 bytes apart. K is visited in its natural order, so Hopper's fp8 datapath
// rounds each of columns 32j..32j+31 of a group together (radiance-kernels README, "The
// block-FP8 decode GEMM").
//
// Split K as in the other kernels: blocks along K write fp32 partials, the last block of a column
// tile to finish sums them in a fixed order.
#include "block_fp8_mm.cuh"

namespace radiance {
namespace {

#ifndef RADIANCE_HIP  // NVIDIA only: the whole kernel, its launch and the tensor maps
// CUtensorMap: 128 opaque bytes, 64-byte aligned, filled by the driver's cuTensorMapEncodeTiled
// (declared here by value so the library needs no driver header).
struct alignas(64) TensorMap {
  uint64_t opaque[16];
};

struct TmaArgs {
  BlockFp8MmArgs p;
  TensorMap weight;  // b [N, K] bytes, box 128 columns x 64 rows
  TensorMap tokens;  // a [M, K] bytes, box 128 columns x 8 TT rows (rows past M land as zeros)
};

constexpr int kTmaRows = 64;                         // weight rows a block: the wgmma's M
constexpr int kWeightTileBytes = kTmaRows * kGroup;  // 8 KiB
__host__ __device__ constexpr int tma_stage_bytes(int tt) { return kWeightTileBytes + 8 * tt * kGroup; }
// Dynamic shared memory: 1024 bytes of slack to align the ring, S stages, S barriers, the
// split-K flag.
__host__ __device__ constexpr int tma_smem_bytes(int tt, int s) {
  return 1024 + s * tma_stage_bytes(tt) + s * 8 + 8;
}

#ifdef RADIANCE_WGMMA
RAD_DEVICE uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

RAD_DEVICE void barrier_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}

// The leader's arrival on a stage's barrier, announcing the bytes its copies will bring.
RAD_DEVICE void barrier_expect_bytes(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

RAD_DEVICE void barrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n wait_stage:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra wait_stage;\n}\n" ::"r"(bar), "r"(parity)
      : "memory");
}

// A [box rows x 128 columns] tile at (column col, row row) into shared memory at dst, counted
// on bar. `policy`: an L2 cache policy (the weight is read once: evict it first).
RAD_DEVICE void tma_load(uint32_t dst, const TensorMap& map, int col, int row, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst), "l"(reinterpret_cast<uint64_t>(&map)), "r"(col),
      "r"(row), "r"(bar)
      : "memory");
}

RAD_DEVICE void tma_load_hinted(uint32_t dst, const TensorMap& map, int col, int row, uint32_t bar,
                                uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst), "l"(reinterpret_cast<uint64_t>(&map)), "r"(col),
      "r"(row), "r"(bar), "l"(policy)
      : "memory");
}

// d (64 weight rows x 8TT tokens, this thread's C fragments) = A(64x32) * B(32 x 8TT) + (add ? d :
// 0), both operands in shared memory. Starting a group with add = 0 instead of zeroing d keeps
// every access to the accumulators inside wgmma, which lets ptxas keep one group's MMAs in flight
// while the previous group's results are read.
template <int TT>
RAD_DEVICE void wgmma_e4m3_ss(float (&d)[TT][4], uint64_t a_desc, uint64_t b_desc, int add) {
  if constexpr (TT == 1) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3}, %4, %5, p, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
        : "l"(a_desc), "l"(b_desc), "r"(add)
        : "memory");
  } else {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
        : "l"(a_desc), "l"(b_desc), "r"(add)
        : "memory");
  }
}
#endif

// Split K: the last block of a column tile to arrive sums the splits' fp32 partials (in split
// order) and resets the counter, as combine_splits does for the other kernels, with every value
// of a thread (at M = 16, 8 of the block's 64 rows x 16 tokens) for kBatch splits requested
// together: one L2 round trip a batch, instead of one a split or one a value and split (several
// microseconds more at M = 16). Timed against one split after the other in one run (the two
// builds alternated twice, H200; radiance-gemm's tma_ab.md): 8-way splits 0.85-0.96x the time,
// the 4-stage auto split of 5120x5120 at M = 4-16 0.82-0.87x, unsplit launches 0.94-1.04x.
template <int TT>
RAD_DEVICE void combine_tma_splits(const BlockFp8MmArgs& p, int n_block, int& last_block) {
  if (!arrive_last(p, last_block)) return;
  constexpr int kPer = kTmaRows * 8 * TT / 128;  // value v of this thread: row t % 64, token 2v + t / 64
  constexpr int kBatch = 32 / kPer;              // 32 partials in registers at a time
  const int row = threadIdx.x % kTmaRows, token0 = threadIdx.x / kTmaRows;
  const int splits = (int)gridDim.y;
  float sum[kPer];
#pragma unroll
  for (int v = 0; v < kPer; ++v) sum[v] = 0.f;
  for (int y0 = 0; y0 < splits; y0 += kBatch) {
    float part[kBatch][kPer];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const float* src = p.partial + (int64_t)(y0 + b) * p.M * p.N + n_block + row;
#pragma unroll
      for (int v = 0; v < kPer; ++v) {
        const int token = 2 * v + token0;
        part[b][v] = y0 + b < splits && token < p.M ? load_partial(src + (int64_t)token * p.N) : 0.f;
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (y0 + b < splits)
#pragma unroll
        for (int v = 0; v < kPer; ++v) sum[v] += part[b][v];
  }
#pragma unroll
  for (int v = 0; v < kPer; ++v) {
    const int token = 2 * v + token0;
    if (token < p.M) store_out(p.c, token * p.ldc + n_block + row, p.out_dtype, sum[v]);
  }
  if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;
}

// TT: 8-token tiles (1: M <= 8, 2: M <= 16); S: ring stages (tiles in flight a block). One
// warpgroup a block, 64 weight rows, grid (N / 64, splits). Thread 0 is the only one that
// requests copies; every thread waits on the stage's barrier, the warpgroup multiplies, and a
// block barrier after the MMAs hands the stage back to thread 0 for the group S further on.
template <int TT, int S>
__global__ void __launch_bounds__(128) block_fp8_mm_tma_kernel(const __grid_constant__ TmaArgs args) {
#ifdef RADIANCE_WGMMA
  const BlockFp8MmArgs& p = args.p;
  constexpr int kStage = tma_stage_bytes(TT);
  extern __shared__ uint8_t smem_raw[];
  uint8_t* ring = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + S * kStage);
  int* last_block = reinterpret_cast<int*>(full + S);
  const uint32_t ring_s = smem_u32(ring), full_s = smem_u32(full);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, q = lane & 3;
  const int n_block = blockIdx.x * kTmaRows;
  const int g_begin = blockIdx.y * p.groups_per_split;
  const int count = max(0, min(p.groups, g_begin + p.groups_per_split) - g_begin);
  const bool leader = threadIdx.x == 0;
  uint64_t policy = 0;
  if (leader) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&args.weight)) : "memory");
    // The weight is read once: its lines go first when L2 needs room (evict-normal loads were
    // 3.6% slower over 32 launch configs on the H200).
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    for (int s = 0; s < S; ++s) barrier_init(full_s + 8 * s);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int s = 0; s < S && s < count; ++s) {
      barrier_expect_bytes(full_s + 8 * s, kStage);
      tma_load_hinted(ring_s + s * kStage, args.weight, (g_begin + s) * kGroup, n_block,
                      full_s + 8 * s, policy);
    }
  }
  // The ring's first loads cover the block's first S groups.
  prefetch_weight_l2(p, n_block, kTmaRows, g_begin + S, g_begin + count);
  __syncthreads();  // the barriers are initialised before anyone waits on them
  release_early(p);
  rad_wait_prior_grids();  // activations and scales may come from the previous kernel
  if (leader)
    for (int s = 0; s < S && s < count; ++s)
      tma_load(ring_s + s * kStage + kWeightTileBytes, args.tokens, (g_begin + s) * kGroup, 0,
               full_s + 8 * s);

  // This thread's accumulators: rows warp*16 + lane/4 (+ 8), tokens 8t + 2q + j. Each group's
  // MMAs go into one of two accumulator sets while the previous group's finish: group i is
  // issued, then the wait for all but the newest MMA group lets group i - 1 be scaled into the
  // total and its stage refilled; the MMAs' latency overlaps the next stage's wait instead of
  // adding to every group. The group scales sa * sb are read one group before they are used.
  const float* sb_row = p.sb + (int64_t)(n_block / kGroup) * p.sb_n;
  auto load_scales = [&](int i, float (&sc)[TT][2]) {
    const int64_t g = g_begin + i;
    const float w = sb_row[g * p.sb_g];
#pragma unroll
    for (int t = 0; t < TT; ++t)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int token = 8 * t + 2 * q + j;
        sc[t][j] = token < p.M ? p.sa[(int64_t)token * p.sa_m + g * p.sa_g] * w : 0.f;
      }
  };
  float total[TT][4], acc0[TT][4] = {}, acc1[TT][4] = {}, sc0[TT][2], sc1[TT][2];
#pragma unroll
  for (int t = 0; t < TT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) total[t][e] = 0.f;
  // Adds a finished group's products, times its scales, to the total.
  auto fold = [&](float (&acc)[TT][4], const float (&sc)[TT][2]) {
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      total[t][0] += acc[t][0] * sc[t][0];
      total[t][1] += acc[t][1] * sc[t][1];
      total[t][2] += acc[t][2] * sc[t][0];
      total[t][3] += acc[t][3] * sc[t][1];
    }
  };
  // Stage i % S may be refilled once every warp's MMAs of group i have finished reading it.
  auto refill = [&](int i) {
    __syncthreads();
    const int s = i % S;
    if (leader && i + S < count) {
      const uint32_t w_s = ring_s + s * kStage;
      barrier_expect_bytes(full_s + 8 * s, kStage);
      tma_load_hinted(w_s, args.weight, (g_begin + i + S) * kGroup, n_block, full_s + 8 * s, policy);
      tma_load(w_s + kWeightTileBytes, args.tokens, (g_begin + i + S) * kGroup, 0, full_s + 8 * s);
    }
  };
  // Group i's MMAs into `acc` once its stage has landed (its scales requested first).
  auto issue = [&](int i, float (&acc)[TT][4], float (&sc)[TT][2]) {
    const int s = i % S;
    load_scales(i, sc);
    barrier_wait(full_s + 8 * s, (uint32_t)(i / S) & 1);
    const uint32_t w_s = ring_s + s * kStage, x_s = w_s + kWeightTileBytes;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k)
      wgmma_e4m3_ss<TT>(acc, swizzled_tile_descriptor(w_s + 32 * k), swizzled_tile_descriptor(x_s + 32 * k),
                        k);
    wgmma_commit();
  };
  // Group i, issued before the newest one: wait for it, add it in, hand its stage back.
  auto retire = [&](int i, float (&acc)[TT][4], const float (&sc)[TT][2]) {
    wgmma_wait<1>();
    fence_accumulators(acc);
    fold(acc, sc);
    refill(i);
  };
  auto retire_last = [&](float (&acc)[TT][4], const float (&sc)[TT][2]) {
    wgmma_wait<0>();
    fence_accumulators(acc);
    fold(acc, sc);
  };
  if (count > 0) {
    issue(0, acc0, sc0);
    int i = 1;
    for (; i + 1 < count; i += 2) {
      issue(i, acc1, sc1);
      retire(i - 1, acc0, sc0);
      issue(i + 1, acc0, sc0);
      retire(i, acc1, sc1);
    }
    if (i < count) {
      issue(i, acc1, sc1);
      retire(i - 1, acc0, sc0);
      retire_last(acc1, sc1);
    } else {
      retire_last(acc0, sc0);
    }
  }
  release_late(p);
  const bool split = gridDim.y > 1;
  emit_fragment<TT>(p, split, n_block, warp * kTileRows, total);
  if (split) combine_tma_splits<TT>(p, n_block, *last_block);
#else
  (void)args;  // never launched: radiance_block_fp8_mm_tma only launches it on sm_90 (sm_90a build)
#endif
}

using EncodeTiled = int (*)(TensorMap*, int, uint32_t, void*, const uint64_t*, const uint64_t*,
                            const uint32_t*, const uint32_t*, int, int, int, int);

// The driver's cuTensorMapEncodeTiled, looked up once through the runtime; null if absent.
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                           cudaEnableDefault, &found);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &found);
#endif
    return e == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<EncodeTiled>(f) : nullptr;
  }();
  return fn;
}

}  // namespace

// Whether the driver's tensor-map encoder was found (radiance_block_fp8_mm_supported's bit 2).
bool tma_encoder_available() { return encode_tiled() != nullptr; }

namespace {

// A map of a [rows, cols] byte matrix (row stride `stride` bytes) read in [box_rows x 128] tiles
// with the 128-byte swizzle; rows past the end read as zeros.
bool encode_rows(TensorMap* map, const void* base, int64_t rows, int64_t cols, int64_t stride,
                 int box_rows) {
  const EncodeTiled fn = encode_tiled();
  if (!fn) return false;
  const uint64_t dims[2] = {(uint64_t)cols, (uint64_t)rows};
  const uint64_t strides[1] = {(uint64_t)stride};
  const uint32_t box[2] = {(uint32_t)kGroup, (uint32_t)box_rows};
  const uint32_t unit[2] = {1, 1};
  // uint8, no interleave, 128-byte swizzle, 128-byte L2 promotion, out-of-bounds zeros. A box
  // row is 128 bytes; promoting its L2 fills to 256 bytes (the next group of the row, which the
  // weight's evict-first policy may drop before the next tile asks for it) was 2% slower over
  // 32 launch configs on the H200, no promotion 0.1% slower than 128 bytes.
  return fn(map, 0, 2, const_cast<void*>(base), dims, strides, box, unit, 0, 3, 2, 0) == 0;
}

// encode_rows through a per-thread cache. A map is a pure function of (address, rows, cols,
// stride, box rows), so a hit is the same map: a layer's weight map is encoded on its first call
// only (and an activation buffer's whenever the allocator hands the same buffer back), and a call
// in the steady state does no driver work before its launch. Direct-mapped: a collision only
// costs a new encode.
bool cached_map(TensorMap* map, const void* base, int64_t rows, int64_t cols, int64_t stride,
                int box_rows) {
  struct Entry {
    TensorMap map;
    const void* base;
    int64_t rows, cols, stride;
    int box_rows;
  };
  constexpr int kSlots = 256;
  thread_local Entry cache[kSlots] = {};
  const uint64_t h = ((uint64_t)(uintptr_t)base >> 7) ^ (uint64_t)rows * 0x9E3779B97F4A7C15ull ^
                     (uint64_t)cols * 0xC2B2AE3D27D4EB4Full ^ (uint64_t)box_rows;
  Entry& e = cache[(h ^ (h >> 29)) % kSlots];
  if (e.base != base || e.rows != rows || e.cols != cols || e.stride != stride || e.box_rows != box_rows) {
    e.base = nullptr;  // stays empty if the encode fails
    if (!encode_rows(&e.map, base, rows, cols, stride, box_rows)) return false;
    e.base = base, e.rows = rows, e.cols = cols, e.stride = stride, e.box_rows = box_rows;
  }
  *map = e.map;
  return true;
}

template <int TT, int S>
rad_error_t launch_tma_staged(dim3 grid, rad_stream_t s, const TmaArgs& args) {
  constexpr int kSmem = tma_smem_bytes(TT, S);
  static int opted_in[64] = {};
  if (const rad_error_t e = opt_in_dynamic_smem(block_fp8_mm_tma_kernel<TT, S>, kSmem, opted_in))
    return e;
  return rad_launch(block_fp8_mm_tma_kernel<TT, S>, grid, dim3(128), s, args, 1, kSmem);
}

template <int TT>
rad_error_t launch_tma(int stages, dim3 grid, rad_stream_t s, const TmaArgs& args) {
  switch (stages) {
    case 4: return launch_tma_staged<TT, 4>(grid, s, args);
    case 6: return launch_tma_staged<TT, 6>(grid, s, args);
    case 8: return launch_tma_staged<TT, 8>(grid, s, args);
    case 12: return launch_tma_staged<TT, 12>(grid, s, args);
    default: return rad_error_invalid_value;
  }
}
#endif

}  // namespace

#ifdef RADIANCE_HIP
bool tma_encoder_available() { return false; }
#endif
}  // namespace radiance

// c [M, N] = block-FP8 a @ b^T, arguments as radiance_block_fp8_mm, by the TMA kernel (sm_90
// only; bit 2 of radiance_block_fp8_mm_supported): 64 weight rows a block (N a multiple of 64),
// `split` K ranges per column tile (> 1 needs `partial` [split, M, N] fp32 and `counters` [N / 64]
// int32 zeros), `stages` tiles in flight a block: 4, 6, 8 or 12, `overlap_next` and
// `l2_prefetch` as there.
// Returns 0, or the invalid-value code (nothing launched) for anything it cannot run.
RAD_EXPORT int radiance_block_fp8_mm_tma(const void* a, int64_t lda, const float* sa, int64_t sa_m,
                                         int64_t sa_g, const void* b, int64_t ldb, const float* sb,
                                         int64_t sb_n, int64_t sb_g, void* c, int64_t ldc,
                                         int out_dtype, int64_t M, int64_t N, int64_t K,
                                         float* partial, int* counters, int split, int stages,
                                         int overlap_next, int l2_prefetch, void* stream) {
  using namespace radiance;
  const int bad = (int)rad_error_invalid_value;
#ifdef RADIANCE_HIP
  (void)a, (void)lda, (void)sa, (void)sa_m, (void)sa_g, (void)b, (void)ldb, (void)sb, (void)sb_n,
      (void)sb_g, (void)c, (void)ldc, (void)out_dtype, (void)M, (void)N, (void)K, (void)partial,
      (void)counters, (void)split, (void)stages, (void)overlap_next, (void)l2_prefetch, (void)stream;
  return bad;
#else
  if (device_compute_capability() != 90 || !tma_encoder_available()) return bad;
  TmaArgs args;
  int splits = 1;
  if (const int e = make_block_fp8_mm_args(a, lda, sa, sa_m, sa_g, b, ldb, sb, sb_n, sb_g, c, ldc,
                                           out_dtype, M, N, K, partial, counters, split, overlap_next,
                                           l2_prefetch, kTmaRows, &args.p, &splits))
    return e;
  const int tt = M <= 8 ? 1 : 2;
  if (!cached_map(&args.weight, b, N, K, ldb, kTmaRows) || !cached_map(&args.tokens, a, M, K, lda, 8 * tt))
    return bad;
  const dim3 grid((unsigned)(N / kTmaRows), (unsigned)splits);
  rad_stream_t s = static_cast<rad_stream_t>(stream);
  return (int)(tt == 1 ? launch_tma<1>(stages, grid, s, args) : launch_tma<2>(stages, grid, s, args));
#endif
}
