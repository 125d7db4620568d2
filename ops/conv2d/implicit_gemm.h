// conv2d's forward as an implicit GEMM on tensor cores: no column buffer, the
// channels_last input read in place by the GEMM's operand iterators, bias
// added in the GEMM's epilogue. The kernels are CUTLASS's sm80-style implicit
// GEMM convolutions (mma.sync with cp.async multistage pipelines), which run on
// compute capability 8.0 and newer; the engine is built where the CUTLASS
// headers are found (CUSTOMCONV_WITH_CUTLASS).
//
// Takes: a CUDA input (N, C, H, W) stored channels_last, float16 or bfloat16,
// groups 1, C and K multiples of 8 (16-byte vectors), 16-byte aligned data,
// every tensor under 2^31 elements. The output is channels_last, as F.conv2d
// gives for a channels_last input. The weight is read as (K, kh, kw, C): a
// channels_last weight is used as it is, another is copied into that layout.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/conv_shapes.h"

namespace customconv {

// The output, or nullopt (nothing launched) when the engine does not take the
// case, so the caller takes another route.
std::optional<at::Tensor> implicit_gemm_conv2d(const at::Tensor& input, const at::Tensor& weight,
                                               const std::optional<at::Tensor>& bias,
                                               const Conv2dShape<int64_t>& s);

namespace implicit_gemm {

// One forward convolution as the kernels take it: NHWC input, KRSC weight,
// NPQK output, a bias of K elements or null.
struct FpropProblem {
  const void* input;
  const void* weight;
  const void* bias;
  void* output;
  int n, h, w, c;  // input
  int k, r, s;     // weight
  int p, q;        // output height and width
  int pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w;
  int device;
  void* stream;  // cudaStream_t
};

// One per element type, each its own translation unit; false: not launched.
bool fprop_f16(const FpropProblem& problem);
bool fprop_bf16(const FpropProblem& problem);

}  // namespace implicit_gemm
}  // namespace customconv
