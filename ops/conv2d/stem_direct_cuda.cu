#include "ops/conv2d/stem_direct.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <cstring>
#include <limits>

namespace customconv {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxChannels = 4;   // input channels
constexpr int kTaps = 9;          // 3x3
constexpr int kMaxOutputs = 64;   // output channels
constexpr int kGroupStep = 8;     // output channels a thread: a multiple of it, up to 32

// One call's geometry: input (n, c, h, w) read through its strides (elements),
// output (n, k, p, q); the window's stride, padding and dilation; the
// weight's strides (k, c, row, column) and the bias's, read in place too.
struct Geometry {
  int n, c, h, w, k, p, q;
  int sh, sw, ph, pw, dh, dw;
  int64_t xs_n;
  int xs_c, xs_h, xs_w;
  int ws_k, ws_c, ws_r, ws_s, bs;
};

// Eight results from v, converted to a 16-bit type and stored as one 16-byte
// word at dst (16-byte aligned).
template <typename T>
__device__ __forceinline__ void store_eight(T* dst, const float* v) {
  T packed[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) packed[j] = T(v[j]);
  uint4 bits;
  memcpy(&bits, packed, sizeof(bits));
  *reinterpret_cast<uint4*>(dst) = bits;
}

// Thread t computes output channels G*g .. G*g + G - 1 of one output
// position: each input value it loads serves G multiply-adds, its weights
// read from shared memory as float4s that the warp's threads share (G = 32:
// 8 shared-memory loads for 32 multiply-adds a tap; with 8 channels a thread
// the loads and index arithmetic took most of the issue slots). With a
// channels_last result t = (position, g), g fastest, so that a block's
// results are one contiguous run; with an NCHW result t = ((n, g), position in the
// plane), the position fastest, so that each channel's store is coalesced
// across the warp. The terms are added in the order (channel, tap row, tap
// column), in float32, starting from the bias; taps outside the image load a
// clamped position and count as zero (an unconditional load: conditional
// 16-bit loads compile to branches).
template <typename T, int G, bool ChannelsLastOut>
__global__ void __launch_bounds__(kThreads)
    stem_forward_kernel(const T* __restrict__ x, const T* __restrict__ wt,
                        const T* __restrict__ bias, T* __restrict__ y, Geometry g, int total,
                        Activation act) {
  // The weight as [channel][tap][output channel], and the bias.
  __shared__ __align__(16) float taps[kMaxChannels * kTaps * kMaxOutputs];
  __shared__ float bias_s[kMaxOutputs];
  for (int i = threadIdx.x; i < g.c * kTaps * g.k; i += kThreads) {
    const int k = i % g.k, ct = i / g.k, c = ct / kTaps, tap = ct % kTaps;
    taps[i] = float(wt[k * g.ws_k + c * g.ws_c + (tap / 3) * g.ws_r + (tap % 3) * g.ws_s]);
  }
  for (int i = threadIdx.x; i < g.k; i += kThreads) {
    bias_s[i] = bias != nullptr ? float(bias[i * g.bs]) : 0.f;
  }
  __syncthreads();
  const int t = blockIdx.x * kThreads + threadIdx.x;
  const int groups = g.k / G, plane = g.p * g.q;
  float acc[G];
  if (t < total) {
    int grp, n, pos;
    if constexpr (ChannelsLastOut) {
      grp = t % groups;
      const int rest = t / groups;
      pos = rest % plane, n = rest / plane;
    } else {
      pos = t % plane;
      const int rest = t / plane;
      grp = rest % groups, n = rest / groups;
    }
    const int oy = pos / g.q, ox = pos % g.q;
    const int k0 = grp * G;
#pragma unroll
    for (int j = 0; j < G; ++j) acc[j] = bias_s[k0 + j];
    const T* image = x + n * g.xs_n;
    const int iy0 = oy * g.sh - g.ph, ix0 = ox * g.sw - g.pw;
    for (int c = 0; c < g.c; ++c) {
      const T* channel = image + c * g.xs_c;
#pragma unroll
      for (int tap = 0; tap < kTaps; ++tap) {
        const int iy = iy0 + (tap / 3) * g.dh, ix = ix0 + (tap % 3) * g.dw;
        const bool inside = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
        const int cy = min(max(iy, 0), g.h - 1), cx = min(max(ix, 0), g.w - 1);
        const float raw = float(channel[cy * g.xs_h + cx * g.xs_w]);
        const float v = inside ? raw : 0.f;
        const float4* wv = reinterpret_cast<const float4*>(taps + (c * kTaps + tap) * g.k + k0);
#pragma unroll
        for (int q = 0; q < G / 4; ++q) {
          const float4 a = wv[q];
          acc[4 * q] += v * a.x, acc[4 * q + 1] += v * a.y;
          acc[4 * q + 2] += v * a.z, acc[4 * q + 3] += v * a.w;
        }
      }
    }
    if (act != Activation::kIdentity) {
#pragma unroll
      for (int j = 0; j < G; ++j) acc[j] = activate<float>(act, acc[j]);
    }
    if constexpr (!ChannelsLastOut) {
      T* dst = y + (int64_t(n) * g.k + k0) * plane + pos;
#pragma unroll
      for (int j = 0; j < G; ++j) dst[int64_t(j) * plane] = T(acc[j]);
    } else if constexpr (sizeof(T) == 2) {
      // Thread t's results are elements t*G .. t*G + G - 1 of the result (its
      // position's channels, positions in order): 16-byte stores.
#pragma unroll
      for (int q = 0; q < G / 8; ++q) store_eight(y + int64_t(t) * G + 8 * q, acc + 8 * q);
    }
  }
  if constexpr (ChannelsLastOut && sizeof(T) == 4) {
    // In float32 the block's results, one contiguous run, go through shared
    // memory (rows padded by one word against bank conflicts) so that a
    // warp's stores cover 32 consecutive elements, not 32 rows of G: 49 us
    // against 74 for MobileNet's stem at N=32 on an H100. (In 16-bit the
    // 16-byte stores above measured faster than this: 38 us against 44.)
    __shared__ float stage[kThreads * (G + 1)];
    if (t < total) {
#pragma unroll
      for (int j = 0; j < G; ++j) stage[threadIdx.x * (G + 1) + j] = acc[j];
    }
    __syncthreads();
    const int64_t first = int64_t(blockIdx.x) * kThreads * G;
    const int64_t end = int64_t(total) * G;
#pragma unroll 4
    for (int e = threadIdx.x; e < kThreads * G; e += kThreads) {
      if (first + e < end) y[first + e] = T(stage[(e / G) * (G + 1) + e % G]);
    }
  }
}

bool takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  const auto dtype = input.scalar_type();
  if (!input.is_cuda() || !s.in.batched || s.groups != 1 || s.in.c < 1 ||
      s.in.c > kMaxChannels || s.win.kh != 3 || s.win.kw != 3 || s.k % kGroupStep != 0 ||
      s.k > kMaxOutputs || (dtype != at::kHalf && dtype != at::kBFloat16 && dtype != at::kFloat)) {
    return false;
  }
  // 32-bit indices: the threads, an image's elements and the window's reach.
  constexpr int64_t kMax = std::numeric_limits<int>::max() / 4;
  const int64_t threads = s.in.n * s.oh * s.ow * (s.k / kGroupStep);
  const int64_t image = (s.in.c - 1) * input.stride(1) + (s.in.h - 1) * input.stride(2) +
                        (s.in.w - 1) * input.stride(3) + 1;
  for (int64_t v : {threads, image, s.oh * s.ow * s.k, s.oh * s.win.sh, s.ow * s.win.sw,
                    s.win.ph, s.win.pw, 2 * s.win.dh, 2 * s.win.dw}) {
    if (v > kMax) return false;
  }
  return true;
}

