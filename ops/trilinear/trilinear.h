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
  // out (N, F); when derivatives is defined, also the output's derivatives by
  // the point's three coordinates, derivatives[n, a, f] = d out[n, f] /
  // d points[n, a] (N, 3, F), in the accumulation type (float32 for 16-bit
  // feats).
  void (*forward)(const at::Tensor& feats, const at::Tensor& points, const at::Tensor& out,
                  const at::Tensor& derivatives);
  // grad_feats (N, 8, F) and grad_points (N, 3) together; the points gradient
  // is a reduction over F in a fixed order (deterministic). With
  // from_derivatives, source is the forward's derivatives (N, 3, F) and the
  // points gradient sums grad_out * derivatives; else source is feats and the
  // kernel blends the derivatives from its 8 rows again.
  void (*backward)(const at::Tensor& grad_out, const at::Tensor& source, bool from_derivatives,
                   const at::Tensor& points, const at::Tensor& grad_feats,
                   const at::Tensor& grad_points);
  // grad_feats (N, 8, F) alone: grad_feats[n, c, f] = weight_c(points[n]) *
  // grad_out[n, f] (no feats needed).
  void (*grad_feats)(const at::Tensor& grad_out, const at::Tensor& points,
                     const at::Tensor& grad_feats);
};

TrilinearKernels cpu_trilinear_kernels();
#ifdef CUSTOMCONV_WITH_CUDA
TrilinearKernels cuda_trilinear_kernels();
#endif

at::Tensor trilinear_impl(const TrilinearKernels& kernels, const at::Tensor& feats,
                          const at::Tensor& points);

// (out, derivatives): the forward and the output's derivatives by the points.
std::tuple<at::Tensor, at::Tensor> trilinear_with_derivatives_impl(const TrilinearKernels& kernels,
                                                                   const at::Tensor& feats,
                                                                   const at::Tensor& points);

// (grad_feats, grad_points) from the forward's derivatives instead of feats.
std::tuple<at::Tensor, at::Tensor> trilinear_backward_from_derivatives_impl(
    const TrilinearKernels& kernels, const at::Tensor& grad_output, const at::Tensor& derivatives,
    const at::Tensor& points);

// grad_feats alone, for points that need no gradient.
at::Tensor trilinear_grad_feats_impl(const TrilinearKernels& kernels, const at::Tensor& grad_output,
                                     const at::Tensor& points);

std::tuple<at::Tensor, at::Tensor> trilinear_backward_impl(const TrilinearKernels& kernels,
                                                           const at::Tensor& grad_output,
                                                           const at::Tensor& feats,
                                                           const at::Tensor& points);

}  // namespace customconv
