// The add_rms_quant row math, shared by add_rms_quant.cu and the all-reduce-fused ar_add_rms_quant.
//
// Mirrors vLLM's native chain (ir.ops.fused_add_rms_norm / rms_norm, then QuantFP8) as torch runs
// it on the GPU; every rounding torch does is done here, in the same order:
//   x      = float(y) + float(residual)              fp32 sum (plain float(y) without residual)
//   res'   = act(x)                                  the new residual, rounded once
//   var    = sum(x*x) * (M / (M*K))                  ATen's CUDA mean multiplies by this factor
//   n      = x * rsqrtf(var + eps)                   rsqrtf: the instruction torch.rsqrt uses
//   plain:   out = act( wdt( wdt(n) * w ) )          x.to(weight.dtype) * weight, then .to(act)
//   gemma:   out = act( n * (float(w) + 1) )         all fp32, one rounding
// then the quant of `out` (epilogue_common.cuh). Only the order of the sum of squares differs
// from torch's reduction tree; it is the one source of (off-by-one-code) differences.
#pragma once

#include "epilogue_common.cuh"

namespace radiance {

struct AddRmsArgs {
  const uint16_t* y;
  int64_t y_stride;
  const uint16_t* residual;  // nullable
  const void* weight;
  uint16_t* residual_out;
  uint8_t* q;
  float* scale;
  int64_t M, K;
  float eps, mean_factor;
  int wdtype, gemma, fmt, tpr, rpb, split;
};

template <bool BF16>
RAD_DEVICE float round_to(int dtype, float f) {  // f32 -> dtype -> f32 (fp32: identity)
  if (dtype == 2) return f;
  return dtype == 0 ? rad_bf16_to_f32(rad_f32_to_bf16(f)) : rad_f16_to_f32(rad_f32_to_f16(f));
}

// Thread t of a row owns vectors c = v*rt + t (epilogue_common.cuh); `on[v]` says whether that
// vector exists. 16-bit weights are static: callers fetch them before waiting for the previous
// kernel, so their latency overlaps its tail (fp32 weights are read later, where they are used).
template <int VPT>
RAD_DEVICE void add_rms_prefetch_weights(const AddRmsArgs& a, const RowThread& rth,
                                         bool (&on)[VPT], uint4 (&wv)[VPT]) {
  const int64_t nvec = a.K / 8;
  const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int64_t c = (int64_t)v * rth.rt + rth.t;
    on[v] = rth.row_ok && c < nvec;
    wv[v] = on[v] && a.wdtype != 2 ? ld16(reinterpret_cast<const uint16_t*>(a.weight) + c * 8) : z;
  }
}

