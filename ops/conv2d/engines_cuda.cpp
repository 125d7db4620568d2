#include <algorithm>

#include "ops/common/relayout_cuda.h"
#include "ops/conv2d/conv2d.h"
#include "ops/conv2d/dense_mma.h"
#include "ops/conv2d/grouped_direct.h"
#include "ops/conv2d/grouped_mma.h"
#include "ops/conv2d/image_chunks.h"
#include "ops/conv2d/implicit_gemm.h"
#include "ops/conv2d/pointwise_fused_lt.h"
#include "ops/conv2d/pointwise_gemm.h"
#include "ops/conv2d/pointwise_tf32_channels_last.h"
#include "ops/conv2d/pointwise_tf32_nchw.h"
#include "ops/conv2d/small_plane.h"
#include "ops/conv2d/stem_direct.h"
#include "ops/conv2d/strided_pointwise.h"
#include "ops/conv2d/tiny_direct.h"

namespace customconv {

namespace {

// Float32 NCHW pointwise forwards whose weight has at most 2^19 elements go
// to per-image GEMMs in place on planes of 7x7 positions and more
// (pointwise_conv2d_nchw), where the NCHW routes keep planes under 128
// positions for the column route (conv2d.h, nchw_gemm_in_place). On an H100
// at N=32 on 7x7 planes (MobileNetV2's and EfficientNet-B0's last stages)
// the per-image GEMMs took the device as long as cuDNN (960 -> 160: 21.5 us,
// cuDNN 21.3, the column route 26.1) and half the column route's host time
// (31-37 us against 60-118, F.conv2d's 23-31). With larger weights the
// column route is faster on the device (512 -> 2048: 43 us against 56), and
// in 16-bit the narrow, misaligned rows cost the per-image GEMMs up to 3x.
// Pointwise forwards of at most 2^26 multiply-adds (ResNet-50's 1x1 layers
// at N=1 are 2^25.6): on an H100 cuBLAS and the engine both take a few
// microseconds for them, less than the host's ~10 us saved per call by one
// launch instead of a GEMM and a bias add (a tiny channels_last 1x1 layer's
// host cost fell from 35-42 us to 17-25, F.conv2d's 18-25). Larger layers keep
// cuBLAS, where the engine measured slower: ResNet-50's at N=32 (2^30.6 to
// 2^31.6 multiply-adds) 1.3-1.8x.
constexpr int64_t kSmallPointwiseMacs = int64_t(1) << 26;

bool large_pointwise(const Conv2dShape<int64_t>& s) {
  return s.in.n * s.oh * s.ow * s.k * s.in.c / std::max<int64_t>(s.groups, 1) > kSmallPointwiseMacs;
}

constexpr int64_t kPerImagePointwiseMaxWeight = int64_t(1) << 19;

bool per_image_pointwise_forward(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  return input.scalar_type() == at::kFloat && s.groups == 1 && s.win.pointwise() &&
         s.oh * s.ow >= 49 && s.in.c * s.k <= kPerImagePointwiseMaxWeight;
}

// Unstrided NCHW pointwise forwards of several images whose planes have under
// 128 positions (those the NCHW routes would take through the column route,
// nchw_gemm_in_place) go through channels_last: the input changes layout
// (relayout_cuda.h), the channels_last GEMM runs (pointwise_gemm.h), and the
// result changes back. The column route moves as many bytes (a 1x1 window's
// im2col copies the input as it is, and its result is regrouped into
// images), but its product, (K, N*H*W) from (C, N*H*W) columns, ran slower in
// cuBLAS than the channels_last one. H200, N=32, us (kernels), column route /
// through channels_last (cuDNN): float32 512 -> 2048 at 7x7 40.7 / 25.7
// (27.5), 2048 -> 512 35.6 / 24.7 (29.9); float16 23.8 / 19.5 (21.3), 24.3 /
// 18.0 (20.8). Float32 layers with at most 2^19 weights keep the per-image
// GEMMs (per_image_pointwise_forward, one launch, as fast as cuDNN). On 14x14
// planes the 16-bit per-image GEMMs are slow (1024 -> 512: 36.6 us, cuDNN's
// the same kernel) and this route was faster (29.1), but its two more
// launches cost the host 14-16 us a call, more than the device saved on
// ResNet-50's other 14x14 layers (1.7 us).
// The same layers' gradients go the same way: grad_output (and for the
// weight's, the input with it, in one launch) changes layout, the
// channels_last GEMM runs, and the input gradient changes back. Before, the
// implicit GEMM took them behind the same layout changes. H200, N=32, us
// (kernels), implicit GEMM / through channels_last (cuDNN's two gradients
// together): float32 2048 -> 512 at 7x7, grad_weight 87.2 / 32.7,
// grad_input 37.3 / 31.0 (74.2); 512 -> 2048, 87.5 / 33.1, 43.4 / 27.9
// (73.7); float16 19.2 / 16.0, 26.0 / 19.3 (43.8) and 21.1 / 15.9, 27.4 /
// 17.7 (40.2).
bool pointwise_nchw_through_channels_last(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  if (s.groups != 1 || !s.win.pointwise() || s.in.n < 2 || input.dim() != 4 ||
      !input.is_contiguous() || input.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return false;
  }
  return !nchw_gemm_in_place(s);
}

std::optional<at::Tensor> pointwise_conv2d_through_channels_last(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const Conv2dShape<int64_t>& s) {
  if (conv2d_output_format(input, weight) != at::MemoryFormat::Contiguous) return std::nullopt;
  const at::Tensor x = to_memory_format(input, at::MemoryFormat::ChannelsLast);
  auto out = pointwise_conv2d(batched_gemm_cuda, x, weight, bias, s);
  if (!out) return std::nullopt;
  return to_memory_format(*out, at::MemoryFormat::Contiguous);
}

std::optional<at::Tensor> pointwise_grad_input_through_channels_last(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    const Conv2dShape<int64_t>& s) {
  if (conv2d_output_format(input, weight) != at::MemoryFormat::Contiguous) return std::nullopt;
  const at::Tensor go = to_memory_format(grad_output, at::MemoryFormat::ChannelsLast);
  auto gi = pointwise_conv2d_grad_input(batched_gemm_cuda, go, weight, s);
  if (!gi) return std::nullopt;
  return to_memory_format(*gi, at::MemoryFormat::Contiguous);
}

// (A 1x1 weight's gradient, (K, C, 1, 1), is NCHW and channels_last at once.)
std::optional<at::Tensor> pointwise_grad_weight_through_channels_last(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    const Conv2dShape<int64_t>& s) {
  if (conv2d_output_format(input, weight) != at::MemoryFormat::Contiguous) return std::nullopt;
  const auto [x, go] = to_channels_last_together(input, grad_output);
  return pointwise_conv2d_grad_weight(batched_gemm_cuda, go, x, s);
}

// Strided pointwise layers (strided_pointwise.h: the gathered positions and
// cuBLAS) above 2^26 multiply-adds; smaller ones stay with one launch of the
// implicit GEMM, as the route's extra launches would cost the host more than
// the device saves. On an H100 at N=32, channels_last, forward+backward
// (kernels, us: CUTLASS's kernels before / this route / cuDNN's):
//   - 16-bit, every layer: 1024 -> 2048 from 14x14 in float16 102 / 50 / 54
//     (CUTLASS's strided dgrad alone took 51 us, cuDNN's 21); 256 -> 512 from
//     56x56 131 / 100 / 96;
//   - float32 with 1024 or more output channels: 1024 -> 2048 from 14x14
//     225 / 119 / 121. With 512 (256 -> 512 from 56x56) the result's
//     zero-filled 100 MB cost more than the GEMMs saved (217 us against
//     207 before), so those layers keep CUTLASS.
// The forward takes the route only where the gather costs less than it saves,
// with deep reductions: float32 with 512 input channels or more (512 -> 1024
// from 28x28: 51.0 / 38.4 us, 1024 -> 2048 from 14x14: 46.5 / 36.9; 256 -> 512
// from 56x56: 49.8 / 56.2), 16-bit with 1024 or more (22.3 against 26.3; 25.7
// against 24.1 with 512).
// On sm_90, float32 channels_last layers go to the Hopper forward instead,
// wherever it takes them: its pingpong kernel measured faster than the route
// (H100, N=32: 512 -> 1024 from 28x28, 31.1 against 36.5 us, cuDNN 28.5;
// 1024 -> 2048 from 14x14, 34.9 against 37.1, cuDNN 28.9). NCHW inputs keep
// the route, which gathers only the positions the stride keeps.
// (Which layers are strided pointwise ones is the route's own check: it
// declines the others.)
bool strided_pointwise_route(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  return s.in.n * s.oh * s.ow * s.k * s.in.c > kSmallPointwiseMacs &&
         (input.scalar_type() != at::kFloat || s.k >= 1024);
}

bool strided_pointwise_forward(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  const bool f32 = input.scalar_type() == at::kFloat;
  if (!strided_pointwise_route(input, s) || s.in.c < (f32 ? 512 : 1024)) return false;
#ifdef CUSTOMCONV_WITH_CUTLASS
  if (f32 && hopper_forward_takes(input, s)) return false;
#endif
  return true;
}

// NCHW strided pointwise forwards (ResNet's downsampling shortcuts on NCHW
// data) on the gathered positions (strided_pointwise.h), where that measured
// faster than the column route (the same gather by im2col, one GEMM over a
// chunk's images, and a regroup into images, in chunks under the workspace
// limit): results of at least 28x28 positions, and float32 ones of at least
// 128, per image in place; float32 results of fewer through channels_last.
// H200, N=32, us, column route / this route (cuDNN): 256 -> 512 from 56x56,
// float32 106.2 / 62.7 (111.6), float16 48.1 / 36.4 (84.4), extra memory 46
// -> 24 MiB in float32; 512 -> 1024 from 28x28 in float32 63.7 / 61.1 (69.8);
// 1024 -> 2048 from 14x14 in float32, through channels_last, 65.4 / 55.9
// (54.0). The per-image GEMMs on narrower rows lost in 16-bit (512 -> 1024
// from 28x28, float16: 35.4 / 57.3) and on 7x7 results in float32 (124.0);
// 16-bit 7x7 results gained nothing through channels_last (39.3 / 40.2).
enum class StridedNchwRoute { kNone, kPerImage, kThroughChannelsLast };

StridedNchwRoute strided_pointwise_nchw_route(const at::Tensor& input,
                                              const Conv2dShape<int64_t>& s) {
  if (s.win.kh * s.win.kw != 1 || (s.win.sh == 1 && s.win.sw == 1)) return StridedNchwRoute::kNone;
  const int64_t length = s.oh * s.ow;
  const bool f32 = input.scalar_type() == at::kFloat;
  if (length >= 28 * 28 || (f32 && length >= kPointwisePerImageMinLength)) {
    return StridedNchwRoute::kPerImage;
  }
  return f32 ? StridedNchwRoute::kThroughChannelsLast : StridedNchwRoute::kNone;
}

// float32 groups of 8 with a stride go to the Hopper forward of merged
// groups before the grouped tensor-core kernels (implicit_gemm.h's
// hopper_grouped_forward_first).
bool grouped_hopper_first(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
#ifdef CUSTOMCONV_WITH_CUTLASS
  return hopper_grouped_forward_first(input, s);
#else
  (void)input, (void)s;
  return false;
#endif
}

// The grouped forward on tensor cores (grouped_mma.h), an NCHW input in
// chunks of images (image_chunks.h) whose channels_last results are written
// into the output's images.
std::optional<at::Tensor> grouped_mma_forward(const at::Tensor& input, const at::Tensor& weight,
                                              const std::optional<at::Tensor>& bias,
                                              const Conv2dShape<int64_t>& s,
                                              const ConvEpilogue* epilogue = nullptr) {
  return forward_by_image_chunks(
      input, s, epilogue, conv2d_output_format(input, weight),
      [&](const at::Tensor& x, const Conv2dShape<int64_t>& xs, const ConvEpilogue* e) {
        return grouped_mma_conv2d(x, weight, bias, xs, e, /*channels_last_result=*/true);
      });
}

}  // namespace

std::optional<at::Tensor> cuda_conv2d_engine(const at::Tensor& input, const at::Tensor& weight,
                                             const std::optional<at::Tensor>& bias,
                                             const Conv2dShape<int64_t>& s) {
  // Tiny NCHW problems in one launch (tiny_direct.h): their cost is the host's.
  if (auto out = tiny_direct_conv2d_cuda(input, weight, bias, s)) return out;
  // RGB stems with 3x3 windows on CUDA cores (stem_direct.h).
  if (auto out = stem_direct_conv2d_cuda(input, weight, bias, s, Activation::kIdentity)) return out;
#ifdef CUSTOMCONV_WITH_CUTLASS
  // Float32 NCHW pointwise layers in TF32: one CUTLASS launch, less host
  // time than cuBLAS's TF32 product (pointwise_tf32_nchw.h).
  if (auto out = pointwise_conv2d_nchw_tf32_cuda(input, weight, bias, s)) return out;
  if (large_pointwise(s)) {
    if (auto out = pointwise_conv2d_channels_last_tf32_cuda(input, weight, bias, s)) return out;
  }
#endif
  if (per_image_pointwise_forward(input, s)) {
    if (auto out = pointwise_conv2d_nchw(batched_gemm_cuda, input, weight, bias, s)) return out;
  }
  if (pointwise_nchw_through_channels_last(input, s)) {
    if (auto out = pointwise_conv2d_through_channels_last(input, weight, bias, s)) return out;
  }
  if (strided_pointwise_forward(input, s)) {
    if (auto out = strided_pointwise_conv2d_cuda(input, weight, bias, s)) return out;
  }
  if (const StridedNchwRoute route = strided_pointwise_nchw_route(input, s);
      route != StridedNchwRoute::kNone) {
    auto out = strided_pointwise_conv2d_nchw_cuda(input, weight, bias, s,
                                                  route == StridedNchwRoute::kThroughChannelsLast);
    if (out) return out;
  }
  if (s.groups > 1) {
    // Groups of 8 (or 4) channels on tensor cores, an 8-channel slice a warp,
    // and in 16-bit 16 channels a warp (grouped_mma.h): RegNet's 6
    // to 55 groups of 8, which no merge into 32-channel tiles divides, and
    // ResNeXt's 32 groups of 4, 8 and 16, where it measured faster than the
    // merged route (implicit_gemm.h), which multiplies the zeros between
    // groups, and than a tiled 3x3 kernel that read the input under a
    // block's output rectangle into shared memory (since removed). H100,
    // N=32, channels_last, us, merged or tiled / this kernel: float32 (TF32)
    // 128 ch at 56x56 (4 a group) 94.8 / 84.5, 256 at 28x28 53.5 / 47.4, 256
    // at 56x56 stride 2 70.7 / 69.3; float16 65.8 / 59.4, 38.3 (tiled) /
    // 32.9, 44.7 / 39.3, 512 at 28x28 stride 2 29.0 / 22.9, 512 at 14x14
    // 24.3 (tiled) / 19.8. On sm_90, float32 groups of 8 with a stride go
    // to the Hopper forward of merged groups first (grouped_hopper_first).
    if (!grouped_hopper_first(input, s)) {
      if (auto out = grouped_mma_forward(input, weight, bias, s)) return out;
    }
  }
#ifdef CUSTOMCONV_WITH_CUTLASS
  if (auto out = implicit_gemm_conv2d(input, weight, bias, s)) return out;
#endif
  if (s.groups > 1) return grouped_direct_conv2d(input, weight, bias, s);
  return std::nullopt;
}

// Channels_last pointwise forwards that the engine takes before the
// pointwise GEMM: the small ones, and the large ones of the TF32 GEMM
// (pointwise_tf32_channels_last.h).
bool cuda_pointwise_engine_first(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  if (!s.win.pointwise()) return false;
  if (!large_pointwise(s)) return true;
#ifdef CUSTOMCONV_WITH_CUTLASS
  return pointwise_tf32_channels_last_takes(input, s);
#else
  (void)input;
  return false;
#endif
}

std::optional<at::Tensor> cuda_conv2d_fused_engine(const at::Tensor& input,
                                                   const at::Tensor& weight,
                                                   const std::optional<at::Tensor>& bias,
                                                   const Conv2dShape<int64_t>& s,
                                                   const ConvEpilogue& epilogue) {
  if (!epilogue.has_residual()) {
    if (auto out = stem_direct_conv2d_cuda(input, weight, bias, s, epilogue.activation)) return out;
  }
  // Pointwise layers with relu or none: one cuBLASLt product, the residual its
  // C operand (pointwise_fused_lt.h).
  if (auto out = pointwise_fused_lt_cuda(input, weight, bias, s, epilogue)) return out;
  if (s.groups > 1 && (epilogue.has_residual() || !grouped_hopper_first(input, s))) {  // as in the forward
    if (auto out = grouped_mma_forward(input, weight, bias, s, &epilogue)) return out;
  }
#ifdef CUSTOMCONV_WITH_CUTLASS
  if (auto out = implicit_gemm_conv2d_fused(input, weight, bias, s, epilogue)) return out;
#endif
  return std::nullopt;
}

namespace {

// Whether a grouped layer's gradients are tiny (at most kTinyDirectMacs
// multiply-adds a pass, tiny_direct.h): they then take the direct kernels
// first (grouped_direct.h; one launch for the input gradient, the slices'
// planes and their sum for the weight's), whose device time is a few
// microseconds there. The routes through the tensor cores cost the host
// more than that: the input gradient as the forward of a rotated weight
// (two copies of the weight and a second op's checks and routing), the
// weight gradient as a dense problem whose groups' blocks are copied out.
bool tiny_grouped_gradients(const Conv2dShape<int64_t>& s) {
  return s.groups > 1 &&
         s.in.n * s.oh * s.ow * s.k * (s.in.c / s.groups) * s.win.kh * s.win.kw <= kTinyDirectMacs;
}

}  // namespace

std::optional<at::Tensor> cuda_conv2d_grad_input_engine(const at::Tensor& grad_output,
                                                        const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const Conv2dShape<int64_t>& s) {
  if (s.groups > 1) {
    if (tiny_grouped_gradients(s)) {
      if (auto gi = grouped_direct_conv2d_grad_input(grad_output, input, weight, s)) return gi;
    }
    // 16-bit 3x3 layers with 8 to 32 channels a group on tensor cores
    // (grouped_mma.h), an NCHW grad_output in chunks of images.
    auto gi = grad_input_by_image_chunks(
        grad_output, input, s, conv2d_output_format(input, weight),
        [&](const at::Tensor& go, const at::Tensor& x, const Conv2dShape<int64_t>& xs) {
          return grouped_mma_conv2d_grad_input(go, x, weight, xs, /*channels_last_result=*/true);
        });
    if (gi) return gi;
    if (grad_input_as_forward(s.win)) return std::nullopt;  // the grouped forward's tensor cores
#ifdef CUSTOMCONV_WITH_CUTLASS
    if (auto gi = implicit_gemm_grouped_conv2d_grad_input(grad_output, input, weight, s)) return gi;
#endif
    return grouped_direct_conv2d_grad_input(grad_output, input, weight, s);
  }
  if (pointwise_nchw_through_channels_last(input, s)) {
    if (auto gi = pointwise_grad_input_through_channels_last(grad_output, input, weight, s))
      return gi;
  }
  // RGB stems (stem_direct.h): no column buffer.
  if (auto gi = stem_direct_conv2d_grad_input_cuda(grad_output, input, weight, s)) return gi;
  // Strided pointwise layers: channels_last data on the gathered positions,
  // NCHW data the same way through channels_last (before: CUTLASS's strided
  // kernels behind the same layout changes; H200, N=32, us, before / now,
  // cuDNN's two NCHW gradients together: float32 1024 -> 2048 from 14x14,
  // grad_input 119.4 / 61.1, grad_weight 101.3 / 61.6 (139.7); 512 -> 1024
  // from 28x28, 150.8 / 93.4, 129.8 / 84.5 (194.0); float16 65.6 / 38.4,
  // 41.9 / 31.9 (74.7) and 66.0 / 52.3, 48.3 / 49.4 (114.9)).
  if (strided_pointwise_route(input, s)) {
    auto gi = strided_pointwise_conv2d_grad_input_cuda(grad_output, input, weight, s);
    if (gi) return gi;
    gi = strided_pointwise_conv2d_grad_input_nchw_cuda(grad_output, input, weight, s);
    if (gi) return gi;
  }
#ifdef CUSTOMCONV_WITH_CUTLASS
  return implicit_gemm_conv2d_grad_input(grad_output, input, weight, s);
#else
  return std::nullopt;
#endif
}

namespace {

// Whether the grouped weight gradient's direct kernel (CUDA cores, the
// groups' work only) goes before the implicit GEMM's dense problem (tensor
// cores, `groups` times the work): from 8 groups on in float32 and float64,
// from 32 in 16-bit, where the tensor cores are twice as fast again. On an
// H100 at N=32 the direct kernel took ResNeXt-50's and RegNet's grouped
// weight gradients in float32 from 0.26-0.41 ms to 0.03-0.08 ms (faster than
// cuDNN's on most), and ResNeXt's in float16 from 0.08-0.20 ms to 0.06-0.09
// ms; RegNet's 13 and 26 groups of 8 in float16 ran 10-15% faster as dense
// problems.
bool direct_grad_weight_first(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  return s.groups >= (input.element_size() == 2 ? 32 : 8);
}

// Whether an ungrouped weight gradient goes to the column route (im2col +
// cuBLAS) before the engines: NCHW 3x3 layers of 512 or more input channels
// over at most 6272 output positions (a 14x14 plane at N=32), whose
// reduction is short against their 9 C columns. On an H200 at N=32, us,
// engines / column route (cuDNN): ResNet-50's 512-channel 3x3 layer at 7x7
// in float32 (TF32) 102.7 / 52.8 (72.1), from 14x14 at stride 2 108.0 /
// 56.0 (79.6), in float16 57.5 / 39.8 (38.8) and 60.9 / 41.3 (41.1); its
// 256-channel layers at 14x14 74.3 / 118.6 in float32, so they stay. In
// channels_last the engines stay faster (float32 at 7x7 80.2 / 76.9, from
// 14x14 80.4 / 96.9; float16 28.1 / 55.7).
bool column_route_grad_weight_first(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  return s.win.kh == 3 && s.win.kw == 3 && s.in.c >= 512 && small_plane(s) &&
         !input.is_contiguous(at::MemoryFormat::ChannelsLast);
}

}  // namespace

std::optional<at::Tensor> cuda_conv2d_grad_weight_engine(const at::Tensor& grad_output,
                                                         const at::Tensor& input,
                                                         const at::Tensor& weight,
                                                         const Conv2dShape<int64_t>& s) {
  if (s.groups > 1) {
    if (tiny_grouped_gradients(s)) {
      if (auto gw = grouped_direct_conv2d_grad_weight(grad_output, input, weight, s)) return gw;
    }
    // NCHW operands in chunks of images (image_chunks.h).
    const at::MemoryFormat format = conv2d_output_format(input, weight);
    // 16-bit 3x3 layers with 8 to 32 channels a group on tensor cores (grouped_mma.h).
    auto gw = grad_weight_by_image_chunks(grad_output, input, weight, s, format,
                                          [&](const at::Tensor& go, const at::Tensor& x,
                                              const Conv2dShape<int64_t>& xs, bool unrounded) {
                                            return grouped_mma_conv2d_grad_weight(go, x, weight, xs,
                                                                                  unrounded);
                                          });
    if (gw) return gw;
    if (direct_grad_weight_first(input, s)) {
      gw = grad_weight_by_image_chunks(grad_output, input, weight, s, format,
                                       [&](const at::Tensor& go, const at::Tensor& x,
                                           const Conv2dShape<int64_t>& xs, bool unrounded) {
                                         return grouped_direct_conv2d_grad_weight(go, x, weight, xs,
                                                                                  unrounded);
                                       });
      if (gw) return gw;
    }
#ifdef CUSTOMCONV_WITH_CUTLASS
    if (auto gw = implicit_gemm_grouped_conv2d_grad_weight(grad_output, input, weight, s)) return gw;
#endif
    return grouped_direct_conv2d_grad_weight(grad_output, input, weight, s);
  }
  // 3x3 layers of 64k channels on tensor cores (dense_mma.h), but where
  // CUTLASS 3's Hopper kernel takes 16-bit ones: on an H100 (float16, N=32,
  // us, in CUDA graphs) ResNet-50's 64-channel layer took 38 here against 67
  // on the sm80-style implicit GEMM, its 128-channel layers 34-35 against 44
  // (cuDNN 26-28), its 256- and 512-channel layers 36 and 46 against the
  // Hopper kernel's 21 and 28. float32 (TF32) layers on large planes too:
  // on an H200, channels_last, 64 channels at 56x56 83.7 against 121.3 (cuDNN
  // 86.7), 128 channels at 28x28 67.5 against 77.8 (60.1).
  if (column_route_grad_weight_first(input, s)) return std::nullopt;
#ifdef CUSTOMCONV_WITH_CUTLASS
  const bool on_hopper = implicit_gemm_wgrad_on_hopper(input, s);
#else
  const bool on_hopper = false;
#endif
  if (!on_hopper) {
    if (auto gw = dense_mma_conv2d_grad_weight(grad_output, input, weight, s)) return gw;
  }
  if (pointwise_nchw_through_channels_last(input, s)) {
    if (auto gw = pointwise_grad_weight_through_channels_last(grad_output, input, weight, s))
      return gw;
  }
  if (strided_pointwise_route(input, s)) {
    auto gw = strided_pointwise_conv2d_grad_weight_cuda(grad_output, input, weight, s);
    if (gw) return gw;
    gw = strided_pointwise_conv2d_grad_weight_nchw_cuda(grad_output, input, weight, s);
    if (gw) return gw;
  }
#ifdef CUSTOMCONV_WITH_CUTLASS
  return implicit_gemm_conv2d_grad_weight(grad_output, input, weight, s);
#else
  return std::nullopt;
#endif
}

}  // namespace customconv
