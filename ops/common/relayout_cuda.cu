#include "ops/common/relayout_cuda.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "ops/common/index_divide.h"
#include "ops/common/launch.h"
#include "ops/common/strided_view.h"

namespace customconv {
namespace {

constexpr int kRowsPerPass = 8;  // the block is 32 x kRowsPerPass threads
// Elements a thread moves in one access (kVector: two, in 8 bytes in float32
// and 4 in 16-bit), and the side of a tile: a warp's 32 accesses along one
// row. 16-bit tiles of 128 x 128 with 8-byte accesses took 94 registers a
// thread (two blocks a multiprocessor) and moved 256 channels at 14x14 with
// their 3x3 weight in 23.3 us on an H200; 64 x 64 tiles take 32 and 12.9 us.
template <typename T>
constexpr int kVector = 2;
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
  // aligned to a vector) and written (rows a whole number of vectors, `out`
  // aligned) in vectors: vectors_fit.
  bool read_vectors, write_vectors;
};
struct Transposes {
  Transpose first, second;  // second: none where first.tiles == total
  uint32_t total;
};

// The element e of the V elements of type T packed in one vector.
template <typename T>
using VectorOf = std::conditional_t<sizeof(T) == 4, uint2, uint32_t>;
template <typename T>
__device__ __forceinline__ T element_of(const VectorOf<T>& v, int e) {
  if constexpr (sizeof(T) == 4) {
    return e == 0 ? v.x : v.y;
  } else {
    return T(e == 0 ? (v & 0xffffu) : (v >> 16));
  }
}
template <typename T>
__device__ __forceinline__ void set_element(VectorOf<T>& v, int e, T value) {
  if constexpr (sizeof(T) == 4) {
    (e == 0 ? v.x : v.y) = value;
  } else {
    v = e == 0 ? ((v & 0xffff0000u) | value) : ((v & 0xffffu) | (uint32_t(value) << 16));
  }
}

// One tile of a job: its matrix's pointers and sizes, and its first row and column.
template <typename T>
struct TileAt {
  const T* src;
  T* dst;
  int64_t rows, cols, i0, j0;
  bool read_vectors, write_vectors;
};

template <typename T>
__device__ __forceinline__ TileAt<T> tile_at(const Transposes& jobs, uint32_t t) {
  constexpr int kSide = kTile<T>;
  const bool second = t >= jobs.first.tiles;
  const Transpose& job = second ? jobs.second : jobs.first;
  const uint32_t rest = second ? t - jobs.first.tiles : t;
  const uint32_t per_matrix = job.row_tiles * job.col_tiles;
  const uint32_t b = rest / per_matrix, r = rest - b * per_matrix;
  const uint32_t it = r / job.col_tiles, jt = r - it * job.col_tiles;
  const int64_t offset = int64_t(b) * job.rows * job.cols;
  return {static_cast<const T*>(job.in) + offset,
          static_cast<T*>(job.out) + offset,
          job.rows,
          job.cols,
          int64_t(it) * kSide,
          int64_t(jt) * kSide,
          job.read_vectors,
          job.write_vectors};
}

// Each block moves kTile x kTile tiles (64 x 64) of the jobs' matrices,
// numbered over both jobs one after the other (job, matrix, row tile, column
// tile); block b takes tiles b, b + grid, ... With V = kVector = 2, thread
// (x, y) reads the elements (i0 + y + 8p, j0 + V x to V x + V - 1) for each
// pass p (a warp reads 32 V neighbours of one input row) into registers,
// stores them in shared memory, and after the barrier writes the elements
// (j0 + y + 8p, i0 + V x to V x + V - 1) of the output (32 V neighbours of
// one output row a warp). Where the job's columns are whole vectors and its
// input aligned to a vector (vectors_fit), each thread reads its V
// neighbours in one access, else one element at a time; the same for the
// writes where the rows are whole vectors and the output aligned (7x7
// planes, 49 positions, move in vectors on one side). A thread issues all its reads of a tile
// before it stores any, and reads its next tile while it writes the current
// one, so that its loads are in flight while the block waits or writes: with
// one load at a time and one tile a block, 64 channels at 56x56 in float32
// (25.7 MB) took 38.9 us on an H200. The rows' odd length (kTile + 1)
// keeps the column reads to two lanes a bank. T is an unsigned integer of
// the element's size: the copy moves bits.
template <typename T>
__global__ void __launch_bounds__(32 * kRowsPerPass) batched_transpose_kernel(Transposes jobs) {
  constexpr int V = kVector<T>, kSide = kTile<T>, kPasses = kSide / kRowsPerPass;
  __shared__ T tile[kSide][kSide + 1];
  using Vector = VectorOf<T>;
  Vector held[kPasses];
  const auto read = [&](const TileAt<T>& at) {
    const int64_t j = at.j0 + V * threadIdx.x;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int64_t i = at.i0 + threadIdx.y + p * kRowsPerPass;
      held[p] = Vector{};
      if (i >= at.rows) continue;
      const T* row = at.src + i * at.cols;
      if (at.read_vectors) {
        if (j < at.cols) held[p] = *reinterpret_cast<const Vector*>(row + j);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          if (j + e < at.cols) set_element<T>(held[p], e, row[j + e]);
        }
      }
    }
  };
  uint32_t t = blockIdx.x;
  if (t >= jobs.total) return;
  TileAt<T> at = tile_at<T>(jobs, t);
  read(at);
  for (;;) {
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        tile[threadIdx.y + p * kRowsPerPass][V * threadIdx.x + e] = element_of<T>(held[p], e);
      }
    }
    __syncthreads();
    const uint64_t next = uint64_t(t) + gridDim.x;
    const bool more = next < jobs.total;
    TileAt<T> next_at = at;
    if (more) {
      next_at = tile_at<T>(jobs, uint32_t(next));
      read(next_at);
    }
    const int64_t i = at.i0 + V * threadIdx.x;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int64_t jj = at.j0 + threadIdx.y + p * kRowsPerPass;
      if (jj >= at.cols) break;
      T* row = at.dst + jj * at.rows;
      if (at.write_vectors) {
        if (i < at.rows) {
          Vector v{};
#pragma unroll
          for (int e = 0; e < V; ++e)
            set_element<T>(v, e, tile[V * threadIdx.x + e][threadIdx.y + p * kRowsPerPass]);
          *reinterpret_cast<Vector*>(row + i) = v;
        }
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          if (i + e < at.rows)
            row[i + e] = tile[V * threadIdx.x + e][threadIdx.y + p * kRowsPerPass];
        }
      }
    }
    if (!more) break;
    __syncthreads();  // the tile is rewritten with the next one
    t = uint32_t(next);
    at = next_at;
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
// its transpose to it: rows and cols swapped) in vectors of kVector
// elements: the row length a whole number of vectors, `in` aligned to one.
bool vectors_fit(const void* in, int64_t cols, int64_t element_size) {
  const int64_t bytes = kVector<uint8_t> * element_size;
  return cols % kVector<uint8_t> == 0 && reinterpret_cast<uintptr_t>(in) % bytes == 0;
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

// The blocks of a launch: at most as many as the device holds at once, and
// as few as give each the same number of tiles (blocks that take one tile
// more than the others would leave the device part idle at the end).
template <typename T>
unsigned blocks_for_tiles(uint32_t tiles) {
  static const int per_sm = [] {
    int blocks = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, batched_transpose_kernel<T>, 32 * kRowsPerPass, 0));
    return std::max(blocks, 1);
  }();
  if (tiles == 0) return 1;
  const int64_t resident =
      int64_t(per_sm) * at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t per_block = (int64_t(tiles) + resident - 1) / resident;
  return unsigned((int64_t(tiles) + per_block - 1) / per_block);
}

void launch(const Transposes& jobs, int64_t element_size) {
  const dim3 block(32, kRowsPerPass);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (element_size == 2) {
    batched_transpose_kernel<uint16_t>
        <<<blocks_for_tiles<uint16_t>(jobs.total), block, 0, stream>>>(jobs);
  } else {
    batched_transpose_kernel<uint32_t>
        <<<blocks_for_tiles<uint32_t>(jobs.total), block, 0, stream>>>(jobs);
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
