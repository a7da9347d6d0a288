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
  int one_exchange;  // per-token split rows may take their max from the row-sum exchange
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

RAD_DEVICE float weight16_to_f32(int wdtype, uint32_t h) {
  return wdtype == 0 ? rad_bf16_to_f32(h) : rad_f16_to_f32(h);
}

// Two outputs of the chain (header comment) from x in fp32 and a pair of 16-bit weights (low
// half first), packed as two act-dtype values. The main path and the candidates of
// token_exchange both compute through here, so they agree bit for bit.
template <bool BF16>
RAD_DEVICE uint32_t add_rms_out2(const AddRmsArgs& a, float xa, float xb, uint32_t wpair, float rs) {
  if (!a.gemma && a.wdtype == (BF16 ? 0 : 1))  // weight in the activation dtype: the common case
    // act(float(act(x * rs)) * float(w)): a product of two 16-bit values, rounded once
    return rad_mul_act2<BF16>(rad_f32x2_to_act<BF16>(rad_mul(xa, rs), rad_mul(xb, rs)), wpair);
  const float wa = weight16_to_f32(a.wdtype, wpair & 0xFFFFu);
  const float wb = weight16_to_f32(a.wdtype, wpair >> 16);
  if (a.gemma)
    return rad_f32x2_to_act<BF16>(rad_mul(rad_mul(xa, rs), rad_add(wa, 1.0f)),
                                  rad_mul(rad_mul(xb, rs), rad_add(wb, 1.0f)));
  const float na = round_to<BF16>(a.wdtype, rad_mul(xa, rs));
  const float nb = round_to<BF16>(a.wdtype, rad_mul(xb, rs));
  return rad_f32x2_to_act<BF16>(round_to<BF16>(a.wdtype, rad_mul(na, wa)),
                                round_to<BF16>(a.wdtype, rad_mul(nb, wb)));
}

template <int VPT, bool BF16>
RAD_DEVICE void add_rms_out_w16(const AddRmsArgs& a, const float (&x)[VPT][8], const uint4 (&wv)[VPT],
                                float rs, uint4 (&o)[VPT]) {
#pragma unroll
  for (int v = 0; v < VPT; ++v)
    o[v] = make_uint4(add_rms_out2<BF16>(a, x[v][0], x[v][1], wv[v].x, rs),
                      add_rms_out2<BF16>(a, x[v][2], x[v][3], wv[v].y, rs),
                      add_rms_out2<BF16>(a, x[v][4], x[v][5], wv[v].z, rs),
                      add_rms_out2<BF16>(a, x[v][6], x[v][7], wv[v].w, rs));
}

// ---- per-token split rows: the row max found in the row-sum exchange ----------------------
// A row split over S blocks needs its sum of squares (for rs) and then the max of |out| (for the
// scale) from every block: two trips through the cluster, ~0.2-0.3 µs each at decode sizes. The
// max can ride along with the sum, because |out_i| is x_i's magnitude times |w_i| times rs,
// moved only by roundings, and rs is one positive number for the whole row. So before rs is
// known each warp pushes, with its partial sum, its two elements of largest p = |x| * |w'|
// (w' = w, or w + 1 for Gemma, in fp32); after the exchange every block computes out for those
// 2 * (warps of the row) candidates with the row's rs, and their max is the row's.
//
// Why it is exact. Every way out is computed (add_rms_out2) is rs * |x| * |w'| moved by at most
// three roundings to a 16-bit float and two to fp32: relative error at most
// e = (1 + 2^-8)^3 (1 + 2^-24)^2 - 1 < 0.0118 while the values stay normal, plus an absolute
// error A where a rounding meets the subnormals of its dtype (fp16: 2^-25 each, one of them
// multiplied by |w| where x * rs is rounded to fp16 before the product; bf16: 2^-134 each).
// Let P be the row's largest p. An element with p < P * (1 - 2^-5) then has
// |out| <= rs * P * (1 - 2^-5)(1 + e)(1 + 2^-24)^2 + A, and the element with p = P (a candidate)
// has |out| >= rs * P * (1 - e)(1 - 2^-24) - A: larger once rs * P * 0.0080 >= 2A. With |w'|
// <= 256 where x * rs is rounded to fp16 (2^64 otherwise), A < 2^-16.9, so rs * P >= 2^-8
// suffices (a normalized row has its largest |x| * rs near or above 1, so only rows with tiny
// weights miss this). Every element with p >= P * (1 - 2^-5) must then be a candidate: a warp
// where more than two elements lie within 2^-5 of its own largest p flags its slot, and a flag
// on a warp whose largest p reaches P * (1 - 2^-5) sends the row to the second exchange. So do
// a weight beyond the cap, rs * P under 2^-8 or not finite, and any NaN or inf in the row (its
// sum or P is then not finite). Every block decides from the same pushed values, so the blocks
// of a row take the same path; the result is the same max either way.
constexpr float kCandidateKeep = 0.96875f;         // 1 - 2^-5
constexpr float kCandidateMinScaled = 0.00390625f;  // 2^-8: smallest rs * P the bound covers
constexpr float kCandidateMaxScaled = 1.2676506e30f;  // 2^100: any finite rs * P short of overflow
constexpr uint32_t kSlotFlag = 0x7FFFFFFFu;         // a NaN in a candidate's x: see above

