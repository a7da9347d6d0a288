// Hopper warpgroup MMA (wgmma) plumbing shared by the kernels that issue it: the arch guard, the
// fences and group waits, and the shared-memory descriptor of a 128-byte-swizzled K-major tile.
// Everything here is sm_90a only (RADIANCE_WGMMA); elsewhere the fences compile to nothing and
// the kernels that need wgmma are not instantiated.
#pragma once

#include "portability.h"

#if !defined(RADIANCE_HIP) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define RADIANCE_WGMMA 1
#endif

namespace radiance {
namespace {

// Orders this thread's register writes before the warpgroup MMAs that read those registers
// (accumulators, or A fragments held in registers).
RAD_DEVICE void wgmma_fence() {
#ifdef RADIANCE_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

RAD_DEVICE void wgmma_commit() {
#ifdef RADIANCE_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// Wait until at most N of this warp's committed MMA groups are still running.
template <int N>
RAD_DEVICE void wgmma_wait() {
#ifdef RADIANCE_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Wait for every wgmma this warp issued (their accumulators are read next).
RAD_DEVICE void wgmma_commit_and_wait() {
  wgmma_commit();
  wgmma_wait<0>();
}

// Ties an accumulator's registers to this point of the program: the MMAs write them
// asynchronously, so reads of them must not be moved above the wait that precedes this.
template <int TT>
RAD_DEVICE void fence_accumulators(float (&d)[TT][4]) {
#ifdef RADIANCE_WGMMA
#pragma unroll
  for (int t = 0; t < TT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[t][e])::"memory");
#else
  (void)d;
#endif
}

// Descriptor of a K-major tile laid out with the 128-byte swizzle (the 16-byte chunk c of row j
// at chunk c ^ (j % 8) of the row's 128-byte line, 8-row groups 1024 bytes apart, the pattern
// anchored at 1024-byte boundaries): stride byte offset 1024, layout type 1 (bits 62-63); the
// leading byte offset is unused by swizzled K-major layouts (1 by convention). A k-step inside
// the 128-byte line is the start address moved by its bytes.
RAD_DEVICE uint64_t swizzled_tile_descriptor(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
         ((uint64_t)1 << 62);
}

}  // namespace
}  // namespace radiance
