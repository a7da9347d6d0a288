// The library-wide exports (ABI version, error strings, launch-config override) and the launch
// heuristic shared by the three epilogue ops.
#include "epilogue_common.cuh"

namespace radiance {

// Benchmark-only override of the launch heuristic, per op; vpt == 0 means "use the heuristic".
static LaunchConfig g_override[kOpCount] = {};

// Splitting a decode row over blocks (pick_split) pays while each block keeps at least this many
// 16-byte vectors; below it the extra blocks (and, where they form a cluster, its barriers) cost
// more than the shorter per-block instruction stream saves.
static int g_min_split_vectors = 128;

// PDL (see rad_launch): on for sm_90+ devices unless the benchmark switched it off.
static int g_pdl_switch = 1;

// Compute capability and multiprocessor count of the current device, cached per device;
// zeros when unknown (HIP, or the runtime failed).
struct DeviceFacts {
  int major, minor, sms, smem_optin;
};

static DeviceFacts device_facts() {
#ifdef RADIANCE_HIP
  return {0, 0, 0, 0};
#else
  static DeviceFacts cache[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return {0, 0, 0, 0};
  if (cache[dev].major == 0) {
    int major = 0, minor = 0, sms = 0, smem_optin = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
      return {0, 0, 0, 0};
    cache[dev] = {major, minor, sms, smem_optin};
  }
  return cache[dev];
#endif
}

bool pdl_enabled() { return g_pdl_switch && device_facts().major >= 9; }

int device_compute_capability() {
  const DeviceFacts f = device_facts();
  return f.major * 10 + f.minor;
}

int device_smem_optin() { return device_facts().smem_optin; }

static int round_up(int64_t a, int b) { return (int)((a + b - 1) / b * b); }

static bool vpt_instantiated(int v) { return (v >= 1 && v <= 6) || v == 8; }

// How a row maps onto threads, from the launch variants timed on the H200
// (benchmarks/results/epilogues: every op, both groupings, K 2048-8192, M 8 and 8192):
//  - Decode (M <= 128) is latency-bound: one 16-byte vector per thread (the most threads, every
//    load issued at once) up to 640 threads a row (K <= 5120) per token, 1024 (K <= 8192) with
//    group-128 scales; 2 vectors a thread beyond, where the per-token row max over a wider block
//    costs more than the extra loads. Where it pays, a decode row is split over several blocks
//    (pick_split).
//  - Mid M (128 < M <= 1024): the rows fill about one wave of the GPU's resident threads, so
//    more threads a row still pay: 2 vectors a thread per token, 1 with group-128 scales up to
//    640 threads a row (K <= 5120), 2 beyond. At M = 512 that is up to 1.4x faster than the
//    large-M layouts (silu_mul_quant per token, K = 5120) and at most 7% slower at any op and K
//    (the "vpt" variants at M = 512 in benchmarks/results/epilogues). gdn_norm_quant, since its
//    gate became the 5-instruction silu_fast_f32, takes 2 with group-128 scales from 512 vectors
//    (K = 4096): 4.15 against 4.82 µs at M = 512, K = 4096; level at 5120 (5.43 / 5.55); at
//    K = 2048 1 stays ahead (2.93 / 3.27) (2026-12-06 20:52 UTC run).
//  - Large M is bandwidth- and issue-bound: per-token rows run best with 4 vectors a thread
//    (fewer, longer-lived threads; up to 20% faster than 2 at K = 8192), group-128 rows of
//    add_rms_quant and gdn_norm_quant with 2 (level with 4 or better). Group-128 silu_mul_quant
//    rows take 4 from K = 4096: with its division written out (silu_f32) it has the fewest
//    instructions a value of the three, and 4 vectors a thread ran 1.02-1.13x faster than 2 at
//    M 2048 and 8192, K 4096-8192; at K = 2048 the two are level. Group-128 gdn_norm_quant
//    rows take 4 from K = 5120, since its 4-vector instantiation is held to 64 registers
//    (GdnMinBlocks): 0.93-0.96x the time of 2 at M 2048 and 8192, K 5120-8192, 1.00-1.02x at
//    K = 4096, 1.05-1.10x at 2048 (2026-12-04 16:51 UTC run).
// Exact divisors of the row are preferred (no idle lanes); several short rows share a block
// when a row needs fewer than 128 threads at large M. Resident blocks streaming rows through a
// cp.async shared-memory ring (loads of the next rows in flight during the math) were timed too
// and were 0.97-1.31x the time of these layouts at M = 8192 (benchmarks/results/streamed_rows.md):
// the large-M rows wait on issue slots, not loads, and the ring's registers cost occupancy.
// Decode rows split over S blocks, one vector a thread (measured on the H200 against one block
// per row, benchmarks/results/epilogues "split" variants). A split moves nvec - nvec/S vectors
// of each block's instruction stream to other blocks; what it costs depends on how often the
// blocks of a row must exchange partials (epilogue_common.cuh: one push through distributed
// shared memory, ~0.2 µs each):
//  - silu_mul_quant / gdn_norm_quant with group-128 scales: never (every reduction stays inside
//    a 128-column group); splitting pays from 128 moved vectors (K = 2048, S = 2).
//  - add_rms_quant with group-128 scales (the row sum), the other two per token (the row max):
//    once; pays from ~384 moved vectors (K = 4096 with S = 4; K = 8192 with S = 2, at M = 64).
//  - add_rms_quant per token (sum, then max): twice; pays from ~768 (K = 8192, S >= 4).
//  Every block adding the whole row's sum itself, so that only a per-token max crosses blocks
//  (each block reading the whole row), was built and timed against this exchange at M 1-128,
//  K 2048-8192: median 1.31x its time at the same split, and at no point faster than the best
//  exchanging launch (benchmarks/results/split_row_sum.md); removed.
// S is the largest of 8, 4, 2 that keeps each block's slice a whole number of warps of at least
// g_min_split_vectors vectors and one block of the grid a SM (M * S <= SMs) where the blocks
// exchange; if that S moves too few vectors, the row is not split. Blocks that never exchange
// need no such spread: up to 4 a SM (M * S <= 4 * SMs, blocks of 128-640 threads). At M = 64,
// K = 8192 that is 8 blocks a row instead of 2: 2.09 against 2.51 µs for group-128
// silu_mul_quant, 2.80 against 2.95 for gdn_norm_quant (benchmarks/results/epilogues against
// the run before this rule; at K = 4096 4 blocks, 1.45 against 1.73 and 1.79 against 1.85).
// sm_90+ only (clusters).
static int pick_split(int op, int64_t M, int64_t nvec, bool group) {
  const DeviceFacts dev = device_facts();
  if (dev.major < 9) return 1;
  const int exchanges = split_exchanges(op, group);
  const int64_t min_moved = exchanges ? 384 * exchanges : 128;
  for (int s = 8; s > 1; s >>= 1) {
    const int64_t slice = nvec / s;
    if (nvec % s || slice % 32 || slice < g_min_split_vectors) continue;
    if (M * s > (exchanges ? 1 : 4) * (int64_t)dev.sms) continue;
    return nvec - slice >= min_moved ? s : 1;
  }
  return 1;
}

LaunchConfig pick_config(int op, int64_t M, int64_t nvec, int warp, bool group, bool allow_split) {
  if (op >= 0 && op < kOpCount && g_override[op].vpt > 0) {
    LaunchConfig o = g_override[op];
    if (o.split > 1 && !allow_split) o.vpt = 0;
    return o;
  }
  const bool latency = M <= 128;
  if (latency && allow_split) {
    const int split = pick_split(op, M, nvec, group);
    if (split > 1) return LaunchConfig{1, (int)(nvec / split), 1, split};
  }
  static const int kDecodeNarrow[] = {1, 2, 3, 4, 5, 6, 8};
  static const int kDecodeWide[] = {2, 1, 3, 4, 5, 6, 8};
  static const int kMidPerToken[] = {2, 4, 1, 3, 5, 6, 8};
  static const int kBulkPerToken[] = {4, 2, 5, 3, 6, 8, 1};
  static const int kBulkGroup[] = {2, 4, 1, 3, 5, 6, 8};
  const int* order;
  if (latency)
    order = nvec <= (group ? 1024 : 640) ? kDecodeNarrow : kDecodeWide;
  else if (M <= 1024)  // mid M
    order = group ? (nvec <= (op == kOpGdnNorm ? 256 : 640) ? kDecodeNarrow : kDecodeWide) : kMidPerToken;
  else
    order = group && !(op == kOpSiluMul && nvec >= 512) && !(op == kOpGdnNorm && nvec >= 640)
                ? kBulkGroup
                : kBulkPerToken;
  LaunchConfig cfg = {0, 0, 1, 1};
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
    const int target = order[0];
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
    if (rad_device_warp_size(dev, &w) != rad_success) w = 64;
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

RAD_EXPORT int radiance_abi_version(void) { return 12; }

RAD_EXPORT const char* radiance_error_string(int code) {
  return rad_error_string_of(code);
}

// Not part of the serving contract: lets the benchmark time the launch with and without PDL.
RAD_EXPORT int radiance_set_pdl(int on) {
  radiance::g_pdl_switch = on ? 1 : 0;
  return 0;
}

// Not part of the serving contract: lets the benchmark time launch variants in one process.
// op: 0 add_rms_quant, 1 silu_mul_quant, 2 gdn_norm_quant; vpt 0 restores the heuristic.
// split > 1 spreads each row over that many blocks of tpr threads (one row per block, at most 2
// vectors a thread, sm_90+).
// Returns 0, or the invalid-value code for a config the kernels cannot run.
RAD_EXPORT int radiance_set_launch_config(int op, int vpt, int tpr, int rpb, int split) {
  using namespace radiance;
  if (op < 0 || op >= kOpCount) return (int)rad_error_invalid_value;
  if (vpt == 0) {
    g_override[op] = LaunchConfig{0, 0, 1, 1};
    return 0;
  }
  if (!vpt_instantiated(vpt) || tpr < 32 || tpr % 32 || rpb < 1 ||
      tpr * rpb > max_threads_for(vpt) || (split != 1 && split != 2 && split != 4 && split != 8) ||
      (split > 1 && (rpb != 1 || vpt > 2 || device_facts().major < 9)))
    return (int)rad_error_invalid_value;
  g_override[op] = LaunchConfig{vpt, tpr, rpb, split};
  return 0;
}

// Not part of the serving contract: the smallest per-block slice (vectors) a split may leave.
RAD_EXPORT int radiance_set_min_split_vectors(int vectors) {
  if (vectors < 32) return (int)rad_error_invalid_value;
  radiance::g_min_split_vectors = vectors;
  return 0;
}

// The config a call with (M, K) would launch with; for reports and benchmarks.
RAD_EXPORT int radiance_get_launch_config(int op, int64_t M, int64_t K, int group, int* vpt,
                                          int* tpr, int* rpb, int* split) {
  using namespace radiance;
  const LaunchConfig c = pick_config(op, M, K / 8, host_warp_size(), group != 0, true);
  *vpt = c.vpt;
  *tpr = c.tpr;
  *rpb = c.rpb;
  *split = c.split;
  return c.vpt ? 0 : (int)rad_error_invalid_value;
}
