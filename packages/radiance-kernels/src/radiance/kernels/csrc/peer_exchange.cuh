// Peer-mapped buffers for the one-shot all-reduce (all_reduce.cu, ar_add_rms_quant.cu).
//
// Every rank allocates one region and exports it through an IPC handle; every rank maps every
// peer's region. A region is
//   [Control 256 B][flags: kArMaxBlocks x kArMaxRanks u32][staging parity 0][staging parity 1]
// with `data_bytes` per staging half.
//
// A call, for block b of rank r (one-shot, "pull"):
//   1. call = control.calls + 1           the number of this call, the same on every rank
//   2. write r's partial rows of block b into r's own staging[call & 1]
//   3. publish: store `call` into every peer's flags[b][r] (release, system scope)
//   4. wait until r's own flags[b][p] has reached `call` for every peer p (acquire)
//   5. read every rank's staging[call & 1] at block b's rows, sum in rank order 0, 1, ..., ws-1
//   6. the last block to finish advances control.calls
// Block b of every rank covers the same rows (same shapes, same grid), so block b depends only on
// block b of each peer. The counter lives in device memory and advances inside the kernel, so a
// captured CUDA graph replays correctly, and every rank counts the same calls because every rank
// runs the same sequence of all-reduces. A rank's calls must therefore run one after another in
// one stream order (never two at once on two streams).
//
// Why two staging halves and one barrier are enough: a rank overwrites staging[p] at call n + 2
// only after its call n + 1 completed; that call waited for every peer's call n + 1 flags, which a
// peer publishes only after its call n finished, reads included (stream order). A peer may run at
// most one call ahead, which is why the wait compares with >= (a flag may already say n + 1).
//
// Reduction order (the result is identical on every rank, whatever its rank):
//   out = act( ((f32(y_0) + f32(y_1)) + f32(y_2)) + ... + f32(y_{ws-1}) )
// fp32 adds that are never contracted, rounded once to the activation dtype.
#pragma once

#include "epilogue_common.cuh"

namespace radiance {

constexpr int kArMaxRanks = 8;
constexpr int kArMaxBlocks = 1024;
constexpr int64_t kArControlBytes = 256;
constexpr int64_t kArFlagBytes = (int64_t)kArMaxBlocks * kArMaxRanks * 4;
constexpr int64_t kArDataOffset = kArControlBytes + kArFlagBytes;

struct ArControl {
  uint32_t calls;  // calls completed by this rank (local use only)
  uint32_t done;   // blocks of the running call that finished (local use only)
  uint32_t hello[kArMaxRanks];  // the setup handshake: peer p stores 1 into hello[p]
  uint32_t hello_ok;            // handshake result, read by the host
};
static_assert(sizeof(ArControl) <= kArControlBytes, "control block too large");

// What a kernel needs to reach every rank's region; passed by value.
struct PeerSet {
  char* base[kArMaxRanks];  // region of rank i as mapped in this process (own one included)
  int rank, ws;
  int64_t data_bytes;  // bytes of one staging half
};

RAD_DEVICE ArControl* ar_control(char* base) { return reinterpret_cast<ArControl*>(base); }
RAD_DEVICE uint32_t* ar_flags(char* base) {
  return reinterpret_cast<uint32_t*>(base + kArControlBytes);
}
RAD_DEVICE uint16_t* ar_staging(const PeerSet& p, int rank, uint32_t call) {
  return reinterpret_cast<uint16_t*>(p.base[rank] + kArDataOffset + (int64_t)(call & 1u) * p.data_bytes);
}

// ---- system-scope flag accesses ------------------------------------------------------------
RAD_DEVICE void ar_store_release(uint32_t* p, uint32_t v) {
#ifdef RADIANCE_HIP
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#else
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#endif
}
RAD_DEVICE uint32_t ar_load_acquire(const uint32_t* p) {
#ifdef RADIANCE_HIP
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#else
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#endif
}
// A peer's staged data is read once per call and must not come from a stale L1 line: NVIDIA
// reads it through L2 only (ld.global.cg); on AMD the system-scope acquire already invalidated
// the vector caches.
RAD_DEVICE uint4 ar_load_peer16(const uint16_t* p) {
#ifdef RADIANCE_HIP
  return ld16(p);
#else
  return __ldcg(reinterpret_cast<const uint4*>(p));
#endif
}

// Step 1, by every block: the number of this call (thread 0 reads, the block shares it).
RAD_DEVICE uint32_t ar_begin_call(const PeerSet& p, uint32_t* shared_call) {
  if (threadIdx.x == 0)
    *shared_call = *reinterpret_cast<volatile uint32_t*>(&ar_control(p.base[p.rank])->calls) + 1u;
  __syncthreads();
  return *shared_call;
}

// Steps 3-4 for this block. The barrier before publishing makes the block's staging writes part
// of what the release publishes; the one after makes the acquired data visible to all threads.
RAD_DEVICE void ar_block_exchange(const PeerSet& p, uint32_t call) {
  __syncthreads();
  const int t = threadIdx.x;
  if (t < p.ws && t != p.rank) {
    ar_store_release(ar_flags(p.base[t]) + blockIdx.x * kArMaxRanks + p.rank, call);
    const uint32_t* mine = ar_flags(p.base[p.rank]) + blockIdx.x * kArMaxRanks + t;
    while ((int32_t)(ar_load_acquire(mine) - call) < 0) {
    }
  }
  __syncthreads();
}

// Step 6: every block has read `calls` before it counts itself done, so the last one may advance
// it; the next call (a later grid in the stream) sees the new value.
RAD_DEVICE void ar_end_call(const PeerSet& p, uint32_t call) {
  __syncthreads();
  if (threadIdx.x == 0) {
    ArControl* c = ar_control(p.base[p.rank]);
    __threadfence();
    if (atomicAdd(&c->done, 1u) == gridDim.x - 1) {
      atomicExch(&c->done, 0u);
      atomicExch(&c->calls, call);
    }
  }
}

// Step 5 for one 16-byte vector: the rank-ordered fp32 sum of 8 elements, rounded once.
// `own` is this rank's vector (already in registers); peers' come from their staging.
template <bool BF16, int WS>
RAD_DEVICE uint4 ar_sum_vector(const PeerSet& p, uint32_t call, int64_t elem, const uint4& own) {
  uint4 part[WS];
#pragma unroll
  for (int r = 0; r < WS; ++r) part[r] = r == p.rank ? own : ar_load_peer16(ar_staging(p, r, call) + elem);
  float acc[8];
  unpack8<BF16>(part[0], acc);
#pragma unroll
  for (int r = 1; r < WS; ++r) {
    float f[8];
    unpack8<BF16>(part[r], f);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = rad_add(acc[e], f[e]);
  }
  uint32_t h[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) h[e] = rad_f32_to_act<BF16>(acc[e]);
  return pack8(h);
}

// ---- host side -----------------------------------------------------------------------------
// Defined in all_reduce.cu.
const PeerSet* peer_set_of(const void* handle);  // null when the handle is not one of ours

}  // namespace radiance

#define RAD_DISPATCH_WS(ws, BODY)                    \
  switch (ws) {                                      \
    case 2: { constexpr int WS = 2; BODY; } break;   \
    case 4: { constexpr int WS = 4; BODY; } break;   \
    case 8: { constexpr int WS = 8; BODY; } break;   \
    default: return (int)rad_error_invalid_value;    \
  }
