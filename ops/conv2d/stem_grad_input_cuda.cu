#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "ops/conv2d/stem_direct.h"

namespace customconv {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxChannels = 4;  // input channels
// NCHW windows of more taps keep the column route, which measured faster
// there: ResNet-50's 7x7 stem at N=32 on an H100 took 0.89-0.92 ms here
// (one channel a lane: the L1's load instructions are the bound) against
// about 0.5-0.6 ms by columns (cuDNN 0.53-0.65), whose buffer is the
// workspace's (conv2d.h). 3x3 windows: 0.07-0.14 ms here, cuDNN 0.14-0.23.
constexpr int kMaxNchwTaps = 16;

// One call's geometry: grad_output (n, k, p, q) and grad_input (n, c, h, w),
// both NCHW or both channels_last, contiguous in that format; the window.
struct Geometry {
  int n, c, h, w, k, p, q;
  int r, s, sh, sw, ph, pw, dh, dw;
  int row_tiles, column_tiles;  // of the blocks (below)
};

// The weight (K, C, kh, kw), read through its strides, as one float4 per
// (tap, output channel): the C input channels' weights, padded with zeros.
// Thread i: entry i = tap * K + k.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    pack_weight_kernel(const T* __restrict__ wt, float4* __restrict__ packed, int k_count,
                       int channels, int kw, int entries, int64_t ws_k, int64_t ws_c, int64_t ws_r,
                       int64_t ws_s) {
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= entries) return;
  const int k = i % k_count, tap = i / k_count, r = tap / kw, s = tap % kw;
  const T* src = wt + k * ws_k + r * ws_r + s * ws_s;
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  for (int c = 0; c < channels; ++c) v[c] = float(src[c * ws_c]);
  packed[i] = make_float4(v[0], v[1], v[2], v[3]);
}

// Four elements of grad_output from src (aligned to their size), as floats.
template <typename T>
__device__ __forceinline__ void load_four(float (&dst)[4], const T* src) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint4, uint2>;
  const Bits bits = *reinterpret_cast<const Bits*>(src);
  const T* v = reinterpret_cast<const T*>(&bits);
#pragma unroll
  for (int e = 0; e < 4; ++e) dst[e] = float(v[e]);
}

// acc[c] += v * (weight of input channel c), c < C.
template <int C>
__device__ __forceinline__ void add_products(float* acc, float v, const float4& w) {
  acc[0] += v * w.x;
  if constexpr (C > 1) acc[1] += v * w.y;
  if constexpr (C > 2) acc[2] += v * w.z;
  if constexpr (C > 3) acc[3] += v * w.w;
}

// Sums each of a lane's N values over the lanes whose index differs in the
// bits Off, Off / 2, ..., 1 (the KL lanes of its positions), by halving: at
// bit Off the lane keeps one half of its values (the upper half where the
// bit is set), adds its partner's copy of that half, and holds N / 2 sums;
// `pixel` grows by the positions the kept half starts past. With N = G * C
// and G = KL, each lane ends with the C sums of position `pixel` (the sums
// taken in one fixed order: deterministic).
template <int N, int C, int Off>
__device__ __forceinline__ void reduce_scatter(float* v, int lane, int& pixel) {
  if constexpr (Off > 0) {
    constexpr int H = N / 2;
    const bool upper = (lane & Off) != 0;
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const float send = upper ? v[i] : v[i + H];
      const float keep = upper ? v[i + H] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, Off);
    }
    if (upper) pixel += H / C;
    reduce_scatter<H, C, Off / 2>(v, lane, pixel);
  }
}

