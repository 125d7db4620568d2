#include "ops/common/relayout_cuda.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "ops/common/index_divide.h"
#include "ops/common/launch.h"
#include "ops/common/strided_view.h"

namespace customconv {
namespace {

constexpr int kRowsPerPass = 8;  // the block is 32 x kRowsPerPass threads
// Elements a thread moves in one 8-byte access (kVector<T>), and the side of
// a tile: a warp's 32 accesses along one row.
template <typename T>
constexpr int kVector = 8 / int(sizeof(T));
template <typename T>
constexpr int kTile = 32 * kVector<T>;

// out[b, j, i] = in[b, i, j] for in (batch, rows, cols), both contiguous;
// its tiles counted on the host (32-bit: the kernel decodes a tile's
// coordinates with two 32-bit divisions).
struct Transpose {
  const void* in;
  void* out;
  int64_t rows, cols;
  uint32_t row_tiles, col_tiles, tiles;
  // Whether the rows are read (columns a whole number of vectors, `in`
  // 8-byte aligned) and written (rows a whole number of vectors, `out`
  // aligned) in vectors: vectors_fit.
  bool read_vectors, write_vectors;
};
struct Transposes {
  Transpose first, second;  // second: none where first.tiles == total
  uint32_t total;
};

// Each block moves kTile x kTile tiles of the jobs' matrices (128 x 128 in
// 16-bit, 64 x 64 in float32), numbered over both jobs one after the other
// (job, matrix, row tile, column tile; a grid stride loop covers more tiles
// than blocks). With V = kVector (4 in 16-bit, 2 in float32), thread (x, y)
// reads the elements (i0 + y + 8k, j0 + V x to V x + V - 1) for each k (a
// warp reads 32 V neighbours of one input row), stores them in shared
// memory, and after the barrier writes the elements (j0 + y + 8k, i0 + V x
// to V x + V - 1) of the output (32 V neighbours of one output row a warp).
// Where the job's columns are whole vectors and its input 8-byte aligned
// (vectors_fit), each thread reads its V neighbours in one 8-byte access,
// else one element at a time; the same for the writes where the rows are
// whole vectors and the output aligned (7x7 planes, 49 positions, move in
// vectors on one side). On an H200 (N=32), 16-bit copies of 128 channels
// at 56x56 ran at 1450 GB/s with one element an access, at 2190 with 8-byte
// vectors. The rows' odd length (kTile + 1) keeps the second half's column
// reads to two lanes a bank. T is an unsigned integer
// of the element's size: the copy moves bits.
template <typename T>
__global__ void __launch_bounds__(32 * kRowsPerPass) batched_transpose_kernel(Transposes jobs) {
  constexpr int V = kVector<T>, kSide = kTile<T>;
  __shared__ T tile[kSide][kSide + 1];
  for (uint32_t t = blockIdx.x; t < jobs.total; t += gridDim.x) {
    const bool second = t >= jobs.first.tiles;
    const Transpose job = second ? jobs.second : jobs.first;
    const uint32_t rest = second ? t - jobs.first.tiles : t;
    const uint32_t per_matrix = job.row_tiles * job.col_tiles;
    const uint32_t b = rest / per_matrix, r = rest - b * per_matrix;
    const uint32_t it = r / job.col_tiles, jt = r - it * job.col_tiles;
    const int64_t i0 = int64_t(it) * kSide, j0 = int64_t(jt) * kSide;
    const T* src = static_cast<const T*>(job.in) + int64_t(b) * job.rows * job.cols;
    T* dst = static_cast<T*>(job.out) + int64_t(b) * job.rows * job.cols;
    const int64_t j = j0 + V * threadIdx.x;
#pragma unroll
    for (int k = 0; k < kSide; k += kRowsPerPass) {
      const int64_t i = i0 + threadIdx.y + k;
      if (i >= job.rows) break;
      T* to = &tile[threadIdx.y + k][V * threadIdx.x];
      if (job.read_vectors) {
        if (j < job.cols) {
          const uint2 v = *reinterpret_cast<const uint2*>(src + i * job.cols + j);
#pragma unroll
          for (int e = 0; e < V; ++e) to[e] = reinterpret_cast<const T*>(&v)[e];
        }
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          if (j + e < job.cols) to[e] = src[i * job.cols + j + e];
        }
      }
    }
    __syncthreads();
    const int64_t i = i0 + V * threadIdx.x;
#pragma unroll
    for (int k = 0; k < kSide; k += kRowsPerPass) {
      const int64_t jj = j0 + threadIdx.y + k;
      if (jj >= job.cols) break;
      if (job.write_vectors) {
        if (i < job.rows) {
          uint2 v;
#pragma unroll
          for (int e = 0; e < V; ++e) reinterpret_cast<T*>(&v)[e] = tile[V * threadIdx.x + e][threadIdx.y + k];
          *reinterpret_cast<uint2*>(dst + jj * job.rows + i) = v;
        }
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          if (i + e < job.rows) dst[jj * job.rows + i + e] = tile[V * threadIdx.x + e][threadIdx.y + k];
        }
      }
    }
    __syncthreads();  // the tile is reused by the next iteration
  }
}

