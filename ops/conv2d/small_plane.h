// The plane size at which conv2d's CUDA weight-gradient routes change:
// 6272 output positions, a 14x14 plane at N=32 (ResNet-50's last two
// stages). At most this many go to the implicit GEMM's wide or Hopper tiles
// (implicit_gemm.cpp), stay off the dense 3x3 kernel in float32
// (dense_mma.h), and, NCHW with 512 or more channels, go to the column route
// (engines_cuda.cpp).
#pragma once

#include <cstdint>

#include "ops/common/conv_shapes.h"

namespace customconv {

constexpr int64_t kSmallPlanePositions = 6272;

inline bool small_plane(const Conv2dShape<int64_t>& s) {
  return s.in.n * s.oh * s.ow <= kSmallPlanePositions;
}

}  // namespace customconv
