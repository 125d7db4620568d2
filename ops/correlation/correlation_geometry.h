// The geometry of a plane correlation as the blocked kernels
// (blocked_correlation.cuh) and the tensor-core kernel
// (tensor_core_correlation.cuh) take it.
#pragma once

#include <c10/macros/Macros.h>

namespace customconv {

// Output plane `plane` (image n = plane / out_channels, channel oc) sums `fan`
// input planes: for j < fan, weight row oc * fan + j applied to input channel
// (oc * fan + j) / div of image n. Forward: fan 1, div m (the multiplier).
// Input gradient: fan m, div 1, flip (taps rotated by 180 degrees).
// Planes of h x w inputs and oh x ow outputs, zero padding ph, pw.
struct BlockedCorrelation {
  int planes, out_channels, in_channels, fan, div;
  int h, w, oh, ow, ph, pw;
  bool flip;
};

// Tap (a, b) of the K x K weight plane at w, rotated by 180 degrees when flip
// (the input gradient's taps).
template <int K, typename T>
C10_HOST_DEVICE inline T square_tap(const T* w, int a, int b, bool flip) {
  return flip ? w[(K - 1 - a) * K + (K - 1 - b)] : w[a * K + b];
}

}  // namespace customconv
