#include "ops/conv2d/grouped_mma.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "ops/common/activation.h"
#include "ops/common/launch.h"
#include "ops/common/mma_sync.cuh"
#include "ops/common/pair_io.cuh"
#include "ops/common/predicated_load.cuh"
#include "ops/common/relayout_cuda.h"

namespace customconv {
namespace {

constexpr int kGroupWidth = 8;  // input and output channels of a warp's slice (an mma tile's n)
constexpr int kWarps = 4;       // warps per block: one 8-channel slice each
constexpr int kTileRows = 16;   // output positions per mma tile
constexpr int kMaxTaps = int(kGroupedMmaMaxTaps);
constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast;

// Resident blocks an SM the forward kernel's registers are capped for (see
// grouped_mma_forward_kernel).
template <typename T>
constexpr int kBlocksPerSm = std::is_same_v<T, float> ? 6 : 8;
// grouped_mma16_forward_kernel: 4, or 5 for stride-1 3x3 layers of groups of
// 4 and 8 (see there).
constexpr int kWideBlocksPerSm = 4, kMoreWideBlocksPerSm = 5;

// One call's geometry, channels_last: input (n, h, w, c), output (n, p, q, k)
// with k == c, weight (k, r, s, width); positions = n * p * q.
struct Geometry {
  int h, w, c, p, q, s, taps;
  int sh, sw, ph, pw, dh, dw;
  int positions, tiles;
  int slices;  // slices of kGroupWidth channels, a warp each: c / 8 (16 channels a warp: c / 16)
  int width;   // channels per group of the layer: 4, 8 or 16
  int row_step, col_step;  // elements between taps: dh * w * c, dw * c
  at::cuda::detail::IntDivider<unsigned> plane, cols;  // by p * q and by q
};

// An output position of a tile as one thread sees it: the element offset
// of its window's top-left tap at the thread's channel, that tap's input
// pixel, and whether the position exists (the last tile's rows past the end
// do not). With a window fixed at compile time (KH x KW), which of its rows
// and columns lie inside the input, decided once per position.
template <int KH, int KW>
struct Row {
  int base, iy, ix;
  bool ok;
  bool row_in[KH > 0 ? KH : 1], col_in[KW > 0 ? KW : 1];
};

template <int KH, int KW>
__device__ __forceinline__ Row<KH, KW> row_at(const Geometry& g, int m, int channel) {
  const auto image = g.plane.divmod(unsigned(m));
  const auto yx = g.cols.divmod(image.mod);
  const int n = int(image.div), y = int(yx.div), x = int(yx.mod);
  Row<KH, KW> r;
  r.iy = y * g.sh - g.ph, r.ix = x * g.sw - g.pw, r.ok = m < g.positions;
  r.base = ((n * g.h + r.iy) * g.w + r.ix) * g.c + channel;
#pragma unroll
  for (int i = 0; i < KH; ++i) r.row_in[i] = r.ok && unsigned(r.iy + i * g.dh) < unsigned(g.h);
#pragma unroll
  for (int j = 0; j < KW; ++j) r.col_in[j] = unsigned(r.ix + j * g.dw) < unsigned(g.w);
  return r;
}

// Each tap's offset from the window's top-left one: dy and dx in input rows
// and columns, `offset` in elements (a runtime window's taps row by row,
// g.s to a row).
template <int KH, int KW, int kTaps>
__device__ __forceinline__ void tap_offsets(const Geometry& g, int (&dy)[kTaps], int (&dx)[kTaps],
                                            int (&offset)[kTaps]) {
#pragma unroll
  for (int t = 0; t < kTaps; ++t) {
    const int i = KH > 0 ? t / KW : t / g.s, j = KH > 0 ? t % KW : t % g.s;
    dy[t] = i * g.dh;
    dx[t] = j * g.dw;
    offset[t] = i * g.row_step + j * g.col_step;
  }
}

// The order in which a 3x3 window's taps are reduced in 16-bit, where the
// n-th and the n+1-th (n even) share a step, read by different lanes of one
// load: kPairs 0 row-major; 2 pairs the taps two columns apart in each window
// row, so that at stride 2 (and dilation 1) a row's second tap is the next
// row's first, the same pixel, read once by the load for both lanes; the
// middle column's taps are paired down the column.
template <int kPairs>
__device__ __forceinline__ constexpr int tap_order(int n) {
  if (kPairs == 0 || n >= 9) return n;
  if (n < 6) return n / 2 * 3 + (n % 2) * 2;  // (i, 0) and (i, 2)
  return 3 * n - 17;                          // (0, 1), (1, 1), (2, 1)
}

// The 8 bytes a lane reads of one row at one tap: tap `t`, or `t_next` where
// `next` (a per-lane choice between two taps known at compile time, so that
// the window's bounds stay in registers); zero in the padding and for taps
// past the window's. `offset` holds each tap's element offset from the
// top-left one; with a runtime window, dy and dx its offset in input rows and
// columns. One predicated load (load_if): with a branch around the load,
// in 16-bit the lanes of the two taps took divergent paths one after the
// other, and on an H100 (N=32) ResNeXt's 256-channel layer at 28x28 took
// 36.2 us instead of 32.9, RegNet's 104 channels at 28x28 20.1 instead of
// 16.2.
template <int KH, int KW>
__device__ __forceinline__ bool tap_inside(const Row<KH, KW>& r, const Geometry& g, int t,
                                           const int* dy, const int* dx) {
  if constexpr (KH > 0) {
    return t < KH * KW && (r.row_in[t / KW] & r.col_in[t % KW]);
  } else {
    return (t < g.taps) & r.ok & (unsigned(r.iy + dy[t]) < unsigned(g.h)) &
           (unsigned(r.ix + dx[t]) < unsigned(g.w));
  }
}

template <int KH, int KW, typename T>
__device__ __forceinline__ uint2 tap_bits(const T* in, const Row<KH, KW>& r, const Geometry& g,
                                          int t, int t_next, bool next, const int* offset,
                                          const int* dy, const int* dx) {
  constexpr int kTaps = KH > 0 ? KH * KW : kMaxTaps;
  const bool inside = next ? tap_inside(r, g, t_next, dy, dx) : tap_inside(r, g, t, dy, dx);
  const int at = next ? offset[t_next < kTaps ? t_next : t] : offset[t];
  return load_if(in + (r.base + at), inside);
}

// Forward. Block (x, y): kWarps warps, warp w on the 8-channel slice
// y * kWarps + w (one group of 8 channels, or two groups of 4), all of them
// walking the same tiles of 16 consecutive output positions (tile =
// blockIdx.x, then strided by the grid), so that between them they read
// 4 * 16 bytes (16-bit) of each input pixel they touch while it is in the
// SM's L1: one warp alone reads half of each 32-byte sector, and on layers
// larger than L2 the other half came from memory a second time. A slice's 8
// output channels are the tile's 8 columns; with groups of 4 its weight is
// block-diagonal (half of the products are zeros). Lane l holds rows l / 4
// and l / 4 + 8 of the tile and, in the accumulators, output channels
// 2 * (l % 4) and + 1 (mma.sync's fragment layout). The reduction runs over
// (tap, channel), and each lane reads 8 bytes of a row's pixel a load:
//   16-bit, m16n8k16: a step is two taps x 8 channels; lanes with l % 4 of
//     0 and 1 read channels 0-3 and 4-7 of the first tap, lanes with 2 and
//     3 the same of the second (one 64-bit load a row and step);
//   float32, m16n8k8 TF32: a step is one tap x 8 channels; lane l reads
//     channels 2 * (l % 4) and + 1.
// The step's reduction index is mapped onto (tap, channel) to match (the
// B fragments follow the same map), so a warp's load covers whole 32-byte
// sectors. In 16-bit 3x3 layers at stride 2 a step's two taps are two
// columns apart (tap_order), so that a row's second tap and the next row's
// first are one pixel: on an H100 (N=32) ResNeXt's 256-channel stride-2
// layer went from 43.1 to 39.2 us, RegNet's 104-channel one from 23.5 to
// 22.0. (At stride 1, pairing neighbouring taps changed nothing; float32
// reading 16 bytes, two taps a step, ran 1.3-1.4x slower.)
// The slice's B fragments for every tap are loaded once into registers;
// taps in the padding read zeros. Accumulators start from the bias; the
// residual and the activation (conv2d_fused) are applied as they are stored.
// Registers are capped for 8 resident blocks (32 warps) an SM in 16-bit and
// 6 (80 registers) in float32, whose 3x3 build holds 36 loaded values and
// 18 B values a tile. On an H100 (N=32): uncapped, with its loads behind
// branches, float32 ran RegNet's 112x112 layer in 96 us, at 8 blocks (64
// registers, a few spilled) in 68; predicated loads at 8 blocks spilled more
// and ran stride-2 layers 5-13% slower; predicated loads at 6 blocks against
// branches at 8: ResNeXt's 128 channels at 56x56 86.0 -> 77.5 us, 256 at
// 56x56 stride 2 71.2 -> 63.7, RegNet's 440 at 7x7 12.6 -> 11.0.
template <typename T, int KH, int KW, int kPairs>
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm<T>)
    grouped_mma_forward_kernel(const T* __restrict__ in, const T* __restrict__ wt, const T* __restrict__ bias,
                               const T* __restrict__ residual, Activation act, T* __restrict__ out, Geometry g) {
  constexpr bool k16 = !std::is_same_v<T, float>;
  constexpr int kTaps = KH > 0 ? KH * KW : kMaxTaps;  // taps the registers hold
  constexpr int kSteps = k16 ? (kTaps + 1) / 2 : kTaps;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, quad = lane & 3, row = lane >> 2;
  const int slice = blockIdx.y * kWarps + warp;
  if (slice >= g.slices) return;
  const int out_channel = slice * kGroupWidth + 2 * quad;
  // The lane's 8 bytes of a pixel: 16-bit, channels 4 * (quad % 2) to + 3
  // of the step's first tap (quads 0 and 1) or its second (quads 2 and 3);
  // float32, channels 2 * quad and + 1.
  const int in_offset = k16 ? 4 * (quad & 1) : 2 * quad;
  const bool second_tap = k16 && quad >= 2;
  const int in_channel = slice * kGroupWidth + in_offset;

  // B: the slice's weight, (output channel `row`, tap, input channel), zero
  // where the input channel is in another group than the output channel
  // (groups of 4: a block-diagonal 8 x 8 per tap). The reduction index k of
  // a step is mapped onto (tap, channel) so that each lane's A values are
  // the 8 bytes it reads (see above), and B follows the same map: 16-bit,
  // k = 2 quad, + 1 are channels in_offset, + 1 and k = 2 quad + 8, + 9
  // channels in_offset + 2, + 3 of the lane's tap; float32, k = quad is
  // channel 2 quad and k = quad + 4 channel 2 quad + 1.
  uint32_t b[kSteps][2];
  int dy[kTaps], dx[kTaps], offset[kTaps];
  tap_offsets<KH, KW, kTaps>(g, dy, dx, offset);
  const T* w = wt + int64_t(slice * kGroupWidth + row) * g.taps * g.width;
  const bool take = in_offset / g.width == row / g.width;  // the lane's channels share a group
#pragma unroll
  for (int st = 0; st < kSteps; ++st) {
    if constexpr (k16) {
      const int t = second_tap ? tap_order<kPairs>(2 * st + 1) : tap_order<kPairs>(2 * st);
      const T* w0 = w + t * g.width + in_offset % g.width;
      b[st][0] = take && t < g.taps ? __ldg(reinterpret_cast<const uint32_t*>(w0)) : 0u;
      b[st][1] = take && t < g.taps ? __ldg(reinterpret_cast<const uint32_t*>(w0 + 2)) : 0u;
    } else {
      const T* w0 = w + st * g.width + in_offset % g.width;
      b[st][0] = take && st < g.taps ? to_tf32(__float_as_uint(__ldg(w0))) : 0u;
      b[st][1] = take && st < g.taps ? to_tf32(__float_as_uint(__ldg(w0 + 1))) : 0u;
    }
  }
  const float bias0 = bias != nullptr ? static_cast<float>(bias[out_channel]) : 0.f;
  const float bias1 = bias != nullptr ? static_cast<float>(bias[out_channel + 1]) : 0.f;
  const int k = g.slices * kGroupWidth;

  for (int tile = blockIdx.x; tile < g.tiles; tile += gridDim.x) {
    const int m0 = tile * kTileRows + row, m1 = m0 + 8;
    const Row<KH, KW> r0 = row_at<KH, KW>(g, m0, in_channel), r1 = row_at<KH, KW>(g, m1, in_channel);
    // Every step's A values are loaded before the first product, so that
    // the loads are in flight together rather than one step's at a time.
    uint32_t a[kSteps][4];
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      const int t = k16 ? tap_order<kPairs>(2 * st) : st, t_next = tap_order<kPairs>(2 * st + 1);
      const uint2 v0 = tap_bits(in, r0, g, t, t_next, second_tap, offset, dy, dx);
      const uint2 v1 = tap_bits(in, r1, g, t, t_next, second_tap, offset, dy, dx);
      if constexpr (k16) {
        a[st][0] = v0.x, a[st][1] = v1.x, a[st][2] = v0.y, a[st][3] = v1.y;
      } else {
        a[st][0] = to_tf32(v0.x), a[st][1] = to_tf32(v1.x), a[st][2] = to_tf32(v0.y),
        a[st][3] = to_tf32(v1.y);
      }
    }
    float d[4] = {bias0, bias1, bias0, bias1};
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      if ((k16 ? 2 * st : st) < g.taps) mma_16x8<T>(d, a[st], b[st]);
    }
    const int64_t o0 = int64_t(m0) * k + out_channel, o1 = int64_t(m1) * k + out_channel;
    if (m0 < g.positions) store_epilogue(out + o0, residual != nullptr ? residual + o0 : nullptr, act, d[0], d[1]);
    if (m1 < g.positions) store_epilogue(out + o1, residual != nullptr ? residual + o1 : nullptr, act, d[2], d[3]);
  }
}