// Everything after the loads: yv and rv hold the row's y and residual vectors (zero where !on).
template <int VPT, bool BF16, bool GROUP>
RAD_DEVICE void add_rms_finish(const AddRmsArgs& a, const uint4 (&yv)[VPT], const uint4 (&rv)[VPT],
                               const uint4 (&wv)[VPT], const bool (&on)[VPT], const RowThread& rth,
                               RowShared& sh) {
  const int t = rth.t, rt = rth.rt;
  uint16_t* const res_out_row = a.residual_out + rth.row * a.K;
  const int split = split_for<VPT>(a.split);
  const bool has_res = a.residual != nullptr;
  const bool w16 = a.wdtype != 2;
  float x[VPT][8];
  float ss = 0.0f;
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    float fy[8], fr[8];
    unpack8<BF16>(yv[v], fy);
    unpack8<BF16>(rv[v], fr);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      x[v][e] = has_res ? rad_add(fy[e], fr[e]) : fy[e];
      ss = rad_add(ss, rad_mul(x[v][e], x[v][e]));
    }
    if (on[v] && has_res) st16(res_out_row + (v * rt + t) * 8, pack8_act<BF16>(x[v]));
  }
  ss = cluster_row_sum(row_sum(ss, a.tpr, rth.first_warp, sh.red_sum), split, sh, /*first=*/true);
  const float rs = rsqrtf(rad_add(rad_mul(ss, a.mean_factor), a.eps));

  uint4 o[VPT];
  if (!a.gemma && a.wdtype == (BF16 ? 0 : 1)) {  // weight in the activation dtype: the common case
    // h = act(float(act(x * rs)) * float(w)): a product of two 16-bit values, rounded once
    // (rad_mul_act2), straight from the packed weight.
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      uint32_t h2[4];
#pragma unroll
      for (int p = 0; p < 4; ++p)
        h2[p] = rad_mul_act2<BF16>(
            rad_f32x2_to_act<BF16>(rad_mul(x[v][2 * p], rs), rad_mul(x[v][2 * p + 1], rs)),
            word_of(wv[v], p));
      o[v] = make_uint4(h2[0], h2[1], h2[2], h2[3]);
    }
  } else {
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      const int c = v * rt + t;
      float w[8];
      if (w16) {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          w[e] = a.wdtype == 0 ? rad_bf16_to_f32(half_of(wv[v], e)) : rad_f16_to_f32(half_of(wv[v], e));
      } else if (on[v]) {
        load_weight8(a.weight, 2, c * 8, w);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) w[e] = 0.0f;
      }
      uint32_t h[8];
      if (a.gemma) {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          h[e] = rad_f32_to_act<BF16>(rad_mul(rad_mul(x[v][e], rs), rad_add(w[e], 1.0f)));
      } else {  // weight in another dtype than the activations
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float n = round_to<BF16>(a.wdtype, rad_mul(x[v][e], rs));
          h[e] = rad_f32_to_act<BF16>(round_to<BF16>(a.wdtype, rad_mul(n, w[e])));
        }
      }
      o[v] = pack8(h);
    }
  }
  quantize_row<VPT, BF16, GROUP>(o, on, rth, a.tpr, split, a.K, a.q, a.scale, a.fmt, sh,
                                 /*summed=*/true);
}

// Host side: checks an add_rms_quant call's arguments and fills everything but the launch layout
// (tpr, rpb, split: set by the caller). Returns 0, or the invalid-value code.
inline int make_add_rms_args(const void* y, int64_t y_stride, const void* residual,
                             const void* weight, int weight_dtype, void* q, float* scale,
                             void* residual_out, int64_t M, int64_t K, float eps, int gemma,
                             int group, int act_dtype, int fp8, AddRmsArgs* a) {
  if (M < 0 || K <= 0 || K % 8 || (group != 0 && group != 128) || (group && K % 128) ||
      (act_dtype != 0 && act_dtype != 1) || weight_dtype < 0 || weight_dtype > 2 ||
      (fp8 != RAD_FP8_FN && fp8 != RAD_FP8_FNUZ) || y_stride < K || y_stride % 8 ||
      !y || !weight || !q || !scale || (residual && !residual_out) || !aligned(y, 16) ||
      !aligned(residual, 16) || !aligned(residual_out, 16) || !aligned(weight, 16) ||
      !aligned(q, 8) || !aligned(scale, 4))
    return (int)rad_error_invalid_value;
  a->y = static_cast<const uint16_t*>(y);
  a->y_stride = y_stride;
  a->residual = static_cast<const uint16_t*>(residual);
  a->weight = weight;
  a->residual_out = static_cast<uint16_t*>(residual_out);
  a->q = static_cast<uint8_t*>(q);
  a->scale = scale;
  a->M = M;
  a->K = K;
  a->eps = eps;
  // ATen's CUDA mean: sum * (float(outputs) / numel), the division done in fp32.
  a->mean_factor = M ? (float)M / (float)(M * K) : 0.0f;
  a->wdtype = weight_dtype;
  a->gemma = gemma ? 1 : 0;
  a->fmt = fp8;
  a->tpr = a->rpb = 0;
  a->split = 1;
  return 0;
}

}  // namespace radiance
