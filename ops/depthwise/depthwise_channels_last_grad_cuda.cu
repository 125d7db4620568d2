// depthwise_conv2d's gradients on channels_last tensors on CUDA, read and
// written in that layout (the NCHW kernels would need grad_output and the
// input changed to NCHW and the input gradient changed back: four passes over
// memory a layer, which cost MobileNetV2's channels_last training step more
// than its depthwise kernels). The input gradient at stride 1 runs the
// forward's kernel (depthwise_channels_last_cuda.cu); the calls taken:
// depthwise_channels_last_cuda.h.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "ops/common/pair_io.cuh"
#include "ops/depthwise/depthwise_channels_last_cuda.h"

namespace customconv {
namespace {

// Input (h, w) and output (oh, ow) planes, channels, padding.
struct Geometry {
  int c, h, w, oh, ow, pad_h, pad_w;
};

constexpr int kGatherThreads = 256;

// The input gradient at stride 2. Thread i computes channels 2p and 2p + 1
// (p = i mod C/2) of input position i div C/2 (positions run over images,
// rows, columns): neighbouring threads take neighbouring channel pairs of a
// position, so loads and stores are coalesced. A position gathers
// grad_output at the outputs whose windows cover it, the taps r, t with
// y + pad - r and x + pad - t even, in float; one rounding at the store.
// I: the index type, 32-bit where the items fit (its divisions cost a
// fraction of 64-bit ones, and a thread's work is a few loads).
template <typename T, int K, typename I>
__global__ void __launch_bounds__(kGatherThreads)
    grad_input_stride2_kernel(const T* __restrict__ go, const T* __restrict__ wt,
                              T* __restrict__ gi, Geometry g, I items) {
  const I i = I(blockIdx.x) * kGatherThreads + threadIdx.x;
  if (i >= items) return;
  const I pairs = I(g.c / 2);
  const int c = 2 * int(i % pairs);
  I pos = i / pairs;
  const int x = int(pos % I(g.w));
  pos /= I(g.w);
  const int y = int(pos % I(g.h));
  const int64_t n = int64_t(pos / I(g.h));
  const T* image = go + n * g.oh * int64_t(g.ow) * g.c + c;
  const T* w0 = wt + int64_t(c) * K * K;
  float a0 = 0.f, a1 = 0.f;
#pragma unroll
  for (int r = 0; r < K; ++r) {
    const int ty = y + g.pad_h - r;
    if (ty < 0 || (ty & 1) != 0 || (ty >> 1) >= g.oh) continue;
#pragma unroll
    for (int t = 0; t < K; ++t) {
      const int tx = x + g.pad_w - t;
      if (tx < 0 || (tx & 1) != 0 || (tx >> 1) >= g.ow) continue;
      const float2 v = load_pair(image + (int64_t(ty >> 1) * g.ow + (tx >> 1)) * g.c);
      a0 += v.x * float(w0[r * K + t]);
      a1 += v.y * float(w0[K * K + r * K + t]);
    }
  }
  store_pair(gi + 2 * int64_t(i), a0, a1);
}

// The weight gradient's partial sums. A block takes kGwPairs channel pairs
// (2 * kGwPairs channels) and one chunk of row segments: kSeg consecutive
// output positions of one output row (segments run over images, rows, and
// along the row). Thread (pair, lane) sums, for its two channels and each
// tap, grad_output times the input under the tap (and grad_output alone: the
// bias's gradient) over segments chunk + lane, + kGwLanes, ... in float. A
// segment's grad_output pairs stay in registers while the input rows under
// it are read once each, (kSeg - 1) * S + K pairs a row, and every tap of
// every position is taken from them (add_segment): half the loads a
// position-at-a-time loop makes at 3x3, a quarter at 7x7. The block's lanes
// are then added in a fixed order (a warp's two lanes by a shuffle, then the
// warps through shared memory) into part[chunk][tap][c], tap K*K being the
// bias. Loads are coalesced over channels.
constexpr int kGwPairs = 16;
constexpr int kGwLanes = 16;
constexpr int kGwThreads = kGwPairs * kGwLanes;  // 256
constexpr int kGwWarps = kGwThreads / 32;
constexpr int kSeg = 8;

// One segment's products added to acc (taps, then the bias's sums): its
// grad_output pairs loaded once, then each input row under it. Positions past
// the row's end and input outside the image count as zeros: every load is
// still made, at a clamped address, and zeroed after it (conditional 16-bit
// loads compile to branches that keep the loads from being issued together).
// One path for edges and interior: an unchecked second copy of the body for
// interior segments (tried with 7-wide segments) measured slower, 199 against
// 138 us for a 96-channel 3x3 layer at 112x112, N=32, in float32.
template <typename T, int K, int S>
__device__ __forceinline__ void add_segment(const T* dout, const T* image, const Geometry& g,
                                            int ox0, int iy0, int ix0, float (&acc)[K * K + 1][2]) {
  constexpr int kSpan = (kSeg - 1) * S + K;
  float d0[kSeg], d1[kSeg];
#pragma unroll
  for (int j = 0; j < kSeg; ++j) {
    const bool inside = ox0 + j < g.ow;
    const float2 d = load_pair(dout + int64_t(inside ? j : 0) * g.c);
    d0[j] = inside ? d.x : 0.f, d1[j] = inside ? d.y : 0.f;
    acc[K * K][0] += d0[j];
    acc[K * K][1] += d1[j];
  }
#pragma unroll
  for (int r = 0; r < K; ++r) {
    const int iy = iy0 + r;
    if (iy < 0 || iy >= g.h) continue;
    const T* src = image + int64_t(iy) * g.w * g.c;
    float v0[kSpan], v1[kSpan];
#pragma unroll
    for (int u = 0; u < kSpan; ++u) {
      const int ix = ix0 + u;
      const bool inside = ix >= 0 && ix < g.w;
      const float2 v = load_pair(src + int64_t(min(max(ix, 0), g.w - 1)) * g.c);
      v0[u] = inside ? v.x : 0.f, v1[u] = inside ? v.y : 0.f;
    }
#pragma unroll
    for (int t = 0; t < K; ++t) {
#pragma unroll
      for (int j = 0; j < kSeg; ++j) {
        acc[r * K + t][0] += d0[j] * v0[j * S + t];
        acc[r * K + t][1] += d1[j] * v1[j * S + t];
      }
    }
  }
}

template <typename T, int K, int S>
__global__ void __launch_bounds__(kGwThreads, K < 7 ? 2 : 1)
    grad_weight_partial_kernel(const T* __restrict__ go, const T* __restrict__ in,
                               float* __restrict__ part, Geometry g, int64_t segments,
                               int64_t chunk) {
  constexpr int kTaps = K * K + 1;
  // At most 26 taps' sums at a time in shared memory (26.6 KB): 7x7 windows
  // take two rounds.
  constexpr int kGroup = kTaps < 26 ? kTaps : 26;
  __shared__ float sums[kGwWarps][kGroup][2 * kGwPairs];
  const int pair = threadIdx.x % kGwPairs, lane = threadIdx.x / kGwPairs;
  const int c = blockIdx.y * 2 * kGwPairs + 2 * pair;
  float acc[kTaps][2];
#pragma unroll
  for (int i = 0; i < kTaps; ++i) acc[i][0] = acc[i][1] = 0.f;
  const int64_t begin = int64_t(blockIdx.x) * chunk;
  const int64_t end = std::min(begin + chunk, segments);
  const int row_segments = (g.ow + kSeg - 1) / kSeg;
  if (c < g.c && begin + lane < end) {
    // (n, oy, segment) of the first segment, then stepped by kGwLanes
    // segments without divisions (64-bit ones would cost more than a row).
    int64_t p = begin + lane;
    int sx = int(p % row_segments);
    const int64_t q = p / row_segments;
    int oy = int(q % g.oh);
    int64_t n = q / g.oh;
    for (; p < end; p += kGwLanes) {
      const int ox0 = sx * kSeg;
      const int iy0 = oy * S - g.pad_h, ix0 = ox0 * S - g.pad_w;
      const T* dout = go + ((n * g.oh + oy) * g.ow + ox0) * int64_t(g.c) + c;
      const T* image = in + n * g.h * int64_t(g.w) * g.c + c;
      add_segment<T, K, S>(dout, image, g, ox0, iy0, ix0, acc);
      sx += kGwLanes;
      while (sx >= row_segments) {
        sx -= row_segments;
        if (++oy == g.oh) oy = 0, ++n;
      }
    }
  }
  // Threads pair and pair + 16 of a warp hold the same channels (lanes 2w, 2w + 1).
#pragma unroll
  for (int i = 0; i < kTaps; ++i) {
    acc[i][0] += __shfl_down_sync(0xffffffffu, acc[i][0], 16);
    acc[i][1] += __shfl_down_sync(0xffffffffu, acc[i][1], 16);
  }
  // Then the warps, kGroup taps at a time through shared memory.
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int t0 = 0; t0 < kTaps; t0 += kGroup) {
    if (threadIdx.x % 32 < 16) {
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        if (t0 + i < kTaps) {
          sums[warp][i][2 * pair] = acc[t0 + i][0];
          sums[warp][i][2 * pair + 1] = acc[t0 + i][1];
        }
      }
    }
    __syncthreads();
    const int taps = kTaps - t0 < kGroup ? kTaps - t0 : kGroup;
    for (int i = threadIdx.x; i < taps * 2 * kGwPairs; i += kGwThreads) {
      const int tap = i / (2 * kGwPairs), cc = i % (2 * kGwPairs);
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kGwWarps; ++w) s += sums[w][tap][cc];
      const int ch = blockIdx.y * 2 * kGwPairs + cc;
      if (ch < g.c) part[(int64_t(blockIdx.x) * kTaps + t0 + tap) * g.c + ch] = s;
    }
    __syncthreads();
  }
}