// Forward, 16 channels a warp, 16-bit: groups of 16 (ResNeXt's 512-channel
// layers), or four groups of 4 or two of 8 (ResNeXt's 128 and 256 channels).
// Block (x, y): kWarps warps, warp w on the 16 channels y * kWarps + w: its 16
// output channels are two n = 8 tiles that share the A fragments, walking
// tiles of 16 output positions as the kernel above. A step is one tap x the
// 16 input channels (m16n8k16): lane l reads channels 4 * (l % 4) to + 3 of
// its two rows' pixels (8 bytes each), as k = 2 (l % 4), + 1, + 8, + 9; the B
// fragments of both tiles (every tap's, in registers) follow the same map,
// zero where input and output channel lie in different groups (groups of 4
// and 8: block-diagonal). Lane l holds rows l / 4 and l / 4 + 8 and output
// channels 2 * (l % 4), + 1 of each tile. Registers are capped for kBlocks
// resident blocks an SM: 4 (122 registers in the 3x3 build), or 5 (96, 16 bytes spilled) for
// stride-1 3x3 layers of groups of 4 and 8, where that measured faster (H100,
// float16, us, 4 / 5 blocks: 128 channels at 56x56 54.1 / 50.2, 256 at 28x28
// 31.4 / 29.5) and slower elsewhere (256 at 56x56 stride 2 37.7 / 41.2, 512
// at 14x14 groups of 16 19.2 / 24.6). On an H100 (N=32, float16) it took ResNeXt's
// 512-channel layer at 28x28 stride 2 from 29.0 us (the merged route) to
// 22.9, the one at 14x14 from 24.3 (a tiled kernel reading the input through
// shared memory) to 19.8; against 8 channels a warp (the kernel above), the
// 128-channel layer at 56x56 (groups of 4) 59.9 -> 54.0, the 256-channel
// ones (groups of 8) 33.7 -> 30.6 at 28x28 and 38.8 -> 37.7 at 56x56 stride
// 2: a tile's positions and bounds are worked out once for 16 channels.
template <typename T, int KH, int KW, int kBlocks>
__global__ void __launch_bounds__(kWarps * 32, kBlocks)
    grouped_mma16_forward_kernel(const T* __restrict__ in, const T* __restrict__ wt, const T* __restrict__ bias,
                                 const T* __restrict__ residual, Activation act, T* __restrict__ out, Geometry g) {
  constexpr int kWidth = 16;
  constexpr int kTaps = KH > 0 ? KH * KW : kMaxTaps;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, quad = lane & 3, row = lane >> 2;
  const int group = blockIdx.y * kWarps + warp;
  if (group >= g.slices) return;
  const int in_channel = group * kWidth + 4 * quad;
  uint32_t b[kTaps][2][2];
  int dy[kTaps], dx[kTaps], offset[kTaps];
  tap_offsets<KH, KW, kTaps>(g, dy, dx, offset);
#pragma unroll
  for (int t = 0; t < kTaps; ++t) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int o = 8 * n + row;  // the output channel among the warp's 16
      const bool take = t < g.taps && 4 * quad / g.width == o / g.width;
      const T* w0 = wt + (int64_t(group * kWidth + o) * g.taps + t) * g.width + 4 * quad % g.width;
      b[t][n][0] = take ? __ldg(reinterpret_cast<const uint32_t*>(w0)) : 0u;
      b[t][n][1] = take ? __ldg(reinterpret_cast<const uint32_t*>(w0 + 2)) : 0u;
    }
  }
  float bias_of[2][2];
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      bias_of[n][c] = bias != nullptr ? static_cast<float>(bias[group * kWidth + 8 * n + 2 * quad + c]) : 0.f;
    }
  }
  const int k = g.slices * kWidth;

  for (int tile = blockIdx.x; tile < g.tiles; tile += gridDim.x) {
    const int m0 = tile * kTileRows + row, m1 = m0 + 8;
    const Row<KH, KW> r0 = row_at<KH, KW>(g, m0, in_channel), r1 = row_at<KH, KW>(g, m1, in_channel);
    uint32_t a[kTaps][4];
#pragma unroll
    for (int t = 0; t < kTaps; ++t) {
      const uint2 v0 = tap_bits(in, r0, g, t, t, false, offset, dy, dx);
      const uint2 v1 = tap_bits(in, r1, g, t, t, false, offset, dy, dx);
      a[t][0] = v0.x, a[t][1] = v1.x, a[t][2] = v0.y, a[t][3] = v1.y;
    }
    float d[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      d[n][0] = d[n][2] = bias_of[n][0];
      d[n][1] = d[n][3] = bias_of[n][1];
    }
#pragma unroll
    for (int t = 0; t < kTaps; ++t) {
      if (t < g.taps) {
        mma_16x8<T>(d[0], a[t], b[t][0]);
        mma_16x8<T>(d[1], a[t], b[t][1]);
      }
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int channel = group * kWidth + 8 * n + 2 * quad;
      const int64_t o0 = int64_t(m0) * k + channel, o1 = int64_t(m1) * k + channel;
      const T* res0 = residual != nullptr ? residual + o0 : nullptr;
      const T* res1 = residual != nullptr ? residual + o1 : nullptr;
      if (m0 < g.positions) store_epilogue(out + o0, res0, act, d[n][0], d[n][1]);
      if (m1 < g.positions) store_epilogue(out + o1, res1, act, d[n][2], d[n][3]);
    }
  }
}

