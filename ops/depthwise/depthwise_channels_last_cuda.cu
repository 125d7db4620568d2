// depthwise_conv2d's three passes on channels_last data on CUDA (channel
// multiplier 1), without changing the layout: a position's channels are
// contiguous, so threads take vectors of up to 16 bytes of channels, and
// neighbouring threads neighbouring vectors (coalesced loads and stores). The
// taps are read transposed to (kh*kw, C), so that a tap's weights are a vector
// too. Arithmetic in float32 for 16-bit data (float64 for float64).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>

#include "ops/common/launch.h"
#include "ops/depthwise/depthwise.h"

namespace customconv {
namespace {

constexpr int kThreads = 256;
constexpr int kPixels = 4;  // neighbouring positions of a row per thread (forward, grad_input)

struct Dims {
  int64_t n, c, h, w, oh, ow;  // input (n, h, w, c), output (n, oh, ow, c)
};

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <typename A, typename T, int V>
__device__ __forceinline__ void load_vec(A (&dst)[V], const T* src) {
  const Vec<T, V> x = *reinterpret_cast<const Vec<T, V>*>(src);
#pragma unroll
  for (int e = 0; e < V; ++e) dst[e] = static_cast<A>(x.v[e]);
}

template <typename A, typename T, int V>
__device__ __forceinline__ void store_vec(T* dst, const A (&src)[V]) {
  Vec<T, V> x;
#pragma unroll
  for (int e = 0; e < V; ++e) x.v[e] = static_cast<T>(src[e]);
  *reinterpret_cast<Vec<T, V>*>(dst) = x;
}

// Forward. Thread (n, y, x0..x0+kPixels-1, c0..c0+V-1): V channels at kPixels
// neighbouring output positions of row y, summing the taps per channel.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ in, const T* __restrict__ taps, const T* __restrict__ bias,
                   T* __restrict__ out, Dims d, Window2d k, int64_t total) {
  using acc_t = at::opmath_type<T>;
  const int64_t cv = d.c / V, xb = (d.ow + kPixels - 1) / kPixels;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c0 = (idx % cv) * V;
    const int64_t x0 = (idx / cv % xb) * kPixels;
    const int64_t y = idx / (cv * xb) % d.oh, n = idx / (cv * xb * d.oh);
    acc_t acc[kPixels][V];
    acc_t b[V];
    if (bias != nullptr) {
      load_vec(b, bias + c0);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) b[e] = acc_t(0);
    }
#pragma unroll
    for (int t = 0; t < kPixels; ++t) {
#pragma unroll
      for (int e = 0; e < V; ++e) acc[t][e] = b[e];
    }
    const T* img = in + n * d.h * d.w * d.c + c0;
    for (int64_t i = 0; i < k.kh; ++i) {
      const int64_t iy = y * k.sh - k.ph + i * k.dh;
      if (iy < 0 || iy >= d.h) continue;
      const T* row = img + iy * d.w * d.c;
      for (int64_t j = 0; j < k.kw; ++j) {
        acc_t wv[V];
        load_vec(wv, taps + (i * k.kw + j) * d.c + c0);
#pragma unroll
        for (int t = 0; t < kPixels; ++t) {
          const int64_t ix = (x0 + t) * k.sw - k.pw + j * k.dw;
          if (x0 + t >= d.ow || ix < 0 || ix >= d.w) continue;
          acc_t xv[V];
          load_vec(xv, row + ix * d.c);
#pragma unroll
          for (int e = 0; e < V; ++e) acc[t][e] += wv[e] * xv[e];
        }
      }
    }
    T* dst = out + ((n * d.oh + y) * d.ow + x0) * d.c + c0;
#pragma unroll
    for (int t = 0; t < kPixels; ++t) {
      if (x0 + t < d.ow) store_vec(dst + t * d.c, acc[t]);
    }
  }
}

