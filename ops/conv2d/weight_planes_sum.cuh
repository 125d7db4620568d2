// The last step of the weight gradients that reduce over output positions in
// slices (the tensor-core kernels of grouped_mma_grad_weight_cuda.cu and
// dense_mma_grad_weight_cuda.cu, and the column route's partial products,
// column_route_cuda.cu): the slices' planes summed in slice order and rounded
// once, so that the result repeats bit for bit.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/common/launch.h"

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

// The tensor-core 3x3 weight gradients' last launch: partial's float32
// planes (slices, k, 3, 3, cg) summed into out (k, cg, 3, 3), of dtype T, or
// float32 where a chunk of images keeps its sum unrounded, on `stream`.
template <typename T>
void sum_weight_planes(const at::Tensor& partial, const at::Tensor& out, int64_t slices,
                       int64_t plane, int64_t cg, cudaStream_t stream) {
  const int threads = 256;
  const unsigned blocks = unsigned(blocks_for(plane, threads));
  const bool reorder = !out.is_contiguous(at::MemoryFormat::ChannelsLast);
  if (out.scalar_type() == at::kFloat) {
    sum_planes_kernel<float, float><<<blocks, threads, 0, stream>>>(
        partial.const_data_ptr<float>(), out.mutable_data_ptr<float>(), slices, plane, int(cg),
        reorder);
  } else {
    sum_planes_kernel<float, T><<<blocks, threads, 0, stream>>>(
        partial.const_data_ptr<float>(), out.mutable_data_ptr<T>(), slices, plane, int(cg),
        reorder);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace customconv
