#include "ops/conv2d/grouped_direct.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>

#include "ops/common/launch.h"

namespace customconv {
namespace {

constexpr int kThreads = 256;
constexpr int kPixels = 4;  // neighbouring positions of a row per thread (forward, grad_input)
constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast;

// One call's geometry, channels_last: input (n, h, w, c), output (n, p, q, k),
// weight (k, r, s, cg).
struct Geometry {
  int64_t n, h, w, c, k, p, q;
  int64_t cg, kg;  // channels per group: input, output
  int r, s, sh, sw, ph, pw, dh, dw;
};

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// V elements from src (V * sizeof(T)-aligned) into dst, widened to A.
template <typename A, typename T, int V>
__device__ __forceinline__ void load_vec(A (&dst)[V], const T* src) {
  const Vec<T, V> x = *reinterpret_cast<const Vec<T, V>*>(src);
#pragma unroll
  for (int i = 0; i < V; ++i) dst[i] = static_cast<A>(x.v[i]);
}

template <typename A, typename T, int V>
__device__ __forceinline__ void store_vec(T* dst, const A (&src)[V]) {
  Vec<T, V> x;
#pragma unroll
  for (int i = 0; i < V; ++i) x.v[i] = static_cast<T>(src[i]);
  *reinterpret_cast<Vec<T, V>*>(dst) = x;
}

// Forward. Thread (n, y, x0..x0+kPixels-1, k0..k0+V-1): V output channels of
// one group at kPixels neighbouring output positions of row y; neighbouring
// threads take neighbouring channel vectors of the same positions, so that
// their loads of the input and their stores are contiguous. Per tap and per
// vector of the group's input channels it adds V x V x kPixels products.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ in, const T* __restrict__ wt, const T* __restrict__ bias,
                   T* __restrict__ out, Geometry g, int64_t total) {
  using acc_t = at::opmath_type<T>;
  const int64_t kv = g.k / V, xb = (g.q + kPixels - 1) / kPixels;
  const int64_t kstride = int64_t(g.r) * g.s * g.cg;  // between weight rows
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k0 = (idx % kv) * V;
    const int64_t x0 = (idx / kv % xb) * kPixels;
    const int64_t y = idx / (kv * xb) % g.p, n = idx / (kv * xb * g.p);
    const T* image = in + n * g.h * g.w * g.c + (k0 / g.kg) * g.cg;
    acc_t acc[kPixels][V] = {};
    for (int i = 0; i < g.r; ++i) {
      const int64_t iy = y * g.sh - g.ph + int64_t(i) * g.dh;
      if (iy < 0 || iy >= g.h) continue;
      const T* row = image + iy * g.w * g.c;
      for (int j = 0; j < g.s; ++j) {
        const T* src[kPixels];
#pragma unroll
        for (int t = 0; t < kPixels; ++t) {
          const int64_t ix = (x0 + t) * g.sw - g.pw + int64_t(j) * g.dw;
          src[t] = (x0 + t < g.q && ix >= 0 && ix < g.w) ? row + ix * g.c : nullptr;
        }
        const T* taps = wt + (k0 * g.r + i) * g.s * g.cg + int64_t(j) * g.cg;
        for (int64_t c = 0; c < g.cg; c += V) {
          acc_t xv[kPixels][V];
#pragma unroll
          for (int t = 0; t < kPixels; ++t) {
            if (src[t] != nullptr) {
              load_vec(xv[t], src[t] + c);
            } else {
#pragma unroll
              for (int e = 0; e < V; ++e) xv[t][e] = acc_t(0);
            }
          }
#pragma unroll
          for (int o = 0; o < V; ++o) {
            acc_t wv[V];
            load_vec(wv, taps + o * kstride + c);
#pragma unroll
            for (int t = 0; t < kPixels; ++t) {
#pragma unroll
              for (int e = 0; e < V; ++e) acc[t][o] += wv[e] * xv[t][e];
            }
          }
        }
      }
    }
    acc_t b[V];
#pragma unroll
    for (int o = 0; o < V; ++o) b[o] = bias != nullptr ? static_cast<acc_t>(bias[k0 + o]) : acc_t(0);
    T* dst = out + ((n * g.p + y) * g.q + x0) * g.k + k0;
#pragma unroll
    for (int t = 0; t < kPixels; ++t) {
      if (x0 + t >= g.q) break;
      acc_t v[V];
#pragma unroll
      for (int o = 0; o < V; ++o) v[o] = acc[t][o] + b[o];
      store_vec(dst + t * g.k, v);
    }
  }
}

