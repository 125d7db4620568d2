// conv2d's forward of RGB stems with 3x3 windows, and the input gradient of
// stems of any window, on CUDA cores.
//
// The first layer of MobileNet, EfficientNet and RegNet (3 -> 16..64
// channels, 3x3, stride 2, at 224x224) is 27 multiply-adds an output: too
// short a reduction for the tensor cores, which the implicit GEMM feeds 64
// channels a step (packed by space-to-depth it still ran 0.079 ms in float16
// at N=32 on an H100, against cuDNN's 0.032). Here each thread sums the 27
// terms for 8, 16 or 32 output channels of one position in float32 (exact,
// not TF32), the weight and the bias read from shared memory, the input read in place
// through its strides (any layout), the result written in the layout
// F.conv2d gives (conv2d_output_format), with conv2d_fused's activation in
// the same pass.
//
// Takes: CUDA, batched, groups 1, 1 to 4 input channels, 3x3 windows (any
// stride, padding and dilation), output channels a multiple of 8 up to 64,
// float16, bfloat16 or float32, no residual; nullopt otherwise.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/activation.h"
#include "ops/common/conv_shapes.h"

namespace customconv {

std::optional<at::Tensor> stem_direct_conv2d_cuda(const at::Tensor& input, const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  const Conv2dShape<int64_t>& s,
                                                  Activation activation);

// The input gradient of a layer with 1 to 4 input channels (ResNet's 7x7 RGB
// stem, the 3x3 stems above), where the implicit GEMMs have no tensor-core
// tiles to fill and the column route would hold the whole im2col matrix
// (N*P*Q x C*kh*kw: 236 MB for ResNet-50's stem at N=32 in float32).
// Each input position gathers the taps that reach it, a warp's lanes split
// between output channels and positions so that their loads of grad_output
// are contiguous, with float32 sums (stem_grad_input_cuda.cu); no buffer
// beyond the result and a packed copy of the weight.
//
// Takes: CUDA, batched, groups 1, 1 to 4 input channels, any window, stride,
// padding and dilation, windows of at most 32 x 32 taps, float16, bfloat16
// or float32 (exact, not TF32); in channels_last a multiple of 4 output
// channels, in NCHW windows of at most 16 taps (stem_grad_input_cuda.cu says
// why); nullopt otherwise. The result takes conv2d_output_format; grad_output is
// read in that format.
std::optional<at::Tensor> stem_direct_conv2d_grad_input_cuda(const at::Tensor& grad_output,
                                                             const at::Tensor& input,
                                                             const at::Tensor& weight,
                                                             const Conv2dShape<int64_t>& s);

}  // namespace customconv