// Input gradient. Thread (n, y, x0..x0+kPixels-1, c0..c0+V-1) of grad_input:
// per tap, the grad_output position it maps each input position to (where
// the stride divides), times the tap's weights.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    grad_input_kernel(const T* __restrict__ gout, const T* __restrict__ taps, T* __restrict__ gin,
                      Dims d, Window2d k, int64_t total) {
  using acc_t = at::opmath_type<T>;
  const int64_t cv = d.c / V, xb = (d.w + kPixels - 1) / kPixels;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c0 = (idx % cv) * V;
    const int64_t x0 = (idx / cv % xb) * kPixels;
    const int64_t y = idx / (cv * xb) % d.h, n = idx / (cv * xb * d.h);
    acc_t acc[kPixels][V] = {};
    const T* img = gout + n * d.oh * d.ow * d.c + c0;
    for (int64_t i = 0; i < k.kh; ++i) {
      const int64_t ty = y + k.ph - i * k.dh;
      if (ty < 0 || ty % k.sh != 0 || ty / k.sh >= d.oh) continue;
      const T* row = img + (ty / k.sh) * d.ow * d.c;
      for (int64_t j = 0; j < k.kw; ++j) {
        acc_t wv[V];
        load_vec(wv, taps + (i * k.kw + j) * d.c + c0);
#pragma unroll
        for (int t = 0; t < kPixels; ++t) {
          const int64_t tx = x0 + t + k.pw - j * k.dw;
          if (x0 + t >= d.w || tx < 0 || tx % k.sw != 0 || tx / k.sw >= d.ow) continue;
          acc_t gv[V];
          load_vec(gv, row + (tx / k.sw) * d.c);
#pragma unroll
          for (int e = 0; e < V; ++e) acc[t][e] += wv[e] * gv[e];
        }
      }
    }
    T* dst = gin + ((n * d.h + y) * d.w + x0) * d.c + c0;
#pragma unroll
    for (int t = 0; t < kPixels; ++t) {
      if (x0 + t < d.w) store_vec(dst + t * d.c, acc[t]);
    }
  }
}

// Weight gradient, one slice (blockIdx.y) of the N*oh*ow output positions.
// Thread (tap, c0..c0+V-1), neighbouring threads on neighbouring channel
// vectors: the products of grad_output and the tap's input over the slice's
// positions, in order, written to plane blockIdx.y of partial (slices, kh*kw, C).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    grad_weight_kernel(const T* __restrict__ gout, const T* __restrict__ in,
                       at::opmath_type<T>* __restrict__ partial, Dims d, Window2d k,
                       int64_t cells, int64_t per_slice) {
  using acc_t = at::opmath_type<T>;
  const int64_t cell = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (cell >= cells) return;
  const int64_t cv = d.c / V, c0 = (cell % cv) * V, tap = cell / cv;
  const int64_t i = tap / k.kw, j = tap % k.kw;
  const int64_t positions = d.n * d.oh * d.ow;
  const int64_t begin = blockIdx.y * per_slice, end = std::min(begin + per_slice, positions);
  acc_t acc[V] = {};
  int64_t x = begin % d.ow, y = begin / d.ow % d.oh, n = begin / (d.ow * d.oh);
  for (int64_t pos = begin; pos < end; ++pos) {
    const int64_t iy = y * k.sh - k.ph + i * k.dh, ix = x * k.sw - k.pw + j * k.dw;
    if (iy >= 0 && iy < d.h && ix >= 0 && ix < d.w) {
      acc_t gv[V], xv[V];
      load_vec(gv, gout + pos * d.c + c0);
      load_vec(xv, in + ((n * d.h + iy) * d.w + ix) * d.c + c0);
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += gv[e] * xv[e];
    }
    if (++x == d.ow) {
      x = 0;
      if (++y == d.oh) y = 0, ++n;
    }
  }
  acc_t* dst = partial + (blockIdx.y * (k.kh * k.kw) + tap) * d.c + c0;
#pragma unroll
  for (int e = 0; e < V; ++e) dst[e] = acc[e];
}

bool takes(const at::Tensor& t) {
  return t.is_cuda() && t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast);
}

// The taps of weight (C, 1, kh, kw) as (kh*kw, C), contiguous.
at::Tensor taps_by_channel(const at::Tensor& weight) {
  return weight.reshape({weight.size(0), weight.size(2) * weight.size(3)}).t().contiguous();
}

// The widest channel vector (at most 16 bytes) dividing C to whose size
// every pointer is aligned.
int vector_width(int64_t c, int64_t element_size, std::initializer_list<const void*> ptrs) {
  for (int v = int(std::min<int64_t>(8, 16 / element_size)); v > 1; v /= 2) {
    if (c % v != 0) continue;
    bool ok = true;
    for (const void* p : ptrs) ok = ok && reinterpret_cast<uintptr_t>(p) % (v * element_size) == 0;
    if (ok) return v;
  }
  return 1;
}

// f(integral_constant<int, V>) for the runtime width v, instantiating only
// widths of at most 16 bytes of T.
template <typename T, typename F>
void with_width(int v, F&& f) {
  switch (v) {
    case 8:
      if constexpr (8 * sizeof(T) <= 16) return f(std::integral_constant<int, 8>{});
      break;
    case 4:
      if constexpr (4 * sizeof(T) <= 16) return f(std::integral_constant<int, 4>{});
      break;
    case 2:
      return f(std::integral_constant<int, 2>{});
    default:
      break;
  }
  f(std::integral_constant<int, 1>{});
}

unsigned grid_for(int64_t total) { return unsigned(blocks_for(total, kThreads)); }

