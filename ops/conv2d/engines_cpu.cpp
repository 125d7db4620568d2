#include "ops/conv2d/channels_last_direct_cpu.h"
#include "ops/conv2d/channels_last_gemm.h"
#include "ops/conv2d/conv2d.h"
#include "ops/conv2d/few_channels_direct_cpu.h"
#include "ops/conv2d/grouped_direct_cpu.h"

namespace customconv {

namespace {

// Whether a pointwise layer (1x1, stride 1, unpadded) is left to ATen's GEMM
// (pointwise_gemm.h) rather than the direct kernels: where either channel
// count is not a whole number of the kernel's 64-channel blocks. Measured at
// N=8, float32, 2 threads on a 2-core machine, MobileNetV2's 1x1 layers ran
// faster as GEMMs (16 -> 96 at 112x112 12.7 ms against 18.4, 576 -> 96 at
// 14x14 0.87 against 1.06, 96 -> 576 0.87 against 0.97), ResNet-50's (64 to
// 2048 channels) as fast or faster on the direct kernel (256 -> 64 at 56x56
// 2.07 against 2.57).
bool pointwise_for_gemm(const Conv2dShape<int64_t>& s) {
  return s.win.pointwise() && (s.in.c % 64 != 0 || s.k % 64 != 0);
}

// The forward's rule: pointwise_for_gemm, except that float32 channels_last
// layers of 16 or more input channels and a multiple of 16 output channels
// go to the direct kernel. Measured again at N=8, 2 threads, with the caches
// evicted before each call, on MobileNetV2's 1x1 layers (ms, GEMM / direct /
// oneDNN): 16 -> 96 at 112x112 8.5 / 3.4 / 4.6, 24 -> 144 at 56x56 3.7 / 1.7
// / 2.0, 32 -> 192 at 28x28 1.4 / 1.0 / 1.0, 96 -> 576 at 14x14 2.0 / 1.5 /
// 1.5; 15 layers together 32.2 / 21.8 / 22.9. The measurement above it was
// dominated by page faults on fresh outputs, which both routes pay; 24
// output channels (half-empty 32-lane blocks) stay on the GEMM, 96 -> 24
// at 56x56 2.1 / 2.3.
bool pointwise_forward_for_gemm(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  if (s.win.pointwise() && input.scalar_type() == at::kFloat && s.in.batched && s.in.c >= 16 &&
      s.k % 16 == 0 && input.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return false;
  }
  return pointwise_for_gemm(s);
}

}  // namespace

std::optional<at::Tensor> cpu_conv2d_engine(const at::Tensor& input, const at::Tensor& weight,
                                            const std::optional<at::Tensor>& bias,
                                            const Conv2dShape<int64_t>& s) {
  if (s.groups > 1) return grouped_direct_conv2d_cpu(input, weight, bias, s);
  if (pointwise_forward_for_gemm(input, s)) return std::nullopt;
  if (auto out = few_channels_direct_conv2d_cpu(input, weight, bias, s)) return out;
  if (auto out = channels_last_direct_conv2d_cpu(input, weight, bias, s)) return out;
  return channels_last_gemm_conv2d(input, weight, bias, s);
}

std::optional<at::Tensor> cpu_conv2d_fused_engine(const at::Tensor& input, const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  const Conv2dShape<int64_t>& s,
                                                  const ConvEpilogue& epilogue) {
  // Pointwise layers the GEMM takes faster: the GEMM, then the epilogue's pass.
  if (s.groups > 1 || pointwise_forward_for_gemm(input, s)) return std::nullopt;
  return channels_last_direct_conv2d_cpu(input, weight, bias, s, &epilogue);
}

bool cpu_pointwise_grad_input_direct(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  return s.win.pointwise() && s.groups == 1 && s.in.batched && input.scalar_type() == at::kFloat &&
         s.in.c > 0 && s.k > 0 && !pointwise_for_gemm(s);
}

std::optional<at::Tensor> cpu_conv2d_grad_input_engine(const at::Tensor& grad_output,
                                                       const at::Tensor& input,
                                                       const at::Tensor& weight,
                                                       const Conv2dShape<int64_t>& s) {
  // Stride-1 windows run as the forward of grad_output with the rotated weight.
  if (grad_input_as_forward(s.win)) return std::nullopt;
  if (cpu_pointwise_grad_input_direct(input, s)) {
    // The same for pointwise layers (cpu_pointwise_grad_input_direct): the
    // forward of grad_output with the transposed weight, in the gradient's format.
    Conv2dShape<int64_t> t = s;
    t.in.c = s.k, t.k = s.in.c;
    const at::Tensor go = grad_output.contiguous(at::MemoryFormat::ChannelsLast);
    if (auto gi = channels_last_direct_conv2d_cpu(go, weight.transpose(0, 1), std::nullopt, t)) {
      return gi->contiguous(conv2d_output_format(input, weight));
    }
  }
  if (s.groups <= 1) return channels_last_gemm_conv2d_grad_input(grad_output, input, weight, s);
  return grouped_direct_conv2d_grad_input_cpu(grad_output, input, weight, s);
}

bool cpu_pointwise_grad_weight_direct(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  return s.win.pointwise() && s.in.n * s.oh * s.ow >= 2048 && direct_conv2d_grad_weight_takes(input, s);
}

std::optional<at::Tensor> cpu_conv2d_grad_weight_engine(const at::Tensor& grad_output,
                                                        const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const Conv2dShape<int64_t>& s) {
  if (s.groups > 1) return grouped_direct_conv2d_grad_weight_cpu(grad_output, input, weight, s);
  if (auto gw = direct_conv2d_grad_weight_cpu(grad_output, input, weight, s)) return gw;
  return channels_last_gemm_conv2d_grad_weight(grad_output, input, weight, s);
}

}  // namespace customconv
