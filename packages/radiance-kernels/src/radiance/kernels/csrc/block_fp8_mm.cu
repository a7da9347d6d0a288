// Block-FP8 GEMM for decode sizes (M <= 16), the weight streamed once at copy bandwidth.
//
//   c[m, n] = sum_g (sum_{k in g} a[m, k] * b[n, k]) * sa[m, g] * sb[n / 128, g]
//
// a: fp8 e4m3fn [M, K] (row stride lda), 1x128 activation scales sa [M, K/128] (any strides,
// so the per-token stride-0 broadcast runs as is); b: fp8 e4m3fn [N, K] (row stride ldb), 128x128
// weight scales sb [ceil(N/128), K/128]. Each 128-column group's integer-exact fp8 products are
// summed in fp32 by the tensor cores, scaled by sa * sb and added to an fp32 total: the
// reference's order of operations per group (reference.block_fp8_mm); only the summation order
// inside and across groups differs.
//
// Why this shape of kernel. At M <= 16 the weight is the whole cost: N*K bytes read once, a few
// flops per byte. CUDA-core fp32 math would need M FMAs per weight byte (16 at M = 16: more than
// the SMs issue at 4.8 TB/s), so the products go through mma.sync m16n8k32 e4m3 (sm_89+) with the
// operands swapped: the *weight* is the 16-row A operand and the tokens are the 8-column B
// operand (two B tiles for M 9-16). Each thread feeds the tensor core from its own 16-byte copies
// of the weight, never shuffling them between threads: the dot over K does not care in which
// order K is visited as long as A and B agree, so a thread's 16 contiguous bytes are mapped onto
// the fragment's K positions (see `mma_step`). A warp reads 16 weight rows x 128 bytes per
// group, every 32-byte sector whole.
//
// Parallelism: a warp owns 16 weight rows (one mma tile, inside one 128-row scale block) and a
// set of K groups. A block puts WN warps side by side along N and WK along K: side by side, the
// warps read the same activation bytes at the same time, so L1 serves them once (at M = 16 the
// activations are as many bytes per group as the weight, and L2 alone could not deliver both);
// along K, a block of few rows still has enough copies in flight. `split` > 1 also spreads K over
// blocks (small N); the last block of a column tile to finish sums their fp32 partials in a
// fixed order. Each warp keeps S groups of weight copies in flight (see the kernel), and on
// sm_90 the first S - 1 are issued before waiting for the previous kernel (PDL): the weight does
// not depend on it.
//
// More in flight is not faster. Timed on the H200 (same harness as the committed results): a
// variant with the ring in dynamic shared memory, S up to 10 (up to a warp's whole share of the
// weight requested at once) and the activations and scales copied into the ring with the weight
// was slower at every mid shape: 5120x4096, M = 1, 11.3 µs at its best config against 8.6, and
// 16-20 µs with the deepest rings; here too S = 3 beats 4 and 5 at 10240x5120. What remains at
// mid sizes is launch, ramp-up and drain: a kernel that only reads the same bytes (benchmark
// `weight_read` rows) takes 7.5 µs at 5120x4096, and this kernel 1.1-1.25x that at M = 1.
#include "block_fp8_mm.cuh"

