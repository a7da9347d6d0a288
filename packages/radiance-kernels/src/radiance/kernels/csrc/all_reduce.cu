// The one-shot all-reduce over peer-mapped buffers (protocol in peer_exchange.cuh): the region
// exports (allocate, IPC handle, map a peer's), the peer set, the setup handshake and the plain
// all-reduce kernel. The fused all-reduce + add_rms_quant is in ar_add_rms_quant.cu.
#include <cstring>
#include <mutex>
#include <set>

#include "peer_exchange.cuh"

namespace radiance {

struct AllReduceArgs {
  const uint16_t* in;
  uint16_t* out;
  int64_t nvec;  // 16-byte vectors
  PeerSet p;
};

// Each thread moves whole 16-byte vectors; the grid is capped (kAllReduceMaxBlocks) and strides
// over the message, so block b covers the same vectors on every rank.
constexpr int kAllReduceThreads = 512;
constexpr int kAllReduceMaxBlocks = 256;

template <bool BF16, int WS>
__global__ void __launch_bounds__(kAllReduceThreads) all_reduce_kernel(const AllReduceArgs args) {
  __shared__ uint32_t call_s;
  const PeerSet& p = args.p;
  rad_wait_prior_grids();
  const uint32_t call = ar_begin_call(p, &call_s);
  uint16_t* mine = ar_staging(p, p.rank, call);
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < args.nvec; i += stride) st16(mine + i * 8, ld16(args.in + i * 8));
  ar_block_exchange(p, call);
  for (int64_t i = first; i < args.nvec; i += stride)
    st16(args.out + i * 8, ar_sum_vector<BF16, WS>(p, call, i * 8, ld16(mine + i * 8)));
  ar_end_call(p, call);
}

// Setup check that every peer's region is really reachable: each rank stores into every peer's
// hello slot, then waits, for at most `timeout_ticks`, to see every peer's store in its own.
// The result goes to control.hello_ok (1 all seen, 2 timed out) for the host to read, so a rank
// whose peer writes never arrive reports it instead of hanging.
__global__ void ar_handshake_kernel(const PeerSet p, uint64_t timeout_ticks) {
  __shared__ int ok;
  const int t = threadIdx.x;
  if (t == 0) ok = 1;
  __syncthreads();
  if (t < p.ws && t != p.rank) {
    ar_store_release(&ar_control(p.base[t])->hello[p.rank], 1u);
    const uint32_t* mine = &ar_control(p.base[p.rank])->hello[t];
    const uint64_t start = rad_wall_ticks();
    while (ar_load_acquire(mine) != 1u) {
      if (rad_wall_ticks() - start > timeout_ticks) {
        atomicExch(&ok, 0);
        break;
      }
    }
  }
  __syncthreads();
  if (t == 0) ar_control(p.base[p.rank])->hello_ok = ok ? 1u : 2u;
}

// Live peer sets, so an export can refuse a pointer that is not one (a stale or foreign handle).
static std::mutex g_peer_sets_mutex;
static std::set<const PeerSet*> g_peer_sets;

const PeerSet* peer_set_of(const void* handle) {
  std::lock_guard<std::mutex> lock(g_peer_sets_mutex);
  const PeerSet* p = static_cast<const PeerSet*>(handle);
  return g_peer_sets.count(p) ? p : nullptr;
}

}  // namespace radiance

RAD_EXPORT int radiance_ipc_handle_bytes(void) { return (int)sizeof(rad_ipc_handle_t); }

RAD_EXPORT int64_t radiance_peer_region_bytes(int64_t data_bytes) {
  return radiance::kArDataOffset + 2 * data_bytes;
}

// Allocates this rank's region (zeroed: every flag and counter starts at 0) and writes its IPC
// handle (radiance_ipc_handle_bytes() bytes) to `handle`.
RAD_EXPORT int radiance_peer_region_alloc(int64_t data_bytes, void** base, void* handle) {
  using namespace radiance;
  if (data_bytes <= 0 || data_bytes % 256 || !base || !handle) return (int)rad_error_invalid_value;
  const int64_t bytes = kArDataOffset + 2 * data_bytes;
  void* p = nullptr;
  rad_error_t err = rad_malloc(&p, (size_t)bytes);
  if (err != rad_success) return (int)err;
  err = rad_memset(p, 0, (size_t)bytes);
  if (err == rad_success) err = rad_device_synchronize();
  rad_ipc_handle_t h;
  if (err == rad_success) err = rad_ipc_get_handle(&h, p);
  if (err != rad_success) {
    (void)rad_free(p);
    return (int)err;
  }
  std::memcpy(handle, &h, sizeof(h));
  *base = p;
  return 0;
}

RAD_EXPORT int radiance_peer_region_open(const void* handle, void** base) {
  if (!handle || !base) return (int)rad_error_invalid_value;
  rad_ipc_handle_t h;
  std::memcpy(&h, handle, sizeof(h));
  return (int)rad_ipc_open(base, h);
}

