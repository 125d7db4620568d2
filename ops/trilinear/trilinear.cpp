#include "ops/trilinear/trilinear.h"

#include "ops/common/trilinear_shapes.h"

#include <ATen/ATen.h>

namespace customconv {

at::Tensor trilinear_impl(const TrilinearKernels& kernels, const at::Tensor& feats,
                          const at::Tensor& points) {
  check_trilinear<int64_t>("trilinear_interpolation", feats, points);
  at::Tensor out = at::empty({feats.size(0), feats.size(2)}, feats.options());
  if (out.numel() > 0) kernels.forward(feats.contiguous(), points.contiguous(), out);
  return out;
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
  kernels.backward(grad_output.contiguous(), feats.contiguous(), points.contiguous(), grad_feats,
                   grad_points);
  return {grad_feats, grad_points};
}

}  // namespace customconv
