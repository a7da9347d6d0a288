// silu(gate) * up + dynamic FP8 quant, one pass, one launch. gu is [M, 2N]: gate columns [0, N),
// up columns [N, 2N), rows `gu_stride` elements apart.
//
// Mirrors vLLM's SiluAndMul.forward_native (F.silu(gate) * up) as eager torch runs it:
//   s   = act( g / (1 + expf(-g)) )     ATen's silu: fp32 opmath, full-precision expf, IEEE
//                                        division, rounded to the activation dtype
//   out = act( float(s) * float(u) )    the activation-dtype multiply rounds again
// then the quant of `out`. expf is the same libm routine torch's kernel calls (compiled by this
// toolkit instead of torch's; they agree unless the two libraries' expf differ).
#include "epilogue_common.cuh"

namespace radiance {

struct SiluMulArgs {
  const uint16_t* gu;
  int64_t gu_stride;
  uint8_t* q;
  float* scale;
  int64_t M, N;
  int fmt, tpr, rpb, split;
};

template <int VPT, bool BF16, bool GROUP>
__global__ void __launch_bounds__(MaxThreads<VPT>::value)
    silu_mul_quant_kernel(const SiluMulArgs a) {
  __shared__ RowShared sh;
  const int split = split_for<VPT>(a.split);
  const RowThread rth = row_thread(a.tpr, a.rpb, split, a.M);
  const int64_t nvec = a.N / 8;

  bool on[VPT];
  uint4 gv[VPT], uv[VPT];
  cluster_row_begin(GROUP ? 1 : split, sh);  // group-128 split blocks never talk
  rad_wait_prior_grids();
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int64_t c = (int64_t)v * rth.rt + rth.t;
    on[v] = rth.row_ok && c < nvec;
    const uint16_t* base = a.gu + rth.row * a.gu_stride + c * 8;
    const uint4 z = make_uint4(0, 0, 0, 0);
    gv[v] = on[v] ? ld16(base) : z;
    uv[v] = on[v] ? ld16(base + a.N) : z;
  }
  rad_release_dependents();
  uint4 o[VPT];
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    float g[8], s[8];
    unpack8<BF16>(gv[v], g);
    silu_f32(g, s);
    uint32_t w[4];
#pragma unroll
    for (int p = 0; p < 4; ++p)  // act(silu) times up: one rounded 16-bit product (rad_mul_act2)
      w[p] = rad_mul_act2<BF16>(rad_f32x2_to_act<BF16>(s[2 * p], s[2 * p + 1]), word_of(uv[v], p));
    o[v] = make_uint4(w[0], w[1], w[2], w[3]);
  }
  quantize_row<VPT, BF16, GROUP>(o, on, rth, a.tpr, split, a.N, a.q, a.scale, a.fmt, sh,
                                 /*summed=*/false);
}


}  // namespace radiance

RAD_EXPORT int radiance_silu_mul_quant(const void* gu, int64_t gu_stride, void* q, float* scale,
                                       int64_t M, int64_t N, int group, int act_dtype, int fp8,
                                       void* stream) {
  using namespace radiance;
  if (M < 0 || N <= 0 || N % 8 || (group != 0 && group != 128) || (group && N % 128) ||
      (act_dtype != 0 && act_dtype != 1) || (fp8 != RAD_FP8_FN && fp8 != RAD_FP8_FNUZ) ||
      gu_stride < 2 * N || gu_stride % 8 || !gu || !q || !scale || !aligned(gu, 16) ||
      !aligned(q, 8) || !aligned(scale, 4))
    return (int)rad_error_invalid_value;
  if (M == 0) return 0;
  const LaunchConfig cfg = pick_config(kOpSiluMul, M, N / 8, host_warp_size(), group != 0);
  if (cfg.vpt == 0) return (int)rad_error_invalid_value;
  SiluMulArgs a;
  a.gu = static_cast<const uint16_t*>(gu);
  a.gu_stride = gu_stride;
  a.q = static_cast<uint8_t*>(q);
  a.scale = scale;
  a.M = M;
  a.N = N;
  a.fmt = fp8;
  a.tpr = cfg.tpr;
  a.rpb = cfg.rpb;
  a.split = cfg.split;
  const dim3 grid((unsigned)((M + cfg.rpb - 1) / cfg.rpb * cfg.split)), block(cfg.tpr * cfg.rpb);
  rad_stream_t s = static_cast<rad_stream_t>(stream);
  rad_error_t err = rad_success;
  RAD_DISPATCH_VPT(cfg.vpt, err = RAD_LAUNCH_TYPED(silu_mul_quant_kernel, VPT, act_dtype == 0, group == 128, grid, block, s, a, split_needs_cluster(kOpSiluMul, group != 0) ? cfg.split : 1));
  return (int)err;
}
