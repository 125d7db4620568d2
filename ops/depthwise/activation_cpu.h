// The CPU depthwise forward kernels' epilogue: the activation of the fused op
// (ops/common/activation.h) applied to float32 outputs just stored (still in
// L1: a block of one output row, or one position's channels), so the output
// is never passed over a second time.
#pragma once

#include <cstdint>

#include "ops/common/activation.h"

namespace customconv {

// p[i] = activate(a, p[i]) for i < n; nothing for identity. One loop per
// activation (the cheap ones vectorize), compiled for AVX2 and the baseline
// (CUSTOMCONV_CPU_CLONES). Defined in depthwise_cpu.cpp.
void activate_floats(Activation a, float* p, int64_t n);

}  // namespace customconv
