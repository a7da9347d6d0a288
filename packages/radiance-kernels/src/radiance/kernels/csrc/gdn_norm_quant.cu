// Qwen3-Next GatedDeltaNet output epilogue: per-head RMSNorm x weight x silu(z) (norm before
// gate), then dynamic FP8 quant over the whole row; one pass, one launch.
//
// Mirrors vLLM's RMSNormGated.forward_static (group_size None, norm_before_gate, swish) applied
// to rows of head_dim, as eager torch runs it: everything in fp32, one rounding at the end.
//   var  = sum_head(x*x) * (M*H / (M*N))      ATen's CUDA mean factor (1/head_dim)
//   out  = act( ((x * rsqrtf(var + eps)) * float(w)) * silu(z) )
// then the quant of `out` over the row of N = H * head_dim. A head is head_dim/8 consecutive
// lanes (the thread layout of epilogue_common.cuh), so its sum is a butterfly within them.
//
// The gate is silu_fast_f32, not torch's bits (silu_f32): at M = 8192 this kernel was bound by
// instruction issue on the H200, and the exact gate was 14 of its ~39 instructions a value
// (per token; 43 with group-128 scales) where the fast one takes 5. The gated product stays in
// fp32 and is rounded once to the activation dtype, so the gate's few-ulp error reaches the
// output only where that product lies within a few fp32 bit patterns of a rounding midpoint:
// such a value moves by one step of the activation dtype, its FP8 code by one at most
// (benchmarks/results/exactness: the differing codes, each traced to a midpoint).
#include "epilogue_common.cuh"

namespace radiance {

struct GdnArgs {
  const uint16_t* x;
  int64_t x_stride;
  const uint16_t* z;
  int64_t z_stride;
  const void* weight;
  uint8_t* q;
  float* scale;
  int64_t M, N;
  float eps, mean_factor;
  int head_lanes, wdtype, fmt, tpr, rpb, split;
};

// Large-M rows of 4 vectors a thread (per token, 128 threads a block) are held to 64 registers
// (two blocks of the bound's 512 threads a SM): 8 blocks a SM instead of 6 at the 76 registers
// ptxas takes unbounded, at the price of a few spilled registers (0-32 bytes a thread). The
// kernel is issue-bound there and the extra warps fill issue slots: 0.92-0.99x the time at
// M = 8192 (benchmarks/results/epilogues_ab.md).
template <int VPT>
struct GdnMinBlocks {
  static constexpr int value = VPT == 4 ? 2 : 1;
};

template <int VPT, bool BF16, bool GROUP>
__global__ void __launch_bounds__(MaxThreads<VPT>::value, GdnMinBlocks<VPT>::value)
    gdn_norm_quant_kernel(const GdnArgs a) {
  __shared__ RowShared sh;
  const int split = split_for<VPT>(a.split);
  const RowThread rth = row_thread(a.tpr, a.rpb, split, a.M);
  const int nvec = (int)(a.N / 8);  // vector indices fit an int (as in quantize_row)
  cluster_row_begin(GROUP ? 1 : split, sh);  // group-128 split blocks never talk

  // Row addresses before the weight's dtype branch: written after it, ptxas places their 64-bit
  // math between the wait and the first load (32 instructions there at one vector a thread,
  // against 20 this way), on the path a decode-size call is made of. The row bases once, then
  // a 32-bit index a vector.
  const uint16_t* const x_row = a.x + rth.row * a.x_stride;
  const uint16_t* const z_row = a.z + rth.row * a.z_stride;
  bool on[VPT];
  const uint16_t* xp[VPT];
  const uint16_t* zp[VPT];
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int c = v * rth.rt + rth.t;
    on[v] = rth.row_ok && c < nvec;
    xp[v] = x_row + c * 8;
    zp[v] = z_row + c * 8;
  }
  // rt*8 is a multiple of head_dim (rt % 32 == 0, head_dim a power of two <= 256), so a thread
  // sees the same 8 weights in every vector it owns. The weight is static: read before the wait
  // for the previous kernel (see rad_wait_prior_grids).
  float w[8];
  load_weight8(a.weight, a.wdtype, (int64_t)(rth.t & (a.head_lanes - 1)) * 8, w);
  rad_wait_prior_grids();

