// Divide<I>: the divider a kernel templated on its index type I takes for a
// divisor fixed before its launch. For 32-bit indices it is FastDivide (a
// multiply-high, an add and a shift); for int64_t, WideDivide, the same
// interface over a plain division (offsets of 2^31 elements and more are
// rare, and their kernels rarer still).
#pragma once

#include <cstdint>
#include <type_traits>

#include "ops/common/fast_divide.h"
#include "ops/common/host_device.h"

namespace customconv {

struct WideDivide {
  int64_t divisor = 1;

  // d >= 1, as FastDivide::of.
  static WideDivide of(int64_t d) { return {d < 1 ? 1 : d}; }
  CUSTOMCONV_HOST_DEVICE int64_t div(int64_t x) const { return x / divisor; }
};

template <typename I>
using Divide = std::conditional_t<sizeof(I) <= 4, FastDivide, WideDivide>;

}  // namespace customconv
