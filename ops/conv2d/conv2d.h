// conv2d as im2col + GEMM, and its three backward pieces, device-generic: the
// device's kernels come in as a Conv2dKernels table.
//
// Images are processed in chunks bounded by workspace_limit_bytes(). Routes:
//   * pointwise layers on channels_last data: one GEMM per pass, in place
//     (pointwise_gemm.h), every device;
//   * the device's engines where they take the case (on CUDA: the implicit
//     GEMMs of implicit_gemm.h for 16-bit and TF32 data, forward and both
//     gradients, on channels_last data or NCHW data changed to channels_last
//     and back, the pointwise GEMMs on the gathered positions of strided 1x1
//     layers (strided_pointwise.h), and the direct kernels of
//     grouped_direct.h for grouped layers;
//     on the CPU: direct float32 forward kernels, few_channels_direct_cpu.h
//     for windows over fewer than 16 input channels and
//     channels_last_direct_cpu.h for the others, then channels_last_gemm.h,
//     the forward, the weight gradient and the strided input gradient as GEMMs
//     over the positions of channels_last data, and grouped_direct_cpu.h for
//     grouped layers);
//   * depthwise (groups == C_in > 1, weight (C*m, 1, kh, kw)): the depthwise kernels;
//   * pointwise (1x1, stride 1, no padding) with planes of at least 128
//     positions: the input is its own column buffer, so forward and grad input
//     are GEMMs straight on the NCHW tensors;
//   * otherwise im2col into a column buffer, then GEMMs. With large output
//     planes the columns are per image, (n, groups, C/groups*kh*kw, L), and one
//     strided-batched GEMM per group writes the NCHW output directly; with small
//     planes they are (groups, C/groups*kh*kw, n*L), so that the chunk is one
//     large GEMM per group, whose result is then copied into place.
// The weight gradient takes the same layout choice. Per image, it computes one
// partial product per image (batched), reading grad_output and, for pointwise
// convolutions, the input in place; otherwise one GEMM per group over the
// chunk, its long reduction split into slices until the GEMMs fill the device.
// Partial products (float32 for float16/bfloat16) are summed in a fixed order.
#pragma once

#include <optional>

#include "ops/columns/column_kernels.h"
#include "ops/common/conv_shapes.h"
#include "ops/common/epilogue.h"
#include "ops/conv2d/batched_gemm.h"
#include "ops/conv2d/channels_last_gemm.h"
#include "ops/conv2d/column_route.h"
#include "ops/conv2d/pointwise_gemm.h"
#include "ops/conv2d/rotated_weight.h"
#include "ops/depthwise/depthwise.h"