// Input gradient. Thread (n, y, x0..x0+kPixels-1, c0..c0+V-1): V input
// channels of one group at kPixels neighbouring input positions of row y,
// neighbouring threads on neighbouring channel vectors. Per tap it gathers
// the output position the tap maps each input position to (where the stride
// divides) and adds, per vector of the group's output channels, V x V x
// kPixels products of grad_output and the weight.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    grad_input_kernel(const T* __restrict__ gout, const T* __restrict__ wt, T* __restrict__ gin,
                      Geometry g, int64_t total) {
  using acc_t = at::opmath_type<T>;
  const int64_t cv = g.c / V, xb = (g.w + kPixels - 1) / kPixels;
  const int64_t kstride = int64_t(g.r) * g.s * g.cg;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c0 = (idx % cv) * V;
    const int64_t x0 = (idx / cv % xb) * kPixels;
    const int64_t y = idx / (cv * xb) % g.h, n = idx / (cv * xb * g.h);
    const int64_t group = c0 / g.cg, k_base = group * g.kg;
    const T* image = gout + n * g.p * g.q * g.k + k_base;
    acc_t acc[kPixels][V] = {};
    for (int i = 0; i < g.r; ++i) {
      const int64_t ty = y + g.ph - int64_t(i) * g.dh;
      if (ty < 0 || ty % g.sh != 0 || ty / g.sh >= g.p) continue;
      const T* row = image + (ty / g.sh) * g.q * g.k;
      for (int j = 0; j < g.s; ++j) {
        const T* src[kPixels];
#pragma unroll
        for (int t = 0; t < kPixels; ++t) {
          const int64_t tx = x0 + t + g.pw - int64_t(j) * g.dw;
          const bool ok = x0 + t < g.w && tx >= 0 && tx % g.sw == 0 && tx / g.sw < g.q;
          src[t] = ok ? row + (tx / g.sw) * g.k : nullptr;
        }
        // weight[k_base + kk][i][j][c0 - group * cg ...]
        const T* taps = wt + (k_base * g.r + i) * g.s * g.cg + int64_t(j) * g.cg + (c0 - group * g.cg);
        for (int64_t kk = 0; kk < g.kg; kk += V) {
          acc_t gv[kPixels][V];
#pragma unroll
          for (int t = 0; t < kPixels; ++t) {
            if (src[t] != nullptr) {
              load_vec(gv[t], src[t] + kk);
            } else {
#pragma unroll
              for (int e = 0; e < V; ++e) gv[t][e] = acc_t(0);
            }
          }
#pragma unroll
          for (int o = 0; o < V; ++o) {  // output channel k_base + kk + o
            acc_t wv[V];
            load_vec(wv, taps + (kk + o) * kstride);
#pragma unroll
            for (int t = 0; t < kPixels; ++t) {
#pragma unroll
              for (int e = 0; e < V; ++e) acc[t][e] += gv[t][o] * wv[e];
            }
          }
        }
      }
    }
    T* dst = gin + ((n * g.h + y) * g.w + x0) * g.c + c0;
#pragma unroll
    for (int t = 0; t < kPixels; ++t) {
      if (x0 + t >= g.w) break;
      store_vec(dst + t * g.c, acc[t]);
    }
  }
}

