#include "ops/conv2d/space_to_depth_cuda.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <limits>

#include "ops/common/launch.h"

namespace customconv {
namespace {

constexpr int kThreads = 256;
constexpr int kVector = 4;  // channels per phase (cv) the kernel is built for

// The packing's geometry in 32-bit integers (the caller checks the sizes).
struct Geometry {
  int c, h, w;               // input channels and plane
  int sn, sc, sy, sx;        // input strides, in elements
  int sh, sw, ph, pw;        // stride and padding of the convolution
  int fold, bstep, oh, ow;   // packed columns folded, their step, packed plane
};

// Thread (n, a, b, j, u, v), in that order from slowest to fastest: the
// kVector channels of phase (u, v) of folded column j at packed position
// (a, b), one vector store; neighbouring threads store to neighbouring
// addresses (a packed position's channels are consecutive). The loads are
// gathers: the input of a stem is small next to its output. A grid-stride
// loop covers the rest.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    space_to_depth_kernel(const T* __restrict__ in, T* __restrict__ out, Geometry g, int total) {
  struct alignas(sizeof(T) * kVector) Vec {
    T v[kVector];
  };
  for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += gridDim.x * blockDim.x) {
    int rest = idx;
    const int v = rest % g.sw;
    rest /= g.sw;
    const int u = rest % g.sh;
    rest /= g.sh;
    const int j = rest % g.fold;
    rest /= g.fold;
    const int b = rest % g.ow;
    rest /= g.ow;
    const int a = rest % g.oh;
    const int n = rest / g.oh;
    const int y = g.sh * a + u - g.ph, x = g.sw * (g.bstep * b + j) + v - g.pw;
    Vec r;
    const bool inside = y >= 0 && y < g.h && x >= 0 && x < g.w;
    const T* src = in + int64_t(n) * g.sn + int64_t(y) * g.sy + int64_t(x) * g.sx;
#pragma unroll
    for (int c = 0; c < kVector; ++c) r.v[c] = inside && c < g.c ? src[int64_t(c) * g.sc] : T(0);
    reinterpret_cast<Vec*>(out)[idx] = r;
  }
}

bool fits_int(int64_t v) { return v >= 0 && v <= std::numeric_limits<int>::max(); }

}  // namespace

at::Tensor space_to_depth_cuda(const at::Tensor& t, const SpaceToDepth& p, int64_t oh, int64_t ow) {
  TORCH_INTERNAL_ASSERT(t.is_cuda() && t.dim() == 4 && t.size(1) <= p.cv && p.cv == kVector);
  const c10::cuda::CUDAGuard guard(t.device());
  at::Tensor out = empty_channels_last(t, t.size(0), p.fold * p.sh * p.sw * p.cv, oh, ow);
  const int64_t total = out.numel() / p.cv;
  if (total == 0) return out;
  for (int64_t v : {total, t.stride(0) * t.size(0), p.sw * (p.bstep * ow + p.fold) + p.pw,
                    p.sh * oh + p.ph}) {
    TORCH_INTERNAL_ASSERT(fits_int(v), "space_to_depth_cuda: sizes past 32-bit indexing");
  }
  const Geometry g{int(t.size(1)), int(t.size(2)), int(t.size(3)), int(t.stride(0)), int(t.stride(1)),
                   int(t.stride(2)), int(t.stride(3)), int(p.sh), int(p.sw), int(p.ph), int(p.pw),
                   int(p.fold), int(p.bstep), int(oh), int(ow)};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "space_to_depth", [&] {
    space_to_depth_kernel<scalar_t>
        <<<blocks_for(total, kThreads), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
            t.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), g, int(total));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace customconv
