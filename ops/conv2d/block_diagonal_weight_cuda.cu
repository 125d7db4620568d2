// block_diagonal_weight.h on CUDA: one pass over the result.
#include "ops/conv2d/block_diagonal_weight.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "ops/common/launch.h"

namespace customconv {
namespace {

constexpr int kLanes = 32, kRowsPerBlock = 8;  // threads a block: kLanes x kRowsPerBlock

// Rows of the result (k, tap), each `wide` = gs * cg merged channels long:
// warp y of a block takes rows blockIdx.x * 8 + y, then strided by the grid;
// its lanes walk the row's merged channels m 32 apart (coalesced writes). m
// in k's own group (its place in the merged group, [lo, lo + cg)) reads the
// weight through its strides; the others are zeros.
template <typename T>
__global__ void block_diagonal_kernel(const T* __restrict__ w, T* __restrict__ out, int rows,
                                      int wide, int kg, int cg, int gs, int taps, int kw,
                                      int64_t sk, int64_t sc, int64_t sh, int64_t sw) {
  for (int row = blockIdx.x * kRowsPerBlock + threadIdx.y; row < rows;
       row += gridDim.x * kRowsPerBlock) {
    const int k = row / taps, tap = row - k * taps;
    const int lo = (k / kg) % gs * cg;
    const int64_t from = k * sk + (tap / kw) * sh + (tap % kw) * sw;
    T* to = out + int64_t(row) * wide;
    for (int m = threadIdx.x; m < wide; m += kLanes) {
      to[m] = (m >= lo && m < lo + cg) ? w[from + (m - lo) * sc] : T(0);
    }
  }
}

}  // namespace

at::Tensor block_diagonal_weight_cuda(const at::Tensor& weight, int64_t groups, int64_t gs) {
  TORCH_CHECK(weight.dim() == 4 && weight.is_cuda(),
              "block_diagonal_weight_cuda: a 4-D CUDA weight");
  const int64_t k = weight.size(0), cg = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  TORCH_CHECK(groups > 0 && gs > 0 && groups % gs == 0 && k % groups == 0,
              "block_diagonal_weight_cuda: ", gs, " of ", groups, " groups merged, ", k,
              " output channels");
  at::Tensor out = at::empty({k, gs * cg, kh, kw},
                             weight.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (out.numel() == 0) return out;
  TORCH_CHECK(out.numel() < (int64_t(1) << 31), "block_diagonal_weight_cuda: weight too large");
  const int64_t rows = k * kh * kw;
  const c10::cuda::CUDAGuard guard(weight.device());
  const int64_t blocks = blocks_for(rows, kRowsPerBlock);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, weight.scalar_type(), "block_diagonal_weight_cuda", [&] {
        block_diagonal_kernel<scalar_t><<<unsigned(blocks), dim3(kLanes, kRowsPerBlock), 0,
                                          at::cuda::getCurrentCUDAStream()>>>(
            weight.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), int(rows),
            int(gs * cg), int(k / groups), int(cg), int(gs), int(kh * kw), int(kw),
            weight.stride(0), weight.stride(1), weight.stride(2), weight.stride(3));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return out;
}

}  // namespace customconv
