#include "ops/filter2d/adjoint.h"

#include "ops/common/launch.h"
#include "ops/filter2d/border.h"
#include "ops/filter2d/filter2d.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <algorithm>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace customconv {
namespace {

constexpr int kThreads = 256;
constexpr int kTileW = 32, kTileH = 16;   // outputs per block of the tiled kernel
constexpr int kBlockX = 32, kBlockY = 8;  // its threads
constexpr int64_t kMaxSharedBytes = 48 * 1024;

// Tiled forward. Block (32, 8) computes a 32 x 16 tile of outputs of one plane
// (grid z strides over planes): the block stages the taps and the tile with its
// halo in shared memory, resolving the border while loading (no padded copy),
// then each thread computes two output rows from shared memory. The taps come
// from device memory, so the launch is stream-ordered and graph-safe.
template <typename T>
__global__ void __launch_bounds__(kBlockX* kBlockY)
    forward_tiled_kernel(const T* __restrict__ in, const T* __restrict__ kern, T* __restrict__ out,
                         int64_t planes, int64_t h, int64_t w, Filter2dShape s) {
  using acc_t = at::opmath_type<T>;
  extern __shared__ unsigned char smem[];
  acc_t* taps = reinterpret_cast<acc_t*>(smem);
  acc_t* tile = taps + s.kh * s.kw;
  const int tid = threadIdx.y * kBlockX + threadIdx.x;
  constexpr int nthreads = kBlockX * kBlockY;
  const int tile_w = kTileW + static_cast<int>(s.kw) - 1;
  const int tile_h = kTileH + static_cast<int>(s.kh) - 1;
  for (int t = tid; t < s.kh * s.kw; t += nthreads) taps[t] = static_cast<acc_t>(kern[t]);
  const int64_t x0 = int64_t(blockIdx.x) * kTileW, y0 = int64_t(blockIdx.y) * kTileH;
  for (int64_t p = blockIdx.z; p < planes; p += gridDim.z) {
    const T* plane = in + p * h * w;
    __syncthreads();  // the previous plane's tile is no longer read
    for (int t = tid; t < tile_h * tile_w; t += nthreads) {
      const int64_t gy = y0 + t / tile_w - s.ph, gx = x0 + t % tile_w - s.pw;
      acc_t v = 0;
      // Positions beyond the halo of any valid output are never read.
      if (gy >= -s.ph && gy < h + s.ph && gx >= -s.pw && gx < w + s.pw) {
        const int64_t sy = border_index(gy, h, s.border), sx = border_index(gx, w, s.border);
        if (sy >= 0 && sx >= 0) v = static_cast<acc_t>(plane[sy * w + sx]);
      }
      tile[t] = v;
    }
    __syncthreads();
    const int64_t x = x0 + threadIdx.x;
    for (int r = threadIdx.y; r < kTileH; r += kBlockY) {
      const int64_t y = y0 + r;
      if (y >= h || x >= w) continue;
      acc_t acc = 0;
      for (int i = 0; i < s.kh; ++i) {
        const acc_t* trow = tile + (r + i) * tile_w + threadIdx.x;
        const acc_t* krow = taps + i * s.kw;
        for (int j = 0; j < s.kw; ++j) acc += krow[j] * trow[j];
      }
      out[(p * h + y) * w + x] = static_cast<T>(acc);
    }
  }
}

// Generic forward for kernels too large for the tiled one: one thread per
// output sample (neighbouring threads along x), reading through the border map.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    forward_direct_kernel(const T* __restrict__ in, const T* __restrict__ kern, T* __restrict__ out,
                          int64_t total, int64_t h, int64_t w, Filter2dShape s) {
  using acc_t = at::opmath_type<T>;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t x = idx % w, y = (idx / w) % h, p = idx / (w * h);
    const T* plane = in + p * h * w;
    acc_t acc = 0;
    for (int64_t i = 0; i < s.kh; ++i) {
      const int64_t sy = border_index(y + i - s.ph, h, s.border);
      if (sy < 0) continue;
      for (int64_t j = 0; j < s.kw; ++j) {
        const int64_t sx = border_index(x + j - s.pw, w, s.border);
        if (sx >= 0)
          acc += static_cast<acc_t>(kern[i * s.kw + j]) * static_cast<acc_t>(plane[sy * w + sx]);
      }
    }
    out[idx] = static_cast<T>(acc);
  }
}

// One thread per input sample (neighbouring threads along x); each gathers its
// gradient with filter2d_input_gradient (fixed order, no atomics).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    grad_input_kernel(const T* __restrict__ go, const T* __restrict__ kern, T* __restrict__ gi,
                      int64_t total, int64_t h, int64_t w, Filter2dShape s) {
  using acc_t = at::opmath_type<T>;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t x = idx % w, y = (idx / w) % h, p = idx / (w * h);
    gi[idx] =
        static_cast<T>(filter2d_input_gradient<T, acc_t>(go + p * h * w, kern, y, x, h, w, s));
  }
}

// Fixed-order tree sum of one value per thread of a kThreads block; returns
// the total in thread 0.
template <typename Acc>
__device__ Acc block_sum(Acc v, Acc* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int step = kThreads / 2; step > 0; step >>= 1) {
    if (threadIdx.x < step) scratch[threadIdx.x] += scratch[threadIdx.x + step];
    __syncthreads();
  }
  return scratch[0];
}

