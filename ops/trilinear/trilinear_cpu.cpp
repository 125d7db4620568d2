#include "ops/trilinear/corner_weights.h"

#include "ops/common/launch.h"
#include "ops/trilinear/trilinear.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <algorithm>

namespace customconv {
namespace {

// One point's output row and its 3 rows of derivatives (d, d + f, d + 2f)
// from its 8 feats rows, in one pass along F (the restrict-qualified
// parameters let the compiler vectorize it).
template <typename T, typename A>
void blend_with_derivatives(const T* __restrict__ fp, const CornerWeights<A>& cw,
                            T* __restrict__ out, A* __restrict__ d, int64_t f) {
  for (int64_t x = 0; x < f; ++x) {
    A acc = 0, bu = 0, bv = 0, bw = 0;
    for (int c = 0; c < 8; ++c) {
      const A fv = static_cast<A>(fp[c * f + x]);
      acc += cw.weight[c] * fv;
      bu += cw.d_point[0][c] * fv;
      bv += cw.d_point[1][c] * fv;
      bw += cw.d_point[2][c] * fv;
    }
    out[x] = static_cast<T>(acc);
    d[x] = bu, d[f + x] = bv, d[2 * f + x] = bw;
  }
}

// Work split: one task per point; the 8 corner rows are blended along F
// (unit stride, vectorizable). With deriv, also the point's 3 rows of
// derivatives (N, 3, F).
template <typename T>
void forward_points(const T* feats, const T* points, T* out, at::opmath_type<T>* deriv, int64_t n,
                    int64_t f) {
  using acc_t = at::opmath_type<T>;
  at::parallel_for(0, n, grain_for((deriv ? 11 : 8) * f), [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const T* pt = points + 3 * p;
      const auto cw = corner_weights<acc_t>(pt[0], pt[1], pt[2]);
      const T* fp = feats + p * 8 * f;
      T* dst = out + p * f;
      if (deriv == nullptr) {
        for (int64_t x = 0; x < f; ++x) {
          acc_t acc = 0;
          for (int c = 0; c < 8; ++c) acc += cw.weight[c] * static_cast<acc_t>(fp[c * f + x]);
          dst[x] = static_cast<T>(acc);
        }
        continue;
      }
      blend_with_derivatives(fp, cw, dst, deriv + 3 * p * f, f);
    }
  });
}

// One point's 8 rows of grad_feats: gf[c * f + x] = weight[c] * g[x].
template <typename T, typename A>
void write_grad_feats(const CornerWeights<A>& cw, const T* __restrict__ g, T* __restrict__ gf,
                      int64_t f) {
  for (int c = 0; c < 8; ++c) {
    for (int64_t x = 0; x < f; ++x) {
      gf[c * f + x] = static_cast<T>(cw.weight[c] * static_cast<A>(g[x]));
    }
  }
}

// Work split: one task per point; it writes the point's 8 rows of grad_feats
// and sums its 3 point derivatives over F in order, blended from the 8 feats
// rows (feats) or read from the forward's derivatives (deriv; feats null).
template <typename T>
void backward_points(const T* go, const T* feats, const at::opmath_type<T>* deriv, const T* points,
                     T* grad_feats, T* grad_points, int64_t n, int64_t f) {
  using acc_t = at::opmath_type<T>;
  at::parallel_for(0, n, grain_for(16 * f), [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const T* pt = points + 3 * p;
      const auto cw = corner_weights<acc_t>(pt[0], pt[1], pt[2]);
      const T* g = go + p * f;
      write_grad_feats(cw, g, grad_feats + p * 8 * f, f);
      acc_t d[3] = {0, 0, 0};
      for (int64_t x = 0; x < f; ++x) {
        const acc_t gx = static_cast<acc_t>(g[x]);
        acc_t blend[3] = {0, 0, 0};
        if (feats != nullptr) {
          for (int c = 0; c < 8; ++c) {
            const acc_t fv = static_cast<acc_t>(feats[(p * 8 + c) * f + x]);
            for (int a = 0; a < 3; ++a) blend[a] += cw.d_point[a][c] * fv;
          }
        } else {
          for (int a = 0; a < 3; ++a) blend[a] = deriv[(3 * p + a) * f + x];
        }
        for (int a = 0; a < 3; ++a) d[a] += gx * blend[a];
      }
      for (int a = 0; a < 3; ++a) grad_points[3 * p + a] = static_cast<T>(d[a]);
    }
  });
}

// Work split: one task per point; it writes the point's 8 rows of grad_feats.
template <typename T>
void grad_feats_points(const T* go, const T* points, T* grad_feats, int64_t n, int64_t f) {
  using acc_t = at::opmath_type<T>;
  at::parallel_for(0, n, grain_for(9 * f), [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const T* pt = points + 3 * p;
      write_grad_feats(corner_weights<acc_t>(pt[0], pt[1], pt[2]), go + p * f,
                       grad_feats + p * 8 * f, f);
    }
  });
}

void grad_feats_cpu(const at::Tensor& grad_out, const at::Tensor& points,
                    const at::Tensor& grad_feats) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_out.scalar_type(), "trilinear_interpolation_grad_feats_cpu",
      [&] {
        grad_feats_points<scalar_t>(grad_out.const_data_ptr<scalar_t>(),
                                    points.const_data_ptr<scalar_t>(),
                                    grad_feats.data_ptr<scalar_t>(), grad_feats.size(0),
                                    grad_feats.size(2));
      });
}

void forward_cpu(const at::Tensor& feats, const at::Tensor& points, const at::Tensor& out,
                 const at::Tensor& derivatives) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, feats.scalar_type(), "trilinear_interpolation_cpu", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        forward_points<scalar_t>(
            feats.const_data_ptr<scalar_t>(), points.const_data_ptr<scalar_t>(),
            out.data_ptr<scalar_t>(),
            derivatives.defined() ? derivatives.data_ptr<acc_t>() : nullptr, feats.size(0),
            feats.size(2));
      });
}

void backward_cpu(const at::Tensor& grad_out, const at::Tensor& source, bool from_derivatives,
                  const at::Tensor& points, const at::Tensor& grad_feats,
                  const at::Tensor& grad_points) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_out.scalar_type(), "trilinear_interpolation_backward_cpu",
      [&] {
        using acc_t = at::opmath_type<scalar_t>;
        backward_points<scalar_t>(
            grad_out.const_data_ptr<scalar_t>(),
            from_derivatives ? nullptr : source.const_data_ptr<scalar_t>(),
            from_derivatives ? source.const_data_ptr<acc_t>() : nullptr,
            points.const_data_ptr<scalar_t>(), grad_feats.data_ptr<scalar_t>(),
            grad_points.data_ptr<scalar_t>(), grad_feats.size(0), grad_feats.size(2));
      });
}

}  // namespace

TrilinearKernels cpu_trilinear_kernels() { return {&forward_cpu, &backward_cpu, &grad_feats_cpu}; }

}  // namespace customconv
