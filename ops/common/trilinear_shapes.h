// Argument checks of trilinear_interpolation, shared by the CPU, CUDA and meta kernels.
#pragma once

#include "ops/common/tensor_checks.h"
#include "ops/common/window.h"

#include <ATen/OpMathType.h>

namespace customconv {

// feats (N, 8, F), points (N, 3), one dtype and device.
template <class I>
void check_trilinear(const char* op, const at::Tensor& feats, const at::Tensor& points) {
  check_dims(op, "feats", feats, {3});
  check_dims(op, "points", points, {2});
  check_floating(op, "feats", feats);
  check_same_dtype_device(op, "points", points, "feats", feats);
  TORCH_CHECK(dim_size<I>(feats, 1) == 8, op,
              ": feats must be (N, 8, F), one row of features per cube corner; got shape ",
              feats.sym_sizes());
  TORCH_CHECK(dim_size<I>(points, 1) == 3, op, ": points must be (N, 3); got shape ",
              points.sym_sizes());
  TORCH_CHECK(dim_size<I>(points, 0) == dim_size<I>(feats, 0), op, ": feats has ",
              dim_size<I>(feats, 0), " cubes but points has ", dim_size<I>(points, 0),
              " points; N must match");
}

// The arguments of trilinear_interpolation_backward: the forward's, and a
// grad_output (N, F) of the forward output's shape, dtype and device.
template <class I>
void check_trilinear_backward(const char* op, const at::Tensor& grad_output,
                              const at::Tensor& feats, const at::Tensor& points) {
  check_trilinear<I>(op, feats, points);
  check_dims(op, "grad_output", grad_output, {2});
  check_same_dtype_device(op, "grad_output", grad_output, "feats", feats);
  TORCH_CHECK(dim_size<I>(grad_output, 0) == dim_size<I>(feats, 0) &&
                  dim_size<I>(grad_output, 1) == dim_size<I>(feats, 2),
              op, ": grad_output has shape ", grad_output.sym_sizes(), " but the output is (",
              dim_size<I>(feats, 0), ", ", dim_size<I>(feats, 2), ")");
}

// The arguments of trilinear_interpolation_grad_feats: grad_output (N, F) and
// points (N, 3) of one dtype and device.
template <class I>
void check_trilinear_grad_feats(const char* op, const at::Tensor& grad_output,
                                const at::Tensor& points) {
  check_dims(op, "grad_output", grad_output, {2});
  check_dims(op, "points", points, {2});
  check_floating(op, "grad_output", grad_output);
  check_same_dtype_device(op, "points", points, "grad_output", grad_output);
  TORCH_CHECK(dim_size<I>(points, 1) == 3, op, ": points must be (N, 3); got shape ",
              points.sym_sizes());
  TORCH_CHECK(dim_size<I>(grad_output, 0) == dim_size<I>(points, 0), op, ": grad_output has ",
              dim_size<I>(grad_output, 0), " rows but points has ", dim_size<I>(points, 0),
              " points; N must match");
}

// The dtype of trilinear_interpolation_with_derivatives' derivatives for
// feats of dtype t: the accumulation type (float32 for 16-bit feats).
inline at::ScalarType trilinear_derivatives_dtype(at::ScalarType t) {
  return at::toOpMathType(t);
}

// The arguments of trilinear_interpolation_backward_from_derivatives:
// grad_output (N, F) and points (N, 3) of one dtype and device, and the
// forward's derivatives (N, 3, F) in that dtype's accumulation type.
template <class I>
void check_trilinear_backward_from_derivatives(const char* op, const at::Tensor& grad_output,
                                               const at::Tensor& derivatives,
                                               const at::Tensor& points) {
  check_dims(op, "grad_output", grad_output, {2});
  check_dims(op, "derivatives", derivatives, {3});
  check_dims(op, "points", points, {2});
  check_floating(op, "grad_output", grad_output);
  check_same_dtype_device(op, "points", points, "grad_output", grad_output);
  TORCH_CHECK(derivatives.device() == grad_output.device(), op, ": derivatives is on ",
              derivatives.device(), " but grad_output is on ", grad_output.device(),
              "; all tensors must be on one device");
  const auto want = trilinear_derivatives_dtype(grad_output.scalar_type());
  TORCH_CHECK(derivatives.scalar_type() == want, op, ": derivatives has dtype ",
              derivatives.scalar_type(), " but grad_output has dtype ", grad_output.scalar_type(),
              "; the derivatives must be ", want, " (as trilinear_interpolation_with_derivatives "
              "returns them)");
  TORCH_CHECK(dim_size<I>(points, 1) == 3, op, ": points must be (N, 3); got shape ",
              points.sym_sizes());
  TORCH_CHECK(dim_size<I>(derivatives, 0) == dim_size<I>(points, 0) &&
                  dim_size<I>(derivatives, 1) == 3,
              op, ": derivatives must be (N, 3, F) with N = ", dim_size<I>(points, 0),
              " points; got shape ", derivatives.sym_sizes());
  TORCH_CHECK(dim_size<I>(grad_output, 0) == dim_size<I>(derivatives, 0) &&
                  dim_size<I>(grad_output, 1) == dim_size<I>(derivatives, 2),
              op, ": grad_output has shape ", grad_output.sym_sizes(), " but the output is (",
              dim_size<I>(derivatives, 0), ", ", dim_size<I>(derivatives, 2), ")");
}

}  // namespace customconv