// Kernel gradient, stage 1: block (chunk, tap) sums grad_out * padded input
// for its tap over its chunk of rows (all planes' rows in sequence), threads
// striding along the chunk; one partial per (tap, chunk).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    grad_kernel_partial_kernel(const T* __restrict__ go, const T* __restrict__ in,
                               at::opmath_type<T>* __restrict__ partial, int64_t total_rows,
                               int64_t h, int64_t w, Filter2dShape s) {
  using acc_t = at::opmath_type<T>;
  __shared__ acc_t scratch[kThreads];
  const int64_t chunks = gridDim.x, chunk = blockIdx.x, tap = blockIdx.y;
  const int64_t i = tap / s.kw, j = tap % s.kw;
  const int64_t r0 = total_rows * chunk / chunks, r1 = total_rows * (chunk + 1) / chunks;
  acc_t sum = 0;
  for (int64_t q = r0 * w + threadIdx.x; q < r1 * w; q += kThreads) {
    const int64_t r = q / w, x = q % w;
    const int64_t p = r / h, y = r % h;
    const int64_t sy = border_index(y + i - s.ph, h, s.border);
    const int64_t sx = border_index(x + j - s.pw, w, s.border);
    if (sy >= 0 && sx >= 0) {
      sum += static_cast<acc_t>(go[q]) * static_cast<acc_t>(in[(p * h + sy) * w + sx]);
    }
  }
  const acc_t total = block_sum(sum, scratch);
  if (threadIdx.x == 0) partial[tap * chunks + chunk] = total;
}

// Kernel gradient, stage 2: block `tap` adds that tap's partials in a fixed order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    grad_kernel_reduce_kernel(const at::opmath_type<T>* __restrict__ partial, T* __restrict__ gk,
                              int64_t chunks) {
  using acc_t = at::opmath_type<T>;
  __shared__ acc_t scratch[kThreads];
  acc_t sum = 0;
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) sum += partial[blockIdx.x * chunks + c];
  const acc_t total = block_sum(sum, scratch);
  if (threadIdx.x == 0) gk[blockIdx.x] = static_cast<T>(total);
}

void forward_cuda(const at::Tensor& planes, const at::Tensor& kernel, const at::Tensor& out,
                  const Filter2dShape& s) {
  const c10::cuda::CUDAGuard guard(planes.device());
  const int64_t n = planes.size(0), h = planes.size(1), w = planes.size(2);
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, planes.scalar_type(), "filter2d_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const int64_t smem = (s.kh * s.kw + (kTileH + s.kh - 1) * (kTileW + s.kw - 1)) *
                             static_cast<int64_t>(sizeof(acc_t));
        const int64_t grid_y = (h + kTileH - 1) / kTileH;
        if (smem <= kMaxSharedBytes && grid_y <= 65535) {
          const dim3 grid((w + kTileW - 1) / kTileW, grid_y, std::min<int64_t>(n, 65535));
          forward_tiled_kernel<scalar_t><<<grid, dim3(kBlockX, kBlockY), smem, stream>>>(
              planes.const_data_ptr<scalar_t>(), kernel.const_data_ptr<scalar_t>(),
              out.data_ptr<scalar_t>(), n, h, w, s);
        } else {
          const int64_t total = out.numel();
          forward_direct_kernel<scalar_t><<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
              planes.const_data_ptr<scalar_t>(), kernel.const_data_ptr<scalar_t>(),
              out.data_ptr<scalar_t>(), total, h, w, s);
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

void grad_input_cuda(const at::Tensor& grad_out, const at::Tensor& kernel,
                     const at::Tensor& grad_in, const Filter2dShape& s) {
  const c10::cuda::CUDAGuard guard(grad_out.device());
  const int64_t total = grad_in.numel();
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_out.scalar_type(), "filter2d_grad_input_cuda", [&] {
        grad_input_kernel<scalar_t><<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
            grad_out.const_data_ptr<scalar_t>(), kernel.const_data_ptr<scalar_t>(),
            grad_in.data_ptr<scalar_t>(), total, grad_out.size(1), grad_out.size(2), s);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

void grad_kernel_cuda(const at::Tensor& grad_out, const at::Tensor& planes,
                      const at::Tensor& grad_kernel, const Filter2dShape& s) {
  const c10::cuda::CUDAGuard guard(planes.device());
  const int64_t h = planes.size(1), w = planes.size(2);
  const int64_t total_rows = planes.size(0) * h;
  const int64_t taps = s.kh * s.kw;
  TORCH_CHECK(taps <= 65535,
              "filter2d_grad_kernel: kernels of more than 65535 taps are not supported");
  // About 64K samples per block, at most 256 chunks per tap.
  const int64_t chunks =
      std::clamp<int64_t>(total_rows * w / 65536, 1, std::min<int64_t>(256, total_rows));
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, planes.scalar_type(), "filter2d_grad_kernel_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const at::Tensor partial = at::empty(
            {taps * chunks}, planes.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
        grad_kernel_partial_kernel<scalar_t><<<dim3(chunks, taps), kThreads, 0, stream>>>(
            grad_out.const_data_ptr<scalar_t>(), planes.const_data_ptr<scalar_t>(),
            partial.data_ptr<acc_t>(), total_rows, h, w, s);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        grad_kernel_reduce_kernel<scalar_t><<<taps, kThreads, 0, stream>>>(
            partial.const_data_ptr<acc_t>(), grad_kernel.data_ptr<scalar_t>(), chunks);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace

Filter2dKernels cuda_filter2d_kernels() {
  return {&forward_cuda, &grad_input_cuda, &grad_kernel_cuda};
}

}  // namespace customconv
