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
// layers of 16 or more input channels and a multiple of 8 output channels
// go to the direct kernel. Measured again at N=8, 2 threads, with the caches
// evicted before each call, on MobileNetV2's 1x1 layers (ms, GEMM / direct /
// oneDNN): 16 -> 96 at 112x112 8.5 / 3.4 / 4.6, 24 -> 144 at 56x56 3.7 / 1.7
// / 2.0, 32 -> 192 at 28x28 1.4 / 1.0 / 1.0, 96 -> 576 at 14x14 2.0 / 1.5 /
// 1.5; 15 layers together 32.2 / 21.8 / 22.9. The measurement above it was
// dominated by page faults on fresh outputs, which both routes pay. Output
// channels that are a multiple of 8 but not of 16 (a block's last vector part
// empty) were measured later, same machine and method, GEMM / direct / oneDNN:
// 144 -> 24 at 56x56 1.63 / 1.42 / 1.17 (in the cache 1.46 / 0.65 / 0.56),
// 96 -> 24 1.15 / 1.01 / 0.66 (0.83 / 0.43 / 0.42), EfficientNet-B0's
// 240 -> 40 at 28x28 1.05 / 0.75 / 0.64, 960 -> 40 at 7x7 0.28 / 0.19 / 0.23.
bool pointwise_forward_for_gemm(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  if (s.win.pointwise() && input.scalar_type() == at::kFloat && s.in.batched && s.in.c >= 16 &&
      s.k % 8 == 0 && input.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return false;
  }
  return pointwise_for_gemm(s);
}

// Whether a pointwise layer's input gradient is the few-channel kernel's
// forward of grad_output (K < 16 channels) with the transposed weight: small
// layers, up to 1M multiply-adds, where the GEMM routes' setup outweighs the
// arithmetic. On a 2-core machine, 2 threads: 8 -> 8 at 8x8 N=1 5.8 us
// against 10.0 (NCHW) and 5.9 against 8.1 (channels_last), 32 -> 8 at 16x16
// N=2 9.6 against 11.1; at 4.8M level (16 -> 3 at 112x112 N=8, 0.2 ms), at
// 257M two times slower (256 -> 8 at 56x56 N=4: 1.07 against 0.46 ms).
bool few_channels_pointwise_grad_input(const Conv2dShape<int64_t>& s) {
  return s.win.pointwise() && s.groups == 1 && s.k < 16 &&
         s.in.n * s.in.h * s.in.w * s.in.c * s.k <= (int64_t(1) << 20);
}

}  // namespace

std::optional<at::Tensor> cpu_conv2d_engine(const at::Tensor& input, const at::Tensor& weight,
                                            const std::optional<at::Tensor>& bias,
                                            const Conv2dShape<int64_t>& s) {
  if (s.groups > 1) return grouped_direct_conv2d_cpu(input, weight, bias, s);
  // Few input channels (C < 16) take the direct kernel for 1x1 layers too:
  // on a 2-core machine, 2 threads, 8 -> 8 at 8x8 N=1 5.4 us against the
  // column route's 13.5 (F.conv2d 6.0-8.3), 8 -> 256 at 56x56 N=4 0.68 ms
  // against 4.2 (channels_last 0.31 against the GEMM's 0.41), 8 -> 64 at
  // 28x28 N=8 channels_last 49 against 62 us, 15 -> 64 at 56x56 N=4 level
  // (0.15-0.26 ms either way).
  if (auto out = few_channels_direct_conv2d_cpu(input, weight, bias, s)) return out;
  if (pointwise_forward_for_gemm(input, s)) return std::nullopt;
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
         s.in.c > 0 && s.k > 0 && (!pointwise_for_gemm(s) || few_channels_pointwise_grad_input(s));
}

// Where the phases' forwards on the direct kernels beat the channels_last
// GEMM route: with at least as many output positions as the GEMM's columns
// (9 C); below that the sub-weights' copies cost more than the GEMM's
// columns. On the 2-core development machine (float32 channels_last, ms,
// GEMM route -> phases): 64 channels at 112x112, N=4, 14.2 -> 5.9; 128 at
// 56x56, N=4, 7.5 -> 5.6 (oneDNN 4.6), N=8 15.8 -> 11.7; 256 at 28x28, N=16,
// 24.4 -> 20.9; and, left to the GEMM, 128 at 56x56, N=1, 1.7 -> 2.2, 256 at
// 28x28, N=4, 5.7 -> 6.0, 512 at 14x14, N=8, 11.5 -> 13.7.
bool cpu_grad_input_by_phases(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  const Window2d& w = s.win;
  return input.scalar_type() == at::kFloat && s.in.batched &&
         input.is_contiguous(at::MemoryFormat::ChannelsLast) && s.groups == 1 && w.kh == 3 &&
         w.kw == 3 && w.sh == 2 && w.sw == 2 && w.dh == 1 && w.dw == 1 && s.in.c >= 64 &&
         s.k >= 64 && s.in.n * s.oh * s.ow >= 9 * s.in.c;
}

std::optional<at::Tensor> cpu_conv2d_grad_input_engine(const at::Tensor& grad_output,
                                                       const at::Tensor& input,
                                                       const at::Tensor& weight,
                                                       const Conv2dShape<int64_t>& s) {
  // Stride-1 windows run as the forward of grad_output with the rotated weight:
  // over few channels here, with the rotated weight packed in one pass (tiny
  // 1x8x8x8 3x3 layer: 18.5 -> 7.4 us on a 2-core machine, F.conv2d's 16.4);
  // conv2d.cpp's stride-1 route takes the rest.
  if (grad_input_as_forward(s.win)) {
    if (s.groups == 1)
      return few_channels_direct_conv2d_grad_input_cpu(grad_output, input, weight, s);
    return std::nullopt;
  }
  // Small pointwise layers of few output channels: the same forward with the
  // transposed weight (few_channels_pointwise_grad_input).
  if (few_channels_pointwise_grad_input(s)) {
    if (auto gi = few_channels_direct_conv2d_grad_input_cpu(grad_output, input, weight, s))
      return gi;
  }
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
  return s.win.pointwise() &&
         ((s.in.n * s.oh * s.ow >= 2048 && direct_conv2d_grad_weight_takes(input, s)) ||
          small_pointwise_grad_weight_takes(input, s));
}

std::optional<at::Tensor> cpu_conv2d_grad_weight_engine(const at::Tensor& grad_output,
                                                        const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const Conv2dShape<int64_t>& s) {
  if (s.groups > 1) return grouped_direct_conv2d_grad_weight_cpu(grad_output, input, weight, s);
  if (auto gw = direct_conv2d_grad_weight_cpu(grad_output, input, weight, s)) return gw;
  if (auto gw = eight_channel_direct_conv2d_grad_weight_cpu(grad_output, input, weight, s))
    return gw;
  if (auto gw = small_pointwise_conv2d_grad_weight_cpu(grad_output, input, weight, s)) return gw;
  return channels_last_gemm_conv2d_grad_weight(grad_output, input, weight, s);
}

}  // namespace customconv
