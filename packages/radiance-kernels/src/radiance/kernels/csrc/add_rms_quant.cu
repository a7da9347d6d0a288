// Fused residual add + RMSNorm (plain or Gemma) + dynamic FP8 quant, one pass, one launch.
// The row math and its numerics are in add_rms_quant.cuh.
#include "add_rms_quant.cuh"

namespace radiance {

template <int VPT, bool BF16, bool GROUP>
__global__ void __launch_bounds__(MaxThreads<VPT>::value)
    add_rms_quant_kernel(const AddRmsArgs a) {
  __shared__ RowShared sh;
  const int split = split_for<VPT>(a.split);
  const RowThread rth = row_thread(a.tpr, a.rpb, split, a.M);
  const bool has_res = a.residual != nullptr;

  bool on[VPT];
  uint4 yv[VPT], rv[VPT], wv[VPT];
  const uint4 z = make_uint4(0, 0, 0, 0);
  cluster_row_begin(split, sh);
  add_rms_prefetch_weights<VPT>(a, rth, on, wv);
  rad_wait_prior_grids();
  const uint16_t* const y_row = a.y + rth.row * a.y_stride;  // c < K/8 fits an int
  const uint16_t* const res_row = a.residual + rth.row * a.K;
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int c = v * rth.rt + rth.t;
    yv[v] = on[v] ? ld16(y_row + c * 8) : z;
    rv[v] = on[v] && has_res ? ld16(res_row + c * 8) : z;
  }
  rad_release_dependents();
  add_rms_finish<VPT, BF16, GROUP>(a, yv, rv, wv, on, rth, sh);
}

}  // namespace radiance

RAD_EXPORT int radiance_add_rms_quant(const void* y, int64_t y_stride, const void* residual,
                                      const void* weight, int weight_dtype, void* q, float* scale,
                                      void* residual_out, int64_t M, int64_t K, float eps,
                                      int gemma, int group, int act_dtype, int fp8, void* stream) {
  using namespace radiance;
  AddRmsArgs a;
  const int bad = make_add_rms_args(y, y_stride, residual, weight, weight_dtype, q, scale,
                                    residual_out, M, K, eps, gemma, group, act_dtype, fp8, &a);
  if (bad || M == 0) return bad;
  const LaunchConfig cfg = pick_config(kOpAddRms, M, K / 8, host_warp_size(), group != 0);
  if (cfg.vpt == 0) return (int)rad_error_invalid_value;
  a.tpr = cfg.tpr;
  a.rpb = cfg.rpb;
  a.split = cfg.split;
  const dim3 grid((unsigned)((M + cfg.rpb - 1) / cfg.rpb * cfg.split)), block(cfg.tpr * cfg.rpb);
  const bool bf16 = act_dtype == 0, grp = group == 128;
  rad_stream_t s = static_cast<rad_stream_t>(stream);
  rad_error_t err = rad_success;
  RAD_DISPATCH_VPT(cfg.vpt, err = RAD_LAUNCH_TYPED(add_rms_quant_kernel, VPT, bf16, grp, grid, block, s, a, cfg.split));
  return (int)err;
}