namespace radiance {
namespace {

// Weights up to this size request each group's activations one group ahead (the kernel's PF).
// Timed on the H200 against requesting them in the group's own iteration, best launch config of
// each, same run (radiance-gemm benchmarks/results/activation_prefetch_ab.md): up to 26 MB,
// where each group's L2 round trip is on a short critical path, 0.85-1.0x the time at M <= 8
// (0.88-1.07x at M = 16); from 42 MB on 0.95-1.10x at M <= 8 and up to 1.33x at M = 16, where
// the ~20 extra registers a thread cost occupancy that streaming the weight needs.
constexpr int64_t kPrefetchMaxBytes = 32ll << 20;

// 16 bytes global -> shared without passing through registers (sm_80+ cp.async, L2 only: the
// weight is read once). HIP: a plain copy (never launched there, see radiance_block_fp8_mm).
RAD_DEVICE void copy_async16(uint4* dst, const uint8_t* src) {
#if !defined(RADIANCE_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned addr = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(src) : "memory");
#else
  *dst = *reinterpret_cast<const uint4*>(src);
#endif
}

RAD_DEVICE void copy_async_commit() {
#if !defined(RADIANCE_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Wait until at most N of this thread's committed copy groups are still in flight.
template <int N>
RAD_DEVICE void copy_async_wait() {
#if !defined(RADIANCE_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// This thread's 4 x 16 bytes of one weight group (its rows r and r + 8, columns 16q.. of each
// 64-column half) into its ring slot; only this thread reads them back.
RAD_DEVICE void copy_group_async(uint4 (&dst)[4][32], int lane, const uint8_t* w_lo,
                                 const uint8_t* w_hi, int64_t off) {
  copy_async16(&dst[0][lane], w_lo + off);
  copy_async16(&dst[1][lane], w_lo + off + 64);
  copy_async16(&dst[2][lane], w_hi + off);
  copy_async16(&dst[3][lane], w_hi + off + 64);
}

RAD_DEVICE uint4 load_shared_input(const uint8_t* p) {
#ifdef RADIANCE_HIP
  return *reinterpret_cast<const uint4*>(p);
#else
  return __ldg(reinterpret_cast<const uint4*>(p));  // read by every block: keep it cached
#endif
}

RAD_DEVICE uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// d += A(16x32) * B(32x8), e4m3 in, fp32 accumulate. Native on sm_89; on sm_90, which has no
// e4m3 mma.sync, ptxas widens the operands to fp16 and runs f16 MMAs. Widening by hand once per
// operand (cvt.rn.f16x2.e4m3x2 + m16n8k16) was timed on the H200 too: 5-15% slower at M 9-16,
// no faster below.
RAD_DEVICE void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                         uint32_t b0, uint32_t b1) {
#if !defined(RADIANCE_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  // Never launched: radiance_block_fp8_mm refuses devices below sm_89 and HIP.
  (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
#endif
}

// One 64-column half of a group. Thread (row r = lane/4, quad q = lane%4) holds 16 contiguous
// bytes at column 16q of weight rows r and r+8 (wl, wh) and of token rows r (+8) (x). The
// m16n8k32 fragments want, per thread, columns {4q..4q+3} and {16+4q..16+4q+3} of its rows; we
// feed them bytes 0-3 / 4-7 (sub-step 0) and 8-11 / 12-15 (sub-step 1) instead. That relabels K
// the same way in A and B, a bijection on the 64 columns, so the dot is unchanged.
template <int TT>
RAD_DEVICE void mma_step(float (&acc)[TT][4], const uint4& wl, const uint4& wh, const uint4 (&x)[TT]) {
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const uint32_t a0 = word(wl, 2 * s), a1 = word(wh, 2 * s);
    const uint32_t a2 = word(wl, 2 * s + 1), a3 = word(wh, 2 * s + 1);
#pragma unroll
    for (int t = 0; t < TT; ++t) mma_e4m3(acc[t], a0, a1, a2, a3, word(x[t], 2 * s), word(x[t], 2 * s + 1));
  }
}

// TT: 8-token tiles (1: M <= 8, 2: M <= 16). A block is WN x WK warps: WN warps side by side
// along N (16 rows each, the same K range, so they read the same activation bytes, which L1
// serves once) and WK warps along K (their sums added through shared memory). S: weight groups
// each warp keeps in flight.
//
// The weight streams through a per-warp ring of S groups in shared memory (cp.async): each
// thread copies its own 4 x 16 bytes of a group and later reads back exactly those, so the ring
// needs no barrier, only the thread's own wait_group. Registers hold one group at a time, which
// is what lets many warps (and so many bytes) be in flight per SM: with the weight staged in
// registers instead, 120-170 registers a thread held the kernel to 12-25% occupancy and 20-40%
// of DRAM bandwidth at mid sizes (Nsight Compute on the H200).
template <int TT, int WN, int WK, int S, bool PF>
__global__ void __launch_bounds__(WN * WK * 32) block_fp8_mm_kernel(const BlockFp8MmArgs p) {
  constexpr int kThreads = WN * WK * 32;
  constexpr int kBlockRows = WN * kTileRows;
  __shared__ uint4 ring[WN * WK][S][4][32];
  __shared__ float red[WK > 1 ? WK : 1][WN][TT * 4][32];
  __shared__ int last_block;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wn = warp % WN, wk = warp / WN;
  const int r = lane >> 2, q = lane & 3;
  const int n_block = blockIdx.x * kBlockRows;
  const int n0 = n_block + wn * kTileRows;
  const int g_begin = blockIdx.y * p.groups_per_split;
  const int g_end = min(p.groups, g_begin + p.groups_per_split);
  const uint8_t* w_lo = p.b + (int64_t)(n0 + r) * p.ldb + q * 16;
  const uint8_t* w_hi = w_lo + 8 * p.ldb;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  // This warp's groups: first, first + WK, ... (count of them).
  const int first = g_begin + wk;
  const int count = first < g_end ? (g_end - first + WK - 1) / WK : 0;
  uint4 (*slot)[4][32] = ring[warp];
  auto issue = [&](int i) {  // group i into ring slot i % S; an empty commit past the end
    if (i < count) {
      copy_group_async(slot[i % S], lane, w_lo, w_hi, (int64_t)(first + i * WK) * kGroup);
    }
    copy_async_commit();
  };
#pragma unroll
  for (int i = 0; i < S - 1; ++i) issue(i);
  // The ring's first copies cover the block's first (S - 1) * WK groups.
  prefetch_weight_l2(p, n_block, kBlockRows, g_begin + (S - 1) * WK, g_end);
  release_early(p);
  rad_wait_prior_grids();  // activations and scales may come from the previous kernel

  const uint8_t* x_row[TT];
  bool x_on[TT];
  const float* sa_row[TT][2];
  bool s_on[TT][2];
#pragma unroll
  for (int t = 0; t < TT; ++t) {
    x_on[t] = r + 8 * t < p.M;
    x_row[t] = p.a + (int64_t)(x_on[t] ? r + 8 * t : 0) * p.lda + q * 16;
    // Output columns of this thread's accumulators: tokens 2q and 2q+1 of each tile.
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int token = 8 * t + 2 * q + j;
      s_on[t][j] = token < p.M;
      sa_row[t][j] = p.sa + (int64_t)(s_on[t][j] ? token : 0) * p.sa_m;
    }
  }
  const float* sb_row = p.sb + (int64_t)(n0 / kGroup) * p.sb_n;

  float total[TT][4];
#pragma unroll
  for (int t = 0; t < TT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) total[t][i] = 0.f;

  // Activations and scales of group i come from L2 (every block reads them). PF: requested one
  // group ahead, into registers, so their latency overlaps the previous group's wait and MMAs
  // instead of adding an L2 round trip to every group; it costs ~20 registers a thread (see
  // kPrefetchMaxBytes). Otherwise requested at the top of the group's own iteration, where their
  // latency overlaps only the wait for the weight.
  uint4 x0[TT], x1[TT];
  float sa[TT][2], sw = 0.f;
  auto load_inputs = [&](int i, uint4 (&a0)[TT], uint4 (&a1)[TT], float (&s)[TT][2], float& w) {
    const int g = first + i * WK;
    const int64_t off = (int64_t)g * kGroup;
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      a0[t] = x_on[t] ? load_shared_input(x_row[t] + off) : zero;
      a1[t] = x_on[t] ? load_shared_input(x_row[t] + off + 64) : zero;
#pragma unroll
      for (int j = 0; j < 2; ++j) s[t][j] = s_on[t][j] ? sa_row[t][j][(int64_t)g * p.sa_g] : 0.f;
    }
    w = sb_row[(int64_t)g * p.sb_g];
  };
  if (PF && count > 0) load_inputs(0, x0, x1, sa, sw);

