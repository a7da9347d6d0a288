// What the decode block-FP8 GEMM kernels share (block_fp8_mm.cu: mma.sync and register-fed wgmma;
// block_fp8_mm_tma.cu: tensor-memory-accelerator copies and wgmma from shared memory): the launch
// arguments, the output stores and the split-K combine (the warpgroup-MMA plumbing is wgmma.cuh's).
#pragma once

#include "portability.h"
#include "wgmma.cuh"

namespace radiance {

bool tma_encoder_available();  // block_fp8_mm_tma.cu: the driver's tensor-map encoder was found

namespace {

constexpr int kTileRows = 16;  // weight rows per block: the mma's M
constexpr int kGroup = 128;    // K columns per scale group

struct BlockFp8MmArgs {
  const uint8_t* a;
  const uint8_t* b;
  const float* sa;
  const float* sb;
  void* c;
  float* partial;  // [splits, M, N] fp32, split > 1 only
  int* counters;   // [N / 16] zeros, left zero; split > 1 only
  int64_t lda, ldb, ldc, sa_m, sa_g, sb_n, sb_g;
  int M, N, groups, groups_per_split, out_dtype;
  int overlap_next;  // 1: release the next kernel before this grid's wait (see release_early)
  int l2_prefetch;   // weight groups of each of a block's rows requested into L2 at its start
};

RAD_DEVICE void store_out(void* c, int64_t idx, int code, float v) {
  if (code == 0) {
    reinterpret_cast<uint16_t*>(c)[idx] = (uint16_t)rad_f32_to_bf16(v);
  } else if (code == 1) {
    reinterpret_cast<uint16_t*>(c)[idx] = (uint16_t)rad_f32_to_f16(v);
  } else {
    reinterpret_cast<float*>(c)[idx] = v;
  }
}

// One output value of the block's rows: the result, or with split K this split's fp32 partial.
RAD_DEVICE void emit_value(const BlockFp8MmArgs& p, bool split, int n_block, int row, int token,
                           float v) {
  if (split) {
    p.partial[((int64_t)blockIdx.y * p.M + token) * p.N + n_block + row] = v;
  } else {
    store_out(p.c, token * p.ldc + n_block + row, p.out_dtype, v);
  }
}

// A warp's C fragments of a 16-row tile starting at block row `row0`: thread (r, q) holds rows
// r and r + 8, tokens 8t + 2q and 8t + 2q + 1 of each 8-token tile t.
template <int TT>
RAD_DEVICE void emit_fragment(const BlockFp8MmArgs& p, bool split, int n_block, int row0,
                              const float (&total)[TT][4]) {
  const int lane = threadIdx.x & 31, r = lane >> 2, q = lane & 3;
#pragma unroll
  for (int t = 0; t < TT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int token = 8 * t + 2 * q + (e & 1);
      if (token < p.M) emit_value(p, split, n_block, row0 + r + (e >= 2 ? 8 : 0), token, total[t][e]);
    }
}

// Where a decode GEMM lets the next kernel in the stream launch (programmatic dependent launch,
// see rad_release_dependents; every kernel calls exactly one of the two). A decode step runs its
// layers' GEMMs and epilogues back to back, and each grid's first weight bytes arrive a launch
// plus a DRAM round trip after it starts: a read-only pass over 4-66 MB costs 3-4 us more than
// its bytes at copy speed on the H200. Released early, before this grid's own wait, the
// next kernel is launched as soon as every block of this one is resident, and where it fits
// beside them its blocks request their static weight while this grid still streams, so those
// microseconds overlap this kernel instead of following it. Released late, after the main loop,
// the next kernel only starts with this one's tail. Early is not always better (1.01-1.13x the
// time for the cp.async kernel below 9 MB, likely because a chain of small grids then becomes
// resident at once and their weight requests compete with the running one's), so the choice is
// a launch parameter and the dispatch table picks it per shape from measurements (radiance-gemm's
// `ov` config field, benchmarks/results/overlap_ab.md there).
RAD_DEVICE void release_early(const BlockFp8MmArgs& p) {
  if (p.overlap_next) rad_release_dependents();
}
RAD_DEVICE void release_late(const BlockFp8MmArgs& p) {
  if (!p.overlap_next) rad_release_dependents();
}

// L2 prefetch of the block's weight share, before its wait for the previous kernel. A block's
// ring requests only its first few groups there (S - 1 a warp: a few KiB a block); under early
// release (ov1) the next GEMM's blocks become resident during this one's tail and then idle in
// their wait. Requested as one bulk prefetch a row (thread t: row n_block + t, groups
// [g_from, g_from + l2_prefetch) of it), the rest of the block's share is on its way to L2 during
// that wait, with no shared memory or registers held for it, and the ring's later copies find it
// there. The weight is static, so requesting it before the wait keeps the stream's order. A
// launch parameter like the others (radiance-gemm's `pf` config field): prefetched far ahead of
// a large grid, lines could be evicted before their block reads them. sm_90+ (the bulk prefetch);
// elsewhere nothing.
RAD_DEVICE void prefetch_weight_l2(const BlockFp8MmArgs& p, int n_block, int rows, int g_from,
                                   int g_to) {
#if !defined(RADIANCE_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int g_end = min(g_to, g_from + p.l2_prefetch);
  const int t = threadIdx.x;
  if (t < rows && g_from < g_end) {
    const uint8_t* src = p.b + (int64_t)(n_block + t) * p.ldb + (int64_t)g_from * kGroup;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"((g_end - g_from) * kGroup)
                 : "memory");
  }
#else
  (void)p, (void)n_block, (void)rows, (void)g_from, (void)g_to;
#endif
}

// Split K: the last block of a column tile to arrive (arrive_last: true in that block) sums the
// partials, in split order, and resets the counter, so the counters are zero before and after
// every launch. Called by every thread of a block after it wrote its partials. `last_block` is the calling kernel's own __shared__ flag:
// declared here instead (one module-scope shared variable for every kernel), the mma.sync kernel
// compiled to the same PTX otherwise yet ran 1.03-1.30x slower on the H200, same launch configs
// timed against the previous build in one process (radiance-gemm wgmma_ab.md).
RAD_DEVICE bool arrive_last(const BlockFp8MmArgs& p, int& last_block) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_block = atomicAdd(&p.counters[blockIdx.x], 1) == (int)gridDim.y - 1;
  __syncthreads();
  if (!last_block) return false;
  __threadfence();
  return true;
}

