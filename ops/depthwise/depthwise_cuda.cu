#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "ops/correlation/blocked_correlation.cuh"
#include "ops/correlation/blocked_transposed_correlation.cuh"
#include "ops/correlation/blocked_weight_grad.cuh"
#include "ops/common/launch.h"
#include "ops/correlation/plane_correlation.cuh"
#include "ops/correlation/plane_weight_grad.cuh"
#include "ops/depthwise/depthwise.h"

namespace customconv {
namespace {

constexpr int kThreads = 256;

struct Dims {
  int64_t n, c, h, w, mult, oh, ow;
};

// Direct kernels, for geometries the tiled engines do not take (shared memory
// or index range exceeded).

// One thread per output element (image, output channel, y, x), neighbouring
// threads along x; each sums its kh*kw taps in opmath precision and stores
// act(sum + bias).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ in, const T* __restrict__ wt, const T* __restrict__ bias,
                   T* __restrict__ out, int64_t total, Dims d, Window2d k, Activation act) {
  using acc_t = at::opmath_type<T>;
  const int64_t kc = d.c * d.mult;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t x = idx % d.ow;
    const int64_t y = (idx / d.ow) % d.oh;
    const int64_t p = idx / (d.ow * d.oh);
    const int64_t oc = p % kc, n = p / kc;
    const T* plane = in + (n * d.c + oc / d.mult) * d.h * d.w;
    const T* taps = wt + oc * k.kh * k.kw;
    acc_t acc = bias ? static_cast<acc_t>(bias[oc]) : acc_t(0);
    for (int64_t i = 0; i < k.kh; ++i) {
      const int64_t iy = y * k.sh - k.ph + i * k.dh;
      if (iy < 0 || iy >= d.h) continue;
      for (int64_t j = 0; j < k.kw; ++j) {
        const int64_t ix = x * k.sw - k.pw + j * k.dw;
        if (ix >= 0 && ix < d.w) {
          acc += static_cast<acc_t>(taps[i * k.kw + j]) * static_cast<acc_t>(plane[iy * d.w + ix]);
        }
      }
    }
    if (act != Activation::kIdentity) acc = activate<acc_t>(act, acc);
    out[idx] = static_cast<T>(acc);
  }
}

// One thread per input element (image, channel, iy, ix); it gathers, in a
// fixed order, the gradient of every output position of its m output
// channels whose window covers it (no atomics: deterministic).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    grad_input_kernel(const T* __restrict__ go, const T* __restrict__ wt, T* __restrict__ gi,
                      int64_t total, Dims d, Window2d k) {
  using acc_t = at::opmath_type<T>;
  const int64_t kc = d.c * d.mult;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ix = idx % d.w;
    const int64_t iy = (idx / d.w) % d.h;
    const int64_t p = idx / (d.w * d.h);
    const int64_t c = p % d.c, n = p / d.c;
    acc_t acc = 0;
    for (int64_t m = 0; m < d.mult; ++m) {
      const int64_t oc = c * d.mult + m;
      const T* gplane = go + (n * kc + oc) * d.oh * d.ow;
      const T* taps = wt + oc * k.kh * k.kw;
      for (int64_t i = 0; i < k.kh; ++i) {
        const int64_t ty = iy + k.ph - i * k.dh;
        if (ty < 0) break;
        if (ty % k.sh != 0) continue;
        const int64_t y = ty / k.sh;
        if (y >= d.oh) continue;
        for (int64_t j = 0; j < k.kw; ++j) {
          const int64_t tx = ix + k.pw - j * k.dw;
          if (tx < 0) break;
          if (tx % k.sw != 0) continue;
          const int64_t x = tx / k.sw;
          if (x >= d.ow) continue;
          acc += static_cast<acc_t>(taps[i * k.kw + j]) * static_cast<acc_t>(gplane[y * d.ow + x]);
        }
      }
    }
    gi[idx] = static_cast<T>(acc);
  }
}

// One block per (output channel, tap): its threads stride over batch and
// output positions, each keeping a private sum; the block then reduces the
// sums in a fixed tree (deterministic, no atomics).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    grad_weight_kernel(const T* __restrict__ go, const T* __restrict__ in, T* __restrict__ gw,
                       Dims d, Window2d k) {
  using acc_t = at::opmath_type<T>;
  __shared__ acc_t partial[kThreads];
  const int64_t kc = d.c * d.mult;
  const int64_t taps = k.kh * k.kw;
  const int64_t oc = blockIdx.x / taps, tap = blockIdx.x % taps;
  const int64_t i = tap / k.kw, j = tap % k.kw;
  const int64_t c = oc / d.mult;
  const int64_t per_image = d.oh * d.ow;
  acc_t sum = 0;
  for (int64_t q = threadIdx.x; q < d.n * per_image; q += blockDim.x) {
    const int64_t n = q / per_image, l = q % per_image;
    const int64_t y = l / d.ow, x = l % d.ow;
    const int64_t iy = y * k.sh - k.ph + i * k.dh;
    const int64_t ix = x * k.sw - k.pw + j * k.dw;
    if (iy >= 0 && iy < d.h && ix >= 0 && ix < d.w) {
      sum += static_cast<acc_t>(go[(n * kc + oc) * per_image + l]) *
             static_cast<acc_t>(in[((n * d.c + c) * d.h + iy) * d.w + ix]);
    }
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) gw[blockIdx.x] = static_cast<T>(partial[0]);
}

