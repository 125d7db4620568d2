// depthwise_conv2d's float32 3x3 stride-2 forward on channels_last tensors on
// CUDA, with no staged tile: each thread walks down a column of outputs and
// loads each input row under it once. The tiled kernel
// (depthwise_channels_last_cuda.cu) holds a block's input in shared memory;
// at stride 2 in float32 that tile caps it at 4 blocks a multiprocessor, and
// its loads and sums run in separate phases, so it read at 2.6-3.0 TB/s where
// cuDNN's kernel reads at 4 (bench/NOTES.md). Here every thread's loads for
// its next output row are in flight while it sums the current one.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "ops/common/launch.h"
#include "ops/depthwise/depthwise_channels_last_cuda.h"

namespace customconv {
namespace {

constexpr int kBlock = 256;
constexpr int kLanes = 4;  // channels a thread computes
constexpr int kTaps = 9;

struct RowsGeometry {
  int c, h, w, oh, ow, pad_h, pad_w;
  int quads;  // c / kLanes
};

__device__ __forceinline__ float4 load4(const float* p) {
  return __ldg(reinterpret_cast<const float4*>(p));
}

__device__ __forceinline__ void fma4(float4& acc, float4 v, float4 x) {
  acc.x += v.x * x.x;
  acc.y += v.y * x.y;
  acc.z += v.z * x.z;
  acc.w += v.w * x.w;
}

// Thread (x, y, z) = (position-and-channels index, row strip, image): the
// index's fastest part is the group of kLanes channels, then the output
// column, so a warp's loads and stores cover contiguous channels of
// neighbouring positions. The thread computes those kLanes channels at its
// column for Rows consecutive output rows. Output row i reads input rows
// 2i - p, 2i - p + 1 and 2i - p + 2 (3 columns each); the last of them is
// also the first of row i + 1, so each input row is loaded once: a row's sum
// starts from its first input row's taps (carried over from the row before),
// and the two input rows the next output row adds are loaded while the
// current one is summed. The kLanes channels' 9 taps are 36 consecutive
// floats of the weight, loaded as 9 vectors. Positions outside the image read
// as zero. Sums in float: act(sum + bias).
template <int Rows>
__global__ void __launch_bounds__(kBlock)
    depthwise_rows_kernel(const float* __restrict__ in, const float* __restrict__ wt,
                          const float* __restrict__ bias, float* __restrict__ out, RowsGeometry g,
                          Activation act) {
  constexpr int K = 3;
  const int idx = blockIdx.x * kBlock + threadIdx.x;
  if (idx >= g.ow * g.quads) return;
  const int quad = idx % g.quads, ox = idx / g.quads;
  const int c = quad * kLanes;
  // w[tap] = the tap of the kLanes channels; raw[j] holds floats 4j..4j+3 of
  // the channels' (channel, tap) block.
  float raw[kLanes * kTaps];
#pragma unroll
  for (int j = 0; j < kTaps; ++j) {
    const float4 v = load4(wt + c * kTaps + 4 * j);
    raw[4 * j] = v.x, raw[4 * j + 1] = v.y, raw[4 * j + 2] = v.z, raw[4 * j + 3] = v.w;
  }
  float4 w[kTaps];
#pragma unroll
  for (int tap = 0; tap < kTaps; ++tap) {
    w[tap] = make_float4(raw[tap], raw[kTaps + tap], raw[2 * kTaps + tap], raw[3 * kTaps + tap]);
  }
  const float4 b = bias != nullptr ? load4(bias + c) : make_float4(0.f, 0.f, 0.f, 0.f);
  const int64_t n = blockIdx.z;
  const float* image = in + n * g.h * g.w * g.c + c;
  float* result = out + n * g.oh * g.ow * g.c + c;
  const int ix0 = ox * 2 - g.pad_w;
  bool col_inside[K];
#pragma unroll
  for (int t = 0; t < K; ++t) col_inside[t] = ix0 + t >= 0 && ix0 + t < g.w;
  const auto load_row = [&](int y, float4(&row)[K]) {
    const bool row_inside = y >= 0 && y < g.h;
    const float* src = image + (int64_t(y) * g.w + ix0) * g.c;
#pragma unroll
    for (int t = 0; t < K; ++t) {
      row[t] = row_inside && col_inside[t] ? load4(src + t * g.c) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  const auto add_row = [&](float4& acc, int r, const float4(&row)[K]) {
#pragma unroll
    for (int t = 0; t < K; ++t) fma4(acc, w[r * K + t], row[t]);
  };

  const int oy0 = blockIdx.y * Rows;
  const int iy0 = oy0 * 2 - g.pad_h;
  float4 acc = b;
  {
    float4 first[K];
    load_row(iy0, first);
    add_row(acc, 0, first);
  }
  float4 mid[K], last[K];
  load_row(iy0 + 1, mid);
  load_row(iy0 + 2, last);
#pragma unroll
  for (int i = 0; i < Rows; ++i) {
    if (oy0 + i >= g.oh) break;
    float4 next_mid[K], next_last[K];
    const bool more = i + 1 < Rows;
    if (more) {
      load_row(iy0 + 2 * i + 3, next_mid);
      load_row(iy0 + 2 * i + 4, next_last);
    }
    add_row(acc, 1, mid);
    add_row(acc, 2, last);
    float4 y = acc;
    if (act != Activation::kIdentity) {
      y = make_float4(activate<float>(act, y.x), activate<float>(act, y.y),
                      activate<float>(act, y.z), activate<float>(act, y.w));
    }
    *reinterpret_cast<float4*>(result + (int64_t(oy0 + i) * g.ow + ox) * g.c) = y;
    if (more) {
      acc = b;
      add_row(acc, 0, last);
#pragma unroll
      for (int t = 0; t < K; ++t) mid[t] = next_mid[t], last[t] = next_last[t];
    }
  }
}

// Output rows a thread: 8, 4 or 2, the most that leaves the call at least
// about two waves of two blocks a multiprocessor (on small planes a thread's
// rows, run one after another, would otherwise be most of the time).
int rows_for(const RowsGeometry& g, int64_t images, int device) {
  const int64_t wanted =
      int64_t(4) * kBlock * at::cuda::getDeviceProperties(device)->multiProcessorCount;
  const int64_t row_threads = int64_t(g.ow) * g.quads * images;
  const int64_t strips = std::max<int64_t>(1, (wanted + row_threads - 1) / row_threads);
  const int64_t rows = (g.oh + strips - 1) / strips;
  return rows >= 8 ? 8 : rows >= 4 ? 4 : 2;
}

template <int Rows>
void launch(const float* in, const float* wt, const float* bias, float* out, const RowsGeometry& g,
            Activation act, int64_t images, int64_t threads) {
  const dim3 grid(unsigned((threads + kBlock - 1) / kBlock), unsigned((g.oh + Rows - 1) / Rows),
                  unsigned(images));
  depthwise_rows_kernel<Rows>
      <<<grid, kBlock, 0, at::cuda::getCurrentCUDAStream()>>>(in, wt, bias, out, g, act);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

bool depthwise_rows_channels_last_cuda(const at::Tensor& image, const at::Tensor& weight,
                                       const at::Tensor& bias, const at::Tensor& result, int pad_h,
                                       int pad_w, Activation act) {
  if (image.scalar_type() != at::kFloat || image.size(1) % kLanes != 0 || !aligned16(weight) ||
      (bias.defined() && !aligned16(bias))) {
    return false;
  }
  const RowsGeometry g{int(image.size(1)),
                       int(image.size(2)),
                       int(image.size(3)),
                       int(result.size(2)),
                       int(result.size(3)),
                       pad_h,
                       pad_w,
                       int(image.size(1)) / kLanes};
  const int rows = rows_for(g, image.size(0), image.get_device());
  const int64_t threads = int64_t(g.ow) * g.quads;
  if (threads > std::numeric_limits<int>::max() - kBlock || (g.oh + rows - 1) / rows > 65535 ||
      image.size(0) > 65535) {
    return false;
  }
  const float* in = image.const_data_ptr<float>();
  const float* wt = weight.const_data_ptr<float>();
  const float* b = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  float* out = result.mutable_data_ptr<float>();
  switch (rows) {
    case 8:
      launch<8>(in, wt, b, out, g, act, image.size(0), threads);
      break;
    case 4:
      launch<4>(in, wt, b, out, g, act, image.size(0), threads);
      break;
    default:
      launch<2>(in, wt, b, out, g, act, image.size(0), threads);
      break;
  }
  return true;
}

}  // namespace customconv