bool forward_cl_cuda(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                     const at::Tensor& output, const Window2d& win) {
  if (!takes(input) || !takes(output)) return false;
  const c10::cuda::CUDAGuard guard(input.device());
  const Dims d{input.size(0), input.size(1), input.size(2), input.size(3), output.size(2),
               output.size(3)};
  const at::Tensor taps = taps_by_channel(weight);
  const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
  const int v = vector_width(d.c, input.element_size(),
                             {input.const_data_ptr(), output.const_data_ptr(),
                              b.defined() ? b.const_data_ptr() : nullptr});
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_cl", [&] {
    with_width<scalar_t>(v, [&](auto width) {
      constexpr int V = decltype(width)::value;
      const int64_t total = d.n * d.oh * ((d.ow + kPixels - 1) / kPixels) * (d.c / V);
      forward_kernel<scalar_t, V><<<grid_for(total), kThreads, 0, stream>>>(
          input.const_data_ptr<scalar_t>(), taps.const_data_ptr<scalar_t>(),
          b.defined() ? b.const_data_ptr<scalar_t>() : nullptr, output.mutable_data_ptr<scalar_t>(),
          d, win, total);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return true;
}

bool grad_input_cl_cuda(const at::Tensor& grad_output, const at::Tensor& weight,
                        const at::Tensor& grad_input, const Window2d& win) {
  if (!takes(grad_output) || !takes(grad_input)) return false;
  const c10::cuda::CUDAGuard guard(grad_output.device());
  const Dims d{grad_input.size(0), grad_input.size(1), grad_input.size(2), grad_input.size(3),
               grad_output.size(2), grad_output.size(3)};
  const at::Tensor taps = taps_by_channel(weight);
  const int v = vector_width(d.c, grad_output.element_size(),
                             {grad_output.const_data_ptr(), grad_input.const_data_ptr()});
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_cl_grad_input", [&] {
    with_width<scalar_t>(v, [&](auto width) {
      constexpr int V = decltype(width)::value;
      const int64_t total = d.n * d.h * ((d.w + kPixels - 1) / kPixels) * (d.c / V);
      grad_input_kernel<scalar_t, V><<<grid_for(total), kThreads, 0, stream>>>(
          grad_output.const_data_ptr<scalar_t>(), taps.const_data_ptr<scalar_t>(),
          grad_input.mutable_data_ptr<scalar_t>(), d, win, total);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return true;
}

bool grad_weight_cl_cuda(const at::Tensor& grad_output, const at::Tensor& input,
                         const at::Tensor& grad_weight, const at::Tensor& grad_bias,
                         const Window2d& win) {
  if (!takes(grad_output) || !takes(input)) return false;
  const c10::cuda::CUDAGuard guard(input.device());
  const Dims d{input.size(0), input.size(1), input.size(2), input.size(3), grad_output.size(2),
               grad_output.size(3)};
  const int v = vector_width(d.c, input.element_size(),
                             {grad_output.const_data_ptr(), input.const_data_ptr()});
  const int64_t taps = win.kh * win.kw, cells = taps * (d.c / v);
  const int64_t positions = d.n * d.oh * d.ow;
  const auto acc_type = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // Slices: about eight blocks per multiprocessor, at least 64 positions
  // each, their planes within 48 MiB; the count depends on the shape and the
  // device only, so the sum's order, and the result, repeat.
  const int64_t blocks = (cells + kThreads - 1) / kThreads;
  const int64_t sms = at::cuda::getDeviceProperties(input.get_device())->multiProcessorCount;
  const int64_t by_memory = (int64_t(48) << 20) / (taps * d.c * at::elementSize(acc_type));
  const int64_t slices = std::max<int64_t>(
      1, std::min({(8 * sms + blocks - 1) / blocks, positions / 64, by_memory, int64_t(65535)}));
  const int64_t per_slice = (positions + slices - 1) / slices;
  at::Tensor partial = at::empty({slices, taps, d.c}, input.options().dtype(acc_type));
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_cl_grad_weight", [&] {
    with_width<scalar_t>(v, [&](auto width) {
      constexpr int V = decltype(width)::value;
      const dim3 grid{unsigned(blocks), unsigned(slices)};
      grad_weight_kernel<scalar_t, V><<<grid, kThreads, 0, stream>>>(
          grad_output.const_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
          partial.mutable_data_ptr<at::opmath_type<scalar_t>>(), d, win, cells, per_slice);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  // (kh*kw, C) summed in slice order and rounded once, into (C, 1, kh, kw).
  grad_weight.copy_(at::sum(partial, {0}, false, input.scalar_type()).t().reshape(grad_weight.sizes()));
  if (grad_bias.defined()) {
    at::Tensor gb = grad_bias;  // a handle to the caller's tensor
    at::sum_out(gb, grad_output, {0, 2, 3});
  }
  return true;
}

}  // namespace

DepthwiseChannelsLastKernels cuda_depthwise_channels_last_kernels() {
  return {&forward_cl_cuda, &grad_input_cl_cuda, &grad_weight_cl_cuda};
}

}  // namespace customconv
