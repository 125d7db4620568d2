#include "ops/columns/column_kernels.h"

#include "ops/common/index_divide.h"
#include "ops/common/launch.h"
#include "ops/common/relayout_cuda.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace customconv {
namespace {

constexpr int kThreads = 256;

// The window geometry in the kernels' index type, with the divisors that
// split a flat index into coordinates (FastDivide's for int32_t).
template <typename I>
struct Geometry {
  I c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
  I image_stride, row_stride;
  Divide<I> c_div, h_div, w_div, oh_div, ow_div;
};

template <typename I>
Geometry<I> geometry(const at::Tensor& images, const Window2d& k, int64_t oh, int64_t ow,
                     ColumnLayout lay) {
  const I c = I(images.size(1)), h = I(images.size(2)), w = I(images.size(3));
  Geometry<I> g{c,
                h,
                w,
                I(oh),
                I(ow),
                I(k.kh),
                I(k.kw),
                I(k.sh),
                I(k.sw),
                I(k.ph),
                I(k.pw),
                I(k.dh),
                I(k.dw),
                I(lay.image_stride),
                I(lay.row_stride)};
  g.c_div = Divide<I>::of(c);
  g.h_div = Divide<I>::of(h);
  g.w_div = Divide<I>::of(w);
  g.oh_div = Divide<I>::of(I(oh));
  g.ow_div = Divide<I>::of(I(ow));
  return g;
}

// Splits a flat index over (planes, rows, cols) into its coordinates.
template <typename I>
struct PlaneIndex {
  I plane, y, x;
};
template <typename I>
__device__ __forceinline__ PlaneIndex<I> split(I idx, const Divide<I>& rows,
                                               const Divide<I>& cols) {
  const I rest = cols.div(idx), p = rows.div(rest);
  return {p, rest - p * I(rows.divisor), idx - rest * I(cols.divisor)};
}

// One thread per (image, channel, y, x) of the window grid; it writes the
// kh*kw column entries of that window position. Neighbouring threads take
// neighbouring x, so both the image reads and the column writes coalesce.
// I is int32_t when every offset fits (cheaper index arithmetic), else int64_t.
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    im2col_kernel(const T* __restrict__ in, T* __restrict__ col, I total, Geometry<I> g) {
  for (I idx = blockIdx.x * I(blockDim.x) + threadIdx.x; idx < total;
       idx += I(gridDim.x) * blockDim.x) {
    const auto [p, y, x] = split(idx, g.oh_div, g.ow_div);  // p: plane index b * c + ch
    const I b = g.c_div.div(p), ch = p - b * g.c;
    const T* plane = in + p * g.h * g.w;
    T* dst = col + b * g.image_stride + ch * g.kh * g.kw * g.row_stride + y * g.ow + x;
    const I y0 = y * g.sh - g.ph, x0 = x * g.sw - g.pw;
    for (I i = 0; i < g.kh; ++i) {
      const I iy = y0 + i * g.dh;
      const bool row_ok = iy >= 0 && iy < g.h;
      for (I j = 0; j < g.kw; ++j) {
        const I ix = x0 + j * g.dw;
        *dst = (row_ok && ix >= 0 && ix < g.w) ? plane[iy * g.w + ix] : T(0);
        dst += g.row_stride;
      }
    }
  }
}

// The V-wide variant: one thread per (image, channel, y, V consecutive x) of
// the window grid; for each tap it gathers V input values and writes them with
// one V-wide store (V * sizeof(T) <= 16 bytes). Needs ow, both layout strides
// and the columns pointer to be multiples of V elements.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    im2col_vec_kernel(const T* __restrict__ in, T* __restrict__ col, int32_t total,
                      Geometry<int32_t> g, FastDivide owv) {
  using I = int32_t;
  for (I idx = blockIdx.x * I(blockDim.x) + threadIdx.x; idx < total;
       idx += I(gridDim.x) * blockDim.x) {
    const auto [p, y, xv] = split(idx, g.oh_div, owv);
    const I b = g.c_div.div(p), ch = p - b * g.c;
    const T* plane = in + p * g.h * g.w;
    T* dst = col + b * g.image_stride + ch * g.kh * g.kw * g.row_stride + y * g.ow + xv * V;
    const I y0 = y * g.sh - g.ph, x0 = xv * V * g.sw - g.pw;
    for (I i = 0; i < g.kh; ++i) {
      const I iy = y0 + i * g.dh;
      const bool row_ok = iy >= 0 && iy < g.h;
      const T* src = plane + (row_ok ? iy : 0) * g.w;
      for (I j = 0; j < g.kw; ++j) {
        Pack<T, V> pack;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const I ix = x0 + e * g.sw + j * g.dw;
          pack.v[e] = (row_ok && ix >= 0 && ix < g.w) ? src[ix] : T(0);
        }
        *reinterpret_cast<Pack<T, V>*>(dst) = pack;
        dst += g.row_stride;
      }
    }
  }
}