  for (int i = 0; i < count; ++i) {
    uint4 nx0[TT], nx1[TT];
    float nsa[TT][2], nsw = 0.f;
    if (!PF) load_inputs(i, x0, x1, sa, sw);
    else if (i + 1 < count) load_inputs(i + 1, nx0, nx1, nsa, nsw);
    issue(i + S - 1);
    copy_async_wait<S - 1>();  // group i has landed: at most the S - 1 newer ones are pending
    const uint4(&src)[4][32] = slot[i % S];
    const uint4 wl0 = src[0][lane], wl1 = src[1][lane], wh0 = src[2][lane], wh1 = src[3][lane];
    float acc[TT][4];
#pragma unroll
    for (int t = 0; t < TT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][e] = 0.f;
    mma_step<TT>(acc, wl0, wh0, x0);
    mma_step<TT>(acc, wl1, wh1, x1);
    // C fragment: acc[0], acc[1] are (row r, tokens 2q, 2q+1); acc[2], acc[3] row r + 8.
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      total[t][0] += acc[t][0] * sa[t][0] * sw;
      total[t][1] += acc[t][1] * sa[t][1] * sw;
      total[t][2] += acc[t][2] * sa[t][0] * sw;
      total[t][3] += acc[t][3] * sa[t][1] * sw;
    }
    if (PF && i + 1 < count) {
#pragma unroll
      for (int t = 0; t < TT; ++t) {
        x0[t] = nx0[t];
        x1[t] = nx1[t];
        sa[t][0] = nsa[t][0];
        sa[t][1] = nsa[t][1];
      }
      sw = nsw;
    }
  }
  copy_async_wait<0>();  // no copy may outlive the block (the trailing groups are empty)
  release_late(p);