bool takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  if (!input.is_cuda() || !s.in.batched || s.groups <= 1 || s.groups >= s.in.c) return false;
  const int64_t width = s.in.c / s.groups;
  const auto dtype = input.scalar_type();
  const bool wide = width == 16 && dtype != at::kFloat;  // groups of 16: 16-bit only
  if ((width != 8 && width != 4 && !wide) || s.k != s.in.c || s.in.c % kGroupWidth != 0) return false;
  if (dtype == at::kFloat) {
    if (!at::globalContext().allowTF32CuDNN(at::Float32Op::CONV)) return false;
  } else if (dtype != at::kHalf && dtype != at::kBFloat16) {
    return false;
  }
  const Window2d& w = s.win;
  if (w.kh * w.kw > kGroupedMmaMaxTaps || s.in.c / kGroupWidth > 65535 * int64_t{kWarps}) return false;
  constexpr int64_t kIntMax = (int64_t{1} << 31) - 1;
  for (int64_t v : {s.in.n * s.in.c * s.in.h * s.in.w, s.in.n * s.k * s.oh * s.ow, w.sh, w.sw, w.ph, w.pw,
                    w.dh * w.kh, w.dw * w.kw}) {
    if (v > kIntMax) return false;
  }
  // Element offsets (ints) reach from a window's top-left tap in the padding
  // to taps past the input's far edges: the padded extent, every stride and
  // window added, must stay an int too.
  const int64_t rows = s.in.h + 2 * w.ph + w.dh * w.kh + w.sh, cols = s.in.w + 2 * w.pw + w.dw * w.kw + w.sw;
  if (rows > kIntMax / cols || s.in.n * rows * cols > kIntMax / s.in.c) return false;
  return at::cuda::getDeviceProperties(input.get_device())->major >= 8;
}

}  // namespace