// Weight gradient, one slice (blockIdx.y) of the N*P*Q output positions.
// Thread (tap i j, c0..c0+V-1, k0..k0+V-1): V output channels of one group x
// V of that group's input channels at one tap, neighbouring threads on
// neighbouring output-channel vectors (contiguous grad_output loads). It sums
// the V x V products over the slice's positions in order and writes them to
// plane blockIdx.y of partial (slices, k, r, s, cg).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    grad_weight_kernel(const T* __restrict__ gout, const T* __restrict__ in,
                       at::opmath_type<T>* __restrict__ partial, Geometry g, int64_t cells,
                       int64_t per_slice) {
  using acc_t = at::opmath_type<T>;
  const int64_t cell = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (cell >= cells) return;
  const int64_t kv = g.k / V, cgv = g.cg / V;
  const int64_t k0 = (cell % kv) * V, c0 = (cell / kv % cgv) * V;
  const int64_t tap = cell / (kv * cgv);
  const int i = int(tap / g.s), j = int(tap % g.s);
  const int64_t positions = g.n * g.p * g.q;
  const int64_t begin = blockIdx.y * per_slice, end = std::min(begin + per_slice, positions);
  const T* channels = in + (k0 / g.kg) * g.cg + c0;
  acc_t acc[V][V] = {};
  int64_t x = begin % g.q, y = begin / g.q % g.p, n = begin / (g.q * g.p);
  for (int64_t pos = begin; pos < end; ++pos) {
    const int64_t iy = y * g.sh - g.ph + int64_t(i) * g.dh;
    const int64_t ix = x * g.sw - g.pw + int64_t(j) * g.dw;
    if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) {
      acc_t gv[V], xv[V];
      load_vec(gv, gout + pos * g.k + k0);
      load_vec(xv, channels + ((n * g.h + iy) * g.w + ix) * g.c);
#pragma unroll
      for (int o = 0; o < V; ++o) {
#pragma unroll
        for (int e = 0; e < V; ++e) acc[o][e] += gv[o] * xv[e];
      }
    }
    if (++x == g.q) {
      x = 0;
      if (++y == g.p) y = 0, ++n;
    }
  }
  acc_t* dst = partial + ((blockIdx.y * g.k + k0) * g.r + i) * g.s * g.cg + int64_t(j) * g.cg + c0;
#pragma unroll
  for (int o = 0; o < V; ++o) {
#pragma unroll
    for (int e = 0; e < V; ++e) dst[o * int64_t(g.r) * g.s * g.cg + e] = acc[o][e];
  }
}

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Whether the kernels take the call: CUDA, batched, grouped (not depthwise),
// at most kGroupedMaxChannels per group, nothing empty (the other routes
// handle empty shapes), the window within int range.
bool takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  if (!input.is_cuda() || !s.in.batched || s.groups <= 1 || s.groups >= s.in.c) return false;
  const int64_t cg = s.in.c / s.groups, kg = s.k / s.groups;
  if (cg > kGroupedMaxChannels || kg > kGroupedMaxChannels || kg == 0) return false;
  if (s.in.n == 0 || s.in.h == 0 || s.in.w == 0 || s.oh == 0 || s.ow == 0) return false;
  const Window2d& w = s.win;
  constexpr int64_t kIntMax = 1 << 30;
  for (int64_t v : {w.kh, w.kw, w.sh, w.sw, w.ph, w.pw, w.dh, w.dw}) {
    if (v > kIntMax) return false;
  }
  return true;
}

Geometry geometry(const Conv2dShape<int64_t>& s) {
  const Window2d& w = s.win;
  return {s.in.n, s.in.h, s.in.w, s.in.c, s.k, s.oh, s.ow, s.in.c / s.groups, s.k / s.groups,
          int(w.kh), int(w.kw), int(w.sh), int(w.sw), int(w.ph), int(w.pw), int(w.dh), int(w.dw)};
}

// The widest channel vector (at most 16 bytes) that divides both per-group
// channel counts and to whose size every tensor's data is aligned.
int vector_width(const Geometry& g, int64_t element_size, std::initializer_list<const at::Tensor*> ts) {
  for (int v = int(std::min<int64_t>(8, 16 / element_size)); v > 1; v /= 2) {
    if (g.cg % v != 0 || g.kg % v != 0) continue;
    bool ok = true;
    for (const at::Tensor* t : ts) ok = ok && aligned(t->const_data_ptr(), v * element_size);
    if (ok) return v;
  }
  return 1;
}

// f.template operator()<V>() for the runtime vector width v, instantiating
// only widths of at most 16 bytes of T.
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

}  // namespace