  // Sum the K-side warps (fixed order: wk = 0 first) and write the block's rows.
  const bool split = gridDim.y > 1;
  if (WK == 1) {
    emit_fragment<TT>(p, split, n_block, wn * kTileRows, total);
  } else {
#pragma unroll
    for (int t = 0; t < TT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[wk][wn][t * 4 + i][lane] = total[t][i];
    __syncthreads();
    for (int i = threadIdx.x; i < WN * TT * 4 * 32; i += kThreads) {
      const int tile = i / (TT * 128), slot = (i >> 5) % (TT * 4), ln = i & 31;
      const int t = slot >> 2, e = slot & 3;
      const int token = 8 * t + 2 * (ln & 3) + (e & 1);
      if (token >= p.M) continue;
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < WK; ++w) v += red[w][tile][slot][ln];
      emit_value(p, split, n_block, tile * kTileRows + (ln >> 2) + (e >= 2 ? 8 : 0), token, v);
    }
  }
  if (split) combine_splits(p, n_block, kBlockRows, kThreads, last_block);
}

template <int TT, int WN, int WK, int S>
rad_error_t launch_ring(bool prefetch, dim3 grid, rad_stream_t s, const BlockFp8MmArgs& p) {
  // Static shared memory must stay within 48 KiB: the ring is warps x S x 2 KiB.
  if constexpr (WN * WK * S * 2048 <= 40 * 1024) {
    return prefetch
        ? rad_launch(block_fp8_mm_kernel<TT, WN, WK, S, true>, grid, dim3(WN * WK * 32), s, p)
        : rad_launch(block_fp8_mm_kernel<TT, WN, WK, S, false>, grid, dim3(WN * WK * 32), s, p);
  } else {
    return rad_error_invalid_value;
  }
}

template <int TT, int WN, int WK>
rad_error_t launch_staged(int stages, bool prefetch, dim3 grid, rad_stream_t s,
                          const BlockFp8MmArgs& p) {
  switch (stages) {
    case 2: return launch_ring<TT, WN, WK, 2>(prefetch, grid, s, p);
    case 3: return launch_ring<TT, WN, WK, 3>(prefetch, grid, s, p);
    case 4: return launch_ring<TT, WN, WK, 4>(prefetch, grid, s, p);
    case 5: return launch_ring<TT, WN, WK, 5>(prefetch, grid, s, p);
    default: return rad_error_invalid_value;
  }
}

template <int TT>
rad_error_t launch_shaped(int warps, int row_warps, int stages, bool prefetch, dim3 grid,
                          rad_stream_t s, const BlockFp8MmArgs& p) {
  switch (warps * 16 + row_warps) {
    case 4 * 16 + 1: return launch_staged<TT, 1, 4>(stages, prefetch, grid, s, p);
    case 4 * 16 + 2: return launch_staged<TT, 2, 2>(stages, prefetch, grid, s, p);
    case 4 * 16 + 4: return launch_staged<TT, 4, 1>(stages, prefetch, grid, s, p);
    case 8 * 16 + 1: return launch_staged<TT, 1, 8>(stages, prefetch, grid, s, p);
    case 8 * 16 + 2: return launch_staged<TT, 2, 4>(stages, prefetch, grid, s, p);
    case 8 * 16 + 4: return launch_staged<TT, 4, 2>(stages, prefetch, grid, s, p);
    case 8 * 16 + 8: return launch_staged<TT, 8, 1>(stages, prefetch, grid, s, p);
    default: return rad_error_invalid_value;
  }
}

// ---- sm_90a: the same GEMM on warpgroup MMAs ---------------------------------------------------
//
// sm_90 runs mma.sync e4m3 as f16 MMAs on widened operands (see mma_e4m3); its native fp8 tensor
// core instruction is the warpgroup MMA, wgmma m64nNk32 e4m3, with the A operand (here the weight)
// in registers and B (the tokens) in shared memory. Each warp still owns 16 weight rows and feeds
// them from its own cp.async ring exactly as above (the warpgroup's 4 warps: 64 consecutive rows,
// N = 8 or 16 tokens); the tokens are staged once per block in wgmma's canonical K-major layout
// (8 x 16-byte core matrices, no swizzle), K relabelled as in mma_step so each thread's 16 weight
// bytes stay its own. A block is WG warpgroups side by side along N, all on the same K groups;
// split K spreads K over blocks. Activations and their scales go through shared memory in chunks
// of kChunkGroups groups, double-buffered: chunk c + 2 is requested into registers while chunk c
// is multiplied and stored at its end, so one barrier a chunk is the only synchronisation.
// Timed on the H200 against the mma.sync kernel, best launch config of each (radiance-gemm
// benchmarks/results/wgmma_ab.md): 0.90-0.98x the time at M = 16 from 25 MB of weight, where the
// widened MMAs of two token tiles limit the mma.sync kernel; 0.98-3.8x elsewhere, where a block
// that reads 128 bytes of each row a group (its warps share one K range) and waits for its MMAs
// every group loses to blocks whose warps spread along K.
constexpr int kChunkGroups = 4;

