// The column route's data movements on CUDA (column_route.h).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "ops/common/launch.h"
#include "ops/conv2d/column_route.h"

namespace customconv {
namespace {

constexpr int kThreads = 256;

// dst (b, a, inner) = src (a, b, inner), counted in units U of the element
// (16-byte vectors where `inner` and both pointers allow, else one element):
// thread i (grid-stride) writes dst's unit i, reading src's unit at the same
// position `l` of row (i / inner) % a of outer block (i / inner) / a. The
// writes are coalesced; the reads are too within each row of `inner` units
// (the column route's rows are output planes, 49 to 1023 positions).
template <typename U>
__global__ void __launch_bounds__(kThreads)
    swap_outer_dims_kernel(const U* __restrict__ src, U* __restrict__ dst, int64_t a, int64_t b,
                           int64_t inner) {
  const int64_t total = a * b * inner;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * kThreads) {
    const int64_t row = i / inner, l = i - row * inner;
    const int64_t j = row / a, r = row - j * a;  // dst (j, r, l) <- src (r, j, l)
    dst[i] = src[(r * b + j) * inner + l];
  }
}

template <typename U>
void launch_swap(const at::Tensor& src, const at::Tensor& dst, int64_t a, int64_t b,
                 int64_t inner) {
  const int64_t units = a * b * inner;
  swap_outer_dims_kernel<U>
      <<<unsigned(blocks_for(units, kThreads)), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          static_cast<const U*>(src.const_data_ptr()), static_cast<U*>(dst.mutable_data_ptr()), a,
          b, inner);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

bool aligned(const at::Tensor& t, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % bytes == 0;
}

// out[i] = the sum over s of partial[s * plane + i], in Acc, in slice order,
// rounded once; a thread per element, grid-stride.
template <typename Acc, typename Out>
__global__ void __launch_bounds__(kThreads)
    sum_slices_kernel(const Acc* __restrict__ partial, Out* __restrict__ out, int64_t slices,
                      int64_t plane) {
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < plane;
       i += int64_t(gridDim.x) * kThreads) {
    Acc sum = partial[i];
    for (int64_t s = 1; s < slices; ++s) sum += partial[s * plane + i];
    out[i] = static_cast<Out>(sum);
  }
}

}  // namespace

void swap_outer_dims_cuda(const at::Tensor& src, const at::Tensor& dst, int64_t a, int64_t b,
                          int64_t inner) {
  if (a * b * inner == 0) return;
  const c10::cuda::CUDAGuard guard(src.device());
  const int64_t es = src.element_size(), vec = 16 / es;
  if (inner % vec == 0 && aligned(src, 16) && aligned(dst, 16)) {
    launch_swap<uint4>(src, dst, a, b, inner / vec);
    return;
  }
  switch (es) {
    case 2:
      launch_swap<uint16_t>(src, dst, a, b, inner);
      break;
    case 4:
      launch_swap<uint32_t>(src, dst, a, b, inner);
      break;
    case 8:
      launch_swap<uint64_t>(src, dst, a, b, inner);
      break;
    default:
      TORCH_CHECK(false, "swap_outer_dims_cuda: unsupported element size ", es);
  }
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
        sum_slices_kernel<Acc, scalar_t><<<blocks, kThreads, 0, stream>>>(
            partial.const_data_ptr<Acc>(), out.mutable_data_ptr<scalar_t>(), slices, plane);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace customconv
