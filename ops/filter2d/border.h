// Border arithmetic of filter2d, for host and device code alike.
//
// The op pads a plane of n samples by `pad` on each side exactly as F.pad
// does, then correlates. A padded coordinate t in [0, n + 2*pad) stands for
// plane index t - pad, mapped back into the plane by the border mode.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

#include "ops/common/filter_shapes.h"

namespace customconv {

// Plane index that padded-plane index `idx` (= t - pad, in [-pad, n + pad))
// reads, or -1 for a zero.
C10_HOST_DEVICE inline int64_t border_index(int64_t idx, int64_t n, Border mode) {
  if (idx >= 0 && idx < n) return idx;
  switch (mode) {
    case Border::Reflect:  // pad < n: one reflection suffices
      return idx < 0 ? -idx : 2 * (n - 1) - idx;
    case Border::Replicate:
      return idx < 0 ? 0 : n - 1;
    case Border::Circular:  // pad <= n: one wrap suffices
      return idx < 0 ? idx + n : idx - n;
    default:
      return -1;
  }
}

// The padded coordinates t whose border mapping lands on plane index q: at most
// three disjoint ranges [lo, hi) (the sample itself, and its mirror, wrapped or
// replicated copies). The adjoint of padding sums the gradient over them.
struct Preimage {
  int64_t lo[3];
  int64_t hi[3];
  int count;
};

C10_HOST_DEVICE inline Preimage border_preimage(int64_t q, int64_t n, int64_t pad, Border mode) {
  Preimage p{};
  auto add = [&p](int64_t lo, int64_t hi) {
    p.lo[p.count] = lo;
    p.hi[p.count] = hi;
    ++p.count;
  };
  const int64_t self = q + pad;
  switch (mode) {
    case Border::Zeros:
      add(self, self + 1);
      break;
    case Border::Reflect:
      add(self, self + 1);
      if (q >= 1 && q <= pad) add(pad - q, pad - q + 1);  // from index -q
      if (q <= n - 2 && 2 * (n - 1) - q < n + pad) {      // from index 2(n-1) - q
        const int64_t t = 2 * (n - 1) - q + pad;
        add(t, t + 1);
      }
      break;
    case Border::Replicate: {
      const int64_t lo = q == 0 ? 0 : self;
      const int64_t hi = q == n - 1 ? n + 2 * pad : self + 1;
      add(lo, hi);
      break;
    }
    case Border::Circular:
      add(self, self + 1);
      if (q - n >= -pad) add(q - n + pad, q - n + pad + 1);    // from index q - n
      if (q + n < n + pad) add(q + n + pad, q + n + pad + 1);  // from index q + n
      break;
  }
  return p;
}

}  // namespace customconv