Dims dims_of(const at::Tensor& input, const at::Tensor& out_like, int64_t mult) {
  return {input.size(0), input.size(1),    input.size(2),   input.size(3),
          mult,          out_like.size(2), out_like.size(3)};
}

// The window and plane sizes as the engines' ints, or false when any is too
// large for them.
bool engine_geometry(const Dims& d, const Window2d& k, int (&v)[12]) {
  const int64_t all[12] = {d.h, d.w, d.oh, d.ow, k.kh, k.kw, k.sh, k.sw, k.ph, k.pw, k.dh, k.dw};
  for (int i = 0; i < 12; ++i) {
    if (all[i] >= (int64_t{1} << 30)) return false;
    v[i] = static_cast<int>(all[i]);
  }
  return true;
}

bool blocked_window(const Dims& d, const Window2d& k, const at::Tensor& data) {
  return blocked_takes(k.kh, k.kw, k.sh, k.sw, k.dh, k.dw, data.element_size()) &&
         d.h < (1 << 30) && d.w < (1 << 30) && d.oh < (1 << 30) && d.ow < (1 << 30);
}

// The forward kernels (tensor-core, streamed-tile, staged-tile, shared-taps,
// register-blocked, then large-kernel and tiled, then forward_kernel) all
// apply `act` to sum + bias as they store.
bool forward_blocked(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                     const at::Tensor& output, const Dims& d, const Window2d& k, Activation act,
                     cudaStream_t stream) {
  if (!blocked_window(d, k, input)) return false;
  const BlockedCorrelation g{int(d.n * d.c * d.mult), int(d.c * d.mult), int(d.c), 1, int(d.mult),
                             int(d.h), int(d.w), int(d.oh), int(d.ow), int(k.ph), int(k.pw),
                             false, act};
  bool done = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d_cuda", [&] {
        done = launch_blocked_correlation<scalar_t>(
            input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
            bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr, output.data_ptr<scalar_t>(),
            g, input.numel(), output.numel(), int(k.kh), int(k.sh), stream);
      });
  return done;
}

// Stride 2: each input-gradient element gathers the grad-output samples that
// reach it (blocked_transposed_correlation.cuh); channel c sums its m output
// planes.
bool grad_input_transposed(const at::Tensor& grad_output, const at::Tensor& weight,
                           const at::Tensor& grad_input, const Dims& d, const Window2d& k,
                           cudaStream_t stream) {
  const BlockedTransposed g{int(d.n * d.c), int(d.c),  int(d.c * d.mult), int(d.mult), int(d.h),
                            int(d.w),       int(d.oh), int(d.ow),         int(k.ph),   int(k.pw)};
  bool done = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_conv2d_grad_input_cuda", [&] {
        done = launch_blocked_transposed<scalar_t>(
            grad_output.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
            grad_input.data_ptr<scalar_t>(), g, grad_output.numel(), grad_input.numel(), int(k.kh),
            stream);
      });
  return done;
}

// Stride 1: the input gradient is the grad output correlated with the rotated
// taps, padded by k - 1 - padding; channel c sums its m output planes.
// Stride 2: grad_input_transposed.
bool grad_input_blocked(const at::Tensor& grad_output, const at::Tensor& weight,
                        const at::Tensor& grad_input, const Dims& d, const Window2d& k,
                        cudaStream_t stream) {
  if (!blocked_window(d, k, grad_output)) return false;
  if (k.sh == 2) return grad_input_transposed(grad_output, weight, grad_input, d, k, stream);
  const BlockedCorrelation g{int(d.n * d.c), int(d.c), int(d.c * d.mult), int(d.mult), 1,
                             int(d.oh), int(d.ow), int(d.h), int(d.w), int(k.kh - 1 - k.ph),
                             int(k.kw - 1 - k.pw), true};
  bool done = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_conv2d_grad_input_cuda", [&] {
        done = launch_blocked_correlation<scalar_t>(
            grad_output.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(), nullptr,
            grad_input.data_ptr<scalar_t>(), g, grad_output.numel(), grad_input.numel(), int(k.kh),
            1, stream);
      });
  return done;
}

