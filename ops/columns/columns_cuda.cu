#include "ops/columns/column_kernels.h"

#include "ops/common/launch.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <algorithm>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace customconv {
namespace {

constexpr int kThreads = 256;

// One thread per (image, channel, y, x) of the window grid; it writes the
// kh*kw column entries of that window position. Neighbouring threads take
// neighbouring x, so both the image reads and the column writes coalesce.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    im2col_kernel(const T* __restrict__ in, T* __restrict__ col, int64_t total, int64_t c,
                  int64_t h, int64_t w, Window2d k, int64_t oh, int64_t ow, ColumnLayout lay) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t x = idx % ow;
    const int64_t y = (idx / ow) % oh;
    const int64_t p = idx / (ow * oh);  // plane index b * c + ch
    const int64_t ch = p % c, b = p / c;
    const T* plane = in + p * h * w;
    T* dst = col + b * lay.image_stride + ch * k.kh * k.kw * lay.row_stride + y * ow + x;
    const int64_t y0 = y * k.sh - k.ph, x0 = x * k.sw - k.pw;
    for (int64_t i = 0; i < k.kh; ++i) {
      const int64_t iy = y0 + i * k.dh;
      const bool row_ok = iy >= 0 && iy < h;
      for (int64_t j = 0; j < k.kw; ++j) {
        const int64_t ix = x0 + j * k.dw;
        *dst = (row_ok && ix >= 0 && ix < w) ? plane[iy * w + ix] : T(0);
        dst += lay.row_stride;
      }
    }
  }
}

// One thread per image element (image, channel, iy, ix); it gathers, in a
// fixed order, every column entry whose window covers it and writes the sum
// once (no atomics: deterministic).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    col2im_kernel(const T* __restrict__ col, T* __restrict__ out, int64_t total, int64_t c,
                  int64_t h, int64_t w, Window2d k, int64_t oh, int64_t ow, ColumnLayout lay) {
  using acc_t = at::opmath_type<T>;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ix = idx % w;
    const int64_t iy = (idx / w) % h;
    const int64_t p = idx / (w * h);
    const int64_t ch = p % c, b = p / c;
    const T* src = col + b * lay.image_stride + ch * k.kh * k.kw * lay.row_stride;
    acc_t sum = 0;
    for (int64_t i = 0; i < k.kh; ++i) {
      const int64_t ty = iy + k.ph - i * k.dh;
      if (ty < 0) break;  // decreases with i
      if (ty % k.sh != 0) continue;
      const int64_t y = ty / k.sh;
      if (y >= oh) continue;
      for (int64_t j = 0; j < k.kw; ++j) {
        const int64_t tx = ix + k.pw - j * k.dw;
        if (tx < 0) break;
        if (tx % k.sw != 0) continue;
        const int64_t x = tx / k.sw;
        if (x >= ow) continue;
        sum += static_cast<acc_t>(src[(i * k.kw + j) * lay.row_stride + y * ow + x]);
      }
    }
    out[idx] = static_cast<T>(sum);
  }
}

}  // namespace

void im2col_cuda(const at::Tensor& images, const at::Tensor& columns, const Window2d& win,
                 int64_t oh, int64_t ow, ColumnLayout layout) {
  const c10::cuda::CUDAGuard guard(images.device());
  const int64_t total = images.size(0) * images.size(1) * oh * ow;
  if (total == 0) return;
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, images.scalar_type(), "im2col_cuda", [&] {
        im2col_kernel<scalar_t><<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
            images.const_data_ptr<scalar_t>(), columns.data_ptr<scalar_t>(), total, images.size(1),
            images.size(2), images.size(3), win, oh, ow, layout);
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
        col2im_kernel<scalar_t><<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
            columns.const_data_ptr<scalar_t>(), images.data_ptr<scalar_t>(), total, images.size(1),
            images.size(2), images.size(3), win, oh, ow, layout);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace customconv
