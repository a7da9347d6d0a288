// What it costs a decode row split over S blocks to exchange its partials, on sm_90.
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o cluster_exchange cluster_exchange.cu
//   ./cluster_exchange > cluster_exchange.md
//
// A stand-in for the epilogue kernels' decode path: a row of K bf16 values, one 16-byte vector a
// thread, spread over S blocks. Each block loads its part, reduces a sum of squares, EXCHANGES it,
// normalizes, reduces an absmax, EXCHANGES it, quantizes and stores, with PDL like the real
// kernels. Variants (columns):
//   one_block       S = 1, no exchange: the unsplit row
//   no_exchange     S blocks, plain launch, no exchange (wrong result; the split's lower bound)
//   cluster_only    S blocks as a cluster, no exchange (what the cluster launch costs)
//   cluster_barrier as cluster_only plus one relaxed cluster barrier (arrive at start, wait late)
//   cluster_sync    each exchange: own part to shared memory, cluster.sync, read the peers'
//                   parts; a last cluster.sync before exit (the epilogues up to 2026-12-02)
//   push            each exchange: st.async of the part into every peer, counted there by an
//                   mbarrier transaction count; no exit barrier (epilogue_common.cuh)
//   poll            each exchange: a (tag, value) 64-bit store into every peer, each block polls
//                   its own slots one after the other
//   poll_lanes      as poll, but lane r of every warp polls slot r and the warp combines the
//                   parts by shuffles in rank order (epilogue_common.cuh)
// Time per call: median over 25 replays of a CUDA graph of 40 launches. Before timing, the
// four exchanging variants must produce bit-identical scales (they add the parts in the same
// order); the program exits 1 if not.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace cg = cooperative_groups;

enum Mode { kOneBlock, kNoExchange, kClusterOnly, kClusterBarrier, kClusterSync, kPush, kPoll, kPollLanes };

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ uint32_t peer_addr(const void* p, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_u32(p)), "r"(rank));
  return r;
}

__device__ __forceinline__ void push_u32(uint32_t addr, uint32_t v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               ::"r"(addr), "r"(v), "r"(bar) : "memory");
}