// The warps of a split row that push a slot each (the one-exchange form), or 0: that form needs a
// split row, per-token scales, 16-bit weights and at most kMaxSlots warps a row.
template <bool GROUP>
RAD_DEVICE int token_slots(const AddRmsArgs& a, int split) {
  const int slots = split * (a.tpr / RAD_WARP);
  return !GROUP && split > 1 && a.one_exchange && a.wdtype != 2 && slots <= kMaxSlots ? slots : 0;
}

RAD_DEVICE float weight_magnitude(const AddRmsArgs& a, uint32_t w16) {
  const float w = weight16_to_f32(a.wdtype, w16);
  return fabsf(a.gemma ? rad_add(w, 1.0f) : w);
}

#ifdef RAD_CLUSTERS
// The row's rs from one exchange of every warp's (partial sum, two candidates); sets max_known
// and known_max (as abs_bits) when the candidates decide the row's max (see above).
template <int VPT, bool BF16>
RAD_DEVICE float token_exchange(const AddRmsArgs& a, const float (&x)[VPT][8], const uint4 (&wv)[VPT],
                                float ss, int split, int slots, RowShared& sh, bool& max_known,
                                uint32_t& known_max) {
  const float cap = !a.gemma && a.wdtype == 1 ? 256.0f : 18446744073709551616.0f;  // 2^64
  const uint32_t lane = threadIdx.x % RAD_WARP;
  float p[VPT][8];
  uint32_t p1 = 0, p2 = 0, w1 = 0, w2 = 0;  // this thread's two largest p (as bits) and weights
  float x1 = 0.0f, x2 = 0.0f;
  bool over_cap = false;
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const uint32_t w = half_of(wv[v], e);
      const float wm = weight_magnitude(a, w);
      over_cap |= !(wm <= cap);
      p[v][e] = rad_mul(fabsf(x[v][e]), wm);
      const uint32_t pb = abs_bits(p[v][e]);  // NaN above inf
      if (pb > p1) {
        p2 = p1, x2 = x1, w2 = w1;
        p1 = pb, x1 = x[v][e], w1 = w;
      } else if (pb > p2) {
        p2 = pb, x2 = x[v][e], w2 = w;
      }
    }
  }
  // The warp's two largest: the first from lane l1, the second from lane l2 (l1's own second
  // where l2 == l1); how many of its elements lie within 2^-5 of its largest.
  const uint32_t top = warp_max_u32(p1);
  const int l1 = __ffs(__ballot_sync(0xFFFFFFFFu, p1 == top)) - 1;
  const uint32_t rest = (int)lane == l1 ? p2 : p1;
  const int l2 = __ffs(__ballot_sync(0xFFFFFFFFu, rest == warp_max_u32(rest))) - 1;
  const float keep = rad_mul(rad_u2f(top), kCandidateKeep);
  int near = 0;
#pragma unroll
  for (int v = 0; v < VPT; ++v)