// Launches im2col_vec_kernel with the widest V the geometry allows; false when
// none does (V would be 1).
template <typename T>
bool launch_im2col_vec(const at::Tensor& images, const at::Tensor& columns, int64_t total,
                       const Geometry<int32_t>& g, cudaStream_t stream) {
  constexpr int kMaxV = 16 / sizeof(T);
  const auto address = reinterpret_cast<uintptr_t>(columns.data_ptr());
  int v = kMaxV;
  while (v > 1 && !(g.ow % v == 0 && g.row_stride % v == 0 && g.image_stride % v == 0 &&
                    address % (v * sizeof(T)) == 0)) {
    v /= 2;
  }
  const int32_t vecs = int32_t(total / v);
  const FastDivide owv = FastDivide::of(g.ow / v);
  const auto blocks = blocks_for(vecs, kThreads);
  const T* src = images.const_data_ptr<T>();
  T* dst = columns.data_ptr<T>();
  switch (v) {
    case 8:
      if constexpr (kMaxV >= 8)
        im2col_vec_kernel<T, 8><<<blocks, kThreads, 0, stream>>>(src, dst, vecs, g, owv);
      return true;
    case 4:
      if constexpr (kMaxV >= 4)
        im2col_vec_kernel<T, 4><<<blocks, kThreads, 0, stream>>>(src, dst, vecs, g, owv);
      return true;
    case 2:
      im2col_vec_kernel<T, 2><<<blocks, kThreads, 0, stream>>>(src, dst, vecs, g, owv);
      return true;
    default:
      return false;
  }
}

// One thread per image element (image, channel, iy, ix); it gathers, in a
// fixed order, every column entry whose window covers it and writes the sum
// once (no atomics: deterministic). kUnit: stride and dilation 1, where the
// covering taps are one rectangle of the kernel, found without divisions.
template <typename T, typename I, bool kUnit>
__global__ void __launch_bounds__(kThreads)
    col2im_kernel(const T* __restrict__ col, T* __restrict__ out, I total, Geometry<I> g) {
  using acc_t = at::opmath_type<T>;
  for (I idx = blockIdx.x * I(blockDim.x) + threadIdx.x; idx < total;
       idx += I(gridDim.x) * blockDim.x) {
    const auto [p, iy, ix] = split(idx, g.h_div, g.w_div);
    const I b = g.c_div.div(p), ch = p - b * g.c;
    const T* src = col + b * g.image_stride + ch * g.kh * g.kw * g.row_stride;
    acc_t sum = 0;
    if constexpr (kUnit) {
      // Tap (i, j) reads output (iy + ph - i, ix + pw - j), which must lie in the output.
      const I ty = iy + g.ph, tx = ix + g.pw;
      const I i0 = ty - g.oh + 1 > 0 ? ty - g.oh + 1 : 0, i1 = ty < g.kh - 1 ? ty : g.kh - 1;
      const I j0 = tx - g.ow + 1 > 0 ? tx - g.ow + 1 : 0, j1 = tx < g.kw - 1 ? tx : g.kw - 1;
      for (I i = i0; i <= i1; ++i) {
        const T* row = src + i * g.kw * g.row_stride + (ty - i) * g.ow + tx;
        for (I j = j0; j <= j1; ++j) sum += static_cast<acc_t>(row[j * g.row_stride - j]);
      }
    } else {
      for (I i = 0; i < g.kh; ++i) {
        const I ty = iy + g.ph - i * g.dh;
        if (ty < 0) break;  // decreases with i
        if (ty % g.sh != 0) continue;
        const I y = ty / g.sh;
        if (y >= g.oh) continue;
        for (I j = 0; j < g.kw; ++j) {
          const I tx = ix + g.pw - j * g.dw;
          if (tx < 0) break;
          if (tx % g.sw != 0) continue;
          const I x = tx / g.sw;
          if (x >= g.ow) continue;
          sum += static_cast<acc_t>(src[(i * g.kw + j) * g.row_stride + y * g.ow + x]);
        }
      }
    }
    out[idx] = static_cast<T>(sum);
  }
}