// Shared-memory writes made by this thread become visible to the async proxy (wgmma's reads).
RAD_DEVICE void fence_proxy_async_shared() {
#ifdef RADIANCE_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Matrix descriptor of a K-major, unswizzled B tile: core matrices of 8 tokens x 16 bytes (128
// contiguous bytes), the two 16-byte halves of a k32 step 128 bytes apart (leading byte offset),
// token octets 256 bytes apart (stride byte offset).
RAD_DEVICE uint64_t b_tile_descriptor(const void* smem) {
#ifdef RADIANCE_WGMMA
  const uint64_t addr = (uint64_t)__cvta_generic_to_shared(smem);
  return ((addr & 0x3FFFF) >> 4) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(256 >> 4) << 32);
#else
  (void)smem;
  return 0;
#endif
}

// d (64 weight rows x 8TT tokens, this thread's C fragments) += A(64x32) * B(32 x 8TT).
template <int TT>
RAD_DEVICE void wgmma_e4m3(float (&d)[TT][4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                           uint64_t b_desc) {
#ifdef RADIANCE_WGMMA
  if constexpr (TT == 1) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 1, 1, 1;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b_desc)
        : "memory");
  } else {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, 1, 1, 1;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b_desc)
        : "memory");
  }
#else
  (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)b_desc;  // never launched
#endif
}

// Shared memory of block_fp8_mm_wgmma_kernel<TT, WG, S, G>: two activation chunks, the warps'
// weight rings (S stages of G groups), two chunks of activation and weight scales.
__host__ __device__ constexpr int wgmma_chunk_bytes(int tt) { return kChunkGroups * 4 * tt * 256; }
__host__ __device__ constexpr int wgmma_smem_bytes(int tt, int wg, int s, int g) {
  return 2 * wgmma_chunk_bytes(tt) + wg * 4 * s * g * 2048 + 2 * kChunkGroups * (8 * tt + wg) * 4;
}