// The input positions are taken in row phases: (n, y, px) holds the
// positions x = px + sw * j of row y, j = 0, 1, ..., and the taps that reach
// them (those whose offsets the stride divides) are the same for all of a
// row phase's positions. Warp w of a block takes row phase 8 * (row tile) +
// w of image n (4 rows x 2 phases at stride 2, 8 rows at stride 1: a 2-D
// patch, whose taps read one small region of grad_output, shared in L1) and
// 32 consecutive positions j of it from 32 * (column tile) on. Its lanes are
// KL output-channel lanes x PL position lanes (KL * PL = 32): lane (kl, pl)
// takes output channels kl, kl + KL, ... and the positions j = first + g *
// PL + pl, g < G = KL. Channels_last runs KL = 8 lanes (4 for layers of
// at most 16 output channels) of vectors of V = 4 channels: a warp's load of
// grad_output is 32 consecutive channels of 4 positions, and each lane loads
// its vector's V x C weights (V float4s, from L1) once for G positions. NCHW
// runs KL = 4 lanes of single channels: a warp's load is 8 consecutive
// positions of 4 planes. (One channel a lane in channels_last made the L1's
// load instructions the bound: 1.1 ms for ResNet-50's stem at N=32 on an
// H100; vectors of 8 16-bit channels needed 128 registers a thread.) The warp's lanes first find
// which of the window's rows and columns reach its row phase (one division each) and the warp walks
// those taps only. The products are added in float32; at the end the KL lanes of each position add
// their sums (reduce_scatter) and each lane stores one position's C gradients.
template <typename T, int C, bool ChannelsLast, int KL>
__global__ void __launch_bounds__(kThreads)
    stem_grad_input_kernel(const T* __restrict__ go, const float4* __restrict__ wp,
                           T* __restrict__ gi, Geometry g) {
  constexpr int PL = 32 / KL, G = KL;
  constexpr int V = ChannelsLast ? 4 : 1;  // channels a load
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kl = lane % KL, pl = lane / KL;
  int b = blockIdx.x;
  const int column_tile = b % g.column_tiles;
  b /= g.column_tiles;
  const int row_phase = (b % g.row_tiles) * kWarps + warp;
  const int64_t n = b / g.row_tiles;
  if (row_phase >= g.h * g.sw) return;
  const int y = row_phase / g.sw, px = row_phase % g.sw;
  const int j0 = column_tile * 32 + pl;  // this lane's first position j
  // Lane r (s) < kh (kw): whether window row r (column s) reaches the row
  // phase, and the output row (the output column of position j = 0) it reaches.
  const int ty = y + g.ph - min(lane, g.r - 1) * g.dh, tx = px + g.pw - min(lane, g.s - 1) * g.dw;
  const int oy_lane = ty >= 0 ? ty / g.sh : -1;
  const int ox_lane = tx >= 0 ? tx / g.sw : -((-tx + g.sw - 1) / g.sw);
  const unsigned rows =
      __ballot_sync(0xffffffffu, lane < g.r && ty >= 0 && oy_lane * g.sh == ty && oy_lane < g.p);
  const unsigned columns = __ballot_sync(0xffffffffu, lane < g.s && ox_lane * g.sw == tx);
  const int64_t plane = int64_t(g.p) * g.q;
  float acc[G * C];
#pragma unroll
  for (int i = 0; i < G * C; ++i) acc[i] = 0.f;
  for (unsigned rm = rows; rm != 0; rm &= rm - 1) {
    const int r = __ffs(rm) - 1;
    const int oy = __shfl_sync(0xffffffffu, oy_lane, r);
    const T* row =
        ChannelsLast ? go + ((n * g.p + oy) * g.q) * g.k : go + n * g.k * plane + int64_t(oy) * g.q;
    for (unsigned cm = columns; cm != 0; cm &= cm - 1) {
      const int s = __ffs(cm) - 1;
      const int ox0 = __shfl_sync(0xffffffffu, ox_lane, s) + j0;
      const float4* w4 = wp + (r * g.s + s) * g.k;
      if constexpr (ChannelsLast) {
        // Vectors of V channels: the lane's V weights, then V x G x C products.
        for (int k = kl * V; k < g.k; k += KL * V) {
          float4 wv[V];
#pragma unroll
          for (int e = 0; e < V; ++e) wv[e] = __ldg(w4 + k + e);
#pragma unroll
          for (int i = 0; i < G; ++i) {
            const int ox = ox0 + i * PL;
            float v[V];
            if (unsigned(ox) < unsigned(g.q)) {
              load_four(v, row + int64_t(ox) * g.k + k);
            } else {
#pragma unroll
              for (int e = 0; e < V; ++e) v[e] = 0.f;
            }
#pragma unroll
            for (int e = 0; e < V; ++e) add_products<C>(acc + i * C, v[e], wv[e]);
          }
        }
      } else {
        for (int k = kl; k < g.k; k += KL) {
          const float4 wv = __ldg(w4 + k);
#pragma unroll
          for (int i = 0; i < G; ++i) {
            const int ox = ox0 + i * PL;
            const float v = unsigned(ox) < unsigned(g.q) ? float(row[k * plane + ox]) : 0.f;
            add_products<C>(acc + i * C, v, wv);
          }
        }
      }
    }
  }
  int pixel = 0;
  reduce_scatter<G * C, C, KL / 2>(acc, lane, pixel);
  const int x = px + g.sw * (j0 + pixel * PL);
  if (x >= g.w) return;
  if constexpr (ChannelsLast) {
    T* dst = gi + ((n * g.h + y) * g.w + x) * C;
#pragma unroll
    for (int c = 0; c < C; ++c) dst[c] = T(acc[c]);
  } else {
    const int64_t in_plane = int64_t(g.h) * g.w;
    T* dst = gi + n * C * in_plane + int64_t(y) * g.w + x;
#pragma unroll
    for (int c = 0; c < C; ++c) dst[c * in_plane] = T(acc[c]);
  }
}

bool takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  const auto dtype = input.scalar_type();
  if (!input.is_cuda() || !s.in.batched || s.groups != 1 || s.in.c < 1 || s.in.c > kMaxChannels ||
      s.k < 1 || s.win.kh > 32 || s.win.kw > 32 ||
      (dtype != at::kHalf && dtype != at::kBFloat16 && dtype != at::kFloat)) {
    return false;
  }
  // 32-bit geometry: rows, columns, the window's reach, the packed weight's
  // entries and the blocks.
  constexpr int64_t kMax = std::numeric_limits<int>::max() / 4;
  for (int64_t v : {s.in.h * s.win.sw, s.in.w, s.oh, s.ow, s.win.ph, s.win.pw, s.win.dh * s.win.kh,
                    s.win.dw * s.win.kw, s.win.sh, s.win.sw, s.win.kh * s.win.kw * s.k}) {
    if (v > kMax) return false;
  }
  const int64_t blocks = s.in.n * ((s.in.h * s.win.sw + kWarps - 1) / kWarps) *
                         ((s.in.w + s.win.sw - 1) / s.win.sw + 31) / 32;
  return blocks < std::numeric_limits<int>::max();
}

