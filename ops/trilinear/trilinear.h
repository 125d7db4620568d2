// trilinear_interpolation: feats (N, 8, F), points (N, 3) -> (N, F). With
// u, v, w = (points + 1) / 2 and corner c = 4i + 2j + k,
//   out[n, f] = sum_c (i ? u : 1-u) (j ? v : 1-v) (k ? w : 1-w) feats[n, c, f].
// Points outside [-1, 1] extrapolate by the same formula. Device-generic: the
// device's kernels come in as a table.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace customconv {

// Kernels on contiguous tensors; each writes every element of its outputs.
struct TrilinearKernels {
  void (*forward)(const at::Tensor& feats, const at::Tensor& points, const at::Tensor& out);
  // grad_feats (N, 8, F) and grad_points (N, 3) together; the points gradient
  // is a reduction over F in a fixed order (deterministic).
  void (*backward)(const at::Tensor& grad_out, const at::Tensor& feats, const at::Tensor& points,
                   const at::Tensor& grad_feats, const at::Tensor& grad_points);
};

TrilinearKernels cpu_trilinear_kernels();
#ifdef CUSTOMCONV_WITH_CUDA
TrilinearKernels cuda_trilinear_kernels();
#endif

at::Tensor trilinear_impl(const TrilinearKernels& kernels, const at::Tensor& feats,
                          const at::Tensor& points);

std::tuple<at::Tensor, at::Tensor> trilinear_backward_impl(const TrilinearKernels& kernels,
                                                           const at::Tensor& grad_output,
                                                           const at::Tensor& feats,
                                                           const at::Tensor& points);

}  // namespace customconv
