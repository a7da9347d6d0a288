// Shared pieces of the three epilogue kernels: the thread layout, row reductions, the group-128
// amax and the dynamic FP8 quant + store.
//
// Thread layout. A block holds `rpb` rows of `tpr` threads each (tpr a multiple of 32), or, split
// across a thread-block cluster, one row is served by `split` consecutive blocks of tpr threads
// (rt = tpr * split threads per row). A row of K elements is nvec = K/8 vectors of 16 bytes;
// thread t of a row (0 <= t < rt) owns vectors c = v*rt + t for v < VPT, so a warp touches 32
// consecutive 16-byte vectors per step (fully coalesced) and the whole row stays in registers
// between the reduction and the quant: one pass over memory. Because tpr is a multiple of 16, the
// 16 consecutive lanes t = 16j..16j+15 of each step own one 128-column quant group (never split
// between blocks), so the group amax is a 4-step shuffle within 16 lanes.
//
// Quant, mirroring vLLM's QuantFP8.forward_native as torch evaluates it on the GPU:
//   scale = max(amax * (1/FP8_MAX), 1/(FP8_MAX*512))   (tensor / python scalar is a multiply by
//           the fp32 reciprocal in ATen's CUDA division kernel and in inductor)
//   per token:  q = fp8(clamp(x * (1/scale)))           (reciprocal, then multiply)
//   per group:  q = fp8(clamp(x / scale))               (true IEEE division)
// amax propagates NaN like torch.amax: it is an unsigned max over |x|'s bit patterns, where
// every NaN sorts above +inf.
#pragma once

#include "portability.h"

// Warp-wide integer reductions in one instruction (redux.sync): NVIDIA sm_80+.
#if !defined(RADIANCE_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define RAD_HAS_REDUX 1
#else
#define RAD_HAS_REDUX 0
#endif

namespace radiance {

constexpr int kMaxThreads = 1024;
constexpr int kMaxWarps = kMaxThreads / 32;

struct LaunchConfig {
  int vpt;    // 16-byte vectors per thread per row (compile-time in the kernel)
  int tpr;    // threads per row in one block
  int rpb;    // rows per block
  int split;  // blocks (one cluster) per row; 1: a row lives in one block
};

// The split a kernel instantiation honours: rows are split only in the decode layouts (at most 2
// vectors a thread); for the large-M instantiations it is the constant 1, so their code carries
// no cluster path (whose temporaries, live next to the row in registers, cost them occupancy).
template <int VPT>
RAD_DEVICE int split_for(int split) {
  return VPT <= 2 ? split : 1;
}

// Where a thread works: its row and its index among the row's threads (across the split).
struct RowThread {
  int64_t row;
  int t;           // 0 <= t < rt
  int rt;          // threads per row, tpr * split
  int first_warp;  // the block's first warp of this row
  bool row_ok;
};

// With one row a block (every decode and most large-M layouts) the thread index is the row's,
// and a split (2, 4 or 8 blocks) is a power of two: no integer division, which costs ~20
// instructions a thread (a float reciprocal and its corrections) and which ptxas may place
// after the wait for the previous kernel. tpr (a multiple of 32, e.g. 160 or 640) needs one
// only for several rows a block.
RAD_DEVICE RowThread row_thread(int tpr, int rpb, int split, int64_t M) {
  RowThread r;
  r.t = threadIdx.x;
  r.first_warp = 0;
  if (split > 1) {  // one row per block, `split` consecutive blocks (a cluster) per row
    const int log2_split = __ffs(split) - 1;
    r.row = blockIdx.x >> log2_split;
    r.t += (int)(blockIdx.x & (split - 1)) * tpr;
  } else if (rpb == 1) {
    r.row = blockIdx.x;
  } else {
    const int rib = threadIdx.x / tpr;
    r.row = (int64_t)blockIdx.x * rpb + rib;
    r.t -= rib * tpr;
    r.first_warp = rib * tpr / RAD_WARP;
  }
  r.rt = tpr * split;
  r.row_ok = r.row < M;
  return r;
}

// Shared memory of one epilogue block: per-warp partials and, for a row split across a cluster,
// every block's partial of the row (pushed here by each block of the cluster) with the two
// transaction barriers that count them in.
constexpr int kMaxSplit = 8;
struct RowShared {
  uint64_t arrived[2];  // mbarriers: [0] the row-sum partials, [1] the row-max partials
  float part_sum[kMaxSplit];
  uint32_t part_max[kMaxSplit];
  float red_sum[kMaxWarps];
  uint32_t red_max[kMaxWarps];
};

// ---- 16-byte vectors ----------------------------------------------------------------------
RAD_DEVICE uint4 ld16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
RAD_DEVICE void st16(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }
RAD_DEVICE void st8(void* p, uint2 v) { *reinterpret_cast<uint2*>(p) = v; }

RAD_DEVICE uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
RAD_DEVICE uint32_t half_of(const uint4& v, int e) {  // 16-bit element e of 8
  return (word_of(v, e >> 1) >> ((e & 1) * 16)) & 0xFFFFu;
}

template <bool BF16>
RAD_DEVICE void unpack8(const uint4& v, float (&f)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] = rad_act_to_f32<BF16>(half_of(v, e));
}