std::optional<at::Tensor> grouped_mma_conv2d(const at::Tensor& input, const at::Tensor& weight,
                                             const std::optional<at::Tensor>& bias,
                                             const Conv2dShape<int64_t>& s,
                                             const ConvEpilogue* epilogue,
                                             bool channels_last_result) {
  if (!takes(input, s)) return std::nullopt;
  // The residual is read where the output is written: channels_last, aligned like it.
  const bool has_residual = epilogue != nullptr && epilogue->has_residual();
  if (has_residual && (!epilogue->residual.is_contiguous(kChannelsLast) ||
                       reinterpret_cast<uintptr_t>(epilogue->residual.const_data_ptr()) % 8 != 0)) {
    return std::nullopt;
  }
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat format =
      channels_last_result ? kChannelsLast : conv2d_output_format(input, weight);
  // NCHW data through the transpose kernel (relayout_cuda.h): ATen's
  // element-wise copies took ResNeXt's 128-channel layer at 56x56 in float16
  // from 59 us of kernel to 238 us.
  at::Tensor x, w;
  std::tie(x, w) = to_channels_last_together(input, weight);
  // Each lane reads 8 bytes of a pixel at a time.
  if (reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 8 != 0) return std::nullopt;
  if (reinterpret_cast<uintptr_t>(w.const_data_ptr()) % 4 != 0) return std::nullopt;
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  at::Tensor out = empty_channels_last(input, s.in.n, s.k, s.oh, s.ow);
  if (out.numel() == 0) return to_memory_format(out, format);
  const Window2d& win = s.win;
  // 16 channels a warp (grouped_mma16_forward_kernel): groups of 16, and in
  // 16-bit groups of 4 and 8 where the 16-channel slices fill the blocks'
  // warps (ResNeXt's 128 and 256 channels; RegNet's 208 would leave a
  // quarter of the last block row idle: 11.2 -> 12.5 us at 14x14).
  const bool wide = s.in.c / s.groups == 16 || (x.scalar_type() != at::kFloat && s.in.c % (16 * kWarps) == 0);
  Geometry g{int(s.in.h), int(s.in.w), int(s.in.c), int(s.oh), int(s.ow), int(win.kw), int(win.kh * win.kw),
             int(win.sh), int(win.sw), int(win.ph), int(win.pw), int(win.dh), int(win.dw),
             int(s.in.n * s.oh * s.ow), 0, int(s.in.c / (wide ? 16 : kGroupWidth)), int(s.in.c / s.groups),
             int(win.dh * s.in.w * s.in.c), int(win.dw * s.in.c),
             at::cuda::detail::IntDivider<unsigned>(unsigned(s.oh * s.ow)),
             at::cuda::detail::IntDivider<unsigned>(unsigned(s.ow))};
  g.tiles = (g.positions + kTileRows - 1) / kTileRows;
  // The resident blocks an SM in all, each warp walking several tiles.
  const int sms = at::cuda::getDeviceProperties(input.get_device())->multiProcessorCount;
  const int64_t rows = (g.slices + kWarps - 1) / kWarps;
  const bool three = win.kh == 3 && win.kw == 3;  // the window fixed at compile time (below)
  const bool more_blocks = wide && s.in.c / s.groups < 16 && three && win.sh == 1 && win.sw == 1;
  const int blocks = more_blocks            ? kMoreWideBlocksPerSm
                     : wide                 ? kWideBlocksPerSm
                     : x.scalar_type() == at::kFloat ? kBlocksPerSm<float>
                                                     : kBlocksPerSm<at::Half>;
  const int64_t per_row = (int64_t(sms) * blocks + rows - 1) / rows;
  const dim3 grid(unsigned(std::max<int64_t>(1, std::min<int64_t>(per_row, g.tiles))), unsigned(rows));
  const auto stream = at::cuda::getCurrentCUDAStream();
  // 3x3 windows (every RegNet layer) with the window fixed at compile time:
  // a tap's position and bounds are then constants and two predicates, and
  // in 16-bit at stride 2 the taps paired to share pixels (tap_order).
  const bool pairs = win.sw == 2 && win.dw == 1;
  const auto launch = [&](auto tag) {
    using T = decltype(tag);
    auto kernel = three ? &grouped_mma_forward_kernel<T, 3, 3, 0> : &grouped_mma_forward_kernel<T, 0, 0, 0>;
    if constexpr (!std::is_same_v<T, float>) {
      if (three && pairs) kernel = &grouped_mma_forward_kernel<T, 3, 3, 2>;
      if (wide) {
        kernel = three ? &grouped_mma16_forward_kernel<T, 3, 3, kWideBlocksPerSm>
                       : &grouped_mma16_forward_kernel<T, 0, 0, kWideBlocksPerSm>;
      }
      if (more_blocks) kernel = &grouped_mma16_forward_kernel<T, 3, 3, kMoreWideBlocksPerSm>;
    }
    kernel<<<grid, kWarps * 32, 0, stream>>>(
        x.const_data_ptr<T>(), w.const_data_ptr<T>(), has_bias ? b.const_data_ptr<T>() : nullptr,
        has_residual ? epilogue->residual.const_data_ptr<T>() : nullptr,
        epilogue != nullptr ? epilogue->activation : Activation::kIdentity, out.mutable_data_ptr<T>(), g);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  switch (x.scalar_type()) {
    case at::kHalf: launch(at::Half{}); break;
    case at::kBFloat16: launch(at::BFloat16{}); break;
    default: launch(float{}); break;
  }
  return to_memory_format(out, format);
}

}  // namespace customconv