// The chunks' partial sums added in chunk order: thread i = tap * C + c
// (coalesced reads of part) writes grad_weight[c][tap], or grad_bias[c] for
// tap K*K (when asked for), rounded once.
constexpr int kFinishThreads = 256;

template <typename T, int K>
__global__ void __launch_bounds__(kFinishThreads)
    grad_weight_finish_kernel(const float* __restrict__ part, T* __restrict__ gw,
                              T* __restrict__ gb, int c_count, int chunks) {
  constexpr int kTaps = K * K + 1;
  const int i = blockIdx.x * kFinishThreads + threadIdx.x;
  if (i >= kTaps * c_count) return;
  float s = 0.f;
  for (int k = 0; k < chunks; ++k) s += part[int64_t(k) * kTaps * c_count + i];
  const int tap = i / c_count, c = i % c_count;
  if (tap < K * K) {
    gw[int64_t(c) * K * K + tap] = T(s);
  } else if (gb != nullptr) {
    gb[c] = T(s);
  }
}

Geometry geometry(const at::Tensor& input, const at::Tensor& output, const Window2d& win) {
  return {int(input.size(1)), int(input.size(2)), int(input.size(3)), int(output.size(2)),
          int(output.size(3)), int(win.ph), int(win.pw)};
}

template <typename T, int K>
void launch_gather(const at::Tensor& go, const at::Tensor& weight, const at::Tensor& gi,
                   const Geometry& g) {
  const int64_t items = gi.numel() / 2;
  const unsigned blocks = unsigned((items + kGatherThreads - 1) / kGatherThreads);
  const auto stream = at::cuda::getCurrentCUDAStream();
  const T* go_p = go.const_data_ptr<T>();
  const T* w_p = weight.const_data_ptr<T>();
  T* gi_p = gi.mutable_data_ptr<T>();
  if (items + kGatherThreads <= int64_t(std::numeric_limits<uint32_t>::max())) {
    grad_input_stride2_kernel<T, K, uint32_t>
        <<<blocks, kGatherThreads, 0, stream>>>(go_p, w_p, gi_p, g, uint32_t(items));
  } else {
    grad_input_stride2_kernel<T, K, uint64_t>
        <<<blocks, kGatherThreads, 0, stream>>>(go_p, w_p, gi_p, g, uint64_t(items));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int K, int S>
void launch_weight(const at::Tensor& go, const at::Tensor& input, const at::Tensor& gw,
                   const at::Tensor& gb, const Geometry& g) {
  constexpr int kTaps = K * K + 1;
  const int64_t segments = go.size(0) * int64_t(g.oh) * ((g.ow + kSeg - 1) / kSeg);
  const int channel_blocks = (g.c + 2 * kGwPairs - 1) / (2 * kGwPairs);
  // About four blocks a multiprocessor, at least 4 segments a lane: the
  // chunks depend on the shape and the device alone (a fixed order).
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t by_device = (4 * int64_t(sms) + channel_blocks - 1) / channel_blocks;
  const int64_t by_length = (segments + 4 * kGwLanes - 1) / (4 * kGwLanes);
  const int64_t wanted = std::max<int64_t>(std::min(by_device, by_length), 1);
  const int64_t chunk = (segments + wanted - 1) / wanted;
  const int64_t chunks = (segments + chunk - 1) / chunk;
  const at::Tensor part = at::empty({chunks * kTaps * g.c}, go.options().dtype(at::kFloat));
  const auto stream = at::cuda::getCurrentCUDAStream();
  grad_weight_partial_kernel<T, K, S>
      <<<dim3(unsigned(chunks), unsigned(channel_blocks)), kGwThreads, 0, stream>>>(
          go.const_data_ptr<T>(), input.const_data_ptr<T>(), part.mutable_data_ptr<float>(), g,
          segments, chunk);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int items = kTaps * g.c;
  grad_weight_finish_kernel<T, K>
      <<<unsigned((items + kFinishThreads - 1) / kFinishThreads), kFinishThreads, 0, stream>>>(
          part.const_data_ptr<float>(), gw.mutable_data_ptr<T>(),
          gb.defined() ? gb.mutable_data_ptr<T>() : nullptr, g.c, int(chunks));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int K>
void launch_weight_stride(const at::Tensor& go, const at::Tensor& input, const at::Tensor& gw,
                          const at::Tensor& gb, const Geometry& g, int stride) {
  if (stride == 1) {
    launch_weight<T, K, 1>(go, input, gw, gb, g);
  } else {
    launch_weight<T, K, 2>(go, input, gw, gb, g);
  }
}

// Calls fn with a value of the element type of `dtype` (float16, bfloat16 or float32).
template <class Fn>
void with_dtype(at::ScalarType dtype, const Fn& fn) {
  switch (dtype) {
    case at::kHalf: fn(at::Half{}); break;
    case at::kBFloat16: fn(at::BFloat16{}); break;
    default: fn(float{});
  }
}

}  // namespace

bool depthwise_grad_input_stride2_channels_last_cuda(const at::Tensor& grad_output,
                                                     const at::Tensor& weight,
                                                     const at::Tensor& grad_input,
                                                     const Window2d& win) {
  if (win.sh != 2 || !channels_last_cuda_takes(grad_output, win) ||
      grad_input.numel() / 2 > int64_t(kGatherThreads) * std::numeric_limits<unsigned>::max()) {
    return false;
  }
  const c10::cuda::CUDAGuard guard(grad_output.device());
  const at::Tensor w = weight.contiguous();
  const Geometry g = geometry(grad_input, grad_output, win);
  const int k = int(win.kh);
  with_dtype(grad_output.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    switch (k) {
      case 3: launch_gather<T, 3>(grad_output, w, grad_input, g); break;
      case 5: launch_gather<T, 5>(grad_output, w, grad_input, g); break;
      default: launch_gather<T, 7>(grad_output, w, grad_input, g);
    }
  });
  return true;
}

bool depthwise_grad_weight_channels_last_cuda(const at::Tensor& grad_output,
                                              const at::Tensor& input,
                                              const at::Tensor& grad_weight,
                                              const at::Tensor& grad_bias, const Window2d& win) {
  if (!channels_last_cuda_takes(input, win) ||
      !channels_last_cuda_takes(grad_output, win) || !grad_weight.is_contiguous() ||
      input.size(1) > 65535 * 2 * kGwPairs) {
    return false;
  }
  const c10::cuda::CUDAGuard guard(input.device());
  const Geometry g = geometry(input, grad_output, win);
  const int k = int(win.kh), stride = int(win.sh);
  with_dtype(input.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const at::Tensor& gb = grad_bias;
    switch (k) {
      case 3: launch_weight_stride<T, 3>(grad_output, input, grad_weight, gb, g, stride); break;
      case 5: launch_weight_stride<T, 5>(grad_output, input, grad_weight, gb, g, stride); break;
      default: launch_weight_stride<T, 7>(grad_output, input, grad_weight, gb, g, stride);
    }
  });
  return true;
}

}  // namespace customconv