// 8 floats rounded to the act dtype, packed (paired conversions).
template <bool BF16>
RAD_DEVICE uint4 pack8_act(const float (&f)[8]) {
  return make_uint4(rad_f32x2_to_act<BF16>(f[0], f[1]), rad_f32x2_to_act<BF16>(f[2], f[3]),
                    rad_f32x2_to_act<BF16>(f[4], f[5]), rad_f32x2_to_act<BF16>(f[6], f[7]));
}

// Loads 8 weights of any storage dtype (0 bf16, 1 fp16, 2 fp32) as floats.
RAD_DEVICE void load_weight8(const void* w, int wdtype, int64_t col, float (&f)[8]) {
  if (wdtype == 2) {
    const float* p = reinterpret_cast<const float*>(w) + col;
    const uint4 a = ld16(p), b = ld16(p + 4);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      f[e] = rad_u2f(word_of(a, e));
      f[e + 4] = rad_u2f(word_of(b, e));
    }
  } else {
    const uint4 a = ld16(reinterpret_cast<const uint16_t*>(w) + col);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      f[e] = wdtype == 0 ? rad_bf16_to_f32(half_of(a, e)) : rad_f16_to_f32(half_of(a, e));
  }
}

// ---- silu, as torch computes it ----------------------------------------------------------
// s = x / (1 + expf(-x)) in fp32, bit for bit ATen's silu (silu_mul_quant's gate): the same
// libm expf, the same rounded add, an IEEE division. x is always the value of a bf16 or fp16
// input (a gate element), a finite set, and the GPU tests check every one of them
// against torch.
//
// nvcc expands an fp32 division into a refined reciprocal and one correction (MUFU.RCP and five
// FMAs) behind a per-quotient check (FCHK) that sends operands the sequence cannot handle
// (infinite or denormal divisors, quotients near the ends of the exponent range) to a slow
// routine. Per element that guard costs a compare, a branch and a convergence barrier, and the
// branches keep the compiler from interleaving the elements' exp -> divide chains. Here the
// division is written out and guarded once per N elements: when every |x| <= 80 the divisor
// 1 + expf(-x) lies in [1, 2^116] and every operand and quotient is a normal number or zero.
// There one correction of q0 = x * y from the hardware reciprocal y (within 1 ulp of 1/d)
// suffices: q0 - y*(d*q0 - x) = x/d + (1 - d*y)(x/d - q0) is within ~2^-45 |x/d| of the
// quotient before its rounding, so it rounds to RN(x/d) unless x/d lies that close to a
// midpoint of two floats, which the all-inputs test shows no 16-bit x does. (nvcc first
// refines y with a Newton step, two FMAs a value, which general operands need; these kernels
// are issue-bound at large M and silu was a third of their instructions.) Signed zeros come
// out right without a test: the first quotient is a plain multiply (FMA with +0 would turn -0
// into +0) and the residual is negated (d*q0 - x, then q0 - y*r), so x = -0 gives -0 / d = -0.
// Outside the range (large |x|, inf, NaN) the plain division runs for all N. HIP: the
// division.
template <int N>
RAD_DEVICE void silu_f32(const float (&x)[N], float (&s)[N]) {
  float d[N];
  bool in_range = true;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    d[e] = rad_add(1.0f, expf(-x[e]));
    in_range &= fabsf(x[e]) <= 80.0f;  // false for NaN
  }
