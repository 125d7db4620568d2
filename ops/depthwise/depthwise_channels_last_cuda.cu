// depthwise_conv2d's forward on channels_last tensors on CUDA, and the input
// gradient at stride 1 through the same kernel: the input read and the output
// written in place, with no layout change (the NCHW kernels need one each
// way, two passes over memory that cost more than the convolution on
// ConvNeXt's and MobileNet's layers).
//
// The calls taken: depthwise_channels_last_cuda.h. Others return false and
// keep the NCHW kernels.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "ops/common/kernel_fit.h"
#include "ops/depthwise/depthwise.h"
#include "ops/depthwise/depthwise_channels_last_cuda.h"

namespace customconv {
namespace {

// A block computes kRows x kCols<Strips> output positions of one image for
// kChannels channels. Its threads: kPairs channel pairs x (kRows x Strips)
// runs; thread (pair, run) computes channels c0 + 2*pair and c0 + 2*pair + 1
// at kRun consecutive positions of one output row. Neighbouring threads take
// neighbouring channel pairs (coalesced stores: a position's channels are
// contiguous), and a warp's two runs mostly lie in neighbouring rows. Runs and
// rows of 7 fit the planes of the models these layers come from (112, 56, 28,
// 14 and 7 wide) without idle threads; Strips (1, 2 or 4 runs a row; 4 at
// stride 1 only, where the input tile is a quarter of stride 2's) is chosen
// per plane width (strips_for).
constexpr int kChannels = 32;
constexpr int kPairs = kChannels / 2;
constexpr int kRows = 7;
constexpr int kRun = 7;
template <int Strips>
constexpr int kCols = Strips * kRun;
template <int Strips>
constexpr int kThreads = kPairs * kRows * Strips;  // 448, 224 or 112

template <typename T>
struct alignas(2 * sizeof(T)) Two {
  T a, b;
};

struct Geometry {
  int c, h, w, oh, ow, pad_h, pad_w, col_tiles;
  int flip;  // 1: the window turned by 180 degrees (the stride-1 input gradient)
};

// The staged input tile: the rows and columns the block's outputs read, each
// position's kChannels channels contiguous, rows `pitch` elements apart.
// 16-bit rows are padded to an odd multiple of 16 words, so that the warp's
// two runs (neighbouring rows) read different shared-memory banks.
template <typename T, int K, int S, int Strips>
struct Tile {
  static constexpr int kInRows = (kRows - 1) * S + K;
  static constexpr int kInCols = (kCols<Strips> - 1) * S + K;
  static constexpr int kPitch =
      kInCols * kChannels + (sizeof(T) == 2 && kInCols % 2 == 0 ? kChannels : 0);
  static constexpr size_t kWeightBytes = size_t(K) * K * kChannels * sizeof(float);
  static constexpr size_t kShared = kWeightBytes + size_t(kInRows) * kPitch * sizeof(T);
  // The input tile in 16-byte vectors, and each thread's share of them.
  static constexpr int kVec = 16 / int(sizeof(T));
  static constexpr int kVecsPerPosition = kChannels / kVec;
  static constexpr int kVecs = kInRows * kInCols * kVecsPerPosition;
  static constexpr int kFillSteps = (kVecs + kThreads<Strips> - 1) / kThreads<Strips>;
};

// Stages the block's taps (float, [tap][channel]) and input tile (zeros
// outside the image and past the last channel) in shared memory, each
// thread's 16-byte loads issued 8 at a time before their stores; then each thread
// sums the K x K taps of its 2 x kRun outputs in float, one window row at a
// time: the row's (kRun - 1) * S + K input pairs are read once from shared
// memory and used by every output of the run. Stores act(sum + bias),
// rounded once.
template <typename T, int K, int S, int Strips>
__global__ void __launch_bounds__(kThreads<Strips>)
    depthwise_channels_last_kernel(const T* __restrict__ in, const T* __restrict__ wt,
                                   const T* __restrict__ bias, T* __restrict__ out, Geometry g,
                                   Activation act) {
  using TileT = Tile<T, K, S, Strips>;
  constexpr int kBlock = kThreads<Strips>;
  extern __shared__ __align__(16) unsigned char shared[];
  float* taps = reinterpret_cast<float*>(shared);
  T* tile = reinterpret_cast<T*>(shared + TileT::kWeightBytes);

  const int c0 = blockIdx.y * kChannels;
  const int oy0 = (blockIdx.x / g.col_tiles) * kRows;
  const int ox0 = (blockIdx.x % g.col_tiles) * kCols<Strips>;
  const int64_t n = blockIdx.z;
  for (int i = threadIdx.x; i < K * K * kChannels; i += kBlock) {
    const int tap = i / kChannels, c = c0 + i % kChannels;
    taps[i] = c < g.c ? float(wt[int64_t(c) * K * K + (g.flip ? K * K - 1 - tap : tap)]) : 0.f;
  }
  const T* image = in + n * g.h * g.w * g.c;
  const int iy0 = oy0 * S - g.pad_h, ix0 = ox0 * S - g.pad_w;
  // At most kBatch 16-byte loads in flight a thread (registers), then their stores.
  constexpr int kBatch = 8;
#pragma unroll
  for (int first = 0; first < TileT::kFillSteps; first += kBatch) {
    uint4 staged[kBatch];
    int offset[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = threadIdx.x + (first + b) * kBlock;
      const bool inside = first + b < TileT::kFillSteps && i < TileT::kVecs;
      const int q = i % TileT::kVecsPerPosition, pos = i / TileT::kVecsPerPosition;
      const int r = pos / TileT::kInCols, col = pos % TileT::kInCols;
      const int y = iy0 + r, x = ix0 + col, c = c0 + q * TileT::kVec;
      staged[b] = make_uint4(0, 0, 0, 0);
      offset[b] = inside ? r * TileT::kPitch + col * kChannels + q * TileT::kVec : -1;
      if (inside && y >= 0 && y < g.h && x >= 0 && x < g.w && c < g.c) {
        staged[b] = __ldg(reinterpret_cast<const uint4*>(image + (int64_t(y) * g.w + x) * g.c + c));
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (offset[b] >= 0) *reinterpret_cast<uint4*>(tile + offset[b]) = staged[b];
    }
  }
  __syncthreads();

  const int pair = threadIdx.x % kPairs, run = threadIdx.x / kPairs;
  const int row = run % kRows, strip = run / kRows;
  const int c = c0 + 2 * pair;
  float acc0[kRun], acc1[kRun];
  const float b0 = bias != nullptr && c < g.c ? float(bias[c]) : 0.f;
  const float b1 = bias != nullptr && c < g.c ? float(bias[c + 1]) : 0.f;
#pragma unroll
  for (int j = 0; j < kRun; ++j) acc0[j] = b0, acc1[j] = b1;
  constexpr int kSpan = (kRun - 1) * S + K;
#pragma unroll
  for (int r = 0; r < K; ++r) {
    const T* src = tile + (row * S + r) * TileT::kPitch + strip * kRun * S * kChannels + 2 * pair;
    float x0[kSpan], x1[kSpan];
#pragma unroll
    for (int q = 0; q < kSpan; ++q) {
      const Two<T> v = *reinterpret_cast<const Two<T>*>(src + q * kChannels);
      x0[q] = float(v.a), x1[q] = float(v.b);
    }
#pragma unroll
    for (int t = 0; t < K; ++t) {
      const float2 w = *reinterpret_cast<const float2*>(taps + (r * K + t) * kChannels + 2 * pair);
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
        acc0[j] += w.x * x0[j * S + t];
        acc1[j] += w.y * x1[j * S + t];
      }
    }
  }
  const int oy = oy0 + row;
  if (oy >= g.oh || c >= g.c) return;
  T* dst = out + ((n * g.oh + oy) * g.ow) * g.c + c;
#pragma unroll
  for (int j = 0; j < kRun; ++j) {
    const int ox = ox0 + strip * kRun + j;
    if (ox < g.ow) {
      float y0 = acc0[j], y1 = acc1[j];
      if (act != Activation::kIdentity) y0 = activate<float>(act, y0), y1 = activate<float>(act, y1);
      *reinterpret_cast<Two<T>*>(dst + int64_t(ox) * g.c) = Two<T>{T(y0), T(y1)};
    }
  }
}

template <typename T, int K, int S, int Strips>
bool launch(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
            const at::Tensor& output, Geometry g, Activation act) {
  const auto kernel = depthwise_channels_last_kernel<T, K, S, Strips>;
  constexpr size_t kShared = Tile<T, K, S, Strips>::kShared;
  static CachedKernelFit fit(reinterpret_cast<const void*>(kernel),
                             KernelNeeds{0, kThreads<Strips>, kShared});
  if (!fit.on(input.get_device())) return false;
  g.col_tiles = (g.ow + kCols<Strips> - 1) / kCols<Strips>;
  const int64_t row_tiles = (g.oh + kRows - 1) / kRows;
  const int64_t spatial = row_tiles * g.col_tiles;
  const int64_t channel_blocks = (g.c + kChannels - 1) / kChannels;
  if (spatial > std::numeric_limits<int>::max() || channel_blocks > 65535 || input.size(0) > 65535) {
    return false;
  }
  const dim3 grid(unsigned(spatial), unsigned(channel_blocks), unsigned(input.size(0)));
  kernel<<<grid, kThreads<Strips>, kShared, at::cuda::getCurrentCUDAStream()>>>(
      input.const_data_ptr<T>(), weight.const_data_ptr<T>(),
      bias.defined() ? bias.const_data_ptr<T>() : nullptr, output.mutable_data_ptr<T>(), g, act);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

// Runs a row may hold: the fewest blocks' worth of input columns for the
// plane's width (a tile reads kCols + K - 1 columns, plus a few columns'
// worth of fixed cost), so that a 14-wide plane takes 2 runs and a 7-wide
// one 1 rather than 4 runs half or three quarters idle.
int strips_for(int ow, int k, int stride) {
  int best = 1;
  int64_t best_cost = std::numeric_limits<int64_t>::max();
  for (int strips : {4, 2, 1}) {
    if (stride != 1 && strips == 4) continue;
    const int cols = strips * kRun;
    const int64_t cost = int64_t((ow + cols - 1) / cols) * ((cols - 1) * stride + k + 4);
    if (cost < best_cost) best = strips, best_cost = cost;
  }
  return best;
}

template <typename T, int K>
bool launch_stride(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                   const at::Tensor& output, const Geometry& g, int stride, Activation act) {
  const int strips = strips_for(g.ow, K, stride);
  if (stride == 1) {
    switch (strips) {
      case 4: return launch<T, K, 1, 4>(input, weight, bias, output, g, act);
      case 2: return launch<T, K, 1, 2>(input, weight, bias, output, g, act);
      default: return launch<T, K, 1, 1>(input, weight, bias, output, g, act);
    }
  }
  return strips == 2 ? launch<T, K, 2, 2>(input, weight, bias, output, g, act)
                     : launch<T, K, 2, 1>(input, weight, bias, output, g, act);
}

template <typename T>
bool launch_window(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                   const at::Tensor& output, const Geometry& g, int k, int stride, Activation act) {
  switch (k) {
    case 3: return launch_stride<T, 3>(input, weight, bias, output, g, stride, act);
    case 5: return launch_stride<T, 5>(input, weight, bias, output, g, stride, act);
    default: return launch_stride<T, 7>(input, weight, bias, output, g, stride, act);
  }
}

// The window and `image`'s channels the kernel takes (the header's rule), and
// the sizes of `image` and `result` (the kernel's input and output, N, C, H, W).
bool takes_call(const at::Tensor& image, const at::Tensor& result, const Window2d& win) {
  if (!channels_last_cuda_takes(image, win)) return false;
  for (int64_t v : {result.size(2), result.size(3)}) {
    if (v > std::numeric_limits<int>::max() / 4) return false;
  }
  return true;
}

// Runs the kernel on `image` into `result` (identity activation and no bias unless given).
bool run(const at::Tensor& image, const at::Tensor& weight, const at::Tensor& bias,
         const at::Tensor& result, const Geometry& g, const Window2d& win, Activation act) {
  const c10::cuda::CUDAGuard guard(image.device());
  const at::Tensor w = weight.contiguous();
  const int k = int(win.kh), stride = int(win.sh);
  // float32 3x3 at stride 2: the kernel without a staged tile, where it takes the call.
  if (k == 3 && stride == 2 && g.flip == 0 &&
      depthwise_rows_channels_last_cuda(image, w, bias, result, g.pad_h, g.pad_w, act)) {
    return true;
  }
  switch (image.scalar_type()) {
    case at::kHalf: return launch_window<at::Half>(image, w, bias, result, g, k, stride, act);
    case at::kBFloat16:
      return launch_window<at::BFloat16>(image, w, bias, result, g, k, stride, act);
    default: return launch_window<float>(image, w, bias, result, g, k, stride, act);
  }
}

bool forward_channels_last_cuda(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                const at::Tensor& output, const Window2d& win, Activation act) {
  if (!takes_call(input, output, win)) return false;
  const Geometry g{int(input.size(1)), int(input.size(2)), int(input.size(3)), int(output.size(2)),
                   int(output.size(3)), int(win.ph), int(win.pw), 0, 0};
  return run(input, weight, bias, output, g, win, act);
}

// The input gradient. At stride 1 it is the forward of grad_output with the
// window turned by 180 degrees and padding k - 1 - p on each side (the full
// correlation); stride 2 has its own kernel (depthwise_channels_last_grad_cuda.cu).
bool grad_input_channels_last_cuda(const at::Tensor& grad_output, const at::Tensor& weight,
                                   const at::Tensor& grad_input, const Window2d& win) {
  if (!takes_call(grad_output, grad_input, win)) return false;
  if (win.sh != 1) {
    return depthwise_grad_input_stride2_channels_last_cuda(grad_output, weight, grad_input, win);
  }
  const Geometry g{int(grad_output.size(1)), int(grad_output.size(2)), int(grad_output.size(3)),
                   int(grad_input.size(2)), int(grad_input.size(3)), int(win.kh - 1 - win.ph),
                   int(win.kw - 1 - win.pw), 0, 1};
  return run(grad_output, weight, at::Tensor(), grad_input, g, win, Activation::kIdentity);
}

}  // namespace

bool channels_last_cuda_takes(const at::Tensor& t, const Window2d& win) {
  const auto dtype = t.scalar_type();
  if (dtype != at::kHalf && dtype != at::kBFloat16 && dtype != at::kFloat) return false;
  const int64_t k = win.kh;
  if (win.kw != k || (k != 3 && k != 5 && k != 7) || win.sh != win.sw ||
      (win.sh != 1 && win.sh != 2) || win.dh != 1 || win.dw != 1 || win.ph >= k || win.pw >= k) {
    return false;
  }
  const int64_t c = t.size(1);
  if (c % (16 / t.element_size()) != 0 ||
      reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 != 0) {
    return false;
  }
  for (int64_t v : {c, t.size(2), t.size(3)}) {
    if (v > std::numeric_limits<int>::max() / 4) return false;
  }
  return true;
}

DepthwiseChannelsLastKernels cuda_depthwise_channels_last_kernels() {
  DepthwiseChannelsLastKernels kernels;
  kernels.forward = &forward_channels_last_cuda;
  kernels.grad_input = &grad_input_channels_last_cuda;
  kernels.grad_weight = &depthwise_grad_weight_channels_last_cuda;
  return kernels;
}

}  // namespace customconv