template <typename T, int C, bool ChannelsLast, int KL>
void launch_kernel(const at::Tensor& go, const at::Tensor& packed, const at::Tensor& gi,
                   Geometry g) {
  constexpr int positions = 32;            // of a row phase per warp
  const int jw = (g.w + g.sw - 1) / g.sw;  // positions of a row phase
  g.row_tiles = (g.h * g.sw + kWarps - 1) / kWarps;
  g.column_tiles = (jw + positions - 1) / positions;
  const int64_t blocks = int64_t(g.n) * g.row_tiles * g.column_tiles;
  stem_grad_input_kernel<T, C, ChannelsLast, KL>
      <<<unsigned(blocks), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          go.const_data_ptr<T>(), reinterpret_cast<const float4*>(packed.const_data_ptr<float>()),
          gi.mutable_data_ptr<T>(), g);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, bool ChannelsLast, int KL>
void launch_channels(const at::Tensor& go, const at::Tensor& packed, const at::Tensor& gi,
                     const Geometry& g) {
  switch (g.c) {
    case 1:
      launch_kernel<T, 1, ChannelsLast, KL>(go, packed, gi, g);
      break;
    case 2:
      launch_kernel<T, 2, ChannelsLast, KL>(go, packed, gi, g);
      break;
    case 3:
      launch_kernel<T, 3, ChannelsLast, KL>(go, packed, gi, g);
      break;
    default:
      launch_kernel<T, 4, ChannelsLast, KL>(go, packed, gi, g);
  }
}

template <typename T>
void launch(const at::Tensor& go, const at::Tensor& weight, const at::Tensor& gi, const Geometry& g,
            bool channels_last) {
  const int entries = g.r * g.s * g.k;
  const at::Tensor packed = at::empty({int64_t(entries) * 4}, go.options().dtype(at::kFloat));
  const auto stream = at::cuda::getCurrentCUDAStream();
  pack_weight_kernel<T><<<unsigned((entries + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      weight.const_data_ptr<T>(), reinterpret_cast<float4*>(packed.mutable_data_ptr<float>()), g.k,
      g.c, g.s, entries, weight.stride(0), weight.stride(1), weight.stride(2), weight.stride(3));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // Channels_last: 8 lanes of 4 channels, or 4 where 16 channels or fewer
  // would leave lanes idle.
  if (!channels_last) {
    launch_channels<T, false, 4>(go, packed, gi, g);
  } else if (g.k > 16) {
    launch_channels<T, true, 8>(go, packed, gi, g);
  } else {
    launch_channels<T, true, 4>(go, packed, gi, g);
  }
}

}  // namespace

std::optional<at::Tensor> stem_direct_conv2d_grad_input_cuda(const at::Tensor& grad_output,
                                                             const at::Tensor& input,
                                                             const at::Tensor& weight,
                                                             const Conv2dShape<int64_t>& s) {
  if (grad_output.dim() != 4 || !takes(input, s)) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const auto format = conv2d_output_format(input, weight);
  const bool channels_last = format == at::MemoryFormat::ChannelsLast;
  if (!channels_last && s.win.kh * s.win.kw > kMaxNchwTaps) return std::nullopt;
  // grad_output in the gradient's format (a copy only where autograd hands
  // over another); in channels_last, whole vectors of 4 channels. The
  // weight is read through its strides into the packed copy.
  const at::Tensor go = grad_output.contiguous(format);
  if (channels_last &&
      (s.k % 4 != 0 ||
       reinterpret_cast<uintptr_t>(go.const_data_ptr()) % (4 * go.element_size()) != 0)) {
    return std::nullopt;
  }
  at::Tensor gi =
      at::empty({s.in.n, s.in.c, s.in.h, s.in.w}, input.options().memory_format(format));
  if (gi.numel() == 0) return gi;
  if (grad_output.numel() == 0) return gi.zero_();
  const Window2d& win = s.win;
  const Geometry g{int(s.in.n),
                   int(s.in.c),
                   int(s.in.h),
                   int(s.in.w),
                   int(s.k),
                   int(s.oh),
                   int(s.ow),
                   int(win.kh),
                   int(win.kw),
                   int(win.sh),
                   int(win.sw),
                   int(win.ph),
                   int(win.pw),
                   int(win.dh),
                   int(win.dw),
                   0,
                   0};
  switch (input.scalar_type()) {
    case at::kHalf:
      launch<at::Half>(go, weight, gi, g, channels_last);
      break;
    case at::kBFloat16:
      launch<at::BFloat16>(go, weight, gi, g, channels_last);
      break;
    default:
      launch<float>(go, weight, gi, g, channels_last);
  }
  return gi;
}

}  // namespace customconv
