// The library-wide exports (ABI version, error strings, launch-config override) and the launch
// heuristic shared by the three epilogue ops.
#include "epilogue_common.cuh"

namespace radiance {

// Benchmark-only override of the launch heuristic, per op; vpt == 0 means "use the heuristic".
static LaunchConfig g_override[kOpCount] = {};

static int round_up(int64_t a, int b) { return (int)((a + b - 1) / b * b); }

static bool vpt_instantiated(int v) { return (v >= 1 && v <= 6) || v == 8; }

// Decode (small M) is latency-bound: spread a row over many threads (about 2 vectors each) so
// its loads all issue at once. Large M is bandwidth-bound: 4-8 vectors per thread keeps enough
// bytes in flight per SM with fewer, cheaper blocks, and several rows share a block when a row
// needs fewer than 128 threads. Exact divisors of the row are preferred (no idle lanes).
LaunchConfig pick_config(int op, int64_t M, int64_t nvec, int warp) {
  if (op >= 0 && op < kOpCount && g_override[op].vpt > 0) return g_override[op];
  const bool latency = M <= 128;
  static const int kLatencyOrder[] = {2, 1, 3, 4, 5, 6, 8};
  static const int kThroughputOrder[] = {4, 5, 8, 6, 3, 2, 1};
  const int* order = latency ? kLatencyOrder : kThroughputOrder;
  LaunchConfig cfg = {0, 0, 1};
  for (int i = 0; i < 7; ++i) {
    const int v = order[i];
    if (nvec % v) continue;
    const int64_t tpr = nvec / v;
    if (tpr % warp || tpr > max_threads_for(v)) continue;
    if (!latency && tpr < 32) continue;
    cfg.vpt = v;
    cfg.tpr = (int)tpr;
    break;
  }
  if (cfg.vpt == 0) {  // no exact fit: round threads up, idle lanes at the row's end
    const int target = latency ? 2 : 4;
    int tpr = round_up((nvec + target - 1) / target, warp);
    if (tpr > max_threads_for(target)) tpr = round_up((nvec + 5) / 6, warp);
    int v = (int)((nvec + tpr - 1) / tpr);
    if (v == 7) v = 8;
    if (tpr > max_threads_for(v)) return cfg;  // row too long (K > 24576): unsupported
    cfg.vpt = v;
    cfg.tpr = tpr;
  }
  if (!latency && cfg.tpr < 128) cfg.rpb = 128 / cfg.tpr;
  return cfg;
}

int host_warp_size() {
#ifdef RADIANCE_HIP
  static int cached[64] = {};
  int dev = 0;
  if (rad_get_device(&dev) != rad_success || dev < 0) return 64;
  if (dev >= 64) {
    int w = 64;
    rad_device_warp_size(dev, &w);
    return w;
  }
  if (cached[dev] == 0) {
    int w = 64;
    if (rad_device_warp_size(dev, &w) != rad_success) w = 64;
    cached[dev] = w;
  }
  return cached[dev];
#else
  return 32;
#endif
}

bool aligned(const void* p, int bytes) { return ((uintptr_t)p % (uintptr_t)bytes) == 0; }

}  // namespace radiance

RAD_EXPORT int radiance_abi_version(void) { return 1; }

RAD_EXPORT const char* radiance_error_string(int code) {
  return rad_error_string_of(code);
}

// Not part of the serving contract: lets the benchmark time launch variants in one process.
// op: 0 add_rms_quant, 1 silu_mul_quant, 2 gdn_norm_quant; vpt 0 restores the heuristic.
// Returns 0, or the invalid-value code for a config the kernels cannot run.
RAD_EXPORT int radiance_set_launch_config(int op, int vpt, int tpr, int rpb) {
  using namespace radiance;
  if (op < 0 || op >= kOpCount) return (int)rad_error_invalid_value;
  if (vpt == 0) {
    g_override[op] = LaunchConfig{0, 0, 1};
    return 0;
  }
  if (!vpt_instantiated(vpt) || tpr < 32 || tpr % 32 || rpb < 1 ||
      tpr * rpb > max_threads_for(vpt))
    return (int)rad_error_invalid_value;
  g_override[op] = LaunchConfig{vpt, tpr, rpb};
  return 0;
}

// The config a call with (M, row vectors = K/8) would launch with; for reports.
RAD_EXPORT int radiance_get_launch_config(int op, int64_t M, int64_t K, int* vpt, int* tpr,
                                          int* rpb) {
  using namespace radiance;
  const LaunchConfig c = pick_config(op, M, K / 8, host_warp_size());
  *vpt = c.vpt;
  *tpr = c.tpr;
  *rpb = c.rpb;
  return c.vpt ? 0 : (int)rad_error_invalid_value;
}