__device__ __forceinline__ void wait_pushes(uint64_t* bar) {
  asm volatile(
      "{\n .reg .pred p;\n wait_loop:\n"
      " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], 0;\n"
      " @!p bra wait_loop;\n}\n" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void store_tagged(uint32_t addr, uint32_t v) {
  asm volatile("st.relaxed.cluster.shared::cluster.u64 [%0], %1;" ::"r"(addr), "l"((1ull << 32) | v) : "memory");
}

__device__ __forceinline__ uint32_t poll_tagged(const uint64_t* p) {
  uint64_t v;
  do {
    asm volatile("ld.relaxed.cluster.shared::cta.u64 %0, [%1];" : "=l"(v) : "r"(smem_u32(p)) : "memory");
  } while ((v >> 32) != 1);
  return (uint32_t)v;
}

struct Shared {
  uint64_t bar[2];
  uint64_t slots[2][8];
  uint32_t parts[2][8];
  uint32_t own[2];
  float red[32];
  uint32_t redm[32];
};

// Exchange `v` (block-uniform) among the S blocks of the row; returns the S parts combined in
// rank order by `combine`.
template <int MODE, typename F>
__device__ uint32_t exchange(uint32_t v, int S, int part, Shared& sh, int which, F combine) {
  const int t = threadIdx.x;
  if (MODE == kClusterSync) {
    cg::cluster_group cl = cg::this_cluster();
    if (t == 0) sh.own[which] = v;
    cl.sync();
    uint32_t acc = *cl.map_shared_rank(&sh.own[which], 0);
    for (int r = 1; r < S; ++r) acc = combine(acc, *cl.map_shared_rank(&sh.own[which], r));
    return acc;
  }
  if (MODE == kPush) {
    if (t < S) push_u32(peer_addr(&sh.parts[which][part], t), v, peer_addr(&sh.bar[which], t));
    wait_pushes(&sh.bar[which]);
    uint32_t acc = sh.parts[which][0];
    for (int r = 1; r < S; ++r) acc = combine(acc, sh.parts[which][r]);
    return acc;
  }
  if (MODE == kPoll) {
    if (t < S) store_tagged(peer_addr(&sh.slots[which][part], t), v);
    uint32_t acc = poll_tagged(&sh.slots[which][0]);
    for (int r = 1; r < S; ++r) acc = combine(acc, poll_tagged(&sh.slots[which][r]));
    return acc;
  }
  if (MODE == kPollLanes) {
    if (t < S) store_tagged(peer_addr(&sh.slots[which][part], t), v);
    const int lane = t & 31;
    const uint32_t mine = lane < S ? poll_tagged(&sh.slots[which][lane]) : 0u;
    uint32_t acc = __shfl_sync(~0u, mine, 0);
    for (int r = 1; r < S; ++r) acc = combine(acc, __shfl_sync(~0u, mine, r));
    return acc;
  }
  return v;
}

template <int MODE>
__global__ void row_kernel(const uint4* __restrict__ x, uint2* __restrict__ q, float* scale, int K, int S) {
  __shared__ Shared sh;
  const int row = blockIdx.x / S, part = blockIdx.x % S;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, nw = blockDim.x / 32;
  if (MODE == kPush && t == 0) {
    for (int i = 0; i < 2; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&sh.bar[i])));
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&sh.bar[i])), "r"(S * 4) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  const bool polled = MODE == kPoll || MODE == kPollLanes;
  if (polled && t < 16) sh.slots[t / 8][t % 8] = 0;
  const bool barrier = MODE == kClusterBarrier || MODE == kPush || polled;
  if (barrier) {
    if (polled) asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    else asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int64_t vec = (int64_t)row * (K / 8) + part * blockDim.x + t;
  const uint4 v = x[vec];
  asm volatile("griddepcontrol.launch_dependents;");
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  float f[8], ss = 0.f;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    f[e] = __uint_as_float((e & 1 ? w[e / 2] >> 16 : w[e / 2] & 0xFFFF) << 16);
    ss = __fadd_rn(ss, __fmul_rn(f[e], f[e]));
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(~0u, ss, o);
  if (nw > 1) {
    if (lane == 0) sh.red[warp] = ss;
    __syncthreads();
    ss = lane < nw ? sh.red[lane] : 0.f;
#pragma unroll
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(~0u, ss, o);
  }
  if (barrier) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  ss = __uint_as_float(exchange<MODE>(__float_as_uint(ss), S, part, sh, 0, [](uint32_t a, uint32_t b) {
    return __float_as_uint(__fadd_rn(__uint_as_float(a), __uint_as_float(b)));
  }));
  const float rs = rsqrtf(ss / K + 1e-6f);
  uint32_t m = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    f[e] = __bfloat162float(__float2bfloat16(f[e] * rs));
    m = max(m, __float_as_uint(f[e]) & 0x7FFFFFFF);
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) m = max(m, __shfl_xor_sync(~0u, m, o));
  if (nw > 1) {
    if (lane == 0) sh.redm[warp] = m;
    __syncthreads();
    m = lane < nw ? sh.redm[lane] : 0u;
#pragma unroll
    for (int o = 16; o; o >>= 1) m = max(m, __shfl_xor_sync(~0u, m, o));
  }
  m = exchange<MODE>(m, S, part, sh, 1, [](uint32_t a, uint32_t b) { return max(a, b); });
  const float sc = fmaxf(__uint_as_float(m) * (1.f / 448.f), 1e-8f);
  const float r = 1.f / sc;
  if (part == 0 && t == 0) scale[row] = sc;
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    lo |= (uint32_t)__nv_cvt_float_to_fp8(f[e] * r, __NV_SATFINITE, __NV_E4M3) << (8 * e);
    hi |= (uint32_t)__nv_cvt_float_to_fp8(f[e + 4] * r, __NV_SATFINITE, __NV_E4M3) << (8 * e);
  }
  q[vec] = make_uint2(lo, hi);
  if (MODE == kClusterSync) cg::this_cluster().sync();
}

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      printf("error: %s (line %d): %s\n", #x, __LINE__, cudaGetErrorString(e_));              \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

template <typename F>
float graph_us(cudaStream_t s, F launch, int per_graph = 40, int reps = 25) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < per_graph; ++i) CK(launch());
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
  std::vector<float> ts;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1000.f / per_graph);
  }
  std::sort(ts.begin(), ts.end());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return ts[ts.size() / 2];
}

