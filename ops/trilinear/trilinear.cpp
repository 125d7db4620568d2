#include "ops/trilinear/trilinear.h"

#include "ops/common/trilinear_shapes.h"

#include <ATen/ATen.h>

namespace customconv {

at::Tensor trilinear_impl(const TrilinearKernels& kernels, const at::Tensor& feats,
                          const at::Tensor& points) {
  check_trilinear<int64_t>("trilinear_interpolation", feats, points);
  at::Tensor out = at::empty({feats.size(0), feats.size(2)}, feats.options());
  if (out.numel() > 0) kernels.forward(feats.contiguous(), points.contiguous(), out, at::Tensor());
  return out;
}

std::tuple<at::Tensor, at::Tensor> trilinear_with_derivatives_impl(const TrilinearKernels& kernels,
                                                                   const at::Tensor& feats,
                                                                   const at::Tensor& points) {
  check_trilinear<int64_t>("trilinear_interpolation_with_derivatives", feats, points);
  const int64_t n = feats.size(0), f = feats.size(2);
  at::Tensor out = at::empty({n, f}, feats.options());
  at::Tensor derivatives = at::empty(
      {n, 3, f}, feats.options().dtype(trilinear_derivatives_dtype(feats.scalar_type())));
  if (out.numel() > 0) kernels.forward(feats.contiguous(), points.contiguous(), out, derivatives);
  return {out, derivatives};
}

std::tuple<at::Tensor, at::Tensor> trilinear_backward_from_derivatives_impl(
    const TrilinearKernels& kernels, const at::Tensor& grad_output, const at::Tensor& derivatives,
    const at::Tensor& points) {
  check_trilinear_backward_from_derivatives<int64_t>(
      "trilinear_interpolation_backward_from_derivatives", grad_output, derivatives, points);
  const int64_t n = derivatives.size(0), f = derivatives.size(2);
  at::Tensor grad_feats = at::empty({n, 8, f}, grad_output.options());
  at::Tensor grad_points = at::empty(points.sizes(), points.options());
  if (n == 0) return {grad_feats, grad_points};
  if (f == 0) return {grad_feats, grad_points.zero_()};
  kernels.backward(grad_output.contiguous(), derivatives.contiguous(), true, points.contiguous(),
                   grad_feats, grad_points);
  return {grad_feats, grad_points};
}

at::Tensor trilinear_grad_feats_impl(const TrilinearKernels& kernels, const at::Tensor& grad_output,
                                     const at::Tensor& points) {
  check_trilinear_grad_feats<int64_t>("trilinear_interpolation_grad_feats", grad_output, points);
  at::Tensor grad_feats =
      at::empty({grad_output.size(0), 8, grad_output.size(1)}, grad_output.options());
  if (grad_feats.numel() > 0) {
    kernels.grad_feats(grad_output.contiguous(), points.contiguous(), grad_feats);
  }
  return grad_feats;
}

std::tuple<at::Tensor, at::Tensor> trilinear_backward_impl(const TrilinearKernels& kernels,
                                                           const at::Tensor& grad_output,
                                                           const at::Tensor& feats,
                                                           const at::Tensor& points) {
  const char* op = "trilinear_interpolation_backward";
  check_trilinear_backward<int64_t>(op, grad_output, feats, points);
  at::Tensor grad_feats = at::empty(feats.sizes(), feats.options());
  at::Tensor grad_points = at::empty(points.sizes(), points.options());
  if (feats.size(0) == 0) return {grad_feats, grad_points};
  if (feats.size(2) == 0) return {grad_feats, grad_points.zero_()};
  kernels.backward(grad_output.contiguous(), feats.contiguous(), false, points.contiguous(),
                   grad_feats, grad_points);
  return {grad_feats, grad_points};
}

}  // namespace customconv