#pragma unroll
    for (int e = 0; e < 8; ++e) near += p[v][e] >= keep;
  near = __reduce_add_sync(0xFFFFFFFFu, near);
  over_cap = __any_sync(0xFFFFFFFFu, over_cap);
  const float cx1 = __shfl_sync(0xFFFFFFFFu, x1, l1);
  const uint32_t cw1 = __shfl_sync(0xFFFFFFFFu, w1, l1);
  const float cx2 = __shfl_sync(0xFFFFFFFFu, (int)lane == l1 ? x2 : x1, l2);
  const uint32_t cw2 = __shfl_sync(0xFFFFFFFFu, (int)lane == l1 ? w2 : w1, l2);
  float part = ss;
#pragma unroll
  for (int off = RAD_WARP / 2; off > 0; off >>= 1) part += rad_shfl_xor(part, off);
  const uint4 mine = make_uint4(rad_f2u(part), over_cap ? kSlotFlag : rad_f2u(cx1),
                                near > 2 ? kSlotFlag : rad_f2u(cx2), cw1 | (cw2 << 16));
  const int warps = a.tpr / RAD_WARP;
  cluster_push_slots(mine, split, (int)cluster_rank() * warps + (int)threadIdx.x / RAD_WARP, sh);

  // Every warp of every block reads the same slots into the same lanes and reduces them in the
  // same order (a butterfly leaves the identical value in every lane): one rs, one verdict.
  float sum = 0.0f;
  uint32_t pmax = 0;
  for (int i = lane; i < slots; i += RAD_WARP) {
    const uint4 sl = sh.slot[i];
    sum = rad_add(sum, rad_u2f(sl.x));
    pmax = max(pmax, abs_bits(rad_mul(fabsf(rad_u2f(sl.y)), weight_magnitude(a, sl.w & 0xFFFFu))));
  }
#pragma unroll
  for (int off = RAD_WARP / 2; off > 0; off >>= 1) sum += rad_shfl_xor(sum, off);
  const float rs = rsqrtf(rad_add(rad_mul(sum, a.mean_factor), a.eps));
  const uint32_t row_p = warp_max_u32(pmax);
  const float row_keep = rad_mul(rad_u2f(row_p), kCandidateKeep);
  uint32_t ymax = 0;
  bool flagged = false;
  for (int i = lane; i < slots; i += RAD_WARP) {
    const uint4 sl = sh.slot[i];
    const float xa = rad_u2f(sl.y), xb = rad_u2f(sl.z);
    const bool b_flag = sl.z == kSlotFlag;
    // the slot's largest p again, as pushed: the same product of the same values
    flagged |= b_flag && rad_mul(fabsf(xa), weight_magnitude(a, sl.w & 0xFFFFu)) >= row_keep;
    const uint32_t y = add_rms_out2<BF16>(a, xa, b_flag ? 0.0f : xb, sl.w, rs);
    const uint32_t m16 = max(y & 0x7FFFu, (y >> 16) & 0x7FFFu);
    ymax = max(ymax, abs_bits(rad_act_to_f32<BF16>(m16)));
  }
  const float scaled = rad_mul(rad_u2f(row_p), rs);
  max_known = !__any_sync(0xFFFFFFFFu, flagged) && scaled >= kCandidateMinScaled &&
              scaled <= kCandidateMaxScaled;
  known_max = warp_max_u32(ymax);
  return rs;
}
#endif

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
  bool max_known = false;
  uint32_t known_max = 0;
  float rs;
#ifdef RAD_CLUSTERS
  if (const int slots = token_slots<GROUP>(a, split)) {
    rs = token_exchange<VPT, BF16>(a, x, wv, ss, split, slots, sh, max_known, known_max);
  } else
#endif
  {
    ss = cluster_row_sum(row_sum(ss, a.tpr, rth.first_warp, sh.red_sum), split, sh, /*first=*/true);
    rs = rsqrtf(rad_add(rad_mul(ss, a.mean_factor), a.eps));
  }

  uint4 o[VPT];
  if (w16) {
    // The same calls under the common case's own test, so that its instance of them carries
    // none of add_rms_out2's per-pair tests.
    if (!a.gemma && a.wdtype == (BF16 ? 0 : 1))
      add_rms_out_w16<VPT, BF16>(a, x, wv, rs, o);
    else
      add_rms_out_w16<VPT, BF16>(a, x, wv, rs, o);
  } else {  // fp32 weights, read here
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      const int c = v * rt + t;
      float w[8];
      if (on[v]) {
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
                                 /*summed=*/true, max_known, known_max);
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
  a->one_exchange = 1;
  return 0;
}

}  // namespace radiance
