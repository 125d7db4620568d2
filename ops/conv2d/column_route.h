// Two data movements of conv2d's column route (conv2d.cpp) that a device may
// run as kernels of its own rather than as ATen's copy_ and sum: the
// GEMM result's rows regrouped into images (forward) and back (grad_output
// read by the input and weight gradients), and the weight gradient's
// partial products summed and rounded into the weight's dtype. ATen's
// versions set up a TensorIterator each, and the weight gradient's sum is
// followed by a second pass for the dtype: several times a raw launch's host
// time, on layers whose device time is a few microseconds. The implicit
// GEMMs' weight gradient (implicit_gemm.cpp) sums its slices with the same
// kernel.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace customconv {

// dst (b, a, inner) = src (a, b, inner) with its two outer dimensions
// swapped; both contiguous, of one dtype, on one device.
using SwapOuterDims = void (*)(const at::Tensor& src, const at::Tensor& dst, int64_t a, int64_t b,
                               int64_t inner);

// out (P elements, contiguous) = the sum over s of partial (S, P, contiguous;
// float32 for 16-bit out, else out's dtype), added in partial's dtype in the
// order s = 0, 1, ..., S - 1 and rounded once into out's dtype.
using SumSlices = void (*)(const at::Tensor& partial, const at::Tensor& out);

// Null members: ATen's copy_ and sum.
struct ColumnRouteKernels {
  SwapOuterDims swap_outer_dims = nullptr;
  SumSlices sum_slices = nullptr;
};

#ifdef CUSTOMCONV_WITH_CUDA
void swap_outer_dims_cuda(const at::Tensor& src, const at::Tensor& dst, int64_t a, int64_t b,
                          int64_t inner);
void sum_slices_cuda(const at::Tensor& partial, const at::Tensor& out);
inline ColumnRouteKernels cuda_column_route_kernels() {
  return {&swap_outer_dims_cuda, &sum_slices_cuda};
}
#endif

}  // namespace customconv
