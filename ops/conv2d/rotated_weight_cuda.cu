// rotated_weight.h on CUDA: a tiled transpose of (K, C) per tap.
#include "ops/conv2d/rotated_weight.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "ops/common/launch.h"

namespace customconv {
namespace {

constexpr int kTile = 32;
constexpr int kRows = 8;  // threads a block: kTile x kRows

// Block (c tile, k tile, tap): 32 x 32 (k, c) pairs of one output tap
// t = i * kw + j. Thread (x, y) reads weight[k0 + y + 8 m][c0 + x] at the
// rotated tap into shared memory (along c: coalesced where the weight is
// channels_last), then writes out[c0 + y + 8 m][i][j][k0 + x] (along k:
// coalesced), m = 0..3.
template <typename T>
__global__ void rotated_weight_kernel(const T* __restrict__ w, T* __restrict__ out, int k, int c,
                                      int kh, int kw, int64_t sk, int64_t sc, int64_t sh,
                                      int64_t sw) {
  __shared__ T tile[kTile][kTile + 1];
  const int c0 = blockIdx.x * kTile, k0 = blockIdx.y * kTile, tap = blockIdx.z;
  const int i = tap / kw, j = tap % kw;
  const int64_t from = int64_t(kh - 1 - i) * sh + int64_t(kw - 1 - j) * sw;
  for (int m = threadIdx.y; m < kTile; m += kRows) {
    const int kk = k0 + m, cc = c0 + threadIdx.x;
    if (kk < k && cc < c) tile[m][threadIdx.x] = w[kk * sk + cc * sc + from];
  }
  __syncthreads();
  const int taps = kh * kw;
  for (int m = threadIdx.y; m < kTile; m += kRows) {
    const int cc = c0 + m, kk = k0 + threadIdx.x;
    if (kk < k && cc < c) out[(int64_t(cc) * taps + tap) * k + kk] = tile[threadIdx.x][m];
  }
}

}  // namespace

at::Tensor rotated_weight_cuda(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 4 && weight.is_cuda(), "rotated_weight_cuda: a 4-D CUDA weight");
  const int64_t k = weight.size(0), c = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  at::Tensor out =
      at::empty({c, k, kh, kw}, weight.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (out.numel() == 0) return out;
  TORCH_CHECK(
      (k + kTile - 1) / kTile <= 65535 && c < (int64_t(1) << 31) / kTile && kh * kw <= 65535,
      "rotated_weight_cuda: weight too large");
  const c10::cuda::CUDAGuard guard(weight.device());
  const dim3 grid(unsigned((c + kTile - 1) / kTile), unsigned((k + kTile - 1) / kTile),
                  unsigned(kh * kw));
  const dim3 block(kTile, kRows);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, weight.scalar_type(), "rotated_weight_cuda", [&] {
        rotated_weight_kernel<scalar_t><<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
            weight.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), int(k), int(c),
            int(kh), int(kw), weight.stride(0), weight.stride(1), weight.stride(2),
            weight.stride(3));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return out;
}

}  // namespace customconv
