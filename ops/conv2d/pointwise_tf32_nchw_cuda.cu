#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <limits>

#include "ops/common/launch.h"
#include "ops/conv2d/pointwise_tf32_nchw.h"
#include "ops/conv2d/tf32_gemm.cuh"

namespace customconv {
namespace {

using cutlass::gemm::GemmShape;
using RowMajor = cutlass::layout::RowMajor;

// One image's product is the GEMM (M, N, K) = (output channels, positions,
// input channels): A the weight (K x C, row-major), B the image's planes
// (C x H*W, row-major: positions contiguous), D the result's planes (K x
// H*W); the images are the batch, A's batch stride 0 (tf32_gemm.cuh).
// 128 x 128 blocks; 64 x 64 where the output channels fill 64-row tiles
// better (24, 144, 960 channels: MobileNetV2's and EfficientNet's layers).
using LargeGemm = Tf32Gemm<RowMajor, RowMajor, GemmShape<128, 128, 16>, GemmShape<64, 64, 16>, 4>;
using SmallGemm = Tf32Gemm<RowMajor, RowMajor, GemmShape<64, 64, 16>, GemmShape<32, 32, 16>, 5>;

// Blocks (K tiles, position tiles, images): planes of over 65535 tiles of
// positions decline (CUDA's grid).
template <typename Kernel>
bool launch(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& out, int n, int k,
            int c, int l) {
  const typename Kernel::Arguments args(
      cutlass::gemm::GemmUniversalMode::kBatched, cutlass::gemm::GemmCoord(k, l, c), n,
      {1.0f, 0.0f}, weight.const_data_ptr<float>(), input.const_data_ptr<float>(),
      out.const_data_ptr<float>(), out.mutable_data_ptr<float>(), 0, int64_t(c) * l, int64_t(k) * l,
      int64_t(k) * l, typename RowMajor::Stride(int(weight.stride(0))),
      typename RowMajor::Stride(l), typename RowMajor::Stride(l), typename RowMajor::Stride(l));
  return launch_tf32_gemm<Kernel>(args, input.get_device());
}

// The layers this GEMM takes: expanding and square ones (K >= C), and those
// with 64 or 128 output channels, which fill its tiles exactly. Other
// reducing layers keep cuBLAS, which ran them faster on the device. H200,
// N=32, us per layer (CUDA graphs), this GEMM / cuBLAS's per-image GEMMs
// (cuDNN): MobileNetV2's 16 -> 96 at 112x112 63.5 / 80.2 (63.5), ResNet-50's
// 1024 -> 512 at 14x14 46.5 / 64.8 (46.6), 256 -> 64 at 56x56 37.5 / 38.6
// (38.6), 512 -> 128 at 28x28 26.7 / 28.3 (28.2); but 512 -> 256 at 28x28
// 49.2 / 35.7, 1024 -> 256 at 14x14 26.6 / 20.2, and MobileNetV2's and
// EfficientNet-B0's projections (C / K of 3 to 6, K not a multiple of 64)
// 6-28% slower. Over a forward's unstrided 1x1 layers at N=32, with this rule,
// the device's time changed by -14.5 us (MobileNetV2), -5.0 (ResNet-50) and
// -1.3 (EfficientNet-B0), and the host's by -106, -125 and -50 us.
bool tf32_nchw_layer(int64_t c, int64_t k) { return k >= c || (k % 64 == 0 && k <= 128); }

}  // namespace

std::optional<at::Tensor> pointwise_conv2d_nchw_tf32_cuda(const at::Tensor& input,
                                                          const at::Tensor& weight,
                                                          const std::optional<at::Tensor>& bias,
                                                          const Conv2dShape<int64_t>& s) {
  if (!input.is_cuda() || input.scalar_type() != at::kFloat || !s.in.batched || s.groups != 1 ||
      !s.win.pointwise() || !at::globalContext().allowTF32CuDNN(at::Float32Op::CONV)) {
    return std::nullopt;
  }
  const int64_t l = s.oh * s.ow;
  if (!tf32_nchw_layer(s.in.c, s.k)) return std::nullopt;
  if (s.in.n * s.k * l == 0 || s.in.c == 0 || l % 4 != 0 || s.in.c % 4 != 0 ||
      !input.is_contiguous() ||
      conv2d_output_format(input, weight) != at::MemoryFormat::Contiguous ||
      weight.stride(1) != 1 || weight.stride(0) % 4 != 0 || !aligned16(input) ||
      !aligned16(weight)) {
    return std::nullopt;
  }
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (s.in.n > 65535 || s.k > kMax || s.in.c > kMax || l > kMax || weight.stride(0) > kMax) {
    return std::nullopt;
  }
  const c10::cuda::CUDAGuard guard(input.device());
  at::Tensor out = at::empty({s.in.n, s.k, s.oh, s.ow}, input.options());
  const int n = int(s.in.n), k = int(s.k), c = int(s.in.c), li = int(l);
  const bool small = (k + 63) / 64 * 64 < (k + 127) / 128 * 128;
  const bool ok = small ? launch<SmallGemm>(input, weight, out, n, k, c, li)
                        : launch<LargeGemm>(input, weight, out, n, k, c, li);
  if (!ok) return std::nullopt;
  if (bias.has_value() && bias->defined()) out.add_(bias->view({1, s.k, 1, 1}));
  return out;
}

}  // namespace customconv