  uint4 xv[VPT], zv[VPT];
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
    xv[v] = on[v] ? ld16(xp[v]) : zero;
    zv[v] = on[v] ? ld16(zp[v]) : zero;
  }
  rad_release_dependents();

  uint4 o[VPT];
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    float xf[8], zf[8];
    unpack8<BF16>(xv[v], xf);
    unpack8<BF16>(zv[v], zf);
    // x is a 16-bit value, so x*x is exact in fp32 (16 or 22 significant bits) and one fma
    // rounds the same sum as torch's product then add (the summation order is already this
    // kernel's own). Only a square under 2^-126 (bf16 |x| < 2^-63) is rounded on torch's path
    // and not here: a difference in the sum's bits under 2^-126, swamped by any eps.
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) ss = fmaf(xf[e], xf[e], ss);
    // Every lane takes part in every step and only the lanes of a head add: as a branch per step
    // (head_lanes is a runtime value) the compiler kept each vector's steps apart, with the
    // predicates saved and restored around them, ~25 instructions a vector instead of ~10.
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float other = rad_shfl_xor(ss, off);
      ss = off < a.head_lanes ? ss + other : ss;
    }
    const float rs = rsqrtf(rad_add(rad_mul(ss, a.mean_factor), a.eps));
    float gate[8], out[8];
    silu_fast_f32(zf, gate);
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = rad_mul(rad_mul(rad_mul(xf[e], rs), w[e]), gate[e]);
    o[v] = pack8_act<BF16>(out);
  }
  quantize_row<VPT, BF16, GROUP>(o, on, rth, a.tpr, split, a.N, a.q, a.scale, a.fmt, sh,
                                 /*summed=*/false);
}


}  // namespace radiance

RAD_EXPORT int radiance_gdn_norm_quant(const void* x, int64_t x_stride, const void* z,
                                       int64_t z_stride, const void* weight, int weight_dtype,
                                       void* q, float* scale, int64_t M, int64_t N,
                                       int64_t head_dim, float eps, int group, int act_dtype,
                                       int fp8, void* stream) {
  using namespace radiance;
  const bool hd_ok = head_dim >= 8 && head_dim <= 256 && (head_dim & (head_dim - 1)) == 0;
  if (M < 0 || N <= 0 || !hd_ok || N % head_dim || (group != 0 && group != 128) ||
      (group && N % 128) || (act_dtype != 0 && act_dtype != 1) || weight_dtype < 0 ||
      weight_dtype > 2 || (fp8 != RAD_FP8_FN && fp8 != RAD_FP8_FNUZ) || x_stride < N ||
      x_stride % 8 || z_stride < N || z_stride % 8 || !x || !z || !weight || !q || !scale ||
      !aligned(x, 16) || !aligned(z, 16) || !aligned(weight, 16) || !aligned(q, 8) ||
      !aligned(scale, 4))
    return (int)rad_error_invalid_value;
  if (M == 0) return 0;
  const LaunchConfig cfg = pick_config(kOpGdnNorm, M, N / 8, host_warp_size(), group != 0);
  if (cfg.vpt == 0) return (int)rad_error_invalid_value;
  GdnArgs a;
  a.x = static_cast<const uint16_t*>(x);
  a.x_stride = x_stride;
  a.z = static_cast<const uint16_t*>(z);
  a.z_stride = z_stride;
  a.weight = weight;
  a.q = static_cast<uint8_t*>(q);
  a.scale = scale;
  a.M = M;
  a.N = N;
  a.eps = eps;
  // ATen's CUDA mean over [M*H, head_dim]: float(M*H) / float(M*N).
  a.mean_factor = (float)(M * (N / head_dim)) / (float)(M * N);
  a.head_lanes = (int)(head_dim / 8);
  a.wdtype = weight_dtype;
  a.fmt = fp8;
  a.tpr = cfg.tpr;
  a.rpb = cfg.rpb;
  a.split = cfg.split;
  const dim3 grid((unsigned)((M + cfg.rpb - 1) / cfg.rpb * cfg.split)), block(cfg.tpr * cfg.rpb);
  rad_stream_t s = static_cast<rad_stream_t>(stream);
  rad_error_t err = rad_success;
  RAD_DISPATCH_VPT(cfg.vpt, err = RAD_LAUNCH_TYPED(gdn_norm_quant_kernel, VPT, act_dtype == 0, group == 128, grid, block, s, a, split_needs_cluster(kOpGdnNorm, group != 0) ? cfg.split : 1));
  return (int)err;
}