// G: consecutive K groups a ring stage holds. With G = 2 each warp requests 256 contiguous bytes
// of each of its rows at a time instead of 128.
template <int TT, int WG, int S, int G>
__global__ void __launch_bounds__(WG * 128) block_fp8_mm_wgmma_kernel(const BlockFp8MmArgs p) {
#ifdef RADIANCE_WGMMA
  constexpr int kThreads = WG * 128;
  constexpr int kBlockRows = WG * 64;
  constexpr int kTokens = 8 * TT;
  constexpr int kStepBytes = TT * 256;  // one k32 step of B: TT token octets x 2 core matrices
  constexpr int kGroupBytes = 4 * kStepBytes;
  constexpr int kChunkBytes = wgmma_chunk_bytes(TT);
  constexpr int kPieces = kChunkGroups * 8 * kTokens;  // 16-byte activation pieces a chunk
  constexpr int kPerThread = kPieces / kThreads;
  static_assert(kPieces % kThreads == 0, "a chunk's pieces spread evenly over the block");
  static_assert(kChunkGroups * (kTokens + WG) <= kThreads, "one scale a thread per chunk");
  static_assert(kChunkGroups % G == 0, "a ring stage never straddles two chunks");
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* xs = smem;  // [2][kChunkBytes]
  uint4 (*ring)[S][G][4][32] = reinterpret_cast<uint4 (*)[S][G][4][32]>(smem + 2 * kChunkBytes);
  float* sas = reinterpret_cast<float*>(smem + 2 * kChunkBytes + WG * 4 * S * G * 2048);
  float* sbs = sas + 2 * kChunkGroups * kTokens;  // [2][kChunkGroups][WG]
  __shared__ int last_block;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, q = lane & 3;
  const int n_block = blockIdx.x * kBlockRows;
  const int g_begin = blockIdx.y * p.groups_per_split;
  const int count = max(0, min(p.groups, g_begin + p.groups_per_split) - g_begin);
  const int chunks = (count + kChunkGroups - 1) / kChunkGroups;
  const uint8_t* w_lo = p.b + (int64_t)(n_block + warp * kTileRows + r) * p.ldb + q * 16;
  const uint8_t* w_hi = w_lo + 8 * p.ldb;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  uint4 (*slot)[G][4][32] = ring[warp];
  auto issue = [&](int st) {  // groups G st.. into ring slot st % S; an empty commit past the end
#pragma unroll
    for (int gg = 0; gg < G; ++gg) {
      const int i = st * G + gg;
      if (i < count) copy_group_async(slot[st % S][gg], lane, w_lo, w_hi, (int64_t)(g_begin + i) * kGroup);
    }
    copy_async_commit();
  };
#pragma unroll
  for (int st = 0; st < S - 1; ++st) issue(st);
  prefetch_weight_l2(p, n_block, kBlockRows, g_begin + (S - 1) * G, g_begin + count);
  release_early(p);
  rad_wait_prior_grids();  // activations and scales may come from the previous kernel

  // Chunk staging. Piece j of a chunk: group j / (8 kTokens), token (j / 8) % kTokens, 16-byte
  // column slice j % 8 (consecutive threads read a token's group contiguously). Its four words
  // land where mma_step's relabelling of K puts them: slice h*4 + qq, word w -> k32 step
  // 2h + w/2 of the group, core matrix w % 2, bytes 4qq.. of the token's 16-byte row.
  uint4 xr[kPerThread];
  float scale_r = 0.f;
  auto load_chunk = [&](int c) {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int piece = threadIdx.x + j * kThreads;
      const int slice = piece & 7, token = (piece >> 3) % kTokens, gl = piece / (8 * kTokens);
      const int i = c * kChunkGroups + gl;
      xr[j] = token < p.M && i < count
                  ? load_shared_input(p.a + (int64_t)token * p.lda + (int64_t)(g_begin + i) * kGroup + slice * 16)
                  : zero;
    }
    const int t = threadIdx.x;
    if (t < kChunkGroups * kTokens) {
      const int gl = t / kTokens, token = t % kTokens, i = c * kChunkGroups + gl;
      scale_r = token < p.M && i < count ? p.sa[(int64_t)token * p.sa_m + (int64_t)(g_begin + i) * p.sa_g] : 0.f;
    } else if (t < kChunkGroups * (kTokens + WG)) {
      const int u = t - kChunkGroups * kTokens, gl = u / WG, wg = u % WG, i = c * kChunkGroups + gl;
      scale_r = i < count ? p.sb[(int64_t)((n_block + wg * 64) / kGroup) * p.sb_n + (int64_t)(g_begin + i) * p.sb_g] : 0.f;
    }
  };
  auto store_chunk = [&](int c) {
    uint8_t* dst = xs + (c & 1) * kChunkBytes;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int piece = threadIdx.x + j * kThreads;
      const int slice = piece & 7, token = (piece >> 3) % kTokens, gl = piece / (8 * kTokens);
      const int h = slice >> 2, qq = slice & 3;
      uint8_t* base = dst + gl * kGroupBytes + (token >> 3) * 256 + (token & 7) * 16 + 4 * qq;
#pragma unroll
      for (int w = 0; w < 4; ++w)
        *reinterpret_cast<uint32_t*>(base + (2 * h + (w >> 1)) * kStepBytes + (w & 1) * 128) = word(xr[j], w);
    }
    if (threadIdx.x < kChunkGroups * (kTokens + WG)) {
      float* dst_s = threadIdx.x < kChunkGroups * kTokens
                         ? sas + (c & 1) * kChunkGroups * kTokens + threadIdx.x
                         : sbs + (c & 1) * kChunkGroups * WG + (threadIdx.x - kChunkGroups * kTokens);
      *dst_s = scale_r;
    }
  };
  if (chunks > 0) {
    load_chunk(0);
    store_chunk(0);
    if (chunks > 1) load_chunk(1);
  }
  fence_proxy_async_shared();
  __syncthreads();

  float total[TT][4];