// out (N, C*m) planes = correlation of input plane oc / m with taps oc.
bool forward_tiled(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                   const at::Tensor& output, const Dims& d, const Window2d& k, Activation act,
                   cudaStream_t stream) {
  int v[12];
  if (!engine_geometry(d, k, v)) return false;
  const int64_t kc = d.c * d.mult;
  const PlaneCorrelation g{d.n * kc, 1,    1,    d.mult, 0,     1,    kc,   0,
                           kc,       v[0], v[1], v[2],   v[3],  v[4], v[5], v[6],
                           v[7],     v[8], v[9], v[10],  v[11], false, act};
  bool done = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d_cuda", [&] {
        done = launch_plane_correlation<scalar_t>(
            input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
            bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr, output.data_ptr<scalar_t>(),
            g, ZeroBorder{}, stream);
      });
  return done;
}

// A grad-output plane spread out by the stride (zeros between its samples),
// as the transposed correlation reads it.
struct StridedGather {
  int sh, sw;
  __device__ static int spread(int t, int s, int n) {
    if (t < 0) return -1;
    const int q = t / s;
    return q * s == t && q < n ? q : -1;
  }
  __device__ int row(int y, int h) const { return spread(y, sh, h); }
  __device__ int col(int x, int w) const { return spread(x, sw, w); }
};

// The input gradient is the grad output, spread out by the stride, correlated
// with the rotated taps and padded by dilation*(k-1) - padding; channel c sums
// its m output planes.
bool grad_input_tiled(const at::Tensor& grad_output, const at::Tensor& weight,
                      const at::Tensor& grad_input, const Dims& d, const Window2d& k,
                      cudaStream_t stream) {
  int v[12];
  if (!engine_geometry(d, k, v)) return false;
  const int64_t kc = d.c * d.mult;
  const PlaneCorrelation g{d.n * d.c,
                           d.mult,
                           d.mult,
                           1,
                           1,
                           d.mult,
                           kc,
                           1,
                           1,
                           v[2],
                           v[3],
                           v[0],
                           v[1],
                           v[4],
                           v[5],
                           1,
                           1,
                           static_cast<int>((k.kh - 1) * k.dh - k.ph),
                           static_cast<int>((k.kw - 1) * k.dw - k.pw),
                           v[10],
                           v[11],
                           true};
  bool done = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_conv2d_grad_input_cuda", [&] {
        const scalar_t* go = grad_output.const_data_ptr<scalar_t>();
        const scalar_t* w = weight.const_data_ptr<scalar_t>();
        scalar_t* gi = grad_input.data_ptr<scalar_t>();
        done = k.sh == 1 && k.sw == 1
                   ? launch_plane_correlation<scalar_t>(go, w, nullptr, gi, g, ZeroBorder{}, stream)
                   : launch_plane_correlation<scalar_t, false>(go, w, nullptr, gi, g,
                                                               StridedGather{v[6], v[7]}, stream);
      });
  return done;
}

// Weight plane oc (kc of them) sums over the n images; its grad-output plane
// is oc of image t, its input plane oc / mult of image t.
bool weight_grad_geometry(const Dims& d, const Window2d& k, PlaneWeightGrad& g) {
  int v[12];
  if (!engine_geometry(d, k, v)) return false;
  const int64_t kc = d.c * d.mult;
  g = PlaneWeightGrad{kc,   d.n,  kc,   d.c,  d.mult, v[0], v[1],  v[2], v[3],
                      v[4], v[5], v[6], v[7], v[8],   v[9], v[10], v[11]};
  return true;
}

template <typename acc_t>
at::Tensor partial_sums(const at::Tensor& like, int64_t count) {
  return at::empty({count}, like.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
}

// grad_bias, when defined, gets the bias gradient from the same pass.
bool grad_weight_blocked(const at::Tensor& grad_output, const at::Tensor& input,
                         const at::Tensor& grad_weight, const at::Tensor& grad_bias, const Dims& d,
                         const Window2d& k, cudaStream_t stream) {
  PlaneWeightGrad g;
  if (!weight_grad_geometry(d, k, g) || !blocked_weight_grad_takes(g, input.element_size())) {
    return false;
  }
  bool done = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d_grad_weight_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const scalar_t* go = grad_output.const_data_ptr<scalar_t>();
        const scalar_t* in = input.const_data_ptr<scalar_t>();
        const BlockedWeightGradPlan p =
            plan_blocked_weight_grad(g, blocked_weight_grad_cols(g, go, in));
        if (!p.ok) return;
        const at::Tensor partial = partial_sums<acc_t>(input, blocked_weight_grad_partials(g, p));
        launch_blocked_weight_grad<scalar_t>(
            go, in, partial.mutable_data_ptr<acc_t>(), grad_weight.data_ptr<scalar_t>(),
            grad_bias.defined() ? grad_bias.data_ptr<scalar_t>() : nullptr, g, p, stream);
        done = true;
      });
  return done;
}