#ifndef RADIANCE_HIP
  if (in_range) {
#pragma unroll
    for (int e = 0; e < N; ++e) {
      float y;
      asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(d[e]));
      const float q0 = rad_mul(x[e], y);
      s[e] = __fmaf_rn(-y, __fmaf_rn(d[e], q0, -x[e]), q0);
    }
    return;
  }
#endif
#pragma unroll
  for (int e = 0; e < N; ++e) s[e] = x[e] / d[e];
}

// ---- silu from the hardware's approximations ----------------------------------------------
// s = x * rcp(1 + ex2(x * -log2 e)): 5 instructions a value against silu_f32's ~14, for a
// kernel that is issue-bound at large M and keeps silu's result in fp32 (the gated norm).
// Against torch's silu the relative error is the rounding of the exponent argument t = -x log2 e
// (|t| * 2^-24, carried into 2^t as |t| ln 2 * 2^-24) plus the approximations' own (ex2.approx
// and rcp.approx about 2 ulps, the products half an ulp each): 13 ulps at most for |x| <= 16,
// 54 where t nears 127 (the all-inputs GPU test measures every 16-bit x), far under the 2^-8 of
// the bf16 rounding that follows, so only products within that many fp32 bit patterns of a
// bf16 midpoint can round the other way (1 in ~10^4 values), and they move their FP8 code by one
// at most. Special values come out as torch's: -0 and +-inf's and NaN's
// quotients, x * 0 = -0 for x < -88.7 (1 + 2^t is inf; torch: x / inf). Where t passes 126 the
// reciprocal nears fp32's normal range and may be flushed, so x in [-88.7, -87.3] gives -0 or a
// value near torch's, which is under 2^-119 in magnitude there; either quantizes to FP8's
// negative zero (scales are at least 2^-17). HIP: the fast exp and an IEEE reciprocal.
template <int N>
RAD_DEVICE void silu_fast_f32(const float (&x)[N], float (&s)[N]) {
#pragma unroll
  for (int e = 0; e < N; ++e) {
#ifdef RADIANCE_HIP
    s[e] = rad_mul(x[e], __frcp_rn(rad_add(1.0f, __expf(-x[e]))));
#else
    float p, r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(p) : "f"(rad_mul(x[e], -1.4426950408889634f)));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(rad_add(1.0f, p)));
    s[e] = rad_mul(x[e], r);
#endif
  }
}