RAD_EXPORT int radiance_peer_region_close(void* base) { return (int)rad_ipc_close(base); }

RAD_EXPORT int radiance_peer_region_free(void* base) { return (int)rad_free(base); }

// bases[i]: rank i's region as mapped here (this rank's own allocation at bases[rank]).
RAD_EXPORT int radiance_peer_set_create(int rank, int ws, void* const* bases, int64_t data_bytes,
                                        void** out) {
  using namespace radiance;
  if (ws < 2 || ws > kArMaxRanks || rank < 0 || rank >= ws || !bases || !out || data_bytes <= 0 ||
      data_bytes % 256)
    return (int)rad_error_invalid_value;
  PeerSet* p = new PeerSet();
  for (int i = 0; i < kArMaxRanks; ++i) p->base[i] = i < ws ? static_cast<char*>(bases[i]) : nullptr;
  for (int i = 0; i < ws; ++i)
    if (!p->base[i]) {
      delete p;
      return (int)rad_error_invalid_value;
    }
  p->rank = rank;
  p->ws = ws;
  p->data_bytes = data_bytes;
  {
    std::lock_guard<std::mutex> lock(g_peer_sets_mutex);
    g_peer_sets.insert(p);
  }
  *out = p;
  return 0;
}

RAD_EXPORT int radiance_peer_set_destroy(void* handle) {
  using namespace radiance;
  std::lock_guard<std::mutex> lock(g_peer_sets_mutex);
  PeerSet* p = static_cast<PeerSet*>(handle);
  if (!g_peer_sets.erase(p)) return (int)rad_error_invalid_value;
  delete p;
  return 0;
}

// Runs the handshake on `stream` and waits for it. *ok: 1 every peer answered, 0 timed out.
RAD_EXPORT int radiance_peer_set_handshake(const void* handle, int64_t timeout_ms, int* ok,
                                           void* stream) {
  using namespace radiance;
  const PeerSet* p = peer_set_of(handle);
  if (!p || !ok || timeout_ms <= 0) return (int)rad_error_invalid_value;
#ifdef RADIANCE_HIP
  int khz = 100000;
#if HIP_VERSION >= 50300000
  int dev = 0;
  rad_error_t err = hipGetDevice(&dev);
  if (err == rad_success) err = hipDeviceGetAttribute(&khz, hipDeviceAttributeWallClockRate, dev);
  if (err != rad_success) return (int)err;
#endif
  const uint64_t ticks = (uint64_t)timeout_ms * (uint64_t)(khz > 0 ? khz : 100000);
#else
  const uint64_t ticks = (uint64_t)timeout_ms * 1000000ull;
#endif
  rad_stream_t s = static_cast<rad_stream_t>(stream);
  ar_handshake_kernel<<<1, kArMaxRanks * 32, 0, s>>>(*p, ticks);
  rad_error_t e = rad_get_last_error();
  if (e == rad_success) e = rad_stream_synchronize(s);
  uint32_t result = 0;
  if (e == rad_success)
    e = rad_memcpy_d2h(&result, &reinterpret_cast<ArControl*>(p->base[p->rank])->hello_ok,
                       sizeof(result));
  if (e != rad_success) return (int)e;
  *ok = result == 1u ? 1 : 0;
  return 0;
}

// out = the rank-ordered sum over the peer set of every rank's `in` (n elements, bf16 or fp16);
// out may be in. n * 2 bytes must fit a staging half.
RAD_EXPORT int radiance_all_reduce(const void* handle, const void* in, void* out, int64_t n,
                                   int act_dtype, void* stream) {
  using namespace radiance;
  const PeerSet* p = peer_set_of(handle);
  if (!p || !in || !out || n <= 0 || n % 8 || n * 2 > p->data_bytes ||
      (act_dtype != 0 && act_dtype != 1) || !aligned(in, 16) || !aligned(out, 16))
    return (int)rad_error_invalid_value;
  AllReduceArgs args;
  args.in = static_cast<const uint16_t*>(in);
  args.out = static_cast<uint16_t*>(out);
  args.nvec = n / 8;
  args.p = *p;
  int64_t blocks = (args.nvec + kAllReduceThreads - 1) / kAllReduceThreads;
  if (blocks > kAllReduceMaxBlocks) blocks = kAllReduceMaxBlocks;
  const dim3 grid((unsigned)blocks), block(kAllReduceThreads);
  rad_stream_t s = static_cast<rad_stream_t>(stream);
  rad_error_t err = rad_success;
  RAD_DISPATCH_WS(p->ws, err = act_dtype == 0
                             ? rad_launch(all_reduce_kernel<true, WS>, grid, block, s, args)
                             : rad_launch(all_reduce_kernel<false, WS>, grid, block, s, args));
  return (int)err;
}