#pragma unroll
  for (int t = 0; t < TT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) total[t][e] = 0.f;

  for (int i = 0; i < count; ++i) {
    const int c = i / kChunkGroups, gl = i % kChunkGroups, st = i / G;
    if (i % G == 0) {
      issue(st + S - 1);
      copy_async_wait<S - 1>();  // stage st has landed: at most the S - 1 newer ones are pending
    }
    const uint4(&src)[4][32] = slot[st % S][i % G];
    const uint4 wl0 = src[0][lane], wl1 = src[1][lane], wh0 = src[2][lane], wh1 = src[3][lane];
    const uint8_t* xb = xs + (c & 1) * kChunkBytes + gl * kGroupBytes;
    float acc[TT][4];
#pragma unroll
    for (int t = 0; t < TT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][e] = 0.f;
    wgmma_fence();
    // k32 steps 2h + s: words 2s, 2s + 1 of this thread's 16 bytes of half h (see mma_step).
    wgmma_e4m3<TT>(acc, word(wl0, 0), word(wh0, 0), word(wl0, 1), word(wh0, 1), b_tile_descriptor(xb));
    wgmma_e4m3<TT>(acc, word(wl0, 2), word(wh0, 2), word(wl0, 3), word(wh0, 3),
                   b_tile_descriptor(xb + kStepBytes));
    wgmma_e4m3<TT>(acc, word(wl1, 0), word(wh1, 0), word(wl1, 1), word(wh1, 1),
                   b_tile_descriptor(xb + 2 * kStepBytes));
    wgmma_e4m3<TT>(acc, word(wl1, 2), word(wh1, 2), word(wl1, 3), word(wh1, 3),
                   b_tile_descriptor(xb + 3 * kStepBytes));
    wgmma_commit_and_wait();
    const float* sa_c = sas + (c & 1) * kChunkGroups * kTokens + gl * kTokens;
    const float sw = sbs[(c & 1) * kChunkGroups * WG + gl * WG + warp / 4];
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      const float s0 = sa_c[8 * t + 2 * q] * sw, s1 = sa_c[8 * t + 2 * q + 1] * sw;
      total[t][0] += acc[t][0] * s0;
      total[t][1] += acc[t][1] * s1;
      total[t][2] += acc[t][2] * s0;
      total[t][3] += acc[t][3] * s1;
    }
    if (gl == kChunkGroups - 1 && c + 1 < chunks) {
      // Chunk c + 1 goes into the buffer chunk c - 1 used: every thread finished reading it
      // (wgmma waited) before the barrier that ended chunk c - 1.
      store_chunk(c + 1);
      if (c + 2 < chunks) load_chunk(c + 2);
      fence_proxy_async_shared();
      __syncthreads();
    }
  }
  copy_async_wait<0>();  // no copy may outlive the block (the trailing groups are empty)
  release_late(p);
  const bool split = gridDim.y > 1;
  emit_fragment<TT>(p, split, n_block, warp * kTileRows, total);
  if (split) combine_splits(p, n_block, kBlockRows, kThreads, last_block);
#else
  (void)p;  // never launched: radiance_block_fp8_mm only launches it on sm_90 (sm_90a build)
#endif
}

template <int TT, int WG, int S, int G>
rad_error_t launch_wgmma_staged(dim3 grid, rad_stream_t s, const BlockFp8MmArgs& p) {
#ifdef RADIANCE_HIP
  (void)grid, (void)s, (void)p;
  return rad_error_invalid_value;
#else
  constexpr int kSmem = wgmma_smem_bytes(TT, WG, S, G);
  static int opted_in[64] = {};
  if (const rad_error_t e = opt_in_dynamic_smem(block_fp8_mm_wgmma_kernel<TT, WG, S, G>, kSmem, opted_in))
    return e;
  return rad_launch(block_fp8_mm_wgmma_kernel<TT, WG, S, G>, grid, dim3(WG * 128), s, p, 1, kSmem);
#endif
}

template <int TT>
rad_error_t launch_wgmma(int warps, int stages, int stage_groups, dim3 grid, rad_stream_t s,
                         const BlockFp8MmArgs& p) {
  switch ((warps * 16 + stages) * 4 + stage_groups) {
    case (4 * 16 + 2) * 4 + 1: return launch_wgmma_staged<TT, 1, 2, 1>(grid, s, p);
    case (4 * 16 + 3) * 4 + 1: return launch_wgmma_staged<TT, 1, 3, 1>(grid, s, p);
    case (4 * 16 + 4) * 4 + 1: return launch_wgmma_staged<TT, 1, 4, 1>(grid, s, p);
    case (4 * 16 + 5) * 4 + 1: return launch_wgmma_staged<TT, 1, 5, 1>(grid, s, p);
    case (8 * 16 + 2) * 4 + 1: return launch_wgmma_staged<TT, 2, 2, 1>(grid, s, p);
    case (8 * 16 + 3) * 4 + 1: return launch_wgmma_staged<TT, 2, 3, 1>(grid, s, p);
    case (4 * 16 + 2) * 4 + 2: return launch_wgmma_staged<TT, 1, 2, 2>(grid, s, p);
    case (4 * 16 + 3) * 4 + 2: return launch_wgmma_staged<TT, 1, 3, 2>(grid, s, p);
    case (8 * 16 + 2) * 4 + 2: return launch_wgmma_staged<TT, 2, 2, 2>(grid, s, p);
    default: return rad_error_invalid_value;
  }
}

}  // namespace
}  // namespace radiance

