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

}  // namespace customconv
