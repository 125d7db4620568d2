// The weight of a grouped convolution as the weight of fewer, wider groups:
// for a weight (K, C/groups, kh, kw) and `gs` groups merged into one, the
// (K, gs*C/groups, kh, kw) weight whose output channel k has its own group's
// taps at that group's channels of the merged group and zeros at the other
// gs - 1 groups' channels. gs == groups gives the dense (K, C, kh, kw) weight
// of the whole layer. The implicit GEMM runs grouped layers so
// (implicit_gemm.cpp). Written channels_last ((K, kh, kw, gs*C/groups) in
// memory) by one kernel; the weight may be stored in any layout.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace customconv {

at::Tensor block_diagonal_weight_cuda(const at::Tensor& weight, int64_t groups, int64_t gs);

}  // namespace customconv
