// conv2d's forward, weight gradient and strided input gradient on
// channels_last data as GEMMs over output positions, the CPU's engines
// (float32, float64; groups 1).
//
// A channels_last input (N, C, H, W) lies in memory as an (N*H*W, C) matrix,
// and a channels_last output as (N*P*Q, K). Pointwise windows (1x1, stride 1,
// unpadded) are one GEMM in place (pointwise_gemm.h, tried first). For any
// other window: for a chunk of images, each output position's window
// is gathered into one row of a column matrix (N_c*P*Q, kh*kw*C), whose rows
// are kh*kw contiguous runs of C input channels (copies, or zeros outside the
// plane), and one GEMM with the weight as (K, kh*kw*C) writes the chunk's
// output rows. Chunks keep the columns within workspace_limit_bytes() (at
// least one image).
// Stride-1 windows on planes that padding enlarges by at most a fifth skip the
// gathering: the padded input's rows, shifted by each tap's offset, are
// multiplied by that tap's (C, K) weight and accumulated into an output grid
// over every padded position, whose top-left P x Q corner per image is the
// output.
// The bias is added by the GEMM. No layout change of input or output; the
// weight is read as (K, kh, kw, C), a copy unless it is channels_last.
// The weight gradient gathers the same rows and accumulates
// grad_output's (N_c*P*Q, K) rows, transposed, times them over the chunks in
// order, into a (K, kh, kw, C) result: the channels_last gradient. On the
// stride-1 planes above it is the transpose of the shifted taps instead:
// grad_output placed on the zero output grid, and each tap's (K, C) gradient
// the grid's rows, transposed, times the padded input's rows shifted by the
// tap's offset, with no gathered copy.
// Windows over fewer than 16 channels, and bfloat16 (whose column route
// accumulates in float32), keep the column route. The float32 forward goes to
// the direct kernels first (channels_last_direct_cpu.h,
// few_channels_direct_cpu.h, pointwise windows included), which take every
// case this route would; the forward here serves float64, and the weight
// gradient every dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/conv_shapes.h"

namespace customconv {

// The output (channels_last), or nullopt when the case is not one this route takes.
std::optional<at::Tensor> channels_last_gemm_conv2d(const at::Tensor& input,
                                                    const at::Tensor& weight,
                                                    const std::optional<at::Tensor>& bias,
                                                    const Conv2dShape<int64_t>& s);
// The input gradient of the windows grad_input_as_forward (conv2d.h) leaves
// out, strided ones above all: grad_output's rows times the (K, kh*kw*C)
// weight give each output position's window of gradients (the columns), and
// each input pixel sums the runs that cover it. Channels_last, like the input.
std::optional<at::Tensor> channels_last_gemm_conv2d_grad_input(const at::Tensor& grad_output,
                                                               const at::Tensor& input,
                                                               const at::Tensor& weight,
                                                               const Conv2dShape<int64_t>& s);
std::optional<at::Tensor> channels_last_gemm_conv2d_grad_weight(const at::Tensor& grad_output,
                                                                const at::Tensor& input,
                                                                const at::Tensor& weight,
                                                                const Conv2dShape<int64_t>& s);

}  // namespace customconv
