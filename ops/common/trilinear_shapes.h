// Argument checks of trilinear_interpolation, shared by the CPU, CUDA and meta kernels.
#pragma once

#include "ops/common/tensor_checks.h"
#include "ops/common/window.h"

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

}  // namespace customconv
