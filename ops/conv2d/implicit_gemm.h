// conv2d as implicit GEMMs on tensor cores: no column buffer, the channels_last
// tensors read in place by the GEMMs' operand iterators, bias added in the
// forward GEMM's epilogue. The kernels are CUTLASS's sm80-style implicit GEMM
// convolutions (mma.sync with cp.async multistage pipelines), which run on
// compute capability 8.0 and newer; the engine is built where the CUTLASS
// headers are found (CUSTOMCONV_WITH_CUTLASS).
//
// Takes: CUDA tensors stored channels_last (the input, and grad_output for the
// gradients), or dense NCHW ones, changed to channels_last by one transpose
// kernel and the results changed back (relayout_cuda.h), in chunks of images
// whose copies stay within the workspace limit (image_chunks.h; 1x1 windows'
// weight gradients that would be chunked are declined), except for the
// pointwise layers whose NCHW route is a GEMM in place (nchw_gemm_in_place in
// conv2d.h); float16 or bfloat16, or float32 where PyTorch's TF32 policy for
// convolutions allows TF32 (torch.backends.cudnn.allow_tf32; the exact routes
// take it otherwise), groups 1 (the forward: see below), C and K multiples of 16 bytes (8 channels in
// 16-bit, 4 in float32), 16-byte aligned data, every tensor under 2^31
// elements. The weight is read as (K, kh, kw, C): a channels_last weight is
// used as it is, another is copied into that layout. Results are
// channels_last, as F.conv2d and its gradients are for channels_last inputs.
//
// Strided layers with fewer input channels than a vector (RGB stems) run
// packed by space-to-depth (space_to_depth_cuda.h) into a stride-1
// convolution of 4 * stride_h * stride_w channels: the forward and the weight
// gradient; their input gradient is declined. Other layers with fewer input
// channels than a vector are padded with zeros to a vector for the weight
// gradient, and their forward and input gradient are declined.

// Pointwise layers (1x1, stride 1, no padding) of any floating dtype skip the
// convolution kernels: on channels_last data each of their passes is one
// matrix product over (N*H*W, C) rows, which cuBLAS computes (pointwise_gemm.h).
//
// Grouped forward (groups > 1): groups are merged a few at a time into groups
// of a whole number of 32-channel tiles, at most 64 channels (ResNeXt's 32
// groups of 4 channels run as 4 groups of 32), the weight expanded into the
// merged groups' block-diagonal weight (zeros between the groups), and
// CUTLASS's single-group kernel runs them: each block computes 128 positions x
// 32 output channels of one merged group. Where no merge divides the groups
// (13 groups of 8) the engine declines, and the grouped direct kernels
// (grouped_direct.h) take them. Groups of 4 and 8 channels do not reach this
// engine's forward on devices the tensor-core kernel of grouped_mma.h runs
// on: that kernel goes first (engines_cuda.cpp). The gradients of grouped layers (2 to 32
// groups) run as the dense problem with the block-diagonal weight; see the
// grouped gradients below.
//
// Routes, each declining (nullopt) where it does not apply:
//   forward      the fprop kernel; on small planes (128 x 128 output tiles
//                for at most half the multiprocessors) its reduction split
//                into float32 partial outputs, added in order with the bias;
//                on sm_90 with 128 or more input channels (64 or more for
//                40 to 64 output channels), our Hopper kernel
//                (fprop_sm90_f32, fprop_wgmma_f16/bf16 below), and in
//                16-bit without bias or epilogue where the reduction would
//                split, CUTLASS 3's Hopper kernel in one pass
//                (fprop_sm90_f16/bf16);
//   grad_input   CUTLASS's dgrad kernels: unit stride (any dilation), or
//                strided without dilation, the weight read as it is; on
//                sm_90, the stride-1 gradient as the Hopper forward of
//                grad_output with the rotated weight where that forward
//                runs a Hopper kernel, and strided layers of 512 or more
//                output channels by stride phases on our Hopper forward
//                kernel (dgrad_phases_sm90_* below);
//   grad_weight  the wgrad kernel, its long reduction (N*P*Q) split into
//                slices that fill the device, each written to its own float32
//                plane (parallel split-K), then summed in a fixed order and
//                rounded once: bitwise reproducible, no atomics.
//
// Fused forward (conv2d_fused): out = activation(conv + bias + residual), the
// whole epilogue in the kernel's epilogue, in float32 from the accumulators,
// rounded once (no second pass over the output). It takes what the forward
// takes, and pointwise layers too (on the fprop kernel, not cuBLAS: their
// epilogue is the point). The residual (optional; the output's sizes and
// dtype) is read as NPQK, in place where it is stored channels_last, else
// copied into that layout first. Per case:
//   dense        CUTLASS's fprop with a broadcast epilogue: the bias the
//                per-output-channel vector, the residual the source tensor,
//                one kernel per dtype and tile for all activations (a runtime
//                parameter, uniform across the block);
//   split-K      (the small planes above) the forward's float32 slices, then
//                the epilogue in the kernel that adds them;
//   grouped      the merged groups' kernel with bias and activation; a
//                residual is declined (the caller's ATen epilogue takes it).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/activation.h"
#include "ops/common/conv_shapes.h"
#include "ops/common/epilogue.h"
#include "ops/conv2d/wgmma_plan.h"