// ---- reductions ---------------------------------------------------------------------------
// Sum over the tpr threads of one row in this block. The warp part is a butterfly; rows wider
// than a warp put one partial per warp in shared memory, which every thread of the row then adds
// in the same order: in sequence for a few warps (large-M rows of up to 8 warps), by a second
// butterfly for more (decode rows of up to 32 warps, where a 32-step sequence of dependent
// shared-memory loads and adds was measured to cost ~0.3 us; zero-padded: adding +0 to a sum of
// squares is exact). A butterfly leaves the identical total in every lane, because each step adds
// the same two values, only in swapped order. `red` must be a distinct buffer per reduction in a
// kernel (the single __syncthreads of each reduction then suffices). tpr and the loop bounds are
// uniform over the block, so the barrier is reached by all threads. Only 64-lane warps can have
// a row narrower than the warp (tpr = 32); on 32-lane ones the lane test is compiled out.
RAD_DEVICE float row_sum(float v, int tpr, int first_warp, float* red) {
#pragma unroll
  for (int off = RAD_WARP / 2; off > 0; off >>= 1)
    if (RAD_WARP == 32 || off < tpr) v += rad_shfl_xor(v, off);
  if (tpr <= RAD_WARP) return v;
  const int warp = threadIdx.x / RAD_WARP;
  const int lane = threadIdx.x % RAD_WARP;
  const int wpr = tpr / RAD_WARP;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
  if (wpr <= 8) {
    for (int i = 0; i < wpr; ++i) s += red[first_warp + i];
    return s;
  }
  s = lane < wpr ? red[first_warp + lane] : 0.0f;
#pragma unroll
  for (int off = RAD_WARP / 2; off > 0; off >>= 1) s += rad_shfl_xor(s, off);
  return s;
}

// Unsigned max over a warp's lanes (every lane gets it). sm_80+ has it as one instruction
// (redux.sync), against a butterfly of 5 dependent shuffles and maxes: at decode sizes a row's
// per-token max is on the critical path twice (in each warp, then over the warps), and every
// instruction a thread saves is saved by up to 1024 threads on the row's one SM.
RAD_DEVICE uint32_t warp_max_u32(uint32_t v) {
#if RAD_HAS_REDUX
  return __reduce_max_sync(0xFFFFFFFFu, v);
#else
#pragma unroll
  for (int off = RAD_WARP / 2; off > 0; off >>= 1) v = max(v, rad_shfl_xor(v, off));
  return v;
#endif
}

// The row's max, as row_sum. With redux the warp part needs tpr >= 32, which every CUDA layout
// has (tpr is a multiple of the warp); the partials are read one a lane and reduced once more.
RAD_DEVICE uint32_t row_max_u32(uint32_t v, int tpr, int first_warp, uint32_t* red) {
#if RAD_HAS_REDUX
  v = warp_max_u32(v);
#else
#pragma unroll
  for (int off = RAD_WARP / 2; off > 0; off >>= 1)
    if (off < tpr) v = max(v, rad_shfl_xor(v, off));
#endif
  if (tpr <= RAD_WARP) return v;
  const int warp = threadIdx.x / RAD_WARP;
  const int lane = threadIdx.x % RAD_WARP;
  const int wpr = tpr / RAD_WARP;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (!RAD_HAS_REDUX && wpr <= 8) {  // a few partials: in sequence, cheaper than a butterfly
    uint32_t m = 0;
    for (int i = 0; i < wpr; ++i) m = max(m, red[first_warp + i]);
    return m;
  }
  return warp_max_u32(lane < wpr ? red[first_warp + lane] : 0u);
}

// ---- rows split across a thread-block cluster (sm_90+) ------------------------------------
// At decode sizes a row per block leaves most SMs idle, and one block's instruction stream over
// the whole row is the latency. Split, each block reduces its part of the row and pushes the
// partial into every block of the cluster (st.async into the peer's shared memory, counted by a
// transaction barrier there); each block then adds the `split` partials in cluster-rank order,
// so every block of the row holds the identical total. A push is one one-way trip through
// distributed shared memory. Timed on the H200 (benchmarks/cluster_exchange.cu: a split row with
// two exchanges, against the same split with no exchange), pushes cost 0.35-0.6 µs a call over
// S = 2-8; exchanging through cluster-wide barriers (write own part, cluster.sync, read the
// peers', cluster.sync before exit) 1.1-1.9 µs; tagged 64-bit stores into the peers' slots,
// polled by every thread one slot after another, 0.25 µs at S = 2 but 0.8 µs at S = 8; the same
// slots polled by lane r of every warp, 0.9-1.3 µs. Only with one row per block; HIP has no
// clusters (split is always 1 there).
//
// Protocol. At kernel start each block arms its two barriers for `split` 4-byte arrivals and
// arrives (relaxed) at the cluster barrier; before its first push it waits there, so no push can
// reach a peer whose barriers are not yet initialised. Each barrier is used for one phase only.
// No block needs a barrier before exit: a block leaves only after every push addressed to it has
// landed (it waited for them), and a push carries its value in the instruction itself.
#if !defined(RADIANCE_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RAD_CLUSTERS 1
#endif