template <typename T, int G>
void launch_group(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                  const at::Tensor& out, const Geometry& g, bool channels_last, Activation act) {
  const int total = g.n * g.p * g.q * (g.k / G);
  const auto stream = at::cuda::getCurrentCUDAStream();
  const unsigned blocks = unsigned((int64_t(total) + kThreads - 1) / kThreads);
  const T* x = input.const_data_ptr<T>();
  const T* w = weight.const_data_ptr<T>();
  const T* b = bias.defined() ? bias.const_data_ptr<T>() : nullptr;
  T* y = out.mutable_data_ptr<T>();
  if (channels_last) {
    stem_forward_kernel<T, G, true><<<blocks, kThreads, 0, stream>>>(x, w, b, y, g, total, act);
  } else {
    stem_forward_kernel<T, G, false><<<blocks, kThreads, 0, stream>>>(x, w, b, y, g, total, act);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The most output channels a thread (32, 16 or 8) that divides the layer's.
template <typename T>
void launch(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
            const at::Tensor& out, const Geometry& g, bool channels_last, Activation act) {
  if (g.k % 32 == 0) {
    launch_group<T, 32>(input, weight, bias, out, g, channels_last, act);
  } else if (g.k % 16 == 0) {
    launch_group<T, 16>(input, weight, bias, out, g, channels_last, act);
  } else {
    launch_group<T, 8>(input, weight, bias, out, g, channels_last, act);
  }
}

}  // namespace

std::optional<at::Tensor> stem_direct_conv2d_cuda(const at::Tensor& input, const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  const Conv2dShape<int64_t>& s,
                                                  Activation activation) {
  if (!takes(input, s)) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const auto format = conv2d_output_format(input, weight);
  at::Tensor out = at::empty({s.in.n, s.k, s.oh, s.ow}, input.options().memory_format(format));
  if (out.numel() == 0) return out;
  // The weight and the bias are read through their strides (no copy of a
  // channels_last weight on every call), unless a stride of a view would not
  // fit the kernel's 32-bit index arithmetic.
  const auto fits = [](const at::Tensor& t) {
    for (int64_t st : t.strides()) {
      if (st > std::numeric_limits<int>::max() / 64) return false;
    }
    return true;
  };
  const at::Tensor w = fits(weight) ? weight : weight.contiguous();
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor b = !has_bias ? at::Tensor() : fits(*bias) ? *bias : bias->contiguous();
  const Window2d& win = s.win;
  const Geometry g{int(s.in.n), int(s.in.c), int(s.in.h), int(s.in.w), int(s.k),
                   int(s.oh), int(s.ow), int(win.sh), int(win.sw), int(win.ph), int(win.pw),
                   int(win.dh), int(win.dw), input.stride(0), int(input.stride(1)),
                   int(input.stride(2)), int(input.stride(3)), int(w.stride(0)),
                   int(w.stride(1)), int(w.stride(2)), int(w.stride(3)),
                   has_bias ? int(b.stride(0)) : 0};
  const bool channels_last = format == at::MemoryFormat::ChannelsLast;
  switch (input.scalar_type()) {
    case at::kHalf:
      launch<at::Half>(input, w, b, out, g, channels_last, activation);
      break;
    case at::kBFloat16:
      launch<at::BFloat16>(input, w, b, out, g, channels_last, activation);
      break;
    default: launch<float>(input, w, b, out, g, channels_last, activation);
  }
  return out;
}

}  // namespace customconv
