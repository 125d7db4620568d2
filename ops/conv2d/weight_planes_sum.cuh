// The last step of the tensor-core weight gradients that reduce over output
// positions in slices (grouped_mma_grad_weight_cuda.cu,
// dense_mma_grad_weight_cuda.cu): the slices' float32 planes summed in slice
// order and rounded once, so that the result repeats bit for bit.
#pragma once

#include <cstdint>

namespace customconv {

constexpr int kPlaneTaps = 9;  // 3x3 windows

// out (the weight's gradient, k x cg x 3 x 3; channels_last: stored (k, 3,
// 3, cg)) = the slices' planes (k, 3, 3, cg), `plane` elements each, summed
// in slice order in float32 and rounded once. A thread per element,
// grid-stride.
template <typename T>
__global__ void sum_planes_kernel(const float* __restrict__ partial, T* __restrict__ out,
                                  int slices, int64_t plane, int cg, bool channels_last) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < plane;
       i += int64_t(gridDim.x) * blockDim.x) {
    float sum = partial[i];
    for (int s = 1; s < slices; ++s) sum += partial[s * plane + i];
    int64_t o = i;
    if (!channels_last) {
      const int64_t c = i % cg, tap = i / cg % kPlaneTaps, k = i / (cg * kPlaneTaps);
      o = (k * cg + c) * kPlaneTaps + tap;
    }
    out[o] = static_cast<T>(sum);
  }
}

}  // namespace customconv