// The most tiles one launch numbers.
constexpr int64_t kMaxTiles = std::numeric_limits<uint32_t>::max();

// The side of the kernel's tiles for t's elements (kTile).
int64_t tile_side(const at::Tensor& t) {
  return t.element_size() == 2 ? kTile<uint16_t> : kTile<uint32_t>;
}

// t's tiles (NCHW <-> channels_last of a 4-D tensor: per image, a (C, H*W)
// or (H*W, C) matrix), or -1 where there are more than kMaxTiles.
int64_t tile_count(const at::Tensor& t) {
  const int64_t n = t.size(0), c = t.size(1), hw = t.size(2) * t.size(3), side = tile_side(t);
  const int64_t tiles = n * ((c + side - 1) / side) * ((hw + side - 1) / side);
  return tiles <= kMaxTiles ? tiles : -1;
}

// Whether the kernel reads a matrix of `rows` x `cols` from `in` (or writes
// its transpose to it: rows and cols swapped) in 8-byte vectors: the row
// length a whole number of vectors, `in` 8-byte aligned.
bool vectors_fit(const void* in, int64_t cols, int64_t element_size) {
  return cols % (8 / element_size) == 0 && reinterpret_cast<uintptr_t>(in) % 8 == 0;
}

// Whether the transpose kernel changes t into `format`: a 4-D CUDA tensor of
// 2- or 4-byte elements, not empty, dense in the other format.
bool kernel_takes(const at::Tensor& t, at::MemoryFormat format) {
  const at::MemoryFormat other = format == at::MemoryFormat::ChannelsLast
                                     ? at::MemoryFormat::Contiguous
                                     : at::MemoryFormat::ChannelsLast;
  const int64_t es = t.element_size();
  return t.is_cuda() && t.dim() == 4 && t.numel() > 0 && (es == 2 || es == 4) && t.is_contiguous(other) &&
         tile_count(t) >= 0;
}

// The job changing t (kernel_takes) into `format`, written to `out`.
Transpose job_of(const at::Tensor& t, void* out, at::MemoryFormat format) {
  // NCHW -> channels_last: each image's (C, H*W) matrix transposed; back: (H*W, C).
  const int64_t c = t.size(1), hw = t.size(2) * t.size(3);
  const bool to_channels_last = format == at::MemoryFormat::ChannelsLast;
  const int64_t rows = to_channels_last ? c : hw, cols = to_channels_last ? hw : c;
  const int64_t side = tile_side(t);
  return {t.const_data_ptr(), out, rows, cols, uint32_t((rows + side - 1) / side),
          uint32_t((cols + side - 1) / side), uint32_t(tile_count(t)),
          vectors_fit(t.const_data_ptr(), cols, t.element_size()), vectors_fit(out, rows, t.element_size())};
}