namespace customconv {

// The output, or nullopt (nothing launched) when the engine does not take the
// case, so the caller takes another route.
std::optional<at::Tensor> implicit_gemm_conv2d(const at::Tensor& input, const at::Tensor& weight,
                                               const std::optional<at::Tensor>& bias,
                                               const Conv2dShape<int64_t>& s);
// out = epilogue.activation(conv(input, weight) + bias + epilogue.residual),
// computed as above; nullopt (nothing launched) where the engine does not take
// the case (as implicit_gemm_conv2d, plus grouped layers with a residual).
std::optional<at::Tensor> implicit_gemm_conv2d_fused(const at::Tensor& input, const at::Tensor& weight,
                                                     const std::optional<at::Tensor>& bias,
                                                     const Conv2dShape<int64_t>& s,
                                                     const ConvEpilogue& epilogue);
// Whether the Hopper forward (fprop_sm90_f32, fprop_wgmma_f16/bf16 below)
// would take the forward of `input` (as it is laid out) on its device: an
// sm_90 device, a build with sm_90a code, float32 under PyTorch's TF32 policy
// for convolutions or 16-bit, and wgmma_fprop_plan's conditions.
bool hopper_forward_takes(const at::Tensor& input, const Conv2dShape<int64_t>& s);
// Whether a grouped layer runs on the Hopper forward of merged groups
// before the grouped tensor-core kernels (grouped_mma.h): float32 under
// TF32, groups that merge into groups of 32 channels (hopper_groups_merged),
// on an sm_90 device, where the kernel that loads a tile's input once for
// its 9 taps takes the merged layer (halo_plan.h). On an H200 at N=32
// (channels_last, us, grouped kernel / this): ResNeXt-50's 128 channels in
// groups of 4 at 56x56 78.5 / 58.3, 256 in groups of 8 at 28x28 42.5 /
// 33.9, at 56x56 stride 2 47.2 / 41.7 (bench/NOTES.md).
bool hopper_grouped_forward_first(const at::Tensor& input, const Conv2dShape<int64_t>& s);
// The input gradient in `format` where given, else in conv2d_output_format
// (a grouped layer's dense problem gives it in the grouped layer's format:
// its block-diagonal weight is channels_last).
std::optional<at::Tensor> implicit_gemm_conv2d_grad_input(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    const Conv2dShape<int64_t>& s, std::optional<at::MemoryFormat> format = std::nullopt);
std::optional<at::Tensor> implicit_gemm_conv2d_grad_weight(const at::Tensor& grad_output,
                                                           const at::Tensor& input,
                                                           const at::Tensor& weight,
                                                           const Conv2dShape<int64_t>& s);
// Whether the weight gradient above runs CUTLASS 3's Hopper kernel: 16-bit
// layers of at most 6272 output positions (a 14x14 plane at N=32) and 128 or
// more output channels on an sm_90 device, in a build with sm_90a code.
bool implicit_gemm_wgrad_on_hopper(const at::Tensor& input, const Conv2dShape<int64_t>& s);

namespace implicit_gemm {

// The weight gradient's kernel, chosen per problem by implicit_gemm.cpp from
// the tile sweep's measurements on an H100 (bench/tune): rows x columns of
// the (K, kh*kw*C) result per block.
enum class WgradTile {
  kLarge,   // 128 x 128 (the general case)
  kSmall,   // 64 x 64: at most 64 output channels (float32: on large planes)
  kNarrow,  // 128 x 64, 16-bit: 1x1 windows (strided; stride 1 is one GEMM)
  kWide,    // 256 x 128, float32: small planes and 1x1 windows
  kSm90,    // 16-bit on sm_90: CUTLASS's Hopper kernel (TMA, warpgroup MMA), 128 x 64,
            // one pass written in the element type (small planes)
};

// One convolution as the kernels take it: NHWC activation, KRSC filter, NPQK
// output. The pass decides which are read and which is written: fprop writes
// `output` (adding `bias`, K elements, where not null); dgrad writes `input`;
// wgrad writes `weight` as float32.
struct ConvProblem {
  void* input;
  void* weight;
  void* output;
  const void* bias;
  int n, h, w, c;  // input
  int k, r, s;     // weight
  int p, q;        // output height and width
  int pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w;
  int device;
  void* stream;           // cudaStream_t
  // Slices of the reduction, each writing its own float32 partial result:
  // wgrad writes them to `weight` ((split_k, K, r, s, C)); fprop to `workspace`
  // ((split_k, N, P, Q, K)), then adds them, with the bias, into `output`.
  // The Hopper forward with split_k 1 takes `workspace`, where not null, as
  // the meeting places of its plan's tail (WgmmaPlan::tail).
  int split_k = 1;
  void* workspace = nullptr;
  // fprop only: groups, the weight (K, r, s, C / groups); each group's input
  // and output channels a multiple of kGroupTile (no split-K; the Hopper
  // forward takes some of them: wgmma_fprop_plan).
  int groups = 1;
  // The fused forward's epilogue after the bias: `residual` (NPQK like
  // `output`, or null) added, then `activation`. fprop_fused_* apply both
  // (split_k 1; no residual with groups); fprop_* apply them only in their
  // split-K sum, and decline them (false) otherwise.
  const void* residual = nullptr;
  Activation activation = Activation::kIdentity;
  // fprop and wgrad: the input's strides in elements between neighbouring
  // positions along w, h and n, where they are not those of packed NHWC
  // (zeros): the packed stems' overlapping view (C contiguous, 16-byte
  // aligned strides).
  int64_t input_strides[3] = {0, 0, 0};
  // The device's multiprocessors (the tile choice of dgrad reads it).
  int multiprocessors = 0;
  // wgrad only: the kernel (its split_k planes sized for that kernel's tile).
  WgradTile wgrad_tile = WgradTile::kLarge;
};

// The output channels of a grouped fprop's block, and the depth of its
// reduction steps: both lie inside one group.
constexpr int kGroupTile = 32;

// The weight gradient's tile (rows: K, columns: kh*kw*C) per kernel.
struct TileRowsCols {
  int rows, cols;
};
constexpr TileRowsCols wgrad_tile_shape(WgradTile t) {
  switch (t) {
    case WgradTile::kSmall: return {64, 64};
    case WgradTile::kNarrow:
    case WgradTile::kSm90: return {128, 64};
    case WgradTile::kWide: return {256, 128};
    default: return {128, 128};
  }
}

// One set per element type, each its own translation unit; false: not launched.
bool fprop_f16(const ConvProblem& problem);
bool fprop_bf16(const ConvProblem& problem);
bool fprop_f32(const ConvProblem& problem);  // TF32
// The fused forward (residual and activation in the kernel's epilogue), split_k 1.
bool fprop_fused_f16(const ConvProblem& problem);
bool fprop_fused_bf16(const ConvProblem& problem);
bool fprop_fused_f32(const ConvProblem& problem);  // TF32
bool dgrad_f16(const ConvProblem& problem);
bool dgrad_bf16(const ConvProblem& problem);
bool dgrad_f32(const ConvProblem& problem);
bool wgrad_f16(const ConvProblem& problem);
bool wgrad_bf16(const ConvProblem& problem);
bool wgrad_f32(const ConvProblem& problem);
// The Hopper forward (implicit_gemm_wgmma.cuh: our warpgroup-MMA kernel fed
// by TMA) in float32 as TF32, float16 or bfloat16, where wgmma_fprop_plan
// takes the problem; the bias, residual and activation in its epilogue, or in
// the split-K sum (split_k > 1, workspace as for fprop_*). False (nothing
// launched) where the plan declines, the build has no sm_90a code or the
// device is not sm_90.
bool fprop_sm90_f32(const ConvProblem& problem);
bool fprop_wgmma_f16(const ConvProblem& problem);
bool fprop_wgmma_bf16(const ConvProblem& problem);

// Whether the Hopper forward takes a problem, its box of output positions
// per tile, its tile width and its reduction slices. It takes dense layers
// (groups 1) with windows larger than 1x1 or a stride (unstrided 1x1 layers
// are GEMMs for cuBLAS; strided ones measured 0-2 us faster here than on the
// sm80-style kernels: float16 512 -> 1024 channels from 28x28, 24.5 -> 22.7
// us), packed NHWC input, K a multiple of 8, strides up to 8, and input
// channels a multiple of one 128-byte step (32 float32, 64 16-bit ones):
//   - 128 or more of them on tiles 128 output channels wide;
//   - 64 or more for layers of 40 to 64 output channels, on tiles 64 wide
//     (`cols`), two blocks a multiprocessor. The 128-wide ones multiplied an
//     empty half: 64 channels at 56x56 in float16 46.0 us against 35.9 on the
//     sm80-style kernels; 64-wide, 33.2 (cuDNN 27.7), and 128 -> 64 channels
//     at 28x28 29.6 -> 19.9 (cuDNN 18.2). With 32 output channels or fewer
//     half of a 64-wide tile is empty too, and it measured slower.
// 128-wide tiles that outnumber the multiprocessors run the pingpong variant
// (`pingpong`; H100, N=32, float32, us: the strided 1x1 256 -> 512 layer
// 48.9 -> 39.0, cuDNN 35.4; 128 channels at 56x56 stride 2 44.5 -> 40.0,
// cuDNN 35.2; with one tile a block it has nothing to overlap and its
// one-warpgroup epilogue is slower). In 16-bit it stores its tiles by TMA
// and takes the layers of short reductions (up to 8 steps of 64 channels)
// without a residual (float16, us: 256 -> 512 from 56x56 29.0 -> 25.8, 512 ->
// 1024 from 28x28 22.3 -> 21.5); ResNet-50's 128-channel 3x3 layers (18
// steps) measured within a microsecond either way, and a residual read from
// registers beside the TMA stores cost more than the overlap saved
// (bench/NOTES.md).
// In float32 the reduction is split in two where the tiles fill at most half
// the multiprocessors; in 16-bit the plan declines those problems (CUTLASS
// 3's Hopper kernel, fprop_sm90_f16 below, is faster than ours split in two:
// 512 channels at 7x7, 22.3 against 27.6 us on an H200).
// On an H100, with the L2 cache evicted before each call (as bench.py times),
// it took ResNet-50's 256- and 512-channel 3x3 layers at N=32 from 46-56 us
// to 43-46 (cuDNN 32-40), and since its epilogue is compiled per activation
// (store_tile), its 128-channel ones too (28x28: 50.8 -> 44.8 us, cuDNN 33.0;
// 56x56 stride 2: 52.2 -> 50.7, cuDNN 34.3). In 16-bit, with the code a cold
// tile runs kept short (stage_tile), it takes the 256-channel ones in 21-22
// us (cuDNN 21) and the 128-channel ones in 25.5-27 (the sm80-style kernels
// 28.5-29.5, cuDNN 21.5-22) (bench/NOTES.md). Tiles are boxes of output positions
// (choose_box), or 128 consecutive positions (im2col) where that takes fewer
// rounds of tiles over the multiprocessors: on an H100 at N=32, float32, us,
// boxes -> rows: 1024 channels at 14x14 460 -> 370 (cuDNN 358), 512 at
// 28x28 442 -> 401 (281), 256 at 56x56 479 -> 428 (282). Where both take
// one round (ResNet-50's layers at N=32) the boxes measured 1-3 us faster.
// Where the last round of tiles fills at most half the resident blocks and
// a tile's reduction has 32 steps or more, its tiles run in two halves of
// their reduction on two blocks (`tail`, wgmma_plan.h's tail_tiles): H200,
// float32, 128 channels at 28x28 34.1 -> 32.7 us, 256 at 14x14 with N=48
// 55.4 -> 47.8 (cuDNN 32.8 and 43.3).
struct WgmmaPlan {
  bool take;
  int split;
  Box box;
  bool im2col;     // tiles of 128 consecutive output positions (TMA's im2col mode), not boxes
  int cols = 128;  // output channels a tile: 128, 64 for layers of 40 to 64, or a group's
  // The pingpong kernel (128-wide tiles, more tiles than multiprocessors;
  // in 16-bit without a residual): each consumer warpgroup owns whole tiles,
  // and one's epilogue runs beside the other's main loop.
  bool pingpong = false;
  // Tiles of the last round run as two halves of their reduction
  // (wgmma_plan.h's tail_tiles; split 1), their meeting places in the
  // problem's workspace (tail_workspace_bytes).
  int tail = 0;
  // Output positions a tile: 128, or (16-bit, 128-wide tiles of the
  // cooperative kernel, rows of positions) 192 on three consumer warpgroups,
  // where fewer rounds of them take less time.
  int rows = 128;
};
// Groups (merged: block_diagonal_weight.h) of 32 input and 32 output
// channels in float32: a tile is one group's output channels, its reduction
// that group's input channels (the zeros between the groups a merge puts in
// are multiplied too), no split, no pingpong. (16-bit groups of 64 on
// 64-wide tiles measured slower than the sm80-style kernels: H200, N=32,
// float16, ResNeXt-50's 1024 channels in groups of 32 at 14x14 stride 2, 20
// against 16 us.)
inline WgmmaPlan wgmma_fprop_plan(const ConvProblem& pr, int element_size) {
  const bool wide = element_size == 2;  // 16-bit: 64 channels a step
  const bool pointwise = pr.r == 1 && pr.s == 1 && pr.stride_h == 1 && pr.stride_w == 1;
  const bool grouped = pr.groups > 1;
  const int cg = grouped ? pr.c / pr.groups : pr.c;  // a group's input channels
  if (grouped && (wide || pr.k != pr.c || cg != kGroupTile)) return {false, 1, {}, false};
  const int cols = grouped ? cg : pr.k > 32 && pr.k <= 64 ? 64 : 128;
  // A strided view of the input (a packed stem's) is read through its
  // strides, which TMA needs in whole 16 bytes.
  bool strides_ok = true;
  for (const int64_t st : pr.input_strides) strides_ok = strides_ok && st * element_size % 16 == 0;
  if ((element_size != 4 && !wide) || pointwise || !strides_ok ||
      cg < cols || cg % (128 / element_size) != 0 || pr.k % 8 != 0 || pr.stride_h > 8 ||
      pr.stride_w > 8) {
    return {false, 1, {}, false};
  }
  // im2col's window corners are 8-bit, its tap offsets 8-bit unsigned.
  const auto in8 = [](int v) { return v >= -128 && v <= 127; };
  const int span_h = (pr.r - 1) * pr.dilation_h, span_w = (pr.s - 1) * pr.dilation_w;
  const bool im2col_ok = in8(-pr.pad_h) && in8(-pr.pad_w) && in8(pr.pad_h - span_h) &&
                         in8(pr.pad_w - span_w) && span_h <= 255 && span_w <= 255 &&
                         int64_t(pr.n) * pr.p * pr.q < (int64_t(1) << 30);
  const Box box = choose_box(pr.n, pr.p, pr.q, pr.stride_h, pr.stride_w, 128);
  const int64_t k_tiles = (pr.k + cols - 1) / cols, sms = pr.multiprocessors;
  const int64_t box_tiles = box.tiles() * k_tiles;
  const int64_t im2col_tiles = (int64_t(pr.n) * pr.p * pr.q + 127) / 128 * k_tiles;
  // The 64-wide tiles run two blocks a multiprocessor, the 128-wide ones one.
  const int64_t blocks = sms * (cols <= 64 ? 2 : 1);
  const int64_t steps = int64_t(pr.r) * pr.s * cg / (128 / element_size);
  // Rows of positions without the boxes' empty rows, where that takes less
  // time over the resident blocks, a last round in halves (the tail) counted
  // as half a round: ResNet-50's 128-channel 3x3 layers at N=32 have 224
  // boxes (two rounds on 132 multiprocessors) and, in float32 (36 steps,
  // long enough for the tail), 196 rows of positions (a round and a half).
  bool im2col =
      im2col_ok && half_rounds(im2col_tiles, blocks, steps) < half_rounds(box_tiles, blocks, steps);
  int64_t tiles = im2col ? im2col_tiles : box_tiles;
  const bool split = !grouped && 2 * tiles <= pr.multiprocessors;
  if (wide && split) return {false, 1, {}, false};
  // 16-bit: the pingpong kernel for short reductions (at most 8 steps: the
  // strided 1x1 layers of up to 512 input channels) without a residual.
  const bool short_reduction = int64_t(pr.r) * pr.s * cg <= 8 * 64;
  const bool pingpong =
      cols == 128 && tiles > sms && (!wide || (short_reduction && pr.residual == nullptr));
  // 16-bit cooperative 128-wide tiles: 192 rows of positions where their
  // rounds, each 1.5 times as long, take less time (ResNet-50's 128-channel
  // 3x3 layers at N=32: 131 such tiles, one round, against 196 or 224 of 128
  // rows, two); a tile of M rows x 128 channels reads (M + 128) x 128 bytes a
  // step for 2 x M x 128 x 64 FLOPs, so 192 rows read a sixth fewer bytes of the
  // L2 a FLOP, which bounds those layers (bench/NOTES.md).
  int rows = 128;
  if (wide && cols == 128 && !pingpong && im2col_ok) {
    const int64_t tiles192 = (int64_t(pr.n) * pr.p * pr.q + 191) / 192 * k_tiles;
    if (3 * half_rounds(tiles192, sms, steps) < 2 * half_rounds(tiles, sms, steps)) {
      rows = 192, im2col = true, tiles = tiles192;
    }
  }
  const int tail = split ? 0 : int(tail_tiles(tiles, blocks, steps));
  return {true, split ? 2 : 1, box, im2col, cols, pingpong, tail, rows};
}

// The input gradient of a strided layer (float32 as TF32, float16, bfloat16)
// on the Hopper forward kernel, by stride phases (wgmma_plan.h's stride_phases: one stride-1
// forward of grad_output per phase, all in one launch, each writing its
// phase's input positions): ConvProblem as for dgrad (`input` written),
// `weight` the phases' weight ((C, taps, K) in memory, taps in
// stride_phases' slot order: phase_weight_cuda). Takes groups 1, dilation 1,
// strides up to 2 no wider than the window, a plane of at least the stride,
// K a multiple of 32 (16-bit: of 64) and C of 8, and `min_k` or more output
// channels (the reduction of the one-tap phases); false (nothing launched)
// otherwise, where the build has no sm_90a code or the device is not sm_90.
inline bool wgmma_dgrad_phases_take(const ConvProblem& pr, int min_k = 512) {
  return pr.groups == 1 && (pr.stride_h > 1 || pr.stride_w > 1) && pr.stride_h <= 2 &&
         pr.stride_w <= 2 && pr.dilation_h == 1 && pr.dilation_w == 1 && pr.r >= pr.stride_h &&
         pr.s >= pr.stride_w && pr.h >= pr.stride_h && pr.w >= pr.stride_w && pr.r * pr.s <= 64 &&
         pr.k >= min_k && pr.k % 32 == 0 && pr.c % 8 == 0;
}
bool dgrad_phases_sm90_f32(const ConvProblem& problem);
bool dgrad_phases_sm90_f16(const ConvProblem& problem);
bool dgrad_phases_sm90_bf16(const ConvProblem& problem);

// The Hopper weight gradient (wgrad_tile kSm90): `weight` written in the
// element type in one pass (split_k 1); false where the build has no sm_90a
// code or the device is not sm_90.
bool wgrad_sm90_f16(const ConvProblem& problem);
bool wgrad_sm90_bf16(const ConvProblem& problem);

// CUTLASS 3's Hopper forward in 16-bit (implicit_gemm_sm90.cuh), one pass
// with no epilogue beyond the store: false (nothing launched) where the
// problem has a bias, a residual, an activation, groups, a split reduction or
// strided input, where CUTLASS declines it, the build has no sm_90a code or
// the device is not sm_90.
bool fprop_sm90_f16(const ConvProblem& problem);
bool fprop_sm90_bf16(const ConvProblem& problem);

}  // namespace implicit_gemm
// Grouped layers' gradients (groups 2 to 32): the dense problem over all
// channel pairs with the block-diagonal weight, whose groups' blocks are kept;
// nullopt where the engine does not take it (its dense weight would pass 48
// MiB in float32, or the dense problem is declined).
std::optional<at::Tensor> implicit_gemm_grouped_conv2d_grad_input(const at::Tensor& grad_output,
                                                                  const at::Tensor& input,
                                                                  const at::Tensor& weight,
                                                                  const Conv2dShape<int64_t>& s);
std::optional<at::Tensor> implicit_gemm_grouped_conv2d_grad_weight(const at::Tensor& grad_output,
                                                                   const at::Tensor& input,
                                                                   const at::Tensor& weight,
                                                                   const Conv2dShape<int64_t>& s);

}  // namespace customconv
