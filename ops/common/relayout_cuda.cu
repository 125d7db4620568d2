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
constexpr int kMaxJobs = 2;

// out[b, j, i] = in[b, i, j] for in (batch, rows, cols), both contiguous.
struct Transpose {
  const void* in;
  void* out;
  int64_t batch, rows, cols;
  __host__ __device__ int64_t tiles() const { return batch * ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile); }
};
struct Transposes {
  Transpose job[kMaxJobs];
  int jobs;
};

// Each block moves kTile x kTile tiles of the jobs' matrices, numbered over
// all jobs one after the other (job, matrix, row tile, column tile; a grid
// stride loop covers more tiles than blocks). Thread (x, y) reads elements
// (i0 + y + 8k, j0 + x) for k = 0..3 (a warp reads 32 neighbours of one input
// row), stores them in shared memory, and after the barrier writes elements
// (j0 + y + 8k, i0 + x) of the output (a warp writes 32 neighbours of one
// output row). The tile's rows are padded by one element so that the column
// reads of the second half hit 32 different banks. T is an unsigned integer
// of the element's size: the copy moves bits.
template <typename T>
__global__ void __launch_bounds__(kTile * kRowsPerPass) batched_transpose_kernel(Transposes jobs) {
  __shared__ T tile[kTile][kTile + 1];
  int64_t total = 0;
  for (int q = 0; q < jobs.jobs; ++q) total += jobs.job[q].tiles();
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    int64_t rest = t;
    int q = 0;
    while (rest >= jobs.job[q].tiles()) rest -= jobs.job[q].tiles(), ++q;
    const Transpose& job = jobs.job[q];
    const int64_t col_tiles = (job.cols + kTile - 1) / kTile, row_tiles = (job.rows + kTile - 1) / kTile;
    const int64_t b = rest / (row_tiles * col_tiles), r = rest % (row_tiles * col_tiles);
    const int64_t i0 = r / col_tiles * kTile, j0 = r % col_tiles * kTile;
    const T* src = static_cast<const T*>(job.in) + b * job.rows * job.cols;
    T* dst = static_cast<T*>(job.out) + b * job.rows * job.cols;
    const int64_t j = j0 + threadIdx.x;
#pragma unroll
    for (int k = 0; k < kTile; k += kRowsPerPass) {
      const int64_t i = i0 + threadIdx.y + k;
      if (i < job.rows && j < job.cols) tile[threadIdx.y + k][threadIdx.x] = src[i * job.cols + j];
    }
    __syncthreads();
    const int64_t i = i0 + threadIdx.x;
#pragma unroll
    for (int k = 0; k < kTile; k += kRowsPerPass) {
      const int64_t jj = j0 + threadIdx.y + k;
      if (jj < job.cols && i < job.rows) dst[jj * job.rows + i] = tile[threadIdx.x][threadIdx.y + k];
    }
    __syncthreads();  // the tile is reused by the next iteration
  }
}

// Whether the transpose kernel changes t into `format`: a 4-D CUDA tensor of
// 2- or 4-byte elements, not empty, dense in the other format.
bool kernel_takes(const at::Tensor& t, at::MemoryFormat format) {
  const at::MemoryFormat other = format == at::MemoryFormat::ChannelsLast
                                     ? at::MemoryFormat::Contiguous
                                     : at::MemoryFormat::ChannelsLast;
  const int64_t es = t.element_size();
  return t.is_cuda() && t.dim() == 4 && t.numel() > 0 && (es == 2 || es == 4) && t.is_contiguous(other);
}

// The job changing t (kernel_takes) into `format`, written to `out`.
Transpose job_of(const at::Tensor& t, void* out, at::MemoryFormat format) {
  // NCHW -> channels_last: each image's (C, H*W) matrix transposed; back: (H*W, C).
  const int64_t n = t.size(0), c = t.size(1), hw = t.size(2) * t.size(3);
  const bool to_channels_last = format == at::MemoryFormat::ChannelsLast;
  return {t.const_data_ptr(), out, n, to_channels_last ? c : hw, to_channels_last ? hw : c};
}

void launch(const Transposes& jobs, int64_t element_size) {
  int64_t total = 0;
  for (int q = 0; q < jobs.jobs; ++q) total += jobs.job[q].tiles();
  const dim3 grid(unsigned(std::min<int64_t>(total, std::numeric_limits<int>::max())));
  const dim3 block(kTile, kRowsPerPass);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (element_size == 2) {
    batched_transpose_kernel<uint16_t><<<grid, block, 0, stream>>>(jobs);
  } else {
    batched_transpose_kernel<uint32_t><<<grid, block, 0, stream>>>(jobs);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

constexpr int64_t kAlignment = 256;  // bytes, between the copies of one allocation

}  // namespace

at::Tensor to_memory_format(const at::Tensor& t, at::MemoryFormat format) {
  if (t.is_contiguous(format)) return t;
  if (!kernel_takes(t, format)) return t.contiguous(format);
  const c10::cuda::CUDAGuard guard(t.device());
  at::Tensor out = at::empty(t.sizes(), t.options().memory_format(format));
  launch({{job_of(t, out.mutable_data_ptr(), format)}, 1}, t.element_size());
  return out;
}

std::pair<at::Tensor, at::Tensor> to_channels_last_together(const at::Tensor& a, const at::Tensor& b) {
  constexpr auto kCl = at::MemoryFormat::ChannelsLast;
  if (a.is_contiguous(kCl) || b.is_contiguous(kCl) || !kernel_takes(a, kCl) || !kernel_takes(b, kCl) ||
      a.scalar_type() != b.scalar_type() || a.device() != b.device()) {
    return {to_memory_format(a, kCl), to_memory_format(b, kCl)};
  }
  const c10::cuda::CUDAGuard guard(a.device());
  const int64_t es = a.element_size();
  const int64_t a_bytes = (a.numel() * es + kAlignment - 1) / kAlignment * kAlignment;
  const at::Tensor buffer = at::empty({a_bytes + b.numel() * es}, a.options().dtype(at::kByte));
  const auto view = [&](const at::Tensor& t, int64_t offset) {
    // (N, C, H, W) over bytes [offset, ...) of the buffer, channels_last: a
    // tensor on the buffer's storage, made without a dispatcher call.
    const int64_t c = t.size(1), h = t.size(2), w = t.size(3);
    at::Tensor v = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(buffer.storage()),
                                                            buffer.key_set(), t.dtype());
    v.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), {h * w * c, 1, w * c, c}, offset / es);
    return v;
  };
  at::Tensor ca = view(a, 0), cb = view(b, a_bytes);
  launch({{job_of(a, ca.mutable_data_ptr(), kCl), job_of(b, cb.mutable_data_ptr(), kCl)}, 2}, es);
  return {ca, cb};
}

}  // namespace customconv