void launch(const Transposes& jobs, int64_t element_size) {
  const dim3 grid(unsigned(std::min<int64_t>(jobs.total, std::numeric_limits<int>::max())));
  const dim3 block(32, kRowsPerPass);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (element_size == 2) {
    batched_transpose_kernel<uint16_t><<<grid, block, 0, stream>>>(jobs);
  } else {
    batched_transpose_kernel<uint32_t><<<grid, block, 0, stream>>>(jobs);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

constexpr int64_t kAlignment = 256;  // bytes, between the copies of one allocation

constexpr int kRowCopyThreads = 256;

// The rows in the order a kernel walks them: row q is (u, v) = (q / rows,
// q - u * rows), at src_u * u + src_v * v in src and dst_u * u + dst_v * v
// in dst (in units).
template <typename I>
struct RowWalk {
  I total;  // units
  Divide<I> inner, rows;
  I src_u, src_v, dst_u, dst_v;
};

// Thread i (grid-stride) moves unit l = i - q * inner of the walk's row q =
// i / inner (U: the element, or a vector of neighbouring elements). A warp's
// 32 units lie in one or two rows on both sides, each row contiguous, so
// reads and writes coalesce; the walk goes along the side whose rows are
// consecutive (dst's where it is a dense swap), so that one side's writes or
// reads are a single run. The divisions are FastDivide's for 32-bit
// indices: with plain ones, the column route's regrouping of 7x7 planes (512
// -> 2048 channels, N=32, float32) ran at a quarter of the memory's
// bandwidth on an H200.
template <typename U, typename I>
__global__ void __launch_bounds__(kRowCopyThreads)
    copy_rows_kernel(const U* __restrict__ src, U* __restrict__ dst, RowWalk<I> w) {
  for (I i = blockIdx.x * I(kRowCopyThreads) + threadIdx.x; i < w.total;
       i += I(gridDim.x) * kRowCopyThreads) {
    const I q = w.inner.div(i), l = i - q * I(w.inner.divisor);
    const I u = w.rows.div(q), v = q - u * I(w.rows.divisor);
    dst[u * w.dst_u + v * w.dst_v + l] = src[u * w.src_u + v * w.src_v + l];
  }
}

template <typename U, typename I>
void launch_copy_rows(const at::Tensor& src, const at::Tensor& dst, int64_t a, int64_t b,
                      int64_t inner, int64_t stride_a, int64_t stride_b) {
  const int64_t total = a * b * inner;
  // src row (r, j) at (r * b + j) * inner; dst row (r, j) at r * stride_a +
  // j * stride_b. Walked (r, j) where dst's rows of one r are farther apart
  // than those of one j, else (j, r).
  const RowWalk<I> w = stride_a >= stride_b ? RowWalk<I>{I(total),
                                                         Divide<I>::of(I(inner)),
                                                         Divide<I>::of(I(b)),
                                                         I(b * inner),
                                                         I(inner),
                                                         I(stride_a),
                                                         I(stride_b)}
                                            : RowWalk<I>{I(total),
                                                         Divide<I>::of(I(inner)),
                                                         Divide<I>::of(I(a)),
                                                         I(inner),
                                                         I(b * inner),
                                                         I(stride_b),
                                                         I(stride_a)};
  copy_rows_kernel<U, I><<<unsigned(blocks_for(total, kRowCopyThreads)), kRowCopyThreads, 0,
                           at::cuda::getCurrentCUDAStream()>>>(
      static_cast<const U*>(src.const_data_ptr()), static_cast<U*>(dst.mutable_data_ptr()), w);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The launch in units of `unit` bytes (1, 2, 4, 8 or 16), with 32-bit
// indices where every unit's index and offset (and the loop's last step)
// stays below 2^30.
template <typename U>
void copy_rows_in(const at::Tensor& src, const at::Tensor& dst, int64_t a, int64_t b, int64_t inner,
                  int64_t stride_a, int64_t stride_b) {
  const int64_t per = int64_t(sizeof(U)) / src.element_size();
  inner /= per, stride_a /= per, stride_b /= per;
  const int64_t reach = (a - 1) * stride_a + (b - 1) * stride_b + inner;
  if (a * b * inner < (int64_t(1) << 30) && reach < (int64_t(1) << 30)) {
    launch_copy_rows<U, int>(src, dst, a, b, inner, stride_a, stride_b);
  } else {
    launch_copy_rows<U, int64_t>(src, dst, a, b, inner, stride_a, stride_b);
  }
}

}  // namespace

void copy_rows_cuda(const at::Tensor& src, const at::Tensor& dst, int64_t a, int64_t b,
                    int64_t inner, int64_t dst_stride_a, int64_t dst_stride_b) {
  if (a * b * inner == 0) return;
  const c10::cuda::CUDAGuard guard(src.device());
  const int64_t es = src.element_size();
  const auto src_at = reinterpret_cast<uintptr_t>(src.const_data_ptr()),
             dst_at = reinterpret_cast<uintptr_t>(dst.const_data_ptr());
  // The widest unit (at most 16 bytes) that the row length, the strides and
  // both pointers are whole multiples of.
  int64_t unit = 16;
  while (unit > es &&
         !(unit % es == 0 && (inner * es) % unit == 0 && (dst_stride_a * es) % unit == 0 &&
           (dst_stride_b * es) % unit == 0 && src_at % unit == 0 && dst_at % unit == 0)) {
    unit /= 2;
  }
  switch (unit) {
    case 16:
      return copy_rows_in<uint4>(src, dst, a, b, inner, dst_stride_a, dst_stride_b);
    case 8:
      return copy_rows_in<uint2>(src, dst, a, b, inner, dst_stride_a, dst_stride_b);
    case 4:
      return copy_rows_in<uint32_t>(src, dst, a, b, inner, dst_stride_a, dst_stride_b);
    case 2:
      return copy_rows_in<uint16_t>(src, dst, a, b, inner, dst_stride_a, dst_stride_b);
    case 1:
      return copy_rows_in<uint8_t>(src, dst, a, b, inner, dst_stride_a, dst_stride_b);
    default:
      TORCH_CHECK(false, "copy_rows_cuda: unsupported element size ", es);
  }
}

at::Tensor to_memory_format(const at::Tensor& t, at::MemoryFormat format) {
  if (t.is_contiguous(format)) return t;
  if (!kernel_takes(t, format)) return t.contiguous(format);
  const c10::cuda::CUDAGuard guard(t.device());
  at::Tensor out = at::empty(t.sizes(), t.options().memory_format(format));
  const Transpose job = job_of(t, out.mutable_data_ptr(), format);
  launch({job, job, job.tiles}, t.element_size());
  return out;
}

void copy_in_memory_format(const at::Tensor& src, const at::Tensor& dst, at::MemoryFormat format) {
  if (src.is_contiguous(format) || !kernel_takes(src, format) || !dst.is_contiguous(format) ||
      dst.sizes() != src.sizes() || dst.scalar_type() != src.scalar_type() ||
      dst.device() != src.device()) {
    dst.copy_(src);
    return;
  }
  const c10::cuda::CUDAGuard guard(src.device());
  const Transpose job = job_of(src, dst.mutable_data_ptr(), format);
  launch({job, job, job.tiles}, src.element_size());
}

std::pair<at::Tensor, at::Tensor> to_channels_last_together(const at::Tensor& a, const at::Tensor& b) {
  constexpr auto kCl = at::MemoryFormat::ChannelsLast;
  if (a.is_contiguous(kCl) || b.is_contiguous(kCl) || !kernel_takes(a, kCl) || !kernel_takes(b, kCl) ||
      a.scalar_type() != b.scalar_type() || a.device() != b.device() ||
      tile_count(a) + tile_count(b) > kMaxTiles) {
    return {to_memory_format(a, kCl), to_memory_format(b, kCl)};
  }
  const c10::cuda::CUDAGuard guard(a.device());
  const int64_t es = a.element_size();
  const int64_t a_bytes = (a.numel() * es + kAlignment - 1) / kAlignment * kAlignment;
  const at::Tensor buffer = at::empty({a_bytes + b.numel() * es}, a.options().dtype(at::kByte));
  const auto view = [&](const at::Tensor& t, int64_t offset) {
    // (N, C, H, W) over bytes [offset, ...) of the buffer, channels_last.
    const int64_t c = t.size(1), h = t.size(2), w = t.size(3);
    return strided_view(buffer, t.sizes(), {h * w * c, 1, w * c, c}, offset / es, t.dtype());
  };
  at::Tensor ca = view(a, 0), cb = view(b, a_bytes);
  const Transpose first = job_of(a, ca.mutable_data_ptr(), kCl), second = job_of(b, cb.mutable_data_ptr(), kCl);
  launch({first, second, first.tiles + second.tiles}, es);
  return {ca, cb};
}

}  // namespace customconv