// Whether every offset into `images` and `columns`, every coordinate a window
// reaches (padding, stride and dilation included) and the loop counters (which
// run up to total plus one grid stride) fit in int32_t.
bool fits_int32(const at::Tensor& images, const at::Tensor& columns, int64_t total,
                const Window2d& k, int64_t oh, int64_t ow) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max() / 2;
  const int64_t col_extent = columns.storage().nbytes() / std::max<int64_t>(columns.element_size(), 1);
  // In double: strides and dilations may be near 2^63, their products overflow int64.
  const double reach_h = std::max(double(oh - 1) * double(k.sh), double(images.size(2))) +
                         double(k.ph) + double(k.kh - 1) * double(k.dh);
  const double reach_w = std::max(double(ow - 1) * double(k.sw), double(images.size(3))) +
                         double(k.pw) + double(k.kw - 1) * double(k.dw);
  const int64_t params[] = {k.kh, k.kw, k.sh, k.sw, k.ph, k.pw, k.dh, k.dw};
  for (const int64_t v : params) {
    if (v >= kMax) return false;  // the window itself must convert to int32 unchanged
  }
  return images.numel() < kMax && col_extent < kMax && total < kMax && reach_h < double(kMax) &&
         reach_w < double(kMax);
}

}  // namespace

void im2col_cuda(const at::Tensor& images, const at::Tensor& columns, const Window2d& win,
                 int64_t oh, int64_t ow, ColumnLayout layout) {
  const c10::cuda::CUDAGuard guard(images.device());
  const int64_t total = images.size(0) * images.size(1) * oh * ow;
  if (total == 0) return;
  if (win.kh == 1 && win.kw == 1 && win.sh == 1 && win.sw == 1 && win.ph == 0 && win.pw == 0) {
    // Every image plane is one row of the columns: a strided copy of rows.
    copy_rows_cuda(images, columns, images.size(0), images.size(1), oh * ow, layout.image_stride,
                   layout.row_stride);
    return;
  }
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, images.scalar_type(), "im2col_cuda", [&] {
        const auto blocks = blocks_for(total, kThreads);
        if (fits_int32(images, columns, total, win, oh, ow)) {
          const auto g = geometry<int32_t>(images, win, oh, ow, layout);
          if (!launch_im2col_vec<scalar_t>(images, columns, total, g, stream)) {
            im2col_kernel<scalar_t, int32_t><<<blocks, kThreads, 0, stream>>>(
                images.const_data_ptr<scalar_t>(), columns.data_ptr<scalar_t>(), int32_t(total), g);
          }
        } else {
          im2col_kernel<scalar_t, int64_t><<<blocks, kThreads, 0, stream>>>(
              images.const_data_ptr<scalar_t>(), columns.data_ptr<scalar_t>(), total,
              geometry<int64_t>(images, win, oh, ow, layout));
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

void col2im_cuda(const at::Tensor& columns, const at::Tensor& images, const Window2d& win,
                 int64_t oh, int64_t ow, ColumnLayout layout) {
  const c10::cuda::CUDAGuard guard(images.device());
  const int64_t total = images.numel();
  if (total == 0) return;
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, images.scalar_type(), "col2im_cuda", [&] {
        const auto blocks = blocks_for(total, kThreads);
        const bool unit = win.sh == 1 && win.sw == 1 && win.dh == 1 && win.dw == 1;
        const scalar_t* src = columns.const_data_ptr<scalar_t>();
        scalar_t* dst = images.data_ptr<scalar_t>();
        if (fits_int32(images, columns, total, win, oh, ow)) {
          const auto g = geometry<int32_t>(images, win, oh, ow, layout);
          if (unit) {
            col2im_kernel<scalar_t, int32_t, true><<<blocks, kThreads, 0, stream>>>(src, dst, int32_t(total), g);
          } else {
            col2im_kernel<scalar_t, int32_t, false><<<blocks, kThreads, 0, stream>>>(src, dst, int32_t(total), g);
          }
        } else {
          const auto g = geometry<int64_t>(images, win, oh, ow, layout);
          if (unit) {
            col2im_kernel<scalar_t, int64_t, true><<<blocks, kThreads, 0, stream>>>(src, dst, total, g);
          } else {
            col2im_kernel<scalar_t, int64_t, false><<<blocks, kThreads, 0, stream>>>(src, dst, total, g);
          }
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace customconv
