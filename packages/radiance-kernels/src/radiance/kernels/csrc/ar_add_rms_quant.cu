// The tensor-parallel all-reduce fused with add_rms_quant: one launch per RowParallel epilogue.
// Each rank's partial sum y is exchanged through the peer-mapped staging (peer_exchange.cuh),
// summed in rank order and rounded to the activation dtype, exactly what the plain all-reduce
// produces; the rest is add_rms_quant's row math (add_rms_quant.cuh) on that sum. The result is
// bit-identical to all_reduce followed by add_rms_quant, on every rank.
//
// Layout: add_rms_quant's launch rule for the same (M, K, group), limited to at most 4 vectors a
// thread (K <= 16384) so that the ws partial vectors of a row slice stay in registers.
#include "add_rms_quant.cuh"
#include "peer_exchange.cuh"

namespace radiance {

struct ArAddRmsArgs {
  AddRmsArgs a;
  PeerSet p;
};

constexpr int kArMaxVpt = 4;

template <int VPT, bool BF16, bool GROUP, int WS>
__global__ void __launch_bounds__(MaxThreads<VPT>::value)
    ar_add_rms_quant_kernel(const ArAddRmsArgs args) {
  __shared__ RowShared sh;
  __shared__ uint32_t call_s;
  const AddRmsArgs& a = args.a;
  const PeerSet& p = args.p;
  const RowThread rth = row_thread(a.tpr, a.rpb, 1, a.M);  // never split: block b pairs with b

  bool on[VPT];
  uint4 yv[VPT], rv[VPT], wv[VPT], sum[VPT];
  const uint4 z = make_uint4(0, 0, 0, 0);
  add_rms_prefetch_weights<VPT>(a, rth, on, wv);
  rad_wait_prior_grids();
  const uint32_t call = ar_begin_call(p, &call_s);
  uint16_t* mine = ar_staging(p, p.rank, call);
  const int64_t row_off = rth.row * a.K;
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int64_t c = (int64_t)v * rth.rt + rth.t;
    yv[v] = on[v] ? ld16(a.y + row_off + c * 8) : z;
    rv[v] = on[v] ? ld16(a.residual + row_off + c * 8) : z;
    if (on[v]) st16(mine + row_off + c * 8, yv[v]);
  }
  ar_block_exchange(p, call);
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int64_t c = (int64_t)v * rth.rt + rth.t;
    sum[v] = on[v] ? ar_sum_vector<BF16, WS>(p, call, row_off + c * 8, yv[v]) : z;
  }
  add_rms_finish<VPT, BF16, GROUP>(a, sum, rv, wv, on, rth, sh);
  ar_end_call(p, call);
}

template <int VPT, int WS>
rad_error_t launch_ar_add_rms(bool bf16, bool grp, dim3 grid, dim3 block, rad_stream_t s,
                              const ArAddRmsArgs& args) {
  if (bf16)
    return grp ? rad_launch(ar_add_rms_quant_kernel<VPT, true, true, WS>, grid, block, s, args)
               : rad_launch(ar_add_rms_quant_kernel<VPT, true, false, WS>, grid, block, s, args);
  return grp ? rad_launch(ar_add_rms_quant_kernel<VPT, false, true, WS>, grid, block, s, args)
             : rad_launch(ar_add_rms_quant_kernel<VPT, false, false, WS>, grid, block, s, args);
}

}  // namespace radiance

// add_rms_quant(all_reduce(y), residual, ...) in one launch. y and residual contiguous [M, K];
// the residual is required (the first layer's epilogue has nothing to reduce). M * K * 2 bytes
// must fit a staging half.
RAD_EXPORT int radiance_ar_add_rms_quant(const void* peers, const void* y, const void* residual,
                                         const void* weight, int weight_dtype, void* q,
                                         float* scale, void* residual_out, int64_t M, int64_t K,
                                         float eps, int gemma, int group, int act_dtype, int fp8,
                                         void* stream) {
  using namespace radiance;
  const PeerSet* p = peer_set_of(peers);
  if (!p || !residual) return (int)rad_error_invalid_value;
  ArAddRmsArgs args;
  const int bad = make_add_rms_args(y, K, residual, weight, weight_dtype, q, scale, residual_out,
                                    M, K, eps, gemma, group, act_dtype, fp8, &args.a);
  if (bad || M == 0) return bad;
  if (M * K * 2 > p->data_bytes) return (int)rad_error_invalid_value;
  const LaunchConfig cfg = pick_config(kOpAddRms, M, K / 8, host_warp_size(), group != 0, false);
  if (cfg.vpt == 0 || cfg.vpt > kArMaxVpt) return (int)rad_error_invalid_value;
  const int64_t blocks = (M + cfg.rpb - 1) / cfg.rpb;
  if (blocks > kArMaxBlocks) return (int)rad_error_invalid_value;
  args.a.tpr = cfg.tpr;
  args.a.rpb = cfg.rpb;
  args.p = *p;
  const dim3 grid((unsigned)blocks), block(cfg.tpr * cfg.rpb);
  const bool bf16 = act_dtype == 0, grp = group == 128;
  rad_stream_t s = static_cast<rad_stream_t>(stream);
  rad_error_t err = rad_success;
  switch (cfg.vpt) {
    case 1: RAD_DISPATCH_WS(p->ws, err = (launch_ar_add_rms<1, WS>(bf16, grp, grid, block, s, args))); break;
    case 2: RAD_DISPATCH_WS(p->ws, err = (launch_ar_add_rms<2, WS>(bf16, grp, grid, block, s, args))); break;
    case 3: RAD_DISPATCH_WS(p->ws, err = (launch_ar_add_rms<3, WS>(bf16, grp, grid, block, s, args))); break;
    case 4: RAD_DISPATCH_WS(p->ws, err = (launch_ar_add_rms<4, WS>(bf16, grp, grid, block, s, args))); break;
    default: return (int)rad_error_invalid_value;
  }
  return (int)err;
}
