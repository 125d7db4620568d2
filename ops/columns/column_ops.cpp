#include "ops/columns/column_ops.h"

#include "ops/common/conv_shapes.h"
#include "ops/common/launch.h"

#include <ATen/ATen.h>

namespace customconv {

at::Tensor im2col_impl(const ColumnKernels& kernels, const at::Tensor& input,
                       c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  const auto s = check_im2col<int64_t>("im2col", input, kernel_size, stride, padding, dilation);
  const int64_t rows = s.in.c * s.win.kh * s.win.kw, length = s.oh * s.ow;
  at::Tensor out = at::empty({s.in.n, rows, length}, input.options());
  if (out.numel() > 0) {
    const at::Tensor images = input.reshape({s.in.n, s.in.c, s.in.h, s.in.w}).contiguous();
    kernels.im2col(images, out, s.win, s.oh, s.ow, ColumnLayout{rows * length, length});
  }
  return unbatch(out, s.in.batched);
}

at::Tensor col2im_impl(const ColumnKernels& kernels, const at::Tensor& columns,
                       c10::IntArrayRef output_size, c10::IntArrayRef kernel_size,
                       c10::IntArrayRef stride, c10::IntArrayRef padding,
                       c10::IntArrayRef dilation) {
  const auto s =
      check_col2im<int64_t>("col2im", columns, output_size, kernel_size, stride, padding, dilation);
  at::Tensor out = at::empty({s.in.n, s.in.c, s.in.h, s.in.w}, columns.options());
  if (out.numel() > 0) {
    const int64_t rows = s.in.c * s.win.kh * s.win.kw, length = s.oh * s.ow;
    const at::Tensor cols = columns.reshape({s.in.n, rows, length}).contiguous();
    kernels.col2im(cols, out, s.win, s.oh, s.ow, ColumnLayout{rows * length, length});
  }
  return unbatch(out, s.in.batched);
}

}  // namespace customconv
