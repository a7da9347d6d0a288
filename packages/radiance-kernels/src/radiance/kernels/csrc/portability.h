// One source for CUDA (nvcc) and HIP (hipcc). Everything platform-specific lives here: the
// runtime API names, the warp width, shuffles, 16-bit float conversions and the FP8 encoders.
//
// Numerics contract: every conversion below produces the same bits as PyTorch's own cast on the
// same platform, because the kernels must equal the torch reference bit for bit.
//  - NVIDIA: torch (sm_80+) converts float->bf16/fp16 with the hardware round-to-nearest-even
//    instructions, so we call the same intrinsics.
//  - HIP: the ROCm 5.2 toolchain predates HIP's bf16/fp8 types, so bf16 and FP8 are raw bits
//    with our own round-to-nearest-even, written after c10's software conversions.
#pragma once

#include <stdint.h>

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_HCC__)
#define RADIANCE_HIP 1
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
// HIP compiles with -ffp-contract=fast by default; a fused multiply-add rounds once where torch
// rounds twice, so contraction is switched off for every translation unit that includes us.
#pragma clang fp contract(off)
typedef hipStream_t rad_stream_t;
typedef hipError_t rad_error_t;
#define rad_success hipSuccess
#define rad_error_invalid_value hipErrorInvalidValue
#define rad_get_last_error hipGetLastError
#define rad_error_string_of(code) hipGetErrorString((hipError_t)(code))
#define rad_get_device hipGetDevice
#define rad_device_warp_size(dev, out) hipDeviceGetAttribute((out), hipDeviceAttributeWarpSize, (dev))
typedef hipIpcMemHandle_t rad_ipc_handle_t;
#define rad_malloc hipMalloc
#define rad_free hipFree
#define rad_memset hipMemset
#define rad_memcpy_d2h(dst, src, n) hipMemcpy((dst), (src), (n), hipMemcpyDeviceToHost)
#define rad_device_synchronize hipDeviceSynchronize
#define rad_stream_synchronize hipStreamSynchronize
#define rad_ipc_get_handle hipIpcGetMemHandle
#define rad_ipc_open(ptr, handle) hipIpcOpenMemHandle((ptr), (handle), hipIpcMemLazyEnablePeerAccess)
#define rad_ipc_close hipIpcCloseMemHandle
#else
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
typedef cudaStream_t rad_stream_t;
typedef cudaError_t rad_error_t;
#define rad_success cudaSuccess
#define rad_error_invalid_value cudaErrorInvalidValue
#define rad_get_last_error cudaGetLastError
#define rad_error_string_of(code) cudaGetErrorString((cudaError_t)(code))
typedef cudaIpcMemHandle_t rad_ipc_handle_t;
#define rad_malloc cudaMalloc
#define rad_free cudaFree
#define rad_memset cudaMemset
#define rad_memcpy_d2h(dst, src, n) cudaMemcpy((dst), (src), (n), cudaMemcpyDeviceToHost)
#define rad_device_synchronize cudaDeviceSynchronize
#define rad_stream_synchronize cudaStreamSynchronize
#define rad_ipc_get_handle cudaIpcGetMemHandle
#define rad_ipc_open(ptr, handle) cudaIpcOpenMemHandle((ptr), (handle), cudaIpcMemLazyEnablePeerAccess)
#define rad_ipc_close cudaIpcCloseMemHandle
#endif

#define RAD_EXPORT extern "C" __attribute__((visibility("default")))
#define RAD_DEVICE __device__ __forceinline__

// Warp (wavefront) width of the code being compiled for the device: 64 on CDNA (gfx9), 32 on
// RDNA (gfx10+, wave32 default) and NVIDIA. Host code asks the runtime instead (rad_host_warp).
#if defined(RADIANCE_HIP) && defined(__AMDGCN_WAVEFRONT_SIZE)
#define RAD_WARP __AMDGCN_WAVEFRONT_SIZE
#else
#define RAD_WARP 32
#endif