#ifdef RAD_CLUSTERS
RAD_DEVICE uint32_t shared_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

RAD_DEVICE uint32_t cluster_addr(const void* p, uint32_t rank) {  // p in block `rank`
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(shared_addr(p)), "r"(rank));
  return r;
}

RAD_DEVICE uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every block's `bits` into slot[my rank] of every block (threads 0..split-1 one push each),
// then wait for all `split` pushes into this block.
RAD_DEVICE void cluster_exchange(uint32_t bits, int split, uint32_t* slot, uint64_t* arrived,
                                 bool first) {
  if (first) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  const uint32_t t = threadIdx.x;
  if (t < (uint32_t)split)
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                 ::"r"(cluster_addr(slot + cluster_rank(), t)), "r"(bits),
                 "r"(cluster_addr(arrived, t))
                 : "memory");
  asm volatile(
      "{\n .reg .pred done;\n wait_pushes:\n"
      " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], 0;\n"
      " @!done bra wait_pushes;\n}\n" ::"r"(shared_addr(arrived))
      : "memory");
}
#endif

// At kernel start, before the wait on the previous kernel (block-uniform `split`).
RAD_DEVICE void cluster_row_begin(int split, RowShared& sh) {
#ifdef RAD_CLUSTERS
  if (split > 1) {
    if (threadIdx.x == 0) {
      for (int i = 0; i < 2; ++i) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_addr(&sh.arrived[i])));
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     ::"r"(shared_addr(&sh.arrived[i])), "r"(split * 4) : "memory");
      }
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  }
#else
  (void)split, (void)sh;
#endif
}

// The row's total from this block's part `v` (held by every thread of the block). `first`: no
// exchange came before it in this kernel.
RAD_DEVICE float cluster_row_sum(float v, int split, RowShared& sh, bool first) {
#ifdef RAD_CLUSTERS
  if (split > 1) {
    cluster_exchange(rad_f2u(v), split, reinterpret_cast<uint32_t*>(sh.part_sum), &sh.arrived[0],
                     first);
    float s = sh.part_sum[0];
    for (int r = 1; r < split; ++r) s = rad_add(s, sh.part_sum[r]);
    return s;
  }
#else
  (void)split, (void)sh, (void)first;
#endif
  return v;
}

RAD_DEVICE uint32_t cluster_row_max(uint32_t v, int split, RowShared& sh, bool first) {
#ifdef RAD_CLUSTERS
  if (split > 1) {
    cluster_exchange(v, split, sh.part_max, &sh.arrived[1], first);
    uint32_t m = 0;
    for (int r = 0; r < split; ++r) m = max(m, sh.part_max[r]);
    return m;
  }
#else
  (void)split, (void)sh, (void)first;
#endif
  return v;
}

// Max over the 16 lanes that share one 128-column group. With redux: one whole-warp max per
// half, the other half contributing 0 (the identity of a max over |x|'s bit patterns), 5
// instructions with two independent reductions instead of 8 with 4 dependent shuffles.
RAD_DEVICE uint32_t group16_max_u32(uint32_t v) {
#if RAD_HAS_REDUX
  const bool upper = threadIdx.x & 16;  // lane & 16: blocks are whole warps
  const uint32_t lower_max = __reduce_max_sync(0xFFFFFFFFu, upper ? 0u : v);
  const uint32_t upper_max = __reduce_max_sync(0xFFFFFFFFu, upper ? v : 0u);
  return upper ? upper_max : lower_max;
#else
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) v = max(v, rad_shfl_xor(v, off));
  return v;
#endif
}