std::optional<at::Tensor> grouped_direct_conv2d(const at::Tensor& input, const at::Tensor& weight,
                                                const std::optional<at::Tensor>& bias,
                                                const Conv2dShape<int64_t>& s) {
  if (!takes(input, s)) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  const at::Tensor x = input.contiguous(kChannelsLast);
  const at::Tensor w = weight.contiguous(kChannelsLast);
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  at::Tensor out = empty_channels_last(input, s.in.n, s.k, s.oh, s.ow);
  const Geometry g = geometry(s);
  const int v = vector_width(g, x.element_size(), {&x, &w, &out});
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "grouped_conv2d", [&] {
    with_width<scalar_t>(v, [&](auto width) {
      constexpr int V = decltype(width)::value;
      const int64_t total = g.n * g.p * ((g.q + kPixels - 1) / kPixels) * (g.k / V);
      forward_kernel<scalar_t, V><<<grid_for(total), kThreads, 0, stream>>>(
          x.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(),
          has_bias ? b.const_data_ptr<scalar_t>() : nullptr, out.mutable_data_ptr<scalar_t>(), g,
          total);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return out.contiguous(format);
}

std::optional<at::Tensor> grouped_direct_conv2d_grad_input(const at::Tensor& grad_output,
                                                           const at::Tensor& input,
                                                           const at::Tensor& weight,
                                                           const Conv2dShape<int64_t>& s) {
  if (!takes(input, s) || grad_output.dim() != 4) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  const at::Tensor go = grad_output.contiguous(kChannelsLast);
  const at::Tensor w = weight.contiguous(kChannelsLast);
  at::Tensor gi = empty_channels_last(input, s.in.n, s.in.c, s.in.h, s.in.w);
  const Geometry g = geometry(s);
  const int v = vector_width(g, go.element_size(), {&go, &w, &gi});
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, go.scalar_type(), "grouped_conv2d_grad_input", [&] {
    with_width<scalar_t>(v, [&](auto width) {
      constexpr int V = decltype(width)::value;
      const int64_t total = g.n * g.h * ((g.w + kPixels - 1) / kPixels) * (g.c / V);
      grad_input_kernel<scalar_t, V><<<grid_for(total), kThreads, 0, stream>>>(
          go.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(), gi.mutable_data_ptr<scalar_t>(),
          g, total);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return gi.contiguous(format);
}

std::optional<at::Tensor> grouped_direct_conv2d_grad_weight(const at::Tensor& grad_output,
                                                            const at::Tensor& input,
                                                            const at::Tensor& weight,
                                                            const Conv2dShape<int64_t>& s) {
  if (!takes(input, s) || grad_output.dim() != 4) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  const at::Tensor go = grad_output.contiguous(kChannelsLast);
  const at::Tensor x = input.contiguous(kChannelsLast);
  const Geometry g = geometry(s);
  const int v = vector_width(g, x.element_size(), {&go, &x});
  const auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t plane = g.k * g.r * g.s * g.cg;
  const int64_t cells = plane / (int64_t(v) * v);
  const int64_t positions = g.n * g.p * g.q;
  // Slices: about eight blocks per multiprocessor, at least 64 positions
  // each, their planes within 48 MiB. The count depends on the shape and the
  // device only, so that the sum's order, and the result, repeat.
  const int64_t blocks = (cells + kThreads - 1) / kThreads;
  const int64_t sms = at::cuda::getDeviceProperties(input.get_device())->multiProcessorCount;
  const int64_t by_memory = (int64_t(48) << 20) / (plane * at::elementSize(acc_type));
  const int64_t slices = std::max<int64_t>(
      1, std::min({(8 * sms + blocks - 1) / blocks, positions / 64, by_memory, int64_t(65535)}));
  const int64_t per_slice = (positions + slices - 1) / slices;
  at::Tensor partial = at::empty({slices, g.k, g.r, g.s, g.cg}, x.options().dtype(acc_type));
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "grouped_conv2d_grad_weight", [&] {
    with_width<scalar_t>(v, [&](auto width) {
      constexpr int V = decltype(width)::value;
      const dim3 grid{unsigned(blocks), unsigned(slices)};
      grad_weight_kernel<scalar_t, V><<<grid, kThreads, 0, stream>>>(
          go.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
          partial.mutable_data_ptr<at::opmath_type<scalar_t>>(), g, cells, per_slice);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  // (k, r, s, cg) summed in slice order, as the weight (k, cg, r, s) stored channels_last.
  const at::Tensor sum = slices == 1 ? partial.select(0, 0).to(x.scalar_type())
                                     : at::sum(partial, {0}, false, x.scalar_type());
  return sum.permute({0, 3, 1, 2}).contiguous(format);
}

}  // namespace customconv
