// The weight of a convolution's transpose: for a weight (K, C, kh, kw), the
// (C, K, kh, kw) weight rotated by 180 degrees in the window,
//   out[c][k][i][j] = weight[k][c][kh - 1 - i][kw - 1 - j],
// with which the stride-1 input gradient is the forward convolution of
// grad_output. On CUDA it is written channels_last ((C, kh, kw, K) in
// memory, as the implicit GEMM forward reads its weight) by one kernel; the
// weight may be stored in any layout.
#pragma once

#include <ATen/core/Tensor.h>

namespace customconv {

at::Tensor rotated_weight_cuda(const at::Tensor& weight);

}  // namespace customconv