namespace customconv {

// A device's engines, each computing a whole pass where it takes the case (the
// result, in the pass's memory format: conv2d_output_format), or declining
// (nullopt) and leaving it to im2col + GEMM. Null: the device has none for
// that pass.
using Conv2dForwardEngine = std::optional<at::Tensor> (*)(const at::Tensor& input,
                                                          const at::Tensor& weight,
                                                          const std::optional<at::Tensor>& bias,
                                                          const Conv2dShape<int64_t>& s);
// grad_input and grad_weight: (grad_output, input, weight, shape).
using Conv2dBackwardEngine = std::optional<at::Tensor> (*)(const at::Tensor& grad_output,
                                                           const at::Tensor& input,
                                                           const at::Tensor& weight,
                                                           const Conv2dShape<int64_t>& s);

// conv2d_fused's forward: the convolution with the bias, the residual and the
// activation applied in the kernel's epilogue, or nullopt.
using Conv2dFusedEngine = std::optional<at::Tensor> (*)(const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const std::optional<at::Tensor>& bias,
                                                        const Conv2dShape<int64_t>& s,
                                                        const ConvEpilogue& epilogue);

// Whether a pass's engine goes before the pointwise GEMM for this input and shape.
using BeforePointwise = bool (*)(const at::Tensor& input, const Conv2dShape<int64_t>& s);

struct Conv2dEngines {
  Conv2dForwardEngine forward = nullptr;
  Conv2dBackwardEngine grad_input = nullptr;
  Conv2dBackwardEngine grad_weight = nullptr;
  Conv2dFusedEngine fused_forward = nullptr;
  // Whether `forward` is tried before the pointwise GEMM route
  // (pointwise_gemm.h) on channels_last data, rather than after it; null:
  // after. The CPU's direct kernels beat its GEMM; on CUDA the engine takes
  // the small layers, whose calls cost more host time than GPU time.
  BeforePointwise forward_before_pointwise = nullptr;
  // The same for `grad_input` and `grad_weight`.
  BeforePointwise grad_input_before_pointwise = nullptr;
  BeforePointwise grad_weight_before_pointwise = nullptr;
  // Whether a strided layer's input gradient runs as one stride-1 forward
  // per stride phase of the input (conv2d_grad_input_impl), before
  // `grad_input`; null: never.
  BeforePointwise grad_input_by_phases = nullptr;
};

inline bool always(const at::Tensor&, const Conv2dShape<int64_t>&) { return true; }

// The weight of a convolution's transpose, rotated (rotated_weight.h).
using RotatedWeight = at::Tensor (*)(const at::Tensor& weight);

struct Conv2dKernels {
  ColumnKernels columns;
  BatchedGemm gemm;
  GemmParallelism gemm_parallelism;
  DepthwiseKernels depthwise;
  Conv2dEngines engines;
  // The rotated weight of the stride-1 input gradient of ungrouped layers
  // (conv2d_grad_input_impl), where the device has a kernel for it; null:
  // flipped and transposed with ATen's ops.
  RotatedWeight rotated_weight = nullptr;
  // The most bytes of per-image columns that a chunk of the input gradient's
  // column route (conv2d_grad_input_impl) holds; 0: the workspace bound
  // (workspace.h) alone. Its per-image GEMMs are as efficient in small
  // chunks, so a device keeps the buffer well under the bound there.
  int64_t grad_input_column_bytes = 0;
  // The column route's regrouping and partial sums (column_route.h).
  ColumnRouteKernels route;
};

// The CPU's engines (engines_cpu.cpp): the grouped direct kernels
// (grouped_direct_cpu.h) for grouped layers, else the direct float32 forward
// kernels (few_channels_direct_cpu.h, channels_last_direct_cpu.h), else the
// channels_last GEMMs.
std::optional<at::Tensor> cpu_conv2d_engine(const at::Tensor& input, const at::Tensor& weight,
                                            const std::optional<at::Tensor>& bias,
                                            const Conv2dShape<int64_t>& s);
std::optional<at::Tensor> cpu_conv2d_grad_input_engine(const at::Tensor& grad_output,
                                                       const at::Tensor& input,
                                                       const at::Tensor& weight,
                                                       const Conv2dShape<int64_t>& s);
// conv2d_fused's forward on the CPU: the direct float32 kernel with the
// epilogue in its store (channels_last_direct_cpu.h), or nullopt.
std::optional<at::Tensor> cpu_conv2d_fused_engine(const at::Tensor& input, const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  const Conv2dShape<int64_t>& s,
                                                  const ConvEpilogue& epilogue);
std::optional<at::Tensor> cpu_conv2d_grad_weight_engine(const at::Tensor& grad_output,
                                                        const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const Conv2dShape<int64_t>& s);

// Whether the CPU's pointwise weight gradient goes to the direct kernel
// (grouped_direct_cpu.h, where it takes the layer) before the GEMM: 2048 or
// more output positions, where it measured faster (N=4, 64 -> 256 at 56x56: 1.96 ms
// against 2.44-2.82); with fewer positions than channel pairs the GEMM is
// (2048 -> 512 at 7x7: 2.19 against 3.6).
bool cpu_pointwise_grad_weight_direct(const at::Tensor& input, const Conv2dShape<int64_t>& s);
// Whether the CPU's pointwise input gradient is the direct forward kernel's
// (channels_last_direct_cpu.h) forward of grad_output with the transposed
// weight, before the GEMM: float32 layers of a multiple of 64 channels each
// way, which the kernel takes (N=4: 64 -> 256 at 56x56 2.20 ms against the
// GEMM's 2.78, 512 -> 128 at 28x28 2.10 against 2.39; oneDNN 2.21 and 1.95);
// and small float32 layers of fewer than 16 output channels, whose input
// gradient the few-channel kernel (few_channels_direct_cpu.h) computes as that
// forward (engines_cpu.cpp).
bool cpu_pointwise_grad_input_direct(const at::Tensor& input, const Conv2dShape<int64_t>& s);

// Whether the CPU's input gradient of a strided layer runs by stride phases,
// each a forward on the direct kernels, before the channels_last GEMM route:
// float32 channels_last 3x3 stride-2 layers of 64 or more channels each way
// with at least 9 C output positions (engines_cpu.cpp).
bool cpu_grad_input_by_phases(const at::Tensor& input, const Conv2dShape<int64_t>& s);

inline Conv2dKernels cpu_conv2d_kernels() {
  return {cpu_column_kernels(),
          &batched_gemm_cpu,
          &gemm_parallelism_cpu,
          cpu_depthwise_kernels(),
          {&cpu_conv2d_engine, &cpu_conv2d_grad_input_engine, &cpu_conv2d_grad_weight_engine,
           &cpu_conv2d_fused_engine, /*forward_before_pointwise=*/&always,
           /*grad_input_before_pointwise=*/&cpu_pointwise_grad_input_direct,
           /*grad_weight_before_pointwise=*/&cpu_pointwise_grad_weight_direct,
           /*grad_input_by_phases=*/&cpu_grad_input_by_phases},
          /*rotated_weight=*/&rotated_weight_cpu};
}
// Whether conv2d_grad_input_impl can run the input gradient as the forward
// convolution of grad_output with the rotated weight (stride 1, the rotated
// padding not negative, not a 1x1 unpadded window), so that a grouped
// layer's grad_input engine leaves it to that route and its forward engine.
inline bool grad_input_as_forward(const Window2d& w) {
  return w.sh == 1 && w.sw == 1 && w.dh * (w.kh - 1) >= w.ph && w.dw * (w.kw - 1) >= w.pw &&
         !w.pointwise();
}

// Whether the NCHW routes compute a layer's forward and input gradient as
// GEMMs straight on the NCHW tensors, with no column buffer: pointwise
// windows (1x1, stride 1, no padding) over planes of at least 128 positions
// (smaller planes would make per-image GEMMs with narrow, misaligned rows),
// and over any plane of a single image, whose one GEMM is the whole layer
// (the column route's im2col would copy the input as it is). The CUDA engines
// change the layout of other NCHW data instead.
constexpr int64_t kPointwisePerImageMinLength = 128;
inline bool nchw_gemm_in_place(const Conv2dShape<int64_t>& s) {
  return s.win.pointwise() && (s.oh * s.ow >= kPointwisePerImageMinLength || s.in.n == 1);
}

#ifdef CUSTOMCONV_WITH_CUDA
// The CUDA engines (engines_cuda.cpp), each trying in turn: the grouped direct
// kernels (grouped_direct.h) for grouped layers, the pointwise GEMMs on the
// gathered positions of large strided 1x1 layers (strided_pointwise.h), then
// the implicit GEMMs (implicit_gemm.h) where CUTLASS is built in.
std::optional<at::Tensor> cuda_conv2d_engine(const at::Tensor& input, const at::Tensor& weight,
                                             const std::optional<at::Tensor>& bias,
                                             const Conv2dShape<int64_t>& s);
std::optional<at::Tensor> cuda_conv2d_grad_input_engine(const at::Tensor& grad_output,
                                                        const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const Conv2dShape<int64_t>& s);
std::optional<at::Tensor> cuda_conv2d_grad_weight_engine(const at::Tensor& grad_output,
                                                         const at::Tensor& input,
                                                         const at::Tensor& weight,
                                                         const Conv2dShape<int64_t>& s);
// The implicit GEMMs with the epilogue in the kernel (implicit_gemm.h).
std::optional<at::Tensor> cuda_conv2d_fused_engine(const at::Tensor& input,
                                                   const at::Tensor& weight,
                                                   const std::optional<at::Tensor>& bias,
                                                   const Conv2dShape<int64_t>& s,
                                                   const ConvEpilogue& epilogue);

// Whether the engine, one launch with the bias in its epilogue, goes before
// the pointwise GEMM and its separate bias add on a pointwise channels_last
// forward (engines_cuda.cpp): the layers small enough to be bound by the host
// (at most 2^26 multiply-adds), and the larger float32 ones that the TF32
// GEMM takes (pointwise_tf32_channels_last.h).
bool cuda_pointwise_engine_first(const at::Tensor& input, const Conv2dShape<int64_t>& s);

// The input gradient's column route on CUDA takes NCHW layers that the
// engines decline, such as RGB stems with more than 16 taps. On an H200 the
// 7x7 stem at N=32 held its whole 147 x 12544-per-image column matrix, 113
// MiB in float16 and 225 in float32 (cuDNN's whole backward: 74 and 128 MiB);
// chunks of at most 32 MiB bound that call's extra memory to the chunk.
constexpr int64_t kCudaGradInputColumnBytes = int64_t{32} << 20;

inline Conv2dKernels cuda_conv2d_kernels() {
  return {cuda_column_kernels(), &batched_gemm_cuda, &gemm_parallelism_cuda,
          cuda_depthwise_kernels(),
          {&cuda_conv2d_engine, &cuda_conv2d_grad_input_engine, &cuda_conv2d_grad_weight_engine,
           &cuda_conv2d_fused_engine, &cuda_pointwise_engine_first},
          /*rotated_weight=*/nullptr,
          /*grad_input_column_bytes=*/kCudaGradInputColumnBytes,
          /*route=*/cuda_column_route_kernels()};
}
#endif

at::Tensor conv2d_impl(const Conv2dKernels& kernels, const at::Tensor& input,
                       const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                       int64_t groups);

// conv2d_fused: activation(conv2d(...) + residual). Routes, in turn:
// depthwise layers without a residual take the depthwise kernels, which apply
// the activation as they store; then the device's fused engine
// (Conv2dEngines::fused_forward); else conv2d_impl followed by the epilogue as
// ATen operations on its output (apply_epilogue_).
at::Tensor conv2d_fused_impl(const Conv2dKernels& kernels, const at::Tensor& input,
                             const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             c10::IntArrayRef stride, c10::IntArrayRef padding,
                             c10::IntArrayRef dilation, int64_t groups,
                             c10::string_view activation,
                             const std::optional<at::Tensor>& residual);

// d(loss)/d(input): GEMM with the transposed weight, then col2im.
at::Tensor conv2d_grad_input_impl(const Conv2dKernels& kernels, const at::Tensor& grad_output,
                                  const at::Tensor& input, const at::Tensor& weight,
                                  c10::IntArrayRef stride, c10::IntArrayRef padding,
                                  c10::IntArrayRef dilation, int64_t groups);

// d(loss)/d(weight): im2col, then GEMM with grad_output, accumulated over chunks.
at::Tensor conv2d_grad_weight_impl(const Conv2dKernels& kernels, const at::Tensor& grad_output,
                                   const at::Tensor& input, const at::Tensor& weight,
                                   c10::IntArrayRef stride, c10::IntArrayRef padding,
                                   c10::IntArrayRef dilation, int64_t groups);

// d(loss)/d(bias): grad_output summed over batch and space (float32 accumulation).
at::Tensor conv2d_grad_bias_impl(const at::Tensor& grad_output);

}  // namespace customconv
