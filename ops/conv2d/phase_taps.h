// The taps of one window axis that reach one stride phase of a strided
// layer's input, for its input gradient computed a stride phase at a time
// (conv2d.cpp's grad_input_by_phases on the CPU, wgmma_plan.h's
// stride_phases on CUDA). Host arithmetic only.
#pragma once

#include <cstdint>
#include <vector>

namespace customconv {

// Input row p + stride * a is reached through tap r from output row
// a + (p + pad - dil * r) / stride, for the taps r where that is a whole
// number: `index` lists them by decreasing r (increasing offset), `first` is
// the first one's offset and `step` the offsets' spacing (evenly spaced: a
// dilated window). No tap reaches the phase where `index` is empty.
struct PhaseTaps {
  std::vector<int64_t> index;
  int64_t first = 0, step = 1;
};
inline PhaseTaps phase_taps(int64_t p, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
  PhaseTaps t;
  for (int64_t r = k - 1; r >= 0; --r) {
    if ((p + pad - dil * r) % stride == 0) t.index.push_back(r);
  }
  if (!t.index.empty()) t.first = (p + pad - dil * t.index[0]) / stride;
  if (t.index.size() > 1) t.step = (p + pad - dil * t.index[1]) / stride - t.first;
  return t;
}

}  // namespace customconv
