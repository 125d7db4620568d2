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

// G lanes (a power of two, 1 to 32) per output element, the groups of G in
// the output's (n, k, y, x) order, so that a warp's stores fall on
// consecutive positions of a row. The reduction's terms, numbered
// r = (c * kh + i) * kw + j over the group's channels c and the taps (i, j),
// are dealt out round-robin: lane l sums r = l, l + G, l + 2G, ... in that
// order (taps outside the image skipped), in A (float, or double for
// double); the G partial sums are then added by a fixed tree of shuffles and
// the bias, so each output is summed in one fixed order. Splitting the
// reduction keeps each thread's chain short: with one thread per output,
// EfficientNet-B0's squeeze-and-excitation layers at N=32 (up to 672 -> 28
// on 1x1 planes) averaged 54 us a call on an H100.
template <typename T, typename A, int G>
__global__ void __launch_bounds__(kThreads)
    tiny_forward_kernel(const T* __restrict__ x, const T* __restrict__ wt,
                        const T* __restrict__ bias, T* __restrict__ y, Geometry g, int total) {
  static_assert(G >= 1 && G <= 32 && (G & (G - 1)) == 0 && kThreads % 32 == 0,
                "G lanes per output");
  const int t = blockIdx.x * kThreads + threadIdx.x;
  const int e = t / G, lane = t % G;
  const int taps = g.r * g.s, reduction = g.cg * taps;
  A acc = A(0);
  int k = 0;
  if (e < total) {  // no early return: every lane takes part in the shuffles
    const int ox = e % g.q, oy = e / g.q % g.p, n = e / (g.q * g.p * g.k);
    k = e / (g.q * g.p) % g.k;
    const T* image = x + (int64_t(n) * g.c + k / g.kg * g.cg) * g.h * g.w;
    const T* wk = wt + int64_t(k) * reduction;
    for (int r = lane; r < reduction; r += G) {
      const int c = r / taps, tap = r - c * taps, i = tap / g.s, j = tap - i * g.s;
      const int iy = oy * g.sh - g.ph + i * g.dh, ix = ox * g.sw - g.pw + j * g.dw;
      if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
      acc += static_cast<A>(image[(int64_t(c) * g.h + iy) * g.w + ix]) * static_cast<A>(wk[r]);
    }
  }
#pragma unroll
  for (int offset = G / 2; offset > 0; offset /= 2) {
    acc += __shfl_down_sync(0xffffffffu, acc, offset, G);
  }
  if (e < total && lane == 0) {
    if (bias != nullptr) acc += static_cast<A>(bias[k]);
    y[e] = static_cast<T>(acc);
  }
}

// Lanes per output: about 8 terms a lane, at most a warp.
int lanes_per_output(int64_t reduction) {
  int lanes = 1;
  while (lanes < 32 && lanes * 8 < reduction) lanes *= 2;
  return lanes;
}

template <typename T, typename A, int G>
void launch_tiny_forward(const T* x, const T* w, const T* b, T* y, const Geometry& g, int total,
                         cudaStream_t stream) {
  const auto blocks = unsigned(blocks_for(int64_t(total) * G, kThreads));
  tiny_forward_kernel<T, A, G><<<blocks, kThreads, 0, stream>>>(x, w, b, y, g, total);
}

bool takes(const at::Tensor& input, const at::Tensor& weight, const Conv2dShape<int64_t>& s) {
  if (!input.is_cuda() || !s.in.batched || !input.is_contiguous() ||
      conv2d_output_format(input, weight) != at::MemoryFormat::Contiguous) {
    return false;
  }
  const int64_t reduction = s.in.c / s.groups * s.win.kh * s.win.kw;
  const int64_t outputs = s.in.n * s.k * s.oh * s.ow;
  // (Indices are 32-bit: the input's too, and each term of a tap's input
  // row and column, oy * sh - ph + i * dh, bounded here so that their sum
  // fits: padding and dilation of 2^40 reach the input only through the
  // other routes' 64-bit arithmetic.)
  constexpr int64_t kMaxTerm = std::numeric_limits<int>::max() / 4;
  const Window2d& w = s.win;
  for (int64_t term : {s.oh * w.sh, s.ow * w.sw, w.ph, w.pw, (w.kh - 1) * w.dh, (w.kw - 1) * w.dw}) {
    if (term > kMaxTerm) return false;
  }
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
  // bounded by kTinyDirectMacs, the input by its element count, the
  // window's stride, padding and dilation by the check there.
  const Window2d& k = s.win;
  const Geometry g{int(s.in.n), int(s.in.c), int(s.in.h), int(s.in.w), int(s.k), int(s.oh), int(s.ow),
                   int(s.in.c / s.groups), int(s.k / s.groups), int(k.kh), int(k.kw), int(k.sh), int(k.sw),
                   int(k.ph), int(k.pw), int(k.dh), int(k.dw)};
  const int total = int(out.numel());
  const int lanes = lanes_per_output(int64_t(g.cg) * g.r * g.s);
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "tiny_conv2d", [&] {
    using A = at::opmath_type<scalar_t>;
    const scalar_t* xp = input.const_data_ptr<scalar_t>();
    const scalar_t* wp = w.const_data_ptr<scalar_t>();
    const scalar_t* bp = has_bias ? b.const_data_ptr<scalar_t>() : nullptr;
    scalar_t* yp = out.mutable_data_ptr<scalar_t>();
    switch (lanes) {
      case 1: launch_tiny_forward<scalar_t, A, 1>(xp, wp, bp, yp, g, total, stream); break;
      case 2: launch_tiny_forward<scalar_t, A, 2>(xp, wp, bp, yp, g, total, stream); break;
      case 4: launch_tiny_forward<scalar_t, A, 4>(xp, wp, bp, yp, g, total, stream); break;
      case 8: launch_tiny_forward<scalar_t, A, 8>(xp, wp, bp, yp, g, total, stream); break;
      case 16: launch_tiny_forward<scalar_t, A, 16>(xp, wp, bp, yp, g, total, stream); break;
      default: launch_tiny_forward<scalar_t, A, 32>(xp, wp, bp, yp, g, total, stream); break;
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace customconv
