// The im2col and col2im ops (== F.unfold / F.fold), device-generic: the
// device's kernels come in as a ColumnKernels pair.
#pragma once

#include "ops/columns/column_kernels.h"

namespace customconv {

at::Tensor im2col_impl(const ColumnKernels& kernels, const at::Tensor& input,
                       c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation);

at::Tensor col2im_impl(const ColumnKernels& kernels, const at::Tensor& columns,
                       c10::IntArrayRef output_size, c10::IntArrayRef kernel_size,
                       c10::IntArrayRef stride, c10::IntArrayRef padding,
                       c10::IntArrayRef dilation);

}  // namespace customconv
