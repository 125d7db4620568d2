#include "ops/common/relayout_cuda.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace customconv {
namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;  // the block is kTile x kRowsPerPass threads

// out[b, j, i] = in[b, i, j] for in (batch, rows, cols), both contiguous.
// A block moves one kTile x kTile tile of one matrix: thread (x, y) reads
// elements (i0 + y + 8k, j0 + x) for k = 0..3 (a warp reads 32 neighbours of
// one input row), stores them in shared memory, and after the barrier writes
// elements (j0 + y + 8k, i0 + x) of the output (a warp writes 32 neighbours of
// one output row). The tile's rows are padded by one element so that the
// column reads of the second half hit 32 different banks. The grid's y and z
// loops cover row tiles and matrices beyond the grid's limits. T is an
// unsigned integer of the element's size: the copy moves bits.
template <typename T>
__global__ void __launch_bounds__(kTile * kRowsPerPass)
    batched_transpose_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t batch,
                             int64_t rows, int64_t cols) {
  __shared__ T tile[kTile][kTile + 1];
  const int64_t j0 = int64_t(blockIdx.x) * kTile;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    const T* src = in + b * rows * cols;
    T* dst = out + b * rows * cols;
    for (int64_t it = blockIdx.y; it < row_tiles; it += gridDim.y) {
      const int64_t i0 = it * kTile;
      const int64_t j = j0 + threadIdx.x;
#pragma unroll
      for (int k = 0; k < kTile; k += kRowsPerPass) {
        const int64_t i = i0 + threadIdx.y + k;
        if (i < rows && j < cols) tile[threadIdx.y + k][threadIdx.x] = src[i * cols + j];
      }
      __syncthreads();
      const int64_t i = i0 + threadIdx.x;
#pragma unroll
      for (int k = 0; k < kTile; k += kRowsPerPass) {
        const int64_t jj = j0 + threadIdx.y + k;
        if (jj < cols && i < rows) dst[jj * rows + i] = tile[threadIdx.x][threadIdx.y + k];
      }
      __syncthreads();  // the tile is reused by the next iteration
    }
  }
}

template <typename T>
void launch_transpose(const at::Tensor& in, at::Tensor& out, int64_t batch, int64_t rows,
                      int64_t cols) {
  const int64_t col_tiles = (cols + kTile - 1) / kTile, row_tiles = (rows + kTile - 1) / kTile;
  TORCH_CHECK(col_tiles <= std::numeric_limits<int>::max(), "to_memory_format: plane too large");
  const dim3 grid(unsigned(col_tiles), unsigned(std::min<int64_t>(row_tiles, 65535)),
                  unsigned(std::min<int64_t>(batch, 65535)));
  const dim3 block(kTile, kRowsPerPass);
  batched_transpose_kernel<T><<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
      static_cast<const T*>(in.const_data_ptr()), static_cast<T*>(out.mutable_data_ptr()), batch,
      rows, cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

at::Tensor to_memory_format(const at::Tensor& t, at::MemoryFormat format) {
  if (t.is_contiguous(format)) return t;
  const bool to_channels_last = format == at::MemoryFormat::ChannelsLast;
  const at::MemoryFormat other =
      to_channels_last ? at::MemoryFormat::Contiguous : at::MemoryFormat::ChannelsLast;
  const int64_t es = t.element_size();
  if (!t.is_cuda() || t.dim() != 4 || !t.is_contiguous(other) || t.numel() == 0 ||
      (es != 2 && es != 4)) {
    return t.contiguous(format);
  }
  const c10::cuda::CUDAGuard guard(t.device());
  at::Tensor out = at::empty(t.sizes(), t.options().memory_format(format));
  // NCHW -> channels_last: each image's (C, H*W) matrix transposed; back: (H*W, C).
  const int64_t n = t.size(0), c = t.size(1), hw = t.size(2) * t.size(3);
  const int64_t rows = to_channels_last ? c : hw, cols = to_channels_last ? hw : c;
  if (es == 2) {
    launch_transpose<uint16_t>(t, out, n, rows, cols);
  } else {
    launch_transpose<uint32_t>(t, out, n, rows, cols);
  }
  return out;
}

}  // namespace customconv
