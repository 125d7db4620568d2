// What the grouped gradient kernels on tensor cores for 8, 16 and 32
// channels a group share (grouped_mma.h; grouped_mma_grad_input_cuda.cu,
// grouped_mma_grad_weight_cuda.cu): the
// layers they take, how many neighbouring groups a block takes, and the
// dispatch to their compiled variants.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

#include "ops/common/conv_shapes.h"

namespace customconv::grouped_mma_gradients {

// Batched CUDA tensors, 1 < groups < C, K == C, 8, 16 or 32 channels a
// group, float16 or bfloat16, a 3x3 window, positions and element offsets
// up to the channel within ints, a device of compute capability 8.0 or newer.
inline bool takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  if (!input.is_cuda() || !s.in.batched || s.groups <= 1 || s.groups >= s.in.c ||
      s.groups > 65535) {
    return false;
  }
  const int64_t width = s.in.c / s.groups;
  if ((width != 8 && width != 16 && width != 32) || s.k != s.in.c) return false;
  if (input.scalar_type() != at::kHalf && input.scalar_type() != at::kBFloat16) return false;
  const Window2d& w = s.win;
  if (w.kh != 3 || w.kw != 3 || w.sh * w.sw > 65535) return false;
  constexpr int64_t kLimit = (int64_t{1} << 30);
  for (int64_t v : {s.in.n * s.in.h * s.in.w, s.in.n * s.oh * s.ow, s.in.n * (s.in.h + w.sh),
                    s.in.n * (s.oh + 1), s.in.h + w.ph + 2 * w.dh + w.sh, s.in.w + w.pw + 2 * w.dw + w.sw,
                    s.oh * w.sh + 2 * w.dh, s.ow * w.sw + 2 * w.dw}) {
    if (v > kLimit) return false;
  }
  return at::cuda::getDeviceProperties(input.get_device())->major >= 8;
}

// Groups a block takes: as many neighbouring groups as make up 32 channels
// where they divide the groups (a position's channels then come as whole
// 32-byte sectors), else the largest power of two that does.
inline int groups_per_block(int64_t width, int64_t groups) {
  for (int64_t gpb = 32 / width; gpb > 1; gpb /= 2) {
    if (groups % gpb == 0) return int(gpb);
  }
  return 1;
}

template <int V>
using Int = std::integral_constant<int, V>;

// f(T{}, Int<CG>{}, Int<GPB>{}) for the call's dtype, channels a group and
// groups a block.
template <typename F>
auto dispatch(at::ScalarType dtype, int64_t width, int gpb, F&& f) {
  const auto on = [&](auto tag) {
    if (width == 8) {
      if (gpb == 4) return f(tag, Int<8>{}, Int<4>{});
      if (gpb == 2) return f(tag, Int<8>{}, Int<2>{});
      return f(tag, Int<8>{}, Int<1>{});
    }
    if (width == 16) {
      if (gpb == 2) return f(tag, Int<16>{}, Int<2>{});
      return f(tag, Int<16>{}, Int<1>{});
    }
    return f(tag, Int<32>{}, Int<1>{});
  };
  return dtype == at::kHalf ? on(c10::Half{}) : on(c10::BFloat16{});
}

}  // namespace customconv::grouped_mma_gradients
