// The weight of a convolution's transpose: for a weight (K, C, kh, kw), the
// (C, K, kh, kw) weight rotated by 180 degrees in the window,
//   out[c][k][i][j] = weight[k][c][kh - 1 - i][kw - 1 - j],
// with which the stride-1 input gradient is the forward convolution of
// grad_output. It is written channels_last ((C, kh, kw, K) in memory, as the
// implicit GEMM forward and the CPU's direct kernels read their weight) by
// one kernel; the weight may be stored in any layout.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace customconv {

at::Tensor rotated_weight_cuda(const at::Tensor& weight);
// The same on the CPU (a blocked transpose per tap over ATen's threads), for
// every floating dtype.
at::Tensor rotated_weight_cpu(const at::Tensor& weight);

// The same transposition with the taps in a given order: for a weight (K, C,
// kh, kw), the (C, taps.size(), K) tensor whose slot t holds the layer's tap
// taps[t] (= i * kw + j),
//   out[c][t][k] = weight[k][c][i][j],
// as the strided input gradient's phases read it (implicit_gemm.h's
// dgrad_phases_sm90_f32). At most 64 slots; one kernel. With groups > 1 the
// weight is a grouped layer's (K, C/groups, kh, kw) and the result the
// (C, slots, K) one of the dense layer with that block-diagonal weight
// (zeros between groups), written without the dense weight.
at::Tensor phase_weight_cuda(const at::Tensor& weight, const std::vector<int>& taps,
                             int64_t groups = 1);

}  // namespace customconv
