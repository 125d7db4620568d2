#include "ops/columns/column_kernels.h"

#include "ops/common/launch.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <vector>

namespace customconv {
namespace {

// Work split: one task per (image, channel) plane; each task writes the
// kh*kw column rows of its plane, row by row.
template <typename T>
void im2col_planes(const T* in, T* col, int64_t n, int64_t c, int64_t h, int64_t w,
                   const Window2d& k, int64_t oh, int64_t ow, ColumnLayout lay) {
  const int64_t taps = k.kh * k.kw;
  const int64_t grain = grain_for(taps * oh * ow);
  at::parallel_for(0, n * c, grain, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t b = p / c, ch = p % c;
      const T* plane = in + p * h * w;
      for (int64_t i = 0; i < k.kh; ++i) {
        for (int64_t j = 0; j < k.kw; ++j) {
          T* dst = col + b * lay.image_stride + ((ch * k.kh + i) * k.kw + j) * lay.row_stride;
          const int64_t x_off = j * k.dw - k.pw;
          for (int64_t y = 0; y < oh; ++y) {
            const int64_t iy = y * k.sh - k.ph + i * k.dh;
            T* row = dst + y * ow;
            if (iy < 0 || iy >= h) {
              std::fill(row, row + ow, T(0));
              continue;
            }
            const T* src = plane + iy * w;
            for (int64_t x = 0; x < ow; ++x) {
              const int64_t ix = x * k.sw + x_off;
              row[x] = (ix >= 0 && ix < w) ? src[ix] : T(0);
            }
          }
        }
      }
    }
  });
}

// Work split: one task per (image, channel) plane. Each task scatters its
// plane's kh*kw column rows into a private accumulator (opmath precision),
// then writes the plane once; the summation order is fixed, so results are
// deterministic.
template <typename T>
void col2im_planes(const T* col, T* out, int64_t n, int64_t c, int64_t h, int64_t w,
                   const Window2d& k, int64_t oh, int64_t ow, ColumnLayout lay) {
  using acc_t = at::opmath_type<T>;
  const int64_t taps = k.kh * k.kw;
  const int64_t grain = grain_for(taps * oh * ow);
  at::parallel_for(0, n * c, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> acc(static_cast<size_t>(h * w));
    for (int64_t p = begin; p < end; ++p) {
      const int64_t b = p / c, ch = p % c;
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t i = 0; i < k.kh; ++i) {
        for (int64_t j = 0; j < k.kw; ++j) {
          const T* src = col + b * lay.image_stride + ((ch * k.kh + i) * k.kw + j) * lay.row_stride;
          const int64_t x_off = j * k.dw - k.pw;
          for (int64_t y = 0; y < oh; ++y) {
            const int64_t iy = y * k.sh - k.ph + i * k.dh;
            if (iy < 0 || iy >= h) continue;
            acc_t* dst = acc.data() + iy * w;
            const T* row = src + y * ow;
            for (int64_t x = 0; x < ow; ++x) {
              const int64_t ix = x * k.sw + x_off;
              if (ix >= 0 && ix < w) dst[ix] += static_cast<acc_t>(row[x]);
            }
          }
        }
      }
      T* plane = out + p * h * w;
      for (int64_t q = 0; q < h * w; ++q) plane[q] = static_cast<T>(acc[q]);
    }
  });
}

}  // namespace

void im2col_cpu(const at::Tensor& images, const at::Tensor& columns, const Window2d& win,
                int64_t oh, int64_t ow, ColumnLayout layout) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, images.scalar_type(), "im2col_cpu", [&] {
        im2col_planes<scalar_t>(images.const_data_ptr<scalar_t>(), columns.data_ptr<scalar_t>(),
                                images.size(0), images.size(1), images.size(2), images.size(3), win,
                                oh, ow, layout);
      });
}

void col2im_cpu(const at::Tensor& columns, const at::Tensor& images, const Window2d& win,
                int64_t oh, int64_t ow, ColumnLayout layout) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, images.scalar_type(), "col2im_cpu", [&] {
        col2im_planes<scalar_t>(columns.const_data_ptr<scalar_t>(), images.data_ptr<scalar_t>(),
                                images.size(0), images.size(1), images.size(2), images.size(3), win,
                                oh, ow, layout);
      });
}

}  // namespace customconv