// Which decode GEMM kernels this device runs: bit 0 the mma.sync kernel (NVIDIA sm_89+), bit 1
// the wgmma kernel, bit 2 the TMA kernel (radiance_block_fp8_mm_tma, which also needs the driver's
// tensor-map encoder); bits 1 and 2 on sm_90, whose library is built for sm_90a. 0: none.
RAD_EXPORT int radiance_block_fp8_mm_supported(void) {
#ifdef RADIANCE_HIP
  return 0;
#else
  const int cc = radiance::device_compute_capability();
  return (cc >= 89 ? 1 : 0) | (cc == 90 ? 2 : 0) | (cc == 90 && radiance::tma_encoder_available() ? 4 : 0);
#endif
}

// c [M, N] (row stride ldc; out_dtype 0 bf16, 1 fp16, 2 fp32) = block-FP8 a @ b^T, see the top.
// split: K ranges per column tile (>= 1; > 1 needs `partial` [split, M, N] fp32 and `counters`
// [N / (16 * row_warps)] int32 zeros); warps: 4 or 8 per block, row_warps of them side by side
// along N (1, 2, 4 or 8, dividing warps and N / 16); stages: weight groups in flight per warp
// (2-5 with 4 warps, 2 with 8: the ring of warps x stages x 2 KiB stays within 40 KiB).
// wgmma = G > 0: the warpgroup-MMA kernel (sm_90 only; row_warps == warps) with G groups a ring
// stage: G = 1 with stages 2-5 (4 warps) or 2-3 (8), G = 2 with stages 2-3 (4 warps) or 2 (8).
// overlap_next: 1 lets the next kernel launch before this one's main loop, 0 after it
// (release_early / release_late in block_fp8_mm.cuh). l2_prefetch >= 0: weight groups of each
// row a block requests into L2 before its wait, past the ones its ring requests (sm_90+;
// prefetch_weight_l2 there).
// Returns 0, or the invalid-value code (nothing launched) for anything it cannot run.
RAD_EXPORT int radiance_block_fp8_mm(const void* a, int64_t lda, const float* sa, int64_t sa_m,
                                     int64_t sa_g, const void* b, int64_t ldb, const float* sb,
                                     int64_t sb_n, int64_t sb_g, void* c, int64_t ldc,
                                     int out_dtype, int64_t M, int64_t N, int64_t K, float* partial,
                                     int* counters, int split, int warps, int row_warps, int stages,
                                     int wgmma, int overlap_next, int l2_prefetch, void* stream) {
  using namespace radiance;
  const int bad = (int)rad_error_invalid_value;
  const int supported = radiance_block_fp8_mm_supported();
  if (!(supported & (wgmma ? 2 : 1)) || wgmma < 0 || wgmma > 2) return bad;
  // The ring: <= 40 KiB static (mma.sync kernel); the wgmma kernel's launcher refuses what it
  // has no instance of (at most 64 KiB of dynamic ring).
  if ((warps != 4 && warps != 8) || stages < 2 || stages > 5 || (!wgmma && warps * stages > 20)) return bad;
  if (row_warps < 1 || warps % row_warps || N % kTileRows || (N / kTileRows) % row_warps) return bad;
  if (wgmma && row_warps != warps) return bad;
  BlockFp8MmArgs p;
  int splits = 1;
  if (const int e = make_block_fp8_mm_args(a, lda, sa, sa_m, sa_g, b, ldb, sb, sb_n, sb_g, c, ldc,
                                           out_dtype, M, N, K, partial, counters, split, overlap_next,
                                           l2_prefetch, kTileRows, &p, &splits))
    return e;
  const dim3 grid((unsigned)(N / (kTileRows * row_warps)), (unsigned)splits);
  rad_stream_t s = static_cast<rad_stream_t>(stream);
  if (wgmma) {
    return (int)(M <= 8 ? launch_wgmma<1>(warps, stages, wgmma, grid, s, p)
                        : launch_wgmma<2>(warps, stages, wgmma, grid, s, p));
  }
  const bool prefetch = N * K <= kPrefetchMaxBytes;
  return (int)(M <= 8 ? launch_shaped<1>(warps, row_warps, stages, prefetch, grid, s, p)
                      : launch_shaped<2>(warps, row_warps, stages, prefetch, grid, s, p));
}
