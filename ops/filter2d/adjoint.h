// The gradient of filter2d with respect to one input sample, for host and
// device code alike.
#pragma once

#include "ops/filter2d/border.h"

namespace customconv {

// Sample (qy, qx) of a plane of h x w gathers the gradient of every padded
// sample (ty, tx) that reads it (its preimage under the border map); the
// gradient of a padded sample is sum_ij kernel[i][j] * grad_out[ty - i][tx - j]
// over the taps that land inside grad_out. Fixed summation order.
template <typename T, typename Acc>
C10_HOST_DEVICE inline Acc filter2d_input_gradient(const T* grad_plane, const T* kern, int64_t qy,
                                                   int64_t qx, int64_t h, int64_t w,
                                                   const Filter2dShape& s) {
  const Preimage py = border_preimage(qy, h, s.ph, s.border);
  const Preimage px = border_preimage(qx, w, s.pw, s.border);
  Acc sum = 0;
  for (int a = 0; a < py.count; ++a) {
    for (int64_t ty = py.lo[a]; ty < py.hi[a]; ++ty) {
      const int64_t i_lo = ty - (h - 1) > 0 ? ty - (h - 1) : 0;
      const int64_t i_hi = ty < s.kh - 1 ? ty : s.kh - 1;
      for (int c = 0; c < px.count; ++c) {
        for (int64_t tx = px.lo[c]; tx < px.hi[c]; ++tx) {
          const int64_t j_lo = tx - (w - 1) > 0 ? tx - (w - 1) : 0;
          const int64_t j_hi = tx < s.kw - 1 ? tx : s.kw - 1;
          for (int64_t i = i_lo; i <= i_hi; ++i) {
            const T* grow = grad_plane + (ty - i) * w + tx;
            const T* krow = kern + i * s.kw;
            for (int64_t j = j_lo; j <= j_hi; ++j) {
              sum += static_cast<Acc>(krow[j]) * static_cast<Acc>(grow[-j]);
            }
          }
        }
      }
    }
  }
  return sum;
}

}  // namespace customconv