// |x| as bits of the act-dtype-rounded value (amax over the rounded output, as torch does).
RAD_DEVICE uint32_t abs_bits(float f) { return rad_f2u(f) & 0x7FFFFFFFu; }

// ---- quant --------------------------------------------------------------------------------
RAD_DEVICE float quant_scale(uint32_t amax_bits, int fmt) {
  // fp32 reciprocal of FP8_MAX (ATen: opmath 1/scalar; inductor: the constant 1/448 as fp32),
  // and vLLM's python-float minimum scale 1/(FP8_MAX*512) rounded to fp32.
  constexpr float kInvFn = 1.0f / 448.0f, kInvFnuz = 1.0f / 224.0f;
  constexpr float kMinFn = (float)(1.0 / (448.0 * 512.0)), kMinFnuz = (float)(1.0 / (224.0 * 512.0));
  const float inv_max = fmt == RAD_FP8_FN ? kInvFn : kInvFnuz;
  const float min_scale = fmt == RAD_FP8_FN ? kMinFn : kMinFnuz;
  const float s = rad_mul(rad_u2f(amax_bits), inv_max);
  return rad_isnan(s) ? s : fmaxf(s, min_scale);             // torch.clamp keeps NaN
}

// x / s correctly rounded, from r = RN(1/s): q0 = RN(x*r) is within 1 ulp of x/s, the residual
// s*q0 - x is exact in one FMA, and RN(q0 - residual*r) is then RN(x/s) (Markstein's theorem for
// round-to-nearest; needs a finite s and a quotient clear of overflow, which clamped scales
// guarantee: |x/s| <= FP8_MAX * (1 + 2^-23)). Cheaper than a full IEEE division per element;
// callers use the plain division where s is not finite. The residual is taken negated so that
// zeros keep their sign with no extra instruction: x = -0 gives q0 = -0, residual +0 and
// -0 + -0 = -0, as torch's division (and its cast to code 0x80) has it; with the residual
// x - s*q0 the +0 residual would turn the sum into +0. Nonzero quotients round the same reals.
RAD_DEVICE float div_by_scale(float x, float s, float r) {
  const float q0 = rad_mul(x, r);
  return fmaf(-fmaf(s, q0, -x), r, q0);
}

// A scale whose reciprocal and quotients stay well inside fp32's normal range: [2^-100, 2^100]
// (false for inf and NaN). Clamped scales are >= 1/(FP8_MAX*512), so only an amax beyond 2^108
// or a non-finite one leaves it.
RAD_DEVICE bool moderate_scale(float s) {
  return rad_f2u(s) - 0x0D800000u <= 0x71800000u - 0x0D800000u;
}

// RN(1/s) for a moderate s: nvcc's own expansion of an IEEE reciprocal (MUFU.RCP, then one
// Newton step as two FMAs) without its range check and branch, which a moderate s always passes.
// HIP: the division.
RAD_DEVICE float rcp_moderate(float s) {
#ifdef RADIANCE_HIP
  return 1.0f / s;
#else
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
  return __fmaf_rn(r, -__fmaf_rn(r, s, -1.0f), r);
#endif
}

#ifndef RADIANCE_HIP
// 8 finite quotients as e4m3fn codes (the saturating hardware conversion), packed for st8.
RAD_DEVICE uint2 fn_codes8(const float (&q)[8]) {
  return make_uint2(rad_fp8_fn_pair_finite(q[0], q[1]) | (rad_fp8_fn_pair_finite(q[2], q[3]) << 16),
                    rad_fp8_fn_pair_finite(q[4], q[5]) | (rad_fp8_fn_pair_finite(q[6], q[7]) << 16));
}
#endif

