// conv2d_fused's pointwise layers on CUDA (1x1 window, stride 1, no padding,
// one group) on channels_last data as one cuBLASLt matrix product whose
// epilogue is the fused op's:
//   out (NHW, K) = act(x (NHW, C) · w (K, C)^T + residual (NHW, K) + bias)
// the residual read as the product's C operand (beta 1) and written to a
// separate D, the bias and relu by cuBLASLt's own epilogue (identity and relu
// only: its GELU is the tanh approximation, not F.gelu's). These layers are
// bound by memory (ResNet-50's expansions read the residual and write the
// output, 64 -> 256 channels at 56x56: 115 MB for 1.6 GFLOP), where a
// product with the epilogue in it takes about as long as the plain product
// plus the residual's read, and the implicit GEMMs' tile epilogues took twice
// that (bench/NOTES.md). float16 and bfloat16 with float32 accumulation;
// float32 as TF32 where PyTorch's policy for convolutions allows it, else
// exactly. The algorithm cuBLASLt's heuristic picks is kept per problem (one
// small entry per shape seen), so a call costs the host a few descriptors
// and one launch, not the heuristic's search. Declines (nullopt) other layers,
// activations, dtypes and layouts, a residual that is not channels_last,
// and operands not aligned to 16 bytes: engines_cuda.cpp then tries the
// implicit GEMMs.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/conv_shapes.h"
#include "ops/common/epilogue.h"

namespace customconv {

std::optional<at::Tensor> pointwise_fused_lt_cuda(const at::Tensor& input, const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  const Conv2dShape<int64_t>& s,
                                                  const ConvEpilogue& epilogue);

}  // namespace customconv