// ---- no-contraction float arithmetic ------------------------------------------------------
// Each of these rounds once, exactly like one torch elementwise op. nvcc contracts a*b+c into an
// FMA unless told not to; the _rn intrinsics are never contracted.
#ifdef RADIANCE_HIP
RAD_DEVICE float rad_mul(float a, float b) { return a * b; }
RAD_DEVICE float rad_add(float a, float b) { return a + b; }
#else
RAD_DEVICE float rad_mul(float a, float b) { return __fmul_rn(a, b); }
RAD_DEVICE float rad_add(float a, float b) { return __fadd_rn(a, b); }
#endif

RAD_DEVICE uint32_t rad_f2u(float f) { return __float_as_uint(f); }
RAD_DEVICE float rad_u2f(uint32_t u) { return __uint_as_float(u); }
RAD_DEVICE bool rad_isnan(float f) { return (rad_f2u(f) & 0x7FFFFFFFu) > 0x7F800000u; }
RAD_DEVICE bool rad_isfinite(float f) { return (rad_f2u(f) & 0x7F800000u) != 0x7F800000u; }

// ---- wall clock, for the bounded waits of setup code (never on a serving path) ---------------
#ifdef RADIANCE_HIP
// wall_clock64() ticks at the device's constant wall-clock rate (100 MHz where the runtime is too
// old to report it); the host converts its timeout to ticks.
RAD_DEVICE uint64_t rad_wall_ticks() {
#if defined(__HIP_DEVICE_COMPILE__)
  return (uint64_t)wall_clock64();
#else
  return 0;
#endif
}
#else
RAD_DEVICE uint64_t rad_wall_ticks() {  // %globaltimer: nanoseconds
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

// ---- shuffles -----------------------------------------------------------------------------
#ifdef RADIANCE_HIP
RAD_DEVICE float rad_shfl_xor(float v, int m) { return __shfl_xor(v, m); }
RAD_DEVICE uint32_t rad_shfl_xor(uint32_t v, int m) { return (uint32_t)__shfl_xor((int)v, m); }
#else
RAD_DEVICE float rad_shfl_xor(float v, int m) { return __shfl_xor_sync(0xFFFFFFFFu, v, m); }
RAD_DEVICE uint32_t rad_shfl_xor(uint32_t v, int m) { return __shfl_xor_sync(0xFFFFFFFFu, v, m); }
#endif

// Per 16-bit half: the unsigned max of a's and b's halves.
RAD_DEVICE uint32_t rad_vmaxu2(uint32_t a, uint32_t b) {
#ifdef RADIANCE_HIP
  return max(a & 0xFFFFu, b & 0xFFFFu) | (max(a >> 16, b >> 16) << 16);
#else
  return __vmaxu2(a, b);
#endif
}

// ---- 16-bit floats as raw bits ------------------------------------------------------------
RAD_DEVICE float rad_bf16_to_f32(uint32_t h) { return rad_u2f(h << 16); }

RAD_DEVICE uint32_t rad_f32_to_bf16(float f) {
#ifdef RADIANCE_HIP
  // c10's round_to_nearest_even (what torch on ROCm runs): NaN becomes the quiet 0x7FC0.
  uint32_t u = rad_f2u(f);
  if (rad_isnan(f)) return 0x7FC0u;
  return (u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16;
#else
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#endif
}

RAD_DEVICE float rad_f16_to_f32(uint32_t h) {
  return __half2float(__ushort_as_half((unsigned short)h));
}
RAD_DEVICE uint32_t rad_f32_to_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }

template <bool BF16>
RAD_DEVICE float rad_act_to_f32(uint32_t h) {
  return BF16 ? rad_bf16_to_f32(h) : rad_f16_to_f32(h);
}
template <bool BF16>
RAD_DEVICE uint32_t rad_f32_to_act(float f) {
  return BF16 ? rad_f32_to_bf16(f) : rad_f32_to_f16(f);
}

// Two floats to two act-dtype values in one word (a in the low half), rounded exactly as the
// single conversions round; on NVIDIA one paired conversion instruction instead of two
// conversions and a merge.
template <bool BF16>
RAD_DEVICE uint32_t rad_f32x2_to_act(float a, float b) {
#ifdef RADIANCE_HIP
  return rad_f32_to_act<BF16>(a) | (rad_f32_to_act<BF16>(b) << 16);
#else
  if (BF16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
#endif
}

// act(float(a) * float(b)) for both halves of two packed act-dtype words, as torch computes a
// 16-bit product (fp32 opmath, one cast). Two 16-bit significands multiply exactly in fp32's 24
// bits, so that is the exact product rounded once to the act dtype, which is what the paired
// 16-bit multiply does: on NVIDIA one instruction instead of four unpacks, two multiplies and a
// conversion. One exception, bf16 only: a product under 2^-126 (below fp32's normal range) is
// rounded to fp32's subnormal grid first, so the two may differ there in the last bit or by a
// flush to a zero of the same sign. The epilogues only quantize such values, and every value under
// 2^-126 divided by a clamped scale (>= 1/(448*512)) has code +-0 by its sign, in both.
template <bool BF16>
RAD_DEVICE uint32_t rad_mul_act2(uint32_t a, uint32_t b) {
#if defined(RADIANCE_HIP) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)  // no bf16x2 math
  const float lo = rad_mul(rad_act_to_f32<BF16>(a & 0xFFFFu), rad_act_to_f32<BF16>(b & 0xFFFFu));
  const float hi = rad_mul(rad_act_to_f32<BF16>(a >> 16), rad_act_to_f32<BF16>(b >> 16));
  return rad_f32x2_to_act<BF16>(lo, hi);
#else
  uint32_t d;
  if (BF16)  // fma with -0 is an exact multiply, signed zeros included (sm_80+, no mul.bf16x2)
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  else
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#endif
}

// ---- FP8 e4m3 -----------------------------------------------------------------------------
// Formats: 0 = e4m3fn (OCP; NVIDIA, RDNA4), 1 = e4m3fnuz (MI300-class).
// The quant range is vLLM's: +-448 for fn, +-224 for fnuz (vLLM deliberately uses 224, not the
// format's 240, on ROCm).
#define RAD_FP8_FN 0
#define RAD_FP8_FNUZ 1

RAD_DEVICE float rad_fp8_max(int fmt) { return fmt == RAD_FP8_FN ? 448.0f : 224.0f; }

// c10::detail::fp8e4m3fn_from_fp32_value, bit for bit (round to nearest even, NaN -> 0x7F|sign).
RAD_DEVICE uint32_t rad_fp8_fn_soft(float f) {
  uint32_t fb = rad_f2u(f);
  const uint32_t sign = fb & 0x80000000u;
  fb ^= sign;
  uint32_t r;
  if (fb >= (1087u << 20)) {
    r = fb > 0x7F800000u ? 0x7Fu : 0x7Eu;
  } else if (fb < (121u << 23)) {
    const uint32_t denorm = 141u << 23;
    fb = rad_f2u(rad_add(rad_u2f(fb), rad_u2f(denorm)));
    r = (fb - denorm) & 0xFFu;
  } else {
    const uint32_t odd = (fb >> 20) & 1u;
    fb += ((uint32_t)(7 - 127) << 23) + 0x7FFFFu;
    fb += odd;
    r = (fb >> 20) & 0xFFu;
    if (r == 0x7Fu) r = 0x7Eu;
  }
  return r | (sign >> 24);
}

// c10::detail::fp8e4m3fnuz_from_fp32_value, bit for bit (NaN and overflow -> 0x80, no -0).
RAD_DEVICE uint32_t rad_fp8_fnuz_soft(float f) {
  uint32_t fb = rad_f2u(f);
  const uint32_t sign = fb & 0x80000000u;
  fb ^= sign;
  if (fb >= (0x87u << 23)) return 0x80u;
  uint32_t r;
  if (fb < (0x78u << 23)) {
    const uint32_t denorm = 0x8Cu << 23;
    fb = rad_f2u(rad_add(rad_u2f(fb), rad_u2f(denorm)));
    r = (fb - denorm) & 0xFFu;
    if (r == 0) return 0u;
  } else {
    const uint32_t odd = (fb >> 20) & 1u;
    fb += ((uint32_t)(8 - 127) << 23) + 0x7FFFFu;
    fb += odd;
    r = (fb >> 20) & 0xFFu;
  }
  return r | (sign >> 24);
}

// torch's clamp(-max, max) keeps NaN (fminf/fmaxf would not), then the format's cast.
RAD_DEVICE uint32_t rad_fp8_clamp_encode(float v, int fmt) {
  const float m = rad_fp8_max(fmt);
  if (!rad_isnan(v)) v = fminf(fmaxf(v, -m), m);
  return fmt == RAD_FP8_FN ? rad_fp8_fn_soft(v) : rad_fp8_fnuz_soft(v);
}

// Two finite values, clamp + e4m3fn cast; low byte holds a. On NVIDIA the saturating hardware
// conversion equals torch's clamp(+-448) followed by its software cast for every finite input
// (and for +-inf); callers use it only when no NaN can occur.
RAD_DEVICE uint32_t rad_fp8_fn_pair_finite(float a, float b) {
#ifdef RADIANCE_HIP
  return rad_fp8_clamp_encode(a, RAD_FP8_FN) | (rad_fp8_clamp_encode(b, RAD_FP8_FN) << 8);
#else
  return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
#endif
}

// ---- launch with programmatic dependent launch (PDL) ---------------------------------------
// Decode-size epilogues are launch-bound: most of a call is the gap between the previous
// kernel's end and this one's first load. On sm_90+ a kernel launched with programmatic stream
// serialization may start while its predecessor is still finishing; it reads the (static)
// weights, then waits in rad_wait_prior_grids() until the predecessor has completed and its
// writes are visible, and only then touches activations or writes anything. Every global read of
// data another kernel produces, and every global write, comes after that wait, so the stream's
// ordering is kept exactly. rad_release_dependents() lets our own successor start its prologue
// early in the same way; a successor launched without PDL waits for our completion as usual.
// The epilogue kernels release right after requesting their inputs. Released before their wait
// instead, they measured 1.15-1.35x slower at M = 64 and from 0.96x to 1.09x at M <= 8 (H200, 72
// decode points, the two builds timed alternately twice); a chain of small kernels then becomes
// resident at once, and the likely cost is the waiting blocks' share of the SMs. The decode GEMMs
// choose per launch (block_fp8_mm.cuh, release_early).
// HIP has no equivalent: both calls compile to nothing and the launch is a plain one.
RAD_DEVICE void rad_wait_prior_grids() {
#if !defined(RADIANCE_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
RAD_DEVICE void rad_release_dependents() {
#if !defined(RADIANCE_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

namespace radiance {
bool pdl_enabled();  // sm_90+ and not switched off (abi.cu)
int device_compute_capability();  // 90 for sm_90; 0 on HIP or when unknown (abi.cu)
int device_smem_optin();  // the current device's per-block shared memory limit, bytes; 0 if unknown (abi.cu)
}

#ifndef RADIANCE_HIP
// Above 48 KiB a kernel must opt in to its dynamic shared memory, per device; `opted` is the
// calling launcher's own per-device record of the bytes its kernel opted in to, so the runtime
// call happens once per device (or when a launch needs more than before), not every launch.
template <typename Kernel>
rad_error_t opt_in_dynamic_smem(Kernel kernel, int bytes, int (&opted)[64]) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return rad_error_invalid_value;
  if (opted[dev] < bytes) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess) return e;
    opted[dev] = bytes;
  }
  return rad_success;
}
#endif

// `cluster` > 1 launches clusters of that many consecutive blocks (sm_90+; gridDim.x must be a
// multiple of it). HIP has no clusters: callers pass 1 there. `smem`: dynamic shared memory bytes.
template <typename Arg>
inline rad_error_t rad_launch(void (*kernel)(Arg), dim3 grid, dim3 block, rad_stream_t stream,
                              const Arg& arg, int cluster = 1, size_t smem = 0) {
#ifdef RADIANCE_HIP
  if (cluster != 1) return hipErrorInvalidValue;
  kernel<<<grid, block, smem, stream>>>(arg);
  return hipGetLastError();
#else
  const bool pdl = radiance::pdl_enabled();
  if (!pdl && cluster == 1) {
    kernel<<<grid, block, smem, stream>>>(arg);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = (unsigned)cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, arg);
#endif
}
