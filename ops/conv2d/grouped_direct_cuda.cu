#include "ops/conv2d/grouped_direct.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <limits>

#include "ops/common/launch.h"
#include "ops/common/relayout_cuda.h"
#include "ops/common/workspace.h"

namespace customconv {
namespace {

constexpr int kThreads = 256;
constexpr int kPixels = 4;  // neighbouring positions of a row per thread (forward, grad_input)
// The weight gradient's blocks: kWarps warps of 32 cells each, kChunkTaps
// taps a cell, at most kMaxWgradWidth channels each way, kUnroll positions'
// loads in flight per thread; registers for kWgradBlocksPerSm resident
// blocks.
constexpr int kWarps = kThreads / 32;
constexpr int kChunkTaps = 3;
constexpr int kMaxWgradWidth = 4;
constexpr int kUnroll = 4;
constexpr int kWgradBlocksPerSm = 2;

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

// The V channels of `row` at column ix, or zeros where ix lies outside
// [0, w) (padding).
template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load_column(const T* row, int ix, int w, int c) {
  return unsigned(ix) < unsigned(w) ? *reinterpret_cast<const Vec<T, V>*>(row + ix * c) : Vec<T, V>{};
}

template <typename A, typename T, int V>
__device__ __forceinline__ void widen(A (&dst)[V], const Vec<T, V>& x) {
#pragma unroll
  for (int i = 0; i < V; ++i) dst[i] = static_cast<A>(x.v[i]);
}

// One output row's products for the weight gradient: acc[t][o][e] +=
// grad_output[x][o] * input[ix0 + x * sw + t * dw][e] over the row's q
// positions x, for the kChunkTaps taps t. `grow` points at the row's
// grad_output (position stride k), `xrow` at its input row (column stride c,
// w columns). SW = 1 or 2 is the stride at dilation 1: a position reuses
// the previous one's last kChunkTaps - SW columns and loads SW new ones, and
// kUnroll positions' loads are issued together before their products, so
// that their latencies overlap. SW = 0 stands for any stride and dilation,
// every column loaded.
template <int SW, typename A, typename T, int V>
__device__ __forceinline__ void row_products(A (&acc)[kChunkTaps][V][V], const T* xrow,
                                             const T* grow, int ix0, int q, int w, int c, int k,
                                             int sw, int dw) {
  static_assert(SW >= 0 && SW < kChunkTaps, "sliding windows: stride 1 or 2");
  constexpr int kFresh = SW == 0 ? kChunkTaps : SW;  // columns loaded per position
  constexpr int kU = SW == 0 ? 1 : kUnroll;          // positions loaded together
  const int step = SW == 0 ? sw : SW, dil = SW == 0 ? dw : 1;
  A win[kChunkTaps][V];
#pragma unroll
  for (int t = kFresh; t < kChunkTaps; ++t) widen(win[t], load_column<T, V>(xrow, ix0 + (t - kFresh) * dil, w, c));
  // One position's products, from its fresh columns and grad_output vector.
  const auto position = [&](const Vec<T, V>* fresh, const Vec<T, V>& g) {
#pragma unroll
    for (int t = 0; t < kChunkTaps - kFresh; ++t) {
#pragma unroll
      for (int e = 0; e < V; ++e) win[t][e] = win[t + kFresh][e];
    }
#pragma unroll
    for (int f = 0; f < kFresh; ++f) widen(win[kChunkTaps - kFresh + f], fresh[f]);
    A gv[V];
    widen(gv, g);
#pragma unroll
    for (int t = 0; t < kChunkTaps; ++t) {
#pragma unroll
      for (int o = 0; o < V; ++o) {
#pragma unroll
        for (int e = 0; e < V; ++e) acc[t][o][e] += gv[o] * win[t][e];
      }
    }
  };
  int x = 0;
  for (; x + kU <= q; x += kU) {
    Vec<T, V> fresh[kU][kFresh], g[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int base = ix0 + (x + u) * step;
#pragma unroll
      for (int f = 0; f < kFresh; ++f) fresh[u][f] = load_column<T, V>(xrow, base + (kChunkTaps - kFresh + f) * dil, w, c);
      g[u] = *reinterpret_cast<const Vec<T, V>*>(grow + (x + u) * k);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) position(fresh[u], g[u]);
  }
  for (; x < q; ++x) {
    Vec<T, V> fresh[kFresh];
    const int base = ix0 + x * step;
#pragma unroll
    for (int f = 0; f < kFresh; ++f) fresh[f] = load_column<T, V>(xrow, base + (kChunkTaps - kFresh + f) * dil, w, c);
    position(fresh, *reinterpret_cast<const Vec<T, V>*>(grow + x * k));
  }
}

// Weight gradient, one slice (blockIdx.y) of the N*P output rows. A cell is
// V output channels x V input channels of one group at up to kChunkTaps
// neighbouring taps of one window row (chunk `chunk`: a row of a 3x3
// window); its sums stay in registers. Lane i of every warp of a block holds
// cell 32 * blockIdx.x + i, so a warp reads 32 neighbouring input channel
// vectors (across groups) of one position; the block's warps take every
// kWarps-th output row of the slice and walk its positions left to right
// (row_products). The warps' sums are then added in shared memory, in warp
// order, and written to plane blockIdx.y of partial (slices, k, r, s, cg).
// Offsets are ints: the caller checks that the tensors' element counts fit.
template <typename T, int V, int SW>
__global__ void __launch_bounds__(kThreads, kWgradBlocksPerSm)
    grad_weight_kernel(const T* __restrict__ gout, const T* __restrict__ in,
                       at::opmath_type<T>* __restrict__ partial, Geometry g, int cells,
                       int rows_per_slice) {
  using acc_t = at::opmath_type<T>;
  __shared__ acc_t sums[kWarps][32][V * V + 1];  // one tap's; padded against bank conflicts
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int cell = int(blockIdx.x) * 32 + lane;
  const bool active = cell < cells;
  const int cvs = int(g.c / V), kvs = int(g.kg / V), cg = int(g.cg), taps = g.r * g.s;
  const int row_chunks = (g.s + kChunkTaps - 1) / kChunkTaps;
  const int cv = cell % cvs, kb = cell / cvs % kvs, chunk = cell / (cvs * kvs);
  const int r = chunk / row_chunks, s0 = chunk % row_chunks * kChunkTaps;
  const int c0 = cv * V, group = c0 / cg, k0 = group * int(g.kg) + kb * V;
  const int h = int(g.h), w = int(g.w), p = int(g.p), q = int(g.q), c = int(g.c), k = int(g.k);
  const int rows = int(g.n) * p;
  const int begin = int(blockIdx.y) * rows_per_slice, end = min(begin + rows_per_slice, rows);
  acc_t acc[kChunkTaps][V][V] = {};
  for (int row = begin + warp; active && row < end; row += kWarps) {
    const int y = row % p, n = row / p;
    const int iy = y * g.sh - g.ph + r * g.dh;
    if (unsigned(iy) >= unsigned(h)) continue;
    const T* xrow = in + (n * h + iy) * w * c + c0;
    const T* grow = gout + row * q * k + k0;
    row_products<SW>(acc, xrow, grow, s0 * g.dw - g.pw, q, w, c, k, g.sw, g.dw);
  }
  // Taps past the window's row (s0 + t >= s) summed products of its padding
  // or of the next columns: not written.
  acc_t* dst = partial + (int64_t(blockIdx.y) * k + k0) * taps * cg + (c0 - group * cg);
#pragma unroll
  for (int t = 0; t < kChunkTaps; ++t) {
#pragma unroll
    for (int o = 0; o < V; ++o) {
#pragma unroll
      for (int e = 0; e < V; ++e) sums[warp][lane][o * V + e] = acc[t][o][e];
    }
    __syncthreads();
    if (warp == 0 && active && s0 + t < g.s) {
      const int tap = r * g.s + s0 + t;
#pragma unroll
      for (int i = 0; i < V * V; ++i) {
        acc_t v = sums[0][lane][i];
#pragma unroll
        for (int j = 1; j < kWarps; ++j) v += sums[j][lane][i];
        dst[(int64_t(i / V) * taps + tap) * cg + i % V] = v;
      }
    }
    __syncthreads();
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

// The widest channel vector (at most 16 bytes and `most` elements) that
// divides both per-group channel counts and to whose size every tensor's data
// is aligned.
int vector_width(const Geometry& g, int64_t element_size, std::initializer_list<const at::Tensor*> ts,
                 int64_t most = 8) {
  for (int v = int(std::min<int64_t>(most, 16 / element_size)); v > 1; v /= 2) {
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
  at::Tensor x, w;
  std::tie(x, w) = to_channels_last_together(input, weight);  // NCHW by the transpose kernel
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
  return to_memory_format(out, format);
}

std::optional<at::Tensor> grouped_direct_conv2d_grad_input(const at::Tensor& grad_output,
                                                           const at::Tensor& input,
                                                           const at::Tensor& weight,
                                                           const Conv2dShape<int64_t>& s) {
  if (!takes(input, s) || grad_output.dim() != 4) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  at::Tensor go, w;
  std::tie(go, w) = to_channels_last_together(grad_output, weight);
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
  return to_memory_format(gi, format);
}

std::optional<at::Tensor> grouped_direct_conv2d_grad_weight(const at::Tensor& grad_output,
                                                            const at::Tensor& input,
                                                            const at::Tensor& weight,
                                                            const Conv2dShape<int64_t>& s,
                                                            bool unrounded) {
  if (!takes(input, s) || grad_output.dim() != 4) return std::nullopt;
  // The kernel's positions and offsets are ints.
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  if (input.numel() > kIntMax || grad_output.numel() > kIntMax) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  at::Tensor go, x;
  std::tie(go, x) = to_channels_last_together(grad_output, input);
  const Geometry g = geometry(s);
  const int v = vector_width(g, x.element_size(), {&go, &x}, kMaxWgradWidth);
  const auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t plane = g.k * g.r * g.s * g.cg;
  const int64_t chunks = int64_t(g.r) * ((g.s + kChunkTaps - 1) / kChunkTaps);
  const int64_t cells = (g.c / v) * (g.kg / v) * chunks;
  const int64_t rows = g.n * g.p;
  // Slices: about two waves of resident blocks, at least one row per warp,
  // their planes within 48 MiB (for a chunk of images,
  // chunk_partials_limit_bytes). The
  // count depends on the shape, the device and the limit only, so that the
  // sum's order, and the result, repeat.
  const int64_t blocks = (cells + 31) / 32;
  const int64_t sms = at::cuda::getDeviceProperties(input.get_device())->multiProcessorCount;
  const int64_t wave = kWgradBlocksPerSm * sms;
  const int64_t planes_bytes =
      unrounded ? chunk_partials_limit_bytes(c10::DeviceType::CUDA) : int64_t(48) << 20;
  const int64_t by_memory = planes_bytes / (plane * at::elementSize(acc_type));
  const int64_t slices = std::max<int64_t>(
      1, std::min({(2 * wave + blocks - 1) / blocks, rows / kWarps, by_memory, int64_t(65535)}));
  const int64_t rows_per_slice = (rows + slices - 1) / slices;
  if (blocks > kIntMax || cells > kIntMax) return std::nullopt;
  at::Tensor partial = at::empty({slices, g.k, g.r, g.s, g.cg}, x.options().dtype(acc_type));
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "grouped_conv2d_grad_weight", [&] {
    with_width<scalar_t>(v, [&](auto width) {
      constexpr int V = decltype(width)::value;
      if constexpr (V <= kMaxWgradWidth) {
        const dim3 grid{unsigned(blocks), unsigned(slices)};
        // The sliding windows (stride 1 or 2, dilation 1) for whole 4-channel vectors.
        const int sw = V == kMaxWgradWidth && g.dw == 1 && g.sw <= 2 ? g.sw : 0;
        const auto kernel = sw == 1   ? grad_weight_kernel<scalar_t, V, V == kMaxWgradWidth ? 1 : 0>
                            : sw == 2 ? grad_weight_kernel<scalar_t, V, V == kMaxWgradWidth ? 2 : 0>
                                      : grad_weight_kernel<scalar_t, V, 0>;
        kernel<<<grid, kThreads, 0, stream>>>(go.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
                                               partial.mutable_data_ptr<at::opmath_type<scalar_t>>(), g,
                                               int(cells), int(rows_per_slice));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    });
  });
  // (k, r, s, cg) summed in slice order and then rounded, as the weight (k, cg, r, s) stored
  // channels_last. (at::sum with a dtype would round each slice first.)
  const at::Tensor sum = slices == 1 ? partial.select(0, 0) : partial.sum(0);
  if (unrounded) return sum.permute({0, 3, 1, 2});
  return sum.to(x.scalar_type()).permute({0, 3, 1, 2}).contiguous(format);
}

}  // namespace customconv
