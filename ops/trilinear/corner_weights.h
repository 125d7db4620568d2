// The corner weights of trilinear_interpolation and their derivatives, for
// host and device code alike.
#pragma once

#include <c10/macros/Macros.h>

namespace customconv {

// weight[c] for corner c = 4i + 2j + k, and d weight[c] / d point[a] for the
// three coordinates a (each coordinate is (p + 1) / 2, hence the factor 1/2).
template <typename Acc>
struct CornerWeights {
  Acc weight[8];
  Acc d_point[3][8];
};

template <typename Acc>
C10_HOST_DEVICE inline CornerWeights<Acc> corner_weights(Acc px, Acc py, Acc pz) {
  const Acc half = Acc(0.5);
  const Acc u = (px + Acc(1)) * half, v = (py + Acc(1)) * half, w = (pz + Acc(1)) * half;
  const Acc wu[2] = {Acc(1) - u, u}, wv[2] = {Acc(1) - v, v}, ww[2] = {Acc(1) - w, w};
  const Acc sign[2] = {-half, half};
  CornerWeights<Acc> cw{};
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      for (int k = 0; k < 2; ++k) {
        const int c = 4 * i + 2 * j + k;
        cw.weight[c] = wu[i] * wv[j] * ww[k];
        cw.d_point[0][c] = sign[i] * wv[j] * ww[k];
        cw.d_point[1][c] = wu[i] * sign[j] * ww[k];
        cw.d_point[2][c] = wu[i] * wv[j] * sign[k];
      }
    }
  }
  return cw;
}

}  // namespace customconv
