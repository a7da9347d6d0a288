// Test probe, built by test_gpu_elementwise_all_inputs.py and never by the library: pieces of
// the epilogue kernels' element math (epilogue_common.cuh) applied to given inputs, writing the
// fp32 results' bits: silu_f32 and silu_fast_f32 on 16-bit inputs, 8 values at a time as the
// kernels apply them; the group quant's division by the group scale (div_by_scale with
// rcp_moderate's reciprocal, as quant_store8 computes them); rcp_moderate alone; and
// rad_mul_act2, the paired 16-bit product.
#include "epilogue_common.cuh"

template <bool BF16, bool FAST>
__global__ void silu_probe_kernel(const uint16_t* in, uint32_t* out, int64_t n) {
  const int64_t i0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (i0 >= n) return;
  float x[8], s[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] = rad_act_to_f32<BF16>(in[i0 + e]);
  if (FAST)
    radiance::silu_fast_f32(x, s);
  else
    radiance::silu_f32(x, s);
#pragma unroll
  for (int e = 0; e < 8; ++e) out[i0 + e] = rad_f2u(s[e]);
}

// n: a multiple of 8; fast: silu_fast_f32 instead of silu_f32. Returns the launch's error code.
RAD_EXPORT int silu_probe(const void* in, void* out, int64_t n, int bf16, int fast) {
  if (n % 8) return (int)rad_error_invalid_value;
  const int64_t threads = n / 8;
  const dim3 block(128), grid((unsigned)((threads + 127) / 128));
  const auto* src = static_cast<const uint16_t*>(in);
  auto* dst = static_cast<uint32_t*>(out);
  if (bf16 && fast)
    silu_probe_kernel<true, true><<<grid, block>>>(src, dst, n);
  else if (bf16)
    silu_probe_kernel<true, false><<<grid, block>>>(src, dst, n);
  else if (fast)
    silu_probe_kernel<false, true><<<grid, block>>>(src, dst, n);
  else
    silu_probe_kernel<false, false><<<grid, block>>>(src, dst, n);
  return (int)rad_get_last_error();
}

__global__ void div_probe_kernel(const uint16_t* in, uint32_t* out, int64_t n, float s) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = rad_f2u(radiance::div_by_scale(rad_bf16_to_f32(in[i]), s, radiance::rcp_moderate(s)));
}

// x / s for bf16 inputs x and a moderate scale s (in [2^-100, 2^100]).
RAD_EXPORT int div_probe(const void* in, void* out, int64_t n, float s) {
  const dim3 block(128), grid((unsigned)((n + 127) / 128));
  div_probe_kernel<<<grid, block>>>(static_cast<const uint16_t*>(in), static_cast<uint32_t*>(out),
                                    n, s);
  return (int)rad_get_last_error();
}

__global__ void rcp_probe_kernel(const float* in, uint32_t* out, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = rad_f2u(radiance::rcp_moderate(in[i]));
}

// 1 / s for moderate fp32 inputs s.
RAD_EXPORT int rcp_probe(const void* in, void* out, int64_t n) {
  const dim3 block(256), grid((unsigned)((n + 255) / 256));
  rcp_probe_kernel<<<grid, block>>>(static_cast<const float*>(in), static_cast<uint32_t*>(out), n);
  return (int)rad_get_last_error();
}

template <bool BF16>
__global__ void mul_act2_probe_kernel(const uint32_t* a, const uint32_t* b, uint32_t* out,
                                      int64_t words) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < words) out[i] = rad_mul_act2<BF16>(a[i], b[i]);
}

// Elementwise a * b of two arrays of packed 16-bit values (2 per word), rounded to their dtype.
RAD_EXPORT int mul_act2_probe(const void* a, const void* b, void* out, int64_t words, int bf16) {
  const dim3 block(256), grid((unsigned)((words + 255) / 256));
  const auto* pa = static_cast<const uint32_t*>(a);
  const auto* pb = static_cast<const uint32_t*>(b);
  auto* dst = static_cast<uint32_t*>(out);
  if (bf16)
    mul_act2_probe_kernel<true><<<grid, block>>>(pa, pb, dst, words);
  else
    mul_act2_probe_kernel<false><<<grid, block>>>(pa, pb, dst, words);
  return (int)rad_get_last_error();
}
