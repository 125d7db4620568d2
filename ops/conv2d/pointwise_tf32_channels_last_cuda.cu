#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <limits>

#include "ops/common/launch.h"
#include "ops/conv2d/pointwise_tf32_channels_last.h"
#include "ops/conv2d/tf32_gemm.cuh"

namespace customconv {
namespace {

using cutlass::gemm::GemmShape;
using RowMajor = cutlass::layout::RowMajor;
using ColumnMajor = cutlass::layout::ColumnMajor;

// The GEMM (M, N, K) = (positions N*H*W, output channels, input channels): A
// the input's rows (positions x C, row-major), B the weight read as its
// transpose (C x K, column-major: each output channel's C weights
// contiguous), D the result's rows (positions x K) (tf32_gemm.cuh); the
// epilogue adds the bias (C's row stride 0) or nothing (beta 0).
// 128 x 128 blocks; 128 x 64 where the output channels fill 64-wide tiles
// better.
using WideGemm = Tf32Gemm<ColumnMajor, RowMajor, GemmShape<128, 128, 16>, GemmShape<64, 64, 16>, 4>;
using NarrowGemm =
    Tf32Gemm<ColumnMajor, RowMajor, GemmShape<128, 64, 16>, GemmShape<64, 32, 16>, 5>;

// Blocks (position tiles, K tiles, 1).
template <typename Kernel>
bool launch(const at::Tensor& input, const at::Tensor& weight, const float* bias,
            const at::Tensor& out, int positions, int k, int c) {
  const float beta = bias != nullptr ? 1.0f : 0.0f;
  const typename Kernel::Arguments args(
      cutlass::gemm::GemmUniversalMode::kGemm, cutlass::gemm::GemmCoord(positions, k, c), 1,
      {1.0f, beta}, input.const_data_ptr<float>(), weight.const_data_ptr<float>(),
      bias != nullptr ? bias : out.const_data_ptr<float>(), out.mutable_data_ptr<float>(), 0, 0, 0,
      0, typename RowMajor::Stride(c), typename ColumnMajor::Stride(int(weight.stride(0))),
      typename RowMajor::Stride(0), typename RowMajor::Stride(k));
  return launch_tf32_gemm<Kernel>(args, input.get_device());
}

}  // namespace

// The layers it takes: at most 10240 multiply-adds a position (C * K), where
// the product is bound by its reads and writes. H200, N=32, channels_last, no
// bias, us per layer (CUDA graphs), this GEMM / cublasGemmStridedBatchedEx
// (cuDNN): MobileNetV2's 24 -> 144 at 56x56 30.5 / 35.1 (35.3), 96 -> 24 at
// 56x56 16.9 / 22.3 (22.3), 144 -> 24 24.1 / 29.4 (23.9), EfficientNet-B0's
// 240 -> 40 at 28x28 9.2 / 13.9 (9.4), ResNet-50's 64 -> 64 at 56x56 16.1 /
// 21.9 (16.1); but with wider products cuBLAS's Hopper kernels are faster:
// ResNet-50's 64 -> 256 at 56x56 55.2 / 41.0 (40.9), 512 -> 256 at 28x28
// 44.5 / 27.4, MobileNetV2's 96 -> 576 at 14x14 11.2 / 9.8, and the reducing
// layers of 7x7 and 14x14 planes (few tiles, deep reductions) up to 3x.
// Over a forward's unstrided 1x1 layers that this rule gives it, the device's
// time changed by -25 us (MobileNetV2), -33 (EfficientNet-B0) and -6
// (ResNet-50), and each such call's host time by -3 to -22 us.
bool pointwise_tf32_channels_last_takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  if (!input.is_cuda() || input.scalar_type() != at::kFloat || !s.in.batched || s.groups != 1 ||
      !s.win.pointwise() || s.in.c % 4 != 0 || s.k % 4 != 0 || s.in.c * s.k > 10240 ||
      !at::globalContext().allowTF32CuDNN(at::Float32Op::CONV)) {
    return false;
  }
  const int64_t positions = s.in.n * s.oh * s.ow;
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  return positions > 0 && positions <= kMax;
}

std::optional<at::Tensor> pointwise_conv2d_channels_last_tf32_cuda(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const Conv2dShape<int64_t>& s) {
  if (!pointwise_tf32_channels_last_takes(input, s) ||
      !input.is_contiguous(at::MemoryFormat::ChannelsLast) ||
      conv2d_output_format(input, weight) != at::MemoryFormat::ChannelsLast ||
      weight.stride(1) != 1 || weight.stride(0) % 4 != 0 ||
      weight.stride(0) > std::numeric_limits<int>::max() || !aligned16(input) ||
      !aligned16(weight)) {
    return std::nullopt;
  }
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias && (bias->stride(0) != 1 || !aligned16(*bias))) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  at::Tensor out = at::empty({s.in.n, s.k, s.oh, s.ow},
                             input.options().memory_format(at::MemoryFormat::ChannelsLast));
  const int positions = int(s.in.n * s.oh * s.ow), k = int(s.k), c = int(s.in.c);
  const float* b = has_bias ? bias->const_data_ptr<float>() : nullptr;
  const bool narrow = (k + 63) / 64 * 64 < (k + 127) / 128 * 128;
  const bool ok = narrow ? launch<NarrowGemm>(input, weight, b, out, positions, k, c)
                         : launch<WideGemm>(input, weight, b, out, positions, k, c);
  if (!ok) return std::nullopt;
  return out;
}

}  // namespace customconv
