#include "ops/depthwise/depthwise.h"

#include "ops/common/launch.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <vector>

namespace customconv {
namespace {

// Geometry of one call in plain integers.
struct Dims {
  int64_t n, c, h, w, mult, oh, ow;
  int64_t k() const { return c * mult; }
};

// The output columns x whose input column x*stride + offset lies in [0, w).
struct XRange {
  int64_t lo, hi;
};
XRange valid_x(int64_t offset, int64_t stride, int64_t w, int64_t ow) {
  const int64_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t hi = w - 1 - offset >= 0 ? std::min(ow, (w - 1 - offset) / stride + 1) : 0;
  return {lo, std::max(lo, hi)};
}

// Work split: one task per output plane (image, output channel); each output
// row is accumulated in opmath precision tap by tap, the inner loop running
// along the row (unit stride in the output, vectorizable).
template <typename T>
void forward_planes(const T* in, const T* wt, const T* bias, T* out, const Dims& d,
                    const Window2d& k) {
  using acc_t = at::opmath_type<T>;
  at::parallel_for(0, d.n * d.k(), grain_for(k.kh * k.kw * d.oh * d.ow), [&](int64_t b, int64_t e) {
    std::vector<acc_t> acc(static_cast<size_t>(d.ow));
    for (int64_t p = b; p < e; ++p) {
      const int64_t oc = p % d.k(), n = p / d.k();
      const T* plane = in + (n * d.c + oc / d.mult) * d.h * d.w;
      const T* taps = wt + oc * k.kh * k.kw;
      const acc_t b0 = bias ? static_cast<acc_t>(bias[oc]) : acc_t(0);
      for (int64_t y = 0; y < d.oh; ++y) {
        std::fill(acc.begin(), acc.end(), b0);
        for (int64_t i = 0; i < k.kh; ++i) {
          const int64_t iy = y * k.sh - k.ph + i * k.dh;
          if (iy < 0 || iy >= d.h) continue;
          const T* row = plane + iy * d.w;
          for (int64_t j = 0; j < k.kw; ++j) {
            const acc_t tap = static_cast<acc_t>(taps[i * k.kw + j]);
            const int64_t off = j * k.dw - k.pw;
            const XRange r = valid_x(off, k.sw, d.w, d.ow);
            if (k.sw == 1) {
              for (int64_t x = r.lo; x < r.hi; ++x)
                acc[x] += tap * static_cast<acc_t>(row[x + off]);
            } else {
              for (int64_t x = r.lo; x < r.hi; ++x) {
                acc[x] += tap * static_cast<acc_t>(row[x * k.sw + off]);
              }
            }
          }
        }
        T* dst = out + (p * d.oh + y) * d.ow;
        for (int64_t x = 0; x < d.ow; ++x) dst[x] = static_cast<T>(acc[x]);
      }
    }
  });
}

// Work split: one task per input plane (image, input channel); the task
// scatters the gradients of its m output channels into a private opmath
// accumulator plane, then writes the plane once (fixed order: deterministic).
template <typename T>
void grad_input_planes(const T* go, const T* wt, T* gi, const Dims& d, const Window2d& k) {
  using acc_t = at::opmath_type<T>;
  const int64_t work = d.mult * k.kh * k.kw * d.oh * d.ow;
  at::parallel_for(0, d.n * d.c, grain_for(work), [&](int64_t b, int64_t e) {
    std::vector<acc_t> acc(static_cast<size_t>(d.h * d.w));
    for (int64_t p = b; p < e; ++p) {
      const int64_t c = p % d.c, n = p / d.c;
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t m = 0; m < d.mult; ++m) {
        const int64_t oc = c * d.mult + m;
        const T* gplane = go + (n * d.k() + oc) * d.oh * d.ow;
        const T* taps = wt + oc * k.kh * k.kw;
        for (int64_t y = 0; y < d.oh; ++y) {
          const T* grow = gplane + y * d.ow;
          for (int64_t i = 0; i < k.kh; ++i) {
            const int64_t iy = y * k.sh - k.ph + i * k.dh;
            if (iy < 0 || iy >= d.h) continue;
            acc_t* arow = acc.data() + iy * d.w;
            for (int64_t j = 0; j < k.kw; ++j) {
              const acc_t tap = static_cast<acc_t>(taps[i * k.kw + j]);
              const int64_t off = j * k.dw - k.pw;
              const XRange r = valid_x(off, k.sw, d.w, d.ow);
              for (int64_t x = r.lo; x < r.hi; ++x) {
                arow[x * k.sw + off] += tap * static_cast<acc_t>(grow[x]);
              }
            }
          }
        }
      }
      T* dst = gi + p * d.h * d.w;
      for (int64_t q = 0; q < d.h * d.w; ++q) dst[q] = static_cast<T>(acc[q]);
    }
  });
}

// Work split: one task per output channel; for each tap it sums
// grad_output * input over batch and space in a fixed order (deterministic).
template <typename T>
void grad_weight_channels(const T* go, const T* in, T* gw, const Dims& d, const Window2d& k) {
  using acc_t = at::opmath_type<T>;
  const int64_t work = d.n * k.kh * k.kw * d.oh * d.ow;
  at::parallel_for(0, d.k(), grain_for(work), [&](int64_t b, int64_t e) {
    for (int64_t oc = b; oc < e; ++oc) {
      const int64_t c = oc / d.mult;
      for (int64_t i = 0; i < k.kh; ++i) {
        for (int64_t j = 0; j < k.kw; ++j) {
          const int64_t off = j * k.dw - k.pw;
          const XRange r = valid_x(off, k.sw, d.w, d.ow);
          acc_t sum = 0;
          for (int64_t n = 0; n < d.n; ++n) {
            const T* gplane = go + (n * d.k() + oc) * d.oh * d.ow;
            const T* plane = in + (n * d.c + c) * d.h * d.w;
            for (int64_t y = 0; y < d.oh; ++y) {
              const int64_t iy = y * k.sh - k.ph + i * k.dh;
              if (iy < 0 || iy >= d.h) continue;
              const T* grow = gplane + y * d.ow;
              const T* row = plane + iy * d.w;
              for (int64_t x = r.lo; x < r.hi; ++x) {
                sum += static_cast<acc_t>(grow[x]) * static_cast<acc_t>(row[x * k.sw + off]);
              }
            }
          }
          gw[(oc * k.kh + i) * k.kw + j] = static_cast<T>(sum);
        }
      }
    }
  });
}

Dims dims_of(const at::Tensor& input, const at::Tensor& out_like, int64_t mult) {
  return {input.size(0), input.size(1),    input.size(2),   input.size(3),
          mult,          out_like.size(2), out_like.size(3)};
}

void forward_cpu(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                 const at::Tensor& output, const Window2d& win, int64_t mult) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d_cpu", [&] {
        forward_planes<scalar_t>(input.const_data_ptr<scalar_t>(),
                                 weight.const_data_ptr<scalar_t>(),
                                 bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr,
                                 output.data_ptr<scalar_t>(), dims_of(input, output, mult), win);
      });
}

void grad_input_cpu(const at::Tensor& grad_output, const at::Tensor& weight,
                    const at::Tensor& grad_input, const Window2d& win, int64_t mult) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_conv2d_grad_input_cpu", [&] {
        grad_input_planes<scalar_t>(
            grad_output.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
            grad_input.data_ptr<scalar_t>(), dims_of(grad_input, grad_output, mult), win);
      });
}

void grad_weight_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                     const at::Tensor& grad_weight, const Window2d& win, int64_t mult) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d_grad_weight_cpu", [&] {
        grad_weight_channels<scalar_t>(
            grad_output.const_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
            grad_weight.data_ptr<scalar_t>(), dims_of(input, grad_output, mult), win);
      });
}

}  // namespace

DepthwiseKernels cpu_depthwise_kernels() {
  return {&forward_cpu, &grad_input_cpu, &grad_weight_cpu};
}

}  // namespace customconv
