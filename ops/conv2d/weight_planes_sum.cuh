// The last step of the weight gradients that reduce over output positions in
// slices (the tensor-core kernels of grouped_mma_grad_weight_cuda.cu and
// dense_mma_grad_weight_cuda.cu, and the column route's partial products,
// column_route_cuda.cu): the slices' planes summed in slice order and rounded
// once, so that the result repeats bit for bit.
#pragma once

#include <cstdint>

namespace customconv {

constexpr int kPlaneTaps = 9;  // 3x3 windows

// out = the slices' planes (`plane` elements each) summed in slice order in
// Acc and rounded once to Out. A thread per element, grid-stride. The
// column route's partial products (Acc float32 or float64) land as they are
// (`reorder` false); the tensor-core 3x3 weight gradients' float32 planes
// (k, 3, 3, cg) land in the weight's gradient (k x cg x 3 x 3), reordered
// (`reorder` true) unless it is channels_last, whose storage is (k, 3, 3, cg).
template <typename Acc, typename Out>
__global__ void sum_planes_kernel(const Acc* __restrict__ partial, Out* __restrict__ out,
                                  int64_t slices, int64_t plane, int cg, bool reorder) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < plane;
       i += int64_t(gridDim.x) * blockDim.x) {
    Acc sum = partial[i];
    for (int64_t s = 1; s < slices; ++s) sum += partial[s * plane + i];
    int64_t o = i;
    if (reorder) {
      const int64_t c = i % cg, tap = i / cg % kPlaneTaps, k = i / (cg * kPlaneTaps);
      o = (k * cg + c) * kPlaneTaps + tap;
    }
    out[o] = static_cast<Out>(sum);
  }
}

}  // namespace customconv