bool grad_weight_tiled(const at::Tensor& grad_output, const at::Tensor& input,
                       const at::Tensor& grad_weight, const Dims& d, const Window2d& k,
                       cudaStream_t stream) {
  PlaneWeightGrad g;
  if (!weight_grad_geometry(d, k, g)) return false;
  bool done = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d_grad_weight_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const WeightGradPlan p = plan_weight_grad<acc_t>(g);
        if (!p.ok) return;
        const at::Tensor partial =
            partial_sums<acc_t>(input, g.weight_planes * p.chunks * g.kh * g.kw);
        launch_plane_weight_grad<scalar_t>(
            grad_output.const_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
            partial.mutable_data_ptr<acc_t>(), grad_weight.data_ptr<scalar_t>(), g, p, ZeroBorder{},
            stream);
        done = true;
      });
  return done;
}

void forward_cuda(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                  const at::Tensor& output, const Window2d& win, int64_t mult, Activation act) {
  const c10::cuda::CUDAGuard guard(input.device());
  const int64_t total = output.numel();
  if (total == 0) return;
  auto stream = at::cuda::getCurrentCUDAStream();
  const Dims d = dims_of(input, output, mult);
  if (forward_blocked(input, weight, bias, output, d, win, act, stream)) return;
  if (forward_tiled(input, weight, bias, output, d, win, act, stream)) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d_cuda", [&] {
        forward_kernel<scalar_t><<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
            input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
            bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr, output.data_ptr<scalar_t>(),
            total, d, win, act);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

void grad_input_cuda(const at::Tensor& grad_output, const at::Tensor& weight,
                     const at::Tensor& grad_input, const Window2d& win, int64_t mult) {
  const c10::cuda::CUDAGuard guard(grad_input.device());
  const int64_t total = grad_input.numel();
  if (total == 0) return;
  auto stream = at::cuda::getCurrentCUDAStream();
  const Dims d = dims_of(grad_input, grad_output, mult);
  if (grad_input_blocked(grad_output, weight, grad_input, d, win, stream)) return;
  if (grad_input_tiled(grad_output, weight, grad_input, d, win, stream)) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_conv2d_grad_input_cuda", [&] {
        grad_input_kernel<scalar_t><<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
            grad_output.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
            grad_input.data_ptr<scalar_t>(), total, d, win);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

void grad_weight_cuda(const at::Tensor& grad_output, const at::Tensor& input,
                      const at::Tensor& grad_weight, const Window2d& win, int64_t mult) {
  const c10::cuda::CUDAGuard guard(input.device());
  const int64_t blocks = grad_weight.numel();
  if (blocks == 0) return;
  auto stream = at::cuda::getCurrentCUDAStream();
  const Dims d = dims_of(input, grad_output, mult);
  if (grad_weight_blocked(grad_output, input, grad_weight, at::Tensor(), d, win, stream)) return;
  if (grad_weight_tiled(grad_output, input, grad_weight, d, win, stream)) return;
  TORCH_CHECK(blocks < (int64_t{1} << 31), "depthwise_conv2d_grad_weight: weight has ", blocks,
              " elements; at most 2^31 - 1 are supported");
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d_grad_weight_cuda", [&] {
        grad_weight_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
            grad_output.const_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
            grad_weight.data_ptr<scalar_t>(), d, win);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

// The blocked weight gradient adds up the bias gradient on the way; the other
// routes leave it to the caller.
bool grad_weight_bias_cuda(const at::Tensor& grad_output, const at::Tensor& input,
                           const at::Tensor& grad_weight, const at::Tensor& grad_bias,
                           const Window2d& win, int64_t mult) {
  const c10::cuda::CUDAGuard guard(input.device());
  if (grad_weight.numel() == 0 || grad_output.numel() == 0) return false;
  return grad_weight_blocked(grad_output, input, grad_weight, grad_bias,
                             dims_of(input, grad_output, mult), win,
                             at::cuda::getCurrentCUDAStream());
}

}  // namespace

DepthwiseKernels cuda_depthwise_kernels() {
  // channels_last: kernels of their own for the three passes
  // (depthwise_channels_last_cuda.h); the calls they decline use these NCHW
  // kernels with the layout changed in and out.
  return {&forward_cuda, &grad_input_cuda, &grad_weight_cuda, &grad_weight_bias_cuda,
          cuda_depthwise_channels_last_kernels()};
}

}  // namespace customconv