template <int MODE>
cudaError_t launch(int M, int K, int S, const uint4* x, uint2* q, float* sc, cudaStream_t s) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(M * S);
  cfg.blockDim = dim3(K / 8 / S);
  cfg.stream = s;
  cudaLaunchAttribute at[2];
  int n = 0;
  at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[n].val.programmaticStreamSerializationAllowed = 1;
  ++n;
  if (MODE >= kClusterOnly) {
    at[n].id = cudaLaunchAttributeClusterDimension;
    at[n].val.clusterDim.x = S;
    at[n].val.clusterDim.y = 1;
    at[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = at;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, row_kernel<MODE>, x, q, sc, K, S);
}

int main() {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int max_m = 64, max_k = 8192;
  uint4* x;
  uint2* q;
  float* sc;
  CK(cudaMalloc(&x, (size_t)max_m * max_k * 2));
  CK(cudaMalloc(&q, (size_t)max_m * max_k));
  CK(cudaMalloc(&sc, max_m * 4));
  std::vector<uint16_t> h((size_t)max_m * max_k);
  uint32_t st = 12345;
  for (auto& v : h) {  // uniform in [-2, 2) as bf16
    st = st * 1664525u + 1013904223u;
    const float f = ((st >> 8) / 16777216.f - 0.5f) * 4.f;
    uint32_t u;
    memcpy(&u, &f, 4);
    v = (uint16_t)(u >> 16);
  }
  CK(cudaMemcpy(x, h.data(), h.size() * 2, cudaMemcpyHostToDevice));

  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("# Split-row exchange cost (%s, CUDA %d.%d)\n\n", prop.name, CUDART_VERSION / 1000,
         CUDART_VERSION % 1000 / 10);
  printf("µs per call, median of CUDA-graph replays (40 launches a graph, PDL). See the header of\n"
         "cluster_exchange.cu for what each column does.\n\n");

  // The exchanging variants add the parts in the same (rank) order: identical scales.
  bool agree = true;
  for (int S : {2, 4, 8}) {
    const int M = 64, K = 8192;
    std::vector<float> a(M), b(M), c(M), d(M);
    CK(launch<kClusterSync>(M, K, S, x, q, sc, s));
    CK(cudaMemcpy(a.data(), sc, M * 4, cudaMemcpyDeviceToHost));
    CK(launch<kPush>(M, K, S, x, q, sc, s));
    CK(cudaMemcpy(b.data(), sc, M * 4, cudaMemcpyDeviceToHost));
    CK(launch<kPoll>(M, K, S, x, q, sc, s));
    CK(cudaMemcpy(c.data(), sc, M * 4, cudaMemcpyDeviceToHost));
    CK(launch<kPollLanes>(M, K, S, x, q, sc, s));
    CK(cudaMemcpy(d.data(), sc, M * 4, cudaMemcpyDeviceToHost));
    agree = agree && !memcmp(a.data(), b.data(), M * 4) && !memcmp(a.data(), c.data(), M * 4) &&
            !memcmp(a.data(), d.data(), M * 4);
  }
  printf("exchanging variants agree bit for bit: %s\n\n", agree ? "yes" : "NO");

  printf("| M | K | S | one_block | no_exchange | cluster_only | cluster_barrier | cluster_sync | push | poll | poll_lanes |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int K : {2048, 4096, 8192})
    for (int M : {1, 8, 32, 64}) {
      const float one = graph_us(s, [&] { return launch<kOneBlock>(M, K, 1, x, q, sc, s); });
      for (int S : {2, 4, 8}) {
        if (K / 8 / S > 1024 || K / 8 / S < 32) continue;
        printf("| %d | %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", M, K, S, one,
               graph_us(s, [&] { return launch<kNoExchange>(M, K, S, x, q, sc, s); }),
               graph_us(s, [&] { return launch<kClusterOnly>(M, K, S, x, q, sc, s); }),
               graph_us(s, [&] { return launch<kClusterBarrier>(M, K, S, x, q, sc, s); }),
               graph_us(s, [&] { return launch<kClusterSync>(M, K, S, x, q, sc, s); }),
               graph_us(s, [&] { return launch<kPush>(M, K, S, x, q, sc, s); }),
               graph_us(s, [&] { return launch<kPoll>(M, K, S, x, q, sc, s); }),
               graph_us(s, [&] { return launch<kPollLanes>(M, K, S, x, q, sc, s); }));
      }
    }
  return agree ? 0 : 1;
}
