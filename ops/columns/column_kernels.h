// The im2col / col2im kernels, one pair per device. They work on a batch of
// contiguous (n, C, H, W) images and a column buffer whose layout is given by
// two strides, so the same kernel serves the public im2col op (N, C*kh*kw, L)
// and conv2d's GEMM-friendly buffer (C*kh*kw, n, L).
#pragma once

#include <ATen/core/Tensor.h>

#include "ops/common/window.h"

namespace customconv {

// Element (image b, row r, position l) of the columns sits at
//   b * image_stride + r * row_stride + l,   r = (c * kh + i) * kw + j,  l = y * ow + x.
struct ColumnLayout {
  int64_t image_stride;
  int64_t row_stride;
};

// Writes every element of the columns for `images` (contiguous, 4-D).
using Im2colKernel = void (*)(const at::Tensor& images, const at::Tensor& columns,
                              const Window2d& win, int64_t oh, int64_t ow, ColumnLayout layout);
// Overwrites every element of `images` (contiguous, 4-D) with the sum of the
// column entries that read it (the adjoint of im2col).
using Col2imKernel = void (*)(const at::Tensor& columns, const at::Tensor& images,
                              const Window2d& win, int64_t oh, int64_t ow, ColumnLayout layout);

struct ColumnKernels {
  Im2colKernel im2col;
  Col2imKernel col2im;
};

void im2col_cpu(const at::Tensor& images, const at::Tensor& columns, const Window2d& win,
                int64_t oh, int64_t ow, ColumnLayout layout);
void col2im_cpu(const at::Tensor& columns, const at::Tensor& images, const Window2d& win,
                int64_t oh, int64_t ow, ColumnLayout layout);
inline ColumnKernels cpu_column_kernels() { return {&im2col_cpu, &col2im_cpu}; }

#ifdef CUSTOMCONV_WITH_CUDA
void im2col_cuda(const at::Tensor& images, const at::Tensor& columns, const Window2d& win,
                 int64_t oh, int64_t ow, ColumnLayout layout);
void col2im_cuda(const at::Tensor& columns, const at::Tensor& images, const Window2d& win,
                 int64_t oh, int64_t ow, ColumnLayout layout);
inline ColumnKernels cuda_column_kernels() { return {&im2col_cuda, &col2im_cuda}; }
#endif

}  // namespace customconv
