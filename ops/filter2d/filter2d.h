// filter2d: one (kh, kw) kernel, odd sizes, correlated with every (H, W) plane
// of an input (..., H, W), the plane extended by a border mode exactly as
// F.pad(plane, (kw//2, kw//2, kh//2, kh//2), mode) would; output of the
// input's shape. Device-generic: the device's kernels come in as a table.
#pragma once

#include <ATen/core/Tensor.h>

#include "ops/common/filter_shapes.h"

namespace customconv {

// Kernels on contiguous tensors: planes (P, H, W), kernel (kh, kw). Each writes
// every element of its output.
struct Filter2dKernels {
  void (*forward)(const at::Tensor& planes, const at::Tensor& kernel, const at::Tensor& out,
                  const Filter2dShape& s);
  // The adjoint: the gradient of every padded sample folded back onto the
  // sample it was read from.
  void (*grad_input)(const at::Tensor& grad_out, const at::Tensor& kernel,
                     const at::Tensor& grad_in, const Filter2dShape& s);
  // A reduction over all planes and pixels, in a fixed order (deterministic).
  void (*grad_kernel)(const at::Tensor& grad_out, const at::Tensor& planes,
                      const at::Tensor& grad_kernel, const Filter2dShape& s);
};

Filter2dKernels cpu_filter2d_kernels();
#ifdef CUSTOMCONV_WITH_CUDA
Filter2dKernels cuda_filter2d_kernels();
#endif

at::Tensor filter2d_impl(const Filter2dKernels& kernels, const at::Tensor& input,
                         const at::Tensor& kernel, c10::string_view border);

at::Tensor filter2d_grad_input_impl(const Filter2dKernels& kernels, const at::Tensor& grad_output,
                                    const at::Tensor& kernel, c10::string_view border);

at::Tensor filter2d_grad_kernel_impl(const Filter2dKernels& kernels, const at::Tensor& grad_output,
                                     const at::Tensor& input, const at::Tensor& kernel,
                                     c10::string_view border);

}  // namespace customconv
