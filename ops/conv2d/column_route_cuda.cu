// The column route's data movements on CUDA (column_route.h).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "ops/common/launch.h"
#include "ops/common/relayout_cuda.h"
#include "ops/conv2d/column_route.h"
#include "ops/conv2d/weight_planes_sum.cuh"

namespace customconv {
namespace {

constexpr int kThreads = 256;

}  // namespace

void swap_outer_dims_cuda(const at::Tensor& src, const at::Tensor& dst, int64_t a, int64_t b,
                          int64_t inner) {
  copy_rows_cuda(src, dst, a, b, inner, inner, a * inner);
}

void sum_slices_cuda(const at::Tensor& partial, const at::Tensor& out) {
  const int64_t plane = out.numel(), slices = partial.size(0);
  if (plane == 0) return;
  const c10::cuda::CUDAGuard guard(out.device());
  const unsigned blocks = unsigned(blocks_for(plane, kThreads));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, out.scalar_type(), "sum_slices_cuda", [&] {
        using Acc = at::opmath_type<scalar_t>;
        TORCH_INTERNAL_ASSERT(partial.scalar_type() == c10::CppTypeToScalarType<Acc>::value);
        sum_planes_kernel<Acc, scalar_t><<<blocks, kThreads, 0, stream>>>(
            partial.const_data_ptr<Acc>(), out.mutable_data_ptr<scalar_t>(), slices, plane, 1,
            /*reorder=*/false);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace customconv