// Quantizes 8 act-dtype values (given as floats) of one vector with scale s and stores 8 codes.
// GROUP: true division by s (recip is ignored and derived here, per group); else a multiply by
// recip = RN(1/s). The common case takes one branch: on NVIDIA, e4m3fn and a moderate scale,
// the reciprocal written out, the quotients by div_by_scale and the saturating hardware
// conversion. Otherwise (HIP, fnuz, an extreme or non-finite scale): the IEEE division where
// Markstein's conditions fail, and clamp + the bit-exact software cast.
template <bool GROUP>
RAD_DEVICE void quant_store8(const float (&f)[8], float s, float recip, int fmt, void* dst) {
  float q[8];
#ifndef RADIANCE_HIP
  if (fmt == RAD_FP8_FN && moderate_scale(s)) {
    if (GROUP) recip = rcp_moderate(s);
#pragma unroll
    for (int e = 0; e < 8; ++e) q[e] = GROUP ? div_by_scale(f[e], s, recip) : rad_mul(f[e], recip);
    st8(dst, fn_codes8(q));
    return;
  }
#endif
  const bool finite = rad_isfinite(s);
  if (GROUP) recip = 1.0f / s;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (GROUP)
      q[e] = finite ? div_by_scale(f[e], s, recip) : f[e] / s;
    else
      q[e] = rad_mul(f[e], recip);
  }
#ifndef RADIANCE_HIP
  if (fmt == RAD_FP8_FN && finite) {
    st8(dst, fn_codes8(q));
    return;
  }
#endif
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    lo |= rad_fp8_clamp_encode(q[e], fmt) << (8 * e);
    hi |= rad_fp8_clamp_encode(q[e + 4], fmt) << (8 * e);
  }
  st8(dst, make_uint2(lo, hi));
}

// Largest |x| of the 8 act-dtype values packed in v, as abs_bits of that value in fp32. A 16-bit
// float's magnitudes order like its bit patterns with the sign cleared (NaN above inf, as in
// fp32), so the max runs on the packed halves, two at a time, and only the winner is widened:
// 7 instructions a vector instead of an unpack, a mask and a max per value.
template <bool BF16>
RAD_DEVICE uint32_t amax8_bits(const uint4& v) {
  constexpr uint32_t kAbs = 0x7FFF7FFFu;
  const uint32_t m = rad_vmaxu2(rad_vmaxu2(v.x & kAbs, v.y & kAbs), rad_vmaxu2(v.z & kAbs, v.w & kAbs));
  return abs_bits(rad_act_to_f32<BF16>(max(m & 0xFFFFu, m >> 16)));
}

// The quant tail shared by all three ops. o[v] holds the row's output (act dtype, packed) for
// vector c = v*rt + t; `on[v]` says whether that vector exists. Writes q and the scale(s).
// `summed`: the row sum already crossed the cluster (add_rms_quant), so the max is its second
// exchange.
template <int VPT, bool BF16, bool GROUP>
RAD_DEVICE void quantize_row(const uint4 (&o)[VPT], const bool (&on)[VPT], const RowThread& rth,
                             int tpr, int split, int64_t K, uint8_t* q, float* scale, int fmt,
                             RowShared& sh, bool summed) {
  const int t = rth.t, rt = rth.rt;
  // Row bases once per row; a vector's index c = v*rt + t < K/8 fits an int, and c >> 4 is its
  // group (signed 64-bit divisions here cost a dozen instructions a vector).
  uint8_t* const q_row = q + rth.row * K;
  uint32_t vmax[VPT];
#pragma unroll
  for (int v = 0; v < VPT; ++v) vmax[v] = on[v] ? amax8_bits<BF16>(o[v]) : 0u;
  if (GROUP) {
    float* const scale_row = scale + rth.row * (K >> 7);
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      const float s = quant_scale(group16_max_u32(vmax[v]), fmt);
      if (!on[v]) continue;
      const int c = v * rt + t;
      if ((t & 15) == 0) scale_row[c >> 4] = s;
      float f[8];
      unpack8<BF16>(o[v], f);
      quant_store8<true>(f, s, 0.0f, fmt, q_row + c * 8);
    }
  } else {
    uint32_t m = 0;
#pragma unroll
    for (int v = 0; v < VPT; ++v) m = max(m, vmax[v]);
    m = row_max_u32(m, tpr, rth.first_warp, sh.red_max);
    m = cluster_row_max(m, split, sh, !summed);
    const float s = quant_scale(m, fmt);
    // torch: scale.reciprocal(), an IEEE division; written out for a moderate scale (the
    // division's range check and slow-path call are ~10 instructions on the row's critical path)
    const float r = moderate_scale(s) ? rcp_moderate(s) : 1.0f / s;
    if (rth.row_ok && t == 0) scale[rth.row] = s;
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      if (!on[v]) continue;
      float f[8];
      unpack8<BF16>(o[v], f);
      quant_store8<false>(f, s, r, fmt, q_row + (v * rt + t) * 8);
    }
  }
}

