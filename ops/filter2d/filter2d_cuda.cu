#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "ops/correlation/blocked_correlation.cuh"
#include "ops/common/launch.h"
#include "ops/correlation/plane_correlation.cuh"
#include "ops/correlation/plane_weight_grad.cuh"
#include "ops/filter2d/adjoint.h"
#include "ops/filter2d/border.h"
#include "ops/filter2d/filter2d.h"

namespace customconv {
namespace {

constexpr int kThreads = 256;
// filter2d's padded plane as the engines' loader: the border mode inside the
// padding, zero beyond it (read only by samples whose results are dropped).
struct BorderLoad {
  Border mode;
  int ph, pw;
  __device__ static int map(int t, int n, int pad, Border mode) {
    if (t < -pad || t >= n + pad) return -1;
    return static_cast<int>(border_index(t, n, mode));
  }
  __device__ int row(int y, int h) const { return map(y, h, ph, mode); }
  __device__ int col(int x, int w) const { return map(x, w, pw, mode); }
};

// Plane sizes and kernel as the engines' ints, or false when too large.
bool engine_sizes(int64_t h, int64_t w, const Filter2dShape& s, int (&v)[6]) {
  const int64_t all[6] = {h, w, s.kh, s.kw, s.ph, s.pw};
  for (int i = 0; i < 6; ++i) {
    if (all[i] >= (int64_t{1} << 30)) return false;
    v[i] = static_cast<int>(all[i]);
  }
  return true;
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

// The samples within `bh` rows or `bw` columns of a plane's edge (where the
// border folds extra gradient back), one thread each, enumerated as the top
// and bottom bands of full rows, then the left and right bands of the rows
// between; each gathers its whole gradient with filter2d_input_gradient.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    grad_input_band_kernel(const T* __restrict__ go, const T* __restrict__ kern, T* __restrict__ gi,
                           int64_t planes, int64_t h, int64_t w, int64_t bh, int64_t bw,
                           Filter2dShape s) {
  using acc_t = at::opmath_type<T>;
  const int64_t rows_part = 2 * bh * w, cols_part = (h - 2 * bh) * 2 * bw;
  const int64_t per_plane = rows_part + cols_part;
  const int64_t total = planes * per_plane;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = idx / per_plane, e = idx % per_plane;
    int64_t y, x;
    if (e < rows_part) {
      const int64_t r = e / w;
      y = r < bh ? r : h - 2 * bh + r;
      x = e % w;
    } else {
      const int64_t c = (e - rows_part) % (2 * bw);
      y = bh + (e - rows_part) / (2 * bw);
      x = c < bw ? c : w - 2 * bw + c;
    }
    gi[(p * h + y) * w + x] =
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
  int v[6];
  const bool sizes_ok = engine_sizes(h, w, s, v);
  // The zero border takes the blocked kernel where it can: one kernel for every plane.
  const bool blocked = sizes_ok && s.border == Border::Zeros &&
                       blocked_takes(s.kh, s.kw, 1, 1, 1, 1, planes.element_size());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, planes.scalar_type(), "filter2d_cuda", [&] {
        if (blocked) {
          const BlockedCorrelation g{int(n), 1, 1, 1, 1, v[0], v[1], v[0], v[1], v[4], v[5], false};
          if (launch_blocked_correlation<scalar_t>(
                  planes.const_data_ptr<scalar_t>(), kernel.const_data_ptr<scalar_t>(), nullptr,
                  out.data_ptr<scalar_t>(), g, planes.numel(), out.numel(), v[2], 1, stream))
            return;
        }
        if (sizes_ok) {
          const PlaneCorrelation g{n,    1,    1,    1,    0, 1, 1,    0,    1, v[0], v[1],
                                   v[0], v[1], v[2], v[3], 1, 1, v[4], v[5], 1, 1,    false};
          const scalar_t* in = planes.const_data_ptr<scalar_t>();
          const scalar_t* k = kernel.const_data_ptr<scalar_t>();
          scalar_t* o = out.data_ptr<scalar_t>();
          if (s.border == Border::Zeros
                  ? launch_plane_correlation<scalar_t>(in, k, nullptr, o, g, ZeroBorder{}, stream)
                  : launch_plane_correlation<scalar_t>(in, k, nullptr, o, g,
                                                       BorderLoad{s.border, v[4], v[5]}, stream))
            return;
        }
        const int64_t total = out.numel();
        forward_direct_kernel<scalar_t><<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
            planes.const_data_ptr<scalar_t>(), kernel.const_data_ptr<scalar_t>(),
            out.data_ptr<scalar_t>(), total, h, w, s);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

// The zero-border adjoint is the grad output correlated with the rotated
// kernel; other borders add the folded gradient near the edges, so the samples
// there are then recomputed whole by the band kernel.
void grad_input_cuda(const at::Tensor& grad_out, const at::Tensor& kernel,
                     const at::Tensor& grad_in, const Filter2dShape& s) {
  const c10::cuda::CUDAGuard guard(grad_out.device());
  const int64_t n = grad_out.size(0), h = grad_out.size(1), w = grad_out.size(2);
  const int64_t total = grad_in.numel();
  const int64_t bh = s.border == Border::Zeros ? 0 : s.ph + 1;
  const int64_t bw = s.border == Border::Zeros ? 0 : s.pw + 1;
  auto stream = at::cuda::getCurrentCUDAStream();
  int v[6];
  const bool sizes_ok = engine_sizes(h, w, s, v) && 2 * bh < h && 2 * bw < w;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_out.scalar_type(), "filter2d_grad_input_cuda", [&] {
        if (sizes_ok) {
          const PlaneCorrelation g{n,
                                   1,
                                   1,
                                   1,
                                   0,
                                   1,
                                   1,
                                   0,
                                   1,
                                   v[0],
                                   v[1],
                                   v[0],
                                   v[1],
                                   v[2],
                                   v[3],
                                   1,
                                   1,
                                   v[2] - 1 - v[4],
                                   v[3] - 1 - v[5],
                                   1,
                                   1,
                                   true};
          const BlockedCorrelation gb{int(n), 1, 1, 1, 1, v[0], v[1], v[0], v[1],
                                      v[2] - 1 - v[4], v[3] - 1 - v[5], true};
          const bool zero_adjoint_done =
              (blocked_takes(s.kh, s.kw, 1, 1, 1, 1, grad_out.element_size()) &&
               launch_blocked_correlation<scalar_t>(
                   grad_out.const_data_ptr<scalar_t>(), kernel.const_data_ptr<scalar_t>(),
                   nullptr, grad_in.data_ptr<scalar_t>(), gb, grad_out.numel(), grad_in.numel(),
                   v[2], 1, stream)) ||
              launch_plane_correlation<scalar_t>(
                  grad_out.const_data_ptr<scalar_t>(), kernel.const_data_ptr<scalar_t>(), nullptr,
                  grad_in.data_ptr<scalar_t>(), g, ZeroBorder{}, stream);
          if (zero_adjoint_done) {
            if (bh > 0) {
              const int64_t band = n * (2 * bh * w + (h - 2 * bh) * 2 * bw);
              grad_input_band_kernel<scalar_t><<<blocks_for(band, kThreads), kThreads, 0, stream>>>(
                  grad_out.const_data_ptr<scalar_t>(), kernel.const_data_ptr<scalar_t>(),
                  grad_in.data_ptr<scalar_t>(), n, h, w, bh, bw, s);
              C10_CUDA_KERNEL_LAUNCH_CHECK();
            }
            return;
          }
        }
        grad_input_kernel<scalar_t><<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
            grad_out.const_data_ptr<scalar_t>(), kernel.const_data_ptr<scalar_t>(),
            grad_in.data_ptr<scalar_t>(), total, h, w, s);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

void grad_kernel_cuda(const at::Tensor& grad_out, const at::Tensor& planes,
                      const at::Tensor& grad_kernel, const Filter2dShape& s) {
  const c10::cuda::CUDAGuard guard(planes.device());
  const int64_t h = planes.size(1), w = planes.size(2);
  const int64_t total_rows = planes.size(0) * h;
  const int64_t taps = s.kh * s.kw;
  // About 64K samples per block, at most 256 chunks per tap.
  const int64_t chunks =
      std::clamp<int64_t>(total_rows * w / 65536, 1, std::min<int64_t>(256, total_rows));
  auto stream = at::cuda::getCurrentCUDAStream();
  int v[6];
  const bool sizes_ok = engine_sizes(h, w, s, v);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, planes.scalar_type(), "filter2d_grad_kernel_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        if (sizes_ok) {
          const PlaneWeightGrad g{1,    planes.size(0), 1, 1, 1,    v[0], v[1], v[0], v[1],
                                  v[2], v[3],           1, 1, v[4], v[5], 1,    1};
          const WeightGradPlan p = plan_weight_grad<acc_t>(g);
          if (p.ok) {
            const at::Tensor partial = at::empty(
                {p.chunks * taps}, planes.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
            launch_plane_weight_grad<scalar_t>(
                grad_out.const_data_ptr<scalar_t>(), planes.const_data_ptr<scalar_t>(),
                partial.mutable_data_ptr<acc_t>(), grad_kernel.data_ptr<scalar_t>(), g, p,
                BorderLoad{s.border, v[4], v[5]}, stream);
            return;
          }
        }
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
