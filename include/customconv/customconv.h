// customconv: convolution-family ops for PyTorch, CPU and CUDA.
//
// Each function calls the registered op through the PyTorch dispatcher, so C++
// callers get device dispatch and autograd exactly as torch.ops.customconv.*
// does in Python. Arguments, their order and defaults mirror the op schemas.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#define CUSTOMCONV_API __attribute__((visibility("default")))

namespace customconv {

// The library's version, "MAJOR.MINOR.PATCH": the CMake project's version, which
// is also the CMake package's (find_package) and the Python package's.
CUSTOMCONV_API std::string version();

// == F.conv2d: input (N, C, H, W) or (C, H, W), weight (K, C/groups, kh, kw).
CUSTOMCONV_API at::Tensor conv2d(const at::Tensor& input, const at::Tensor& weight,
                                 const std::optional<at::Tensor>& bias = std::nullopt,
                                 c10::IntArrayRef stride = 1, c10::IntArrayRef padding = 0,
                                 c10::IntArrayRef dilation = 1, int64_t groups = 1);

// == F.conv2d(input, weight, bias, stride, padding, dilation, groups=C) with
// weight (C*m, 1, kh, kw), channel multiplier m >= 1; direct kernels.
CUSTOMCONV_API at::Tensor depthwise_conv2d(const at::Tensor& input, const at::Tensor& weight,
                                           const std::optional<at::Tensor>& bias = std::nullopt,
                                           c10::IntArrayRef stride = 1,
                                           c10::IntArrayRef padding = 0,
                                           c10::IntArrayRef dilation = 1);

// Inference building block: activation(conv2d(input, weight, bias, ...) +
// residual), where residual (optional) has the output's shape and activation is
// "identity", "relu", "relu6", "silu", "hardswish", "gelu" (erf form) or
// "sigmoid". Depthwise layers (groups == C) included. Differentiable.
CUSTOMCONV_API at::Tensor conv2d_fused(const at::Tensor& input, const at::Tensor& weight,
                                       const std::optional<at::Tensor>& bias = std::nullopt,
                                       c10::IntArrayRef stride = 1, c10::IntArrayRef padding = 0,
                                       c10::IntArrayRef dilation = 1, int64_t groups = 1,
                                       c10::string_view activation = "identity",
                                       const std::optional<at::Tensor>& residual = std::nullopt);

// One odd-sized (kh, kw) kernel correlated with every (H, W) plane of an input
// (..., H, W); output of the input's shape. border is "zeros", "reflect",
// "replicate" or "circular", meaning F.pad(plane, (kw/2, kw/2, kh/2, kh/2), border).
CUSTOMCONV_API at::Tensor filter2d(const at::Tensor& input, const at::Tensor& kernel,
                                   c10::string_view border = "zeros");

// feats (N, 8, F), points (N, 3) -> (N, F): with u, v, w = (points + 1) / 2 and
// corner c = 4i + 2j + k, sum_c (i ? u : 1-u)(j ? v : 1-v)(k ? w : 1-w) feats[:, c].
// Points outside [-1, 1] extrapolate by the same formula. Differentiable in both.
CUSTOMCONV_API at::Tensor trilinear_interpolation(const at::Tensor& feats,
                                                  const at::Tensor& points);

// == F.unfold: (N, C, H, W) -> (N, C*kh*kw, L).
CUSTOMCONV_API at::Tensor im2col(const at::Tensor& input, c10::IntArrayRef kernel_size,
                                 c10::IntArrayRef stride = 1, c10::IntArrayRef padding = 0,
                                 c10::IntArrayRef dilation = 1);

// == F.fold: (N, C*kh*kw, L) -> (N, C, H, W) with (H, W) = output_size.
CUSTOMCONV_API at::Tensor col2im(const at::Tensor& columns, c10::IntArrayRef output_size,
                                 c10::IntArrayRef kernel_size, c10::IntArrayRef stride = 1,
                                 c10::IntArrayRef padding = 0, c10::IntArrayRef dilation = 1);

// Bound on the temporary memory of one conv2d call's column buffers and
// layout changes on `device`: 256 MiB on the CPU and 48 MiB on CUDA by
// default; the environment variable CUSTOMCONV_WORKSPACE_MB or
// set_workspace_limit_bytes(bytes > 0) sets one limit for every device, and
// set_workspace_limit_bytes(0) goes back to the environment's or the
// defaults. A chunk always holds at least one image, so a call uses at most
// max(limit, one image's columns + GEMM output).
CUSTOMCONV_API int64_t workspace_limit_bytes(c10::DeviceType device = c10::DeviceType::CPU);
CUSTOMCONV_API void set_workspace_limit_bytes(int64_t bytes);

namespace detail {

// The backward ops, registered as ops of their own (used by the autograd kernels).
CUSTOMCONV_API at::Tensor conv2d_grad_input(const at::Tensor& grad_output, const at::Tensor& input,
                                            const at::Tensor& weight, c10::IntArrayRef stride,
                                            c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                            int64_t groups);
CUSTOMCONV_API at::Tensor conv2d_grad_weight(const at::Tensor& grad_output, const at::Tensor& input,
                                             const at::Tensor& weight, c10::IntArrayRef stride,
                                             c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                             int64_t groups);
CUSTOMCONV_API at::Tensor conv2d_grad_bias(const at::Tensor& grad_output);
CUSTOMCONV_API at::Tensor depthwise_conv2d_grad_input(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation);
CUSTOMCONV_API at::Tensor depthwise_conv2d_grad_weight(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation);
// (grad_weight, grad_bias), in one pass over grad_output where the device can.
CUSTOMCONV_API std::tuple<at::Tensor, at::Tensor> depthwise_conv2d_grad_weight_bias(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation);

CUSTOMCONV_API at::Tensor filter2d_grad_input(const at::Tensor& grad_output,
                                              const at::Tensor& kernel, c10::string_view border);
CUSTOMCONV_API at::Tensor filter2d_grad_kernel(const at::Tensor& grad_output,
                                               const at::Tensor& input, const at::Tensor& kernel,
                                               c10::string_view border);

// (grad_feats, grad_points)
CUSTOMCONV_API std::tuple<at::Tensor, at::Tensor> trilinear_interpolation_backward(
    const at::Tensor& grad_output, const at::Tensor& feats, const at::Tensor& points);

// grad_feats alone (points needing no gradient): weight_c(points[n]) *
// grad_output[n, f] at [n, c, f].
CUSTOMCONV_API at::Tensor trilinear_interpolation_grad_feats(const at::Tensor& grad_output,
                                                             const at::Tensor& points);

// (out, derivatives): the forward and d out[n, f] / d points[n, a] as
// derivatives (N, 3, F), in float32 for 16-bit feats (else feats' dtype).
CUSTOMCONV_API std::tuple<at::Tensor, at::Tensor> trilinear_interpolation_with_derivatives(
    const at::Tensor& feats, const at::Tensor& points);

// (grad_feats, grad_points) from the derivatives above instead of feats.
CUSTOMCONV_API std::tuple<at::Tensor, at::Tensor> trilinear_interpolation_backward_from_derivatives(
    const at::Tensor& grad_output, const at::Tensor& derivatives, const at::Tensor& points);

}  // namespace detail
}  // namespace customconv

// version() for callers without C++ (the Python package reads it through ctypes).
extern "C" CUSTOMCONV_API const char* customconv_version();

// Referencing a symbol of the library from every file that includes this header
// keeps the library linked (and its ops registered) even when the linker drops
// libraries that look unused (--as-needed).
extern "C" CUSTOMCONV_API int customconv_link_anchor();
extern "C" {
__attribute__((weak)) int (*customconv_link_anchor_ref)() = &customconv_link_anchor;
}