// A partial another block of this grid wrote: read from L2, never from a stale L1 line.
RAD_DEVICE float load_partial(const float* src) {
#ifdef RADIANCE_HIP
  return *reinterpret_cast<const volatile float*>(src);
#else
  return __ldcg(src);
#endif
}

RAD_DEVICE void combine_splits(const BlockFp8MmArgs& p, int n_block, int block_rows, int threads,
                               int& last_block) {
  if (!arrive_last(p, last_block)) return;
  for (int i = threadIdx.x; i < block_rows * p.M; i += threads) {
    const int token = i / block_rows, row = i % block_rows;
    float s = 0.f;
    for (int y = 0; y < (int)gridDim.y; ++y) {
      s += load_partial(p.partial + ((int64_t)y * p.M + token) * p.N + n_block + row);
    }
    store_out(p.c, token * p.ldc + n_block + row, p.out_dtype, s);
  }
  if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;
}

// Host side, both exports: checks what every decode GEMM kernel needs (M 1-16, N a multiple of
// `rows`, K of 128, 16-byte aligned rows, split K's scratch) and fills `p`. Returns 0, or the
// invalid-value code.
inline int make_block_fp8_mm_args(const void* a, int64_t lda, const float* sa, int64_t sa_m,
                                  int64_t sa_g, const void* b, int64_t ldb, const float* sb,
                                  int64_t sb_n, int64_t sb_g, void* c, int64_t ldc, int out_dtype,
                                  int64_t M, int64_t N, int64_t K, float* partial, int* counters,
                                  int split, int overlap_next, int l2_prefetch, int rows,
                                  BlockFp8MmArgs* p, int* splits) {
  const int bad = (int)rad_error_invalid_value;
  if (M < 1 || M > 16 || N < rows || N % rows || K < kGroup || K % kGroup) return bad;
  if (N > (1 << 30) || K > (1 << 30) || out_dtype < 0 || out_dtype > 2) return bad;
  if (!a || !b || !sa || !sb || !c || lda % 16 || ldb % 16 || lda < K || ldb < K || ldc < N) return bad;
  if ((uintptr_t)a % 16 || (uintptr_t)b % 16 || split < 1 || l2_prefetch < 0) return bad;
  const int groups = (int)(K / kGroup);
  const int per_split = (groups + split - 1) / split;
  *splits = (groups + per_split - 1) / per_split;
  if (*splits > 1 && (!partial || !counters)) return bad;
  p->a = static_cast<const uint8_t*>(a);
  p->b = static_cast<const uint8_t*>(b);
  p->sa = sa;
  p->sb = sb;
  p->c = c;
  p->partial = partial;
  p->counters = counters;
  p->lda = lda, p->ldb = ldb, p->ldc = ldc, p->sa_m = sa_m, p->sa_g = sa_g, p->sb_n = sb_n;
  p->sb_g = sb_g;
  p->M = (int)M, p->N = (int)N, p->groups = groups, p->groups_per_split = per_split;
  p->out_dtype = out_dtype;
  p->overlap_next = overlap_next != 0;
  p->l2_prefetch = l2_prefetch;
  return 0;
}

}  // namespace
}  // namespace radiance
