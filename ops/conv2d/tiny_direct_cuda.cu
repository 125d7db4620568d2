#include "ops/conv2d/tiny_direct.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <limits>

#include "ops/common/launch.h"

namespace customconv {
namespace {

constexpr int kThreads = 128;

// One call's geometry: input (n, c, h, w), output (n, k, p, q), weight
// (k, cg, r, s), NCHW and contiguous.
struct Geometry {
  int n, c, h, w, k, p, q;
  int cg, kg;  // channels per group: input, output
  int r, s, sh, sw, ph, pw, dh, dw;
};

// One thread per output element, in the output's (n, k, y, x) order, so that
// a warp's stores fall on consecutive positions of a row. Each thread sums
// its group's cg channels x r x s taps in a fixed order (taps outside the
// image skipped), starting from the bias, in A (float, or double for double).
template <typename T, typename A>
__global__ void __launch_bounds__(kThreads)
    tiny_forward_kernel(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,
                   T* __restrict__ y, Geometry g, int total) {
  const int e = blockIdx.x * kThreads + threadIdx.x;
  if (e >= total) return;
  const int ox = e % g.q, oy = e / g.q % g.p, k = e / (g.q * g.p) % g.k, n = e / (g.q * g.p * g.k);
  const int c0 = k / g.kg * g.cg;
  A acc = bias != nullptr ? static_cast<A>(bias[k]) : A(0);
  const T* wk = wt + int64_t(k) * g.cg * g.r * g.s;
  for (int c = 0; c < g.cg; ++c) {
    const T* plane = x + (int64_t(n) * g.c + c0 + c) * g.h * g.w;
    for (int i = 0; i < g.r; ++i) {
      const int iy = oy * g.sh - g.ph + i * g.dh;
      if (iy < 0 || iy >= g.h) continue;
      for (int j = 0; j < g.s; ++j) {
        const int ix = ox * g.sw - g.pw + j * g.dw;
        if (ix < 0 || ix >= g.w) continue;
        acc += static_cast<A>(plane[iy * g.w + ix]) * static_cast<A>(wk[(c * g.r + i) * g.s + j]);
      }
    }
  }
  y[e] = static_cast<T>(acc);
}

bool takes(const at::Tensor& input, const at::Tensor& weight, const Conv2dShape<int64_t>& s) {
  if (!input.is_cuda() || !s.in.batched || !input.is_contiguous() ||
      conv2d_output_format(input, weight) != at::MemoryFormat::Contiguous) {
    return false;
  }
  const int64_t reduction = s.in.c / s.groups * s.win.kh * s.win.kw;
  const int64_t outputs = s.in.n * s.k * s.oh * s.ow;
  // (Indices are 32-bit: the input's too, bounded here.)
  return reduction > 0 && reduction <= kTinyDirectReduction && outputs * reduction <= kTinyDirectMacs &&
         input.numel() <= std::numeric_limits<int>::max();
}

}  // namespace

std::optional<at::Tensor> tiny_direct_conv2d_cuda(const at::Tensor& input, const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  const Conv2dShape<int64_t>& s) {
  if (!takes(input, weight, s)) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  at::Tensor out = at::empty({s.in.n, s.k, s.oh, s.ow}, input.options());
  if (out.numel() == 0) return out;
  const at::Tensor w = weight.contiguous();
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  // Every extent fits in int (takes): the outputs and the reduction are
  // bounded by kTinyDirectMacs, the input by its element count.
  const Window2d& k = s.win;
  const Geometry g{int(s.in.n), int(s.in.c), int(s.in.h), int(s.in.w), int(s.k), int(s.oh), int(s.ow),
                   int(s.in.c / s.groups), int(s.k / s.groups), int(k.kh), int(k.kw), int(k.sh), int(k.sw),
                   int(k.ph), int(k.pw), int(k.dh), int(k.dw)};
  const int total = int(out.numel());
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "tiny_conv2d", [&] {
    using A = at::opmath_type<scalar_t>;
    tiny_forward_kernel<scalar_t, A><<<unsigned(blocks_for(total, kThreads)), kThreads, 0, stream>>>(
        input.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(),
        has_bias ? b.const_data_ptr<scalar_t>() : nullptr, out.mutable_data_ptr<scalar_t>(), g, total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace customconv