RAD_DEVICE uint4 pack8(const uint32_t (&h)[8]) {
  return make_uint4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16),
                    h[6] | (h[7] << 16));
}

// Launch bound per VPT, so that each instantiation gets the registers its row slice needs with
// no spill: VPT <= 2 serves the latency configs (up to 1024 threads, 64 registers), VPT 3-6 up to
// 512 threads (128 registers), VPT 8 up to 256 threads (255 registers).
template <int VPT>
struct MaxThreads {
  static constexpr int value = VPT <= 2 ? 1024 : VPT <= 6 ? 512 : 256;
};
inline int max_threads_for(int vpt) { return vpt <= 2 ? 1024 : vpt <= 6 ? 512 : 256; }

}  // namespace radiance

// ---- host side ----------------------------------------------------------------------------
namespace radiance {

// Op ids for the launch-config override and query (radiance_set_launch_config).
enum OpId { kOpAddRms = 0, kOpSiluMul = 1, kOpGdnNorm = 2, kOpCount = 3 };

// How many partials a split row's blocks exchange: add_rms_quant's row sum crosses blocks, and so
// does any per-token row max; silu_mul_quant and gdn_norm_quant with group-128 scales reduce
// only within a group, and their blocks never talk. Blocks that exchange must form a cluster.
inline int split_exchanges(int op, bool group) { return (op == kOpAddRms ? 1 : 0) + (group ? 0 : 1); }
inline bool split_needs_cluster(int op, bool group) { return split_exchanges(op, group) > 0; }

// Defined in abi.cu.
LaunchConfig pick_config(int op, int64_t M, int64_t nvec, int warp, bool group,
                         bool allow_split = true);
int host_warp_size();
bool aligned(const void* p, int bytes);

}  // namespace radiance

// Expands `BODY` with a compile-time VPT matching cfg.vpt (1..6, 8).
// Launches KERNEL<VPT, BF16, GROUP> for the runtime (bf16, group) pair: each op compiles all four
// per vectors-per-thread count, and picks one per call.
#define RAD_LAUNCH_TYPED(KERNEL, VPT, bf16, group, grid, block, stream, args, split)           \
  ((bf16) ? ((group) ? rad_launch(KERNEL<VPT, true, true>, grid, block, stream, args, split)    \
                     : rad_launch(KERNEL<VPT, true, false>, grid, block, stream, args, split))  \
          : ((group) ? rad_launch(KERNEL<VPT, false, true>, grid, block, stream, args, split)   \
                     : rad_launch(KERNEL<VPT, false, false>, grid, block, stream, args, split)))

#define RAD_DISPATCH_VPT(vpt, BODY)                   \
  switch (vpt) {                                      \
    case 1: { constexpr int VPT = 1; BODY; } break;   \
    case 2: { constexpr int VPT = 2; BODY; } break;   \
    case 3: { constexpr int VPT = 3; BODY; } break;   \
    case 4: { constexpr int VPT = 4; BODY; } break;   \
    case 5: { constexpr int VPT = 5; BODY; } break;   \
    case 6: { constexpr int VPT = 6; BODY; } break;   \
    case 8: { constexpr int VPT = 8; BODY; } break;   \
    default: return (int)rad_error_invalid_value;     \
  }
