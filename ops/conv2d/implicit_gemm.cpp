#include "ops/conv2d/implicit_gemm.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/common/launch.h"
#include "ops/common/relayout_cuda.h"
#include "ops/common/workspace.h"
#include "ops/conv2d/block_diagonal_weight.h"
#include "ops/conv2d/conv2d.h"
#include "ops/conv2d/halo_plan.h"
#include "ops/conv2d/image_chunks.h"
#include "ops/conv2d/rotated_weight.h"
#include "ops/conv2d/small_plane.h"
#include "ops/conv2d/space_to_depth_cuda.h"

namespace customconv {
namespace {

constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast;

bool fits_int(int64_t v) { return v <= std::numeric_limits<int>::max(); }

// The channel multiple the kernels need (16-byte vectors): 8 for 16-bit data, 4 for float32.
int64_t channel_multiple(const at::Tensor& t) { return 16 / t.element_size(); }

// Whether the engine takes the dtype: 16-bit, or float32 where PyTorch's TF32
// policy for convolutions allows TF32 (the kernels round float32 operands to
// TF32); otherwise the exact routes take float32.
bool takes_dtype(const at::Tensor& input) {
  const auto dtype = input.scalar_type();
  if (dtype == at::kFloat) return at::globalContext().allowTF32CuDNN(at::Float32Op::CONV);
  return dtype == at::kHalf || dtype == at::kBFloat16;
}

// Grouped layers run as groups of `gs` groups each (block_diagonal), where
// gs groups have a whole number of kGroupTile input and output channels, at
// most 64: the fewest such gs that divides the groups, or 0 where there is
// none. ResNeXt's 32 groups of 4 channels run as 4 groups of 32.
constexpr int64_t kMaxMergedChannels = 64;
int64_t groups_merged(const Conv2dShape<int64_t>& s) {
  const int64_t cg = s.in.c / s.groups, kg = s.k / s.groups;
  for (int64_t gs = 1; gs <= s.groups && gs * std::max(cg, kg) <= kMaxMergedChannels; ++gs) {
    if (s.groups % gs == 0 && (gs * cg) % implicit_gemm::kGroupTile == 0 &&
        (gs * kg) % implicit_gemm::kGroupTile == 0) {
      return gs;
    }
  }
  return 0;
}

// Whether the engine takes the geometry and dtype: batched, groups 1 (or, for
// the forward, groups that groups_merged() merges), C and K multiples of
// channel_multiple() and not zero, every size an int.
bool takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  if (!takes_dtype(input)) return false;
  const int64_t m = channel_multiple(input);
  if (!s.in.batched || (s.groups != 1 && groups_merged(s) == 0) || s.in.c == 0 || s.in.c % m != 0 || s.k == 0 ||
      s.k % m != 0) {
    return false;
  }
  const Window2d& win = s.win;
  for (int64_t v : {s.in.n * s.in.c * s.in.h * s.in.w, s.k * s.in.c * win.kh * win.kw,
                    s.in.n * s.k * s.oh * s.ow, win.ph, win.pw, win.sh, win.sw, win.dh, win.dw}) {
    if (!fits_int(v)) return false;
  }
  return true;
}

int multiprocessors(int device) { return at::cuda::getDeviceProperties(device)->multiProcessorCount; }

// The problem with the geometry of s and no tensors yet.
implicit_gemm::ConvProblem geometry(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  const Window2d& win = s.win;
  implicit_gemm::ConvProblem pr{};
  pr.n = int(s.in.n), pr.h = int(s.in.h), pr.w = int(s.in.w), pr.c = int(s.in.c);
  pr.k = int(s.k), pr.r = int(win.kh), pr.s = int(win.kw), pr.p = int(s.oh), pr.q = int(s.ow);
  pr.pad_h = int(win.ph), pr.pad_w = int(win.pw), pr.stride_h = int(win.sh);
  pr.stride_w = int(win.sw), pr.dilation_h = int(win.dh), pr.dilation_w = int(win.dw);
  pr.device = int(input.get_device());
  pr.stream = at::cuda::getCurrentCUDAStream().stream();
  pr.multiprocessors = multiprocessors(pr.device);
  return pr;
}

// The input's strides for the kernels where it is a view other than packed
// channels_last (packed_input's folded columns).
void set_input_strides(implicit_gemm::ConvProblem& pr, const at::Tensor& input) {
  if (input.is_contiguous(kChannelsLast)) return;
  pr.input_strides[0] = input.stride(3), pr.input_strides[1] = input.stride(2);
  pr.input_strides[2] = input.stride(0);
}

// One pass's kernels per element type.
using Launcher = bool (*)(const implicit_gemm::ConvProblem&);
struct PassKernels {
  Launcher f16, bf16, f32;
  bool operator()(const at::Tensor& t, const implicit_gemm::ConvProblem& pr) const {
    switch (t.scalar_type()) {
      case at::kHalf: return f16(pr);
      case at::kBFloat16: return bf16(pr);
      default: return f32(pr);
    }
  }
};
constexpr PassKernels kFprop{&implicit_gemm::fprop_f16, &implicit_gemm::fprop_bf16,
                             &implicit_gemm::fprop_f32};
constexpr PassKernels kFpropFused{&implicit_gemm::fprop_fused_f16, &implicit_gemm::fprop_fused_bf16,
                                  &implicit_gemm::fprop_fused_f32};
constexpr PassKernels kDgrad{&implicit_gemm::dgrad_f16, &implicit_gemm::dgrad_bf16,
                             &implicit_gemm::dgrad_f32};
constexpr PassKernels kWgrad{&implicit_gemm::wgrad_f16, &implicit_gemm::wgrad_bf16,
                             &implicit_gemm::wgrad_f32};


// Reduction slices for the forward, 1 unless its 128 x 128 tiles (more than
// 64 output channels) fill at most half the multiprocessors: then as many slices
// as bring them to about two blocks per multiprocessor, each slice a whole
// number of 64-channel reduction steps, and at least 128 channels long.
int fprop_split_k(const Conv2dShape<int64_t>& s, int device) {
  if (s.k <= 64) return 1;
  const int64_t tiles = ((s.in.n * s.oh * s.ow + 127) / 128) * ((s.k + 127) / 128);
  const int64_t sms = multiprocessors(device);
  // (With half the multiprocessors busy or more, splitting measured slower:
  // ResNet-50's 14x14 3x3 layer at N=32 has 98 tiles on 132 SMs.)
  if (2 * tiles > sms) return 1;
  int split = int(std::min<int64_t>((2 * sms + tiles - 1) / tiles, s.in.c / 128));
  while (split > 1 && s.in.c % (split * 64) != 0) --split;
  return std::max(split, 1);
}

#ifdef CUSTOMCONV_WITH_SM90A
bool is_sm90(int device) {
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(device);
  return p->major == 9 && p->minor == 0;
}
#endif

// The weight gradient's kernel, from bench/tune's sweep on an H100 (ResNet-50's
// layers at N=32, against the kernel used before, 128 x 128 throughout):
// float32 small planes and 1x1 windows 256 x 128 (0.083 -> 0.065 ms on 28x28
// 3x3 stride 2); 16-bit small planes the Hopper kernel (0.046 -> 0.029 ms on
// the same layer, 0.057 -> 0.041 ms on 7x7 3x3), at most 64 output channels
// 64 x 64 (0.107 -> 0.075 ms on 56x56 3x3 64 -> 64), 1x1 windows 128 x 64.
// float32 with at most 64 output channels on large planes 64 x 64 too: the
// 128-row tiles are half empty there (56x56 3x3 64 -> 64: 0.221 ms on 128 x
// 128, 0.128 on 64 x 64 with 120 slices; cuDNN 0.087).
using implicit_gemm::WgradTile;

WgradTile wgrad_tile(const at::Tensor& input, const Conv2dShape<int64_t>& s, bool sm90) {
  const int64_t positions = s.in.n * s.oh * s.ow;
  const bool pointwise = s.win.kh == 1 && s.win.kw == 1;
  if (input.scalar_type() == at::kFloat) {
    if (positions <= kSmallPlanePositions) return WgradTile::kWide;
    if (s.k <= 64) return WgradTile::kSmall;
    return pointwise ? WgradTile::kWide : WgradTile::kLarge;
  }
  if (sm90 && positions <= kSmallPlanePositions && s.k >= 128) return WgradTile::kSm90;
  if (s.k <= 64) return WgradTile::kSmall;
  if (pointwise) return WgradTile::kNarrow;
  return WgradTile::kLarge;
}

// Reduction slices for the weight gradient: enough blocks for about `waves`
// per multiprocessor (2; 64 x 64 tiles 4, 8 in float32, 128 x 64 tiles 1, as
// measured), each slice at least `min_slice` positions long (1024; a chunk
// of an NCHW batch's images, wgrad_in_chunks, the chunk's share of that),
// their float32 planes within 48 MiB.
constexpr int64_t kMinSlicePositions = 1024;

int wgrad_split_k(const at::Tensor& input, const Conv2dShape<int64_t>& s, int device,
                  WgradTile tile, int64_t min_slice) {
  const implicit_gemm::TileRowsCols shape = implicit_gemm::wgrad_tile_shape(tile);
  const int64_t tiles = ((s.k + shape.rows - 1) / shape.rows) *
                        ((s.win.kh * s.win.kw * s.in.c + shape.cols - 1) / shape.cols);
  const int64_t small_waves = input.scalar_type() == at::kFloat ? 8 : 4;
  const int64_t waves = tile == WgradTile::kSmall    ? small_waves
                        : tile == WgradTile::kNarrow ? 1
                                                     : 2;
  const int64_t wanted = (waves * int64_t(multiprocessors(device)) + tiles - 1) / tiles;
  const int64_t by_length = (s.in.n * s.oh * s.ow) / min_slice;
  const int64_t plane_bytes = s.k * s.win.kh * s.win.kw * s.in.c * 4;
  const int64_t by_memory = (int64_t(48) << 20) / plane_bytes;
  return int(std::max<int64_t>(1, std::min({wanted, by_length, by_memory, int64_t(256)})));
}

// t (N, C, H, W) with zero channels appended up to c, channels_last.
at::Tensor pad_channels(const at::Tensor& t, int64_t c) {
  return at::constant_pad_nd(t.permute({0, 2, 3, 1}), {0, c - t.size(1)}).permute({0, 3, 1, 2});
}

// Strided layers with fewer input channels than a vector (RGB stems: 7x7
// stride 2 in ResNets) run as the stride-1 convolution that
// space_to_depth_cuda.h packs them into: phases and neighbouring columns
// folded into the channels until each tap holds one whole reduction step of
// the fprop kernel (64 channels in 16-bit, 32 in float32), whose optimized
// iterators step through C per tap in such steps. ResNet-50's stem in
// float16: 4x1 taps of 64 channels, a 256-long reduction for the layer's 147
// (7x7 taps of 3 channels), at full 16-byte vectors: 0.10 ms at N=32 on an
// H100 (cuDNN 0.09), where the column route ran im2col and a GEMM whose
// 147-long rows are not 16-byte aligned (0.21-0.35 ms). Packing the phases
// alone (16 channels a tap) left three quarters of each step empty (0.21 ms),
// and CUTLASS's few-channels iterators, which step through the flattened
// reduction, compute coordinates per vector and ran no faster. The zero taps
// cost arithmetic, not memory traffic, and a stem's output is large next to
// its arithmetic: MobileNet's 3x3 stride-2 stem (27 -> 128, 3 -> 32
// channels) is bound by writing its output either way. Stems whose packed
// reduction would be more than 5 times the layer's keep the column route, and
// so do forwards with an NCHW result whose packed reduction is more than twice
// the layer's: their channels_last result costs a layout change that the
// column route does not pay (MobileNet's stem in float16 NCHW: 0.078 ms by
// columns, 0.113 ms packed on an H100; ResNet's, 1.74 times the reduction,
// gains either way).
constexpr int64_t kPackedChannels = 4;  // channels per phase: C is at most this
constexpr int64_t kMaxPackedReduction = 5;      // times the layer's
constexpr int64_t kMaxPackedReductionNchw = 2;  // the same, forwards with an NCHW result

struct PackedStem {
  Conv2dShape<int64_t> shape;  // the packed convolution's
  SpaceToDepth input, weight;
};

// The packed problem of s, or nullopt where the rule above keeps the other
// routes; max_ratio bounds the packed reduction, in times the layer's.
std::optional<PackedStem> packed_stem(const at::Tensor& input, const Conv2dShape<int64_t>& s,
                                      int64_t max_ratio = kMaxPackedReduction) {
  const Window2d& w = s.win;
  const int64_t m = channel_multiple(input);
  if (!takes_dtype(input) || input.dim() != 4 || s.groups != 1 || s.in.c == 0 ||
      s.in.c > kPackedChannels || s.in.c % m == 0 || w.dh != 1 || w.dw != 1 ||
      w.sh * w.sw < 2 || s.in.n * s.oh * s.ow == 0) {
    return std::nullopt;
  }
  const int64_t step = 128 / input.element_size();  // the fprop kernels' reduction step
  const int64_t phases = kPackedChannels * w.sh * w.sw;
  if (step % phases != 0 && phases % step != 0) return std::nullopt;
  const int64_t fold = std::max<int64_t>(1, step / phases);
  const int64_t th = (w.kh + w.sh - 1) / w.sh, tw = (w.kw + w.sw * fold - 1) / (w.sw * fold);
  if (th * tw * phases * fold > max_ratio * w.kh * w.kw * s.in.c) return std::nullopt;
  PackedStem p{s, {w.sh, w.sw, w.ph, w.pw, kPackedChannels, fold, 1},
               {w.sh, w.sw, 0, 0, kPackedChannels, fold, fold}};
  p.shape.in.c = phases * fold;
  p.shape.in.h = s.oh + th - 1, p.shape.in.w = s.ow + fold * (tw - 1);
  p.shape.win = Window2d{th, tw, 1, 1, 0, 0, 1, fold};
  if (!takes(input, p.shape)) return std::nullopt;
  return p;
}

// The packed input: the phases packed (fold 1) on a plane fold - 1 columns
// wider, and the folded columns an overlapping view of it (channel j*phases + i
// of column b is channel i of column b + j), which the kernels read through
// its strides: 1/fold of the bytes that packing the folds would write.
at::Tensor packed_input(const at::Tensor& input, const PackedStem& p) {
  SpaceToDepth phases_only = p.input;
  phases_only.fold = 1;
  const int64_t fold = p.input.fold, h = p.shape.in.h, w = p.shape.in.w + fold - 1;
  const at::Tensor t = space_to_depth_cuda(input, phases_only, h, w);
  if (fold == 1) return t;
  const int64_t c = t.size(1);
  return t.as_strided({t.size(0), c * fold, h, p.shape.in.w}, {h * w * c, 1, w * c, c});
}
at::Tensor packed_weight(const at::Tensor& weight, const PackedStem& p) {
  return space_to_depth_cuda(weight, p.weight, p.shape.win.kh, p.shape.win.kw);
}

// The packed weight's gradient (K, fold*sh*sw*cv, th, tw), stored
// channels_last, unpacked into the layer's (K, C, kh, kw): channel
// ((j*sh + u)*sw + v)*cv + c of tap (t, t') is tap (sh*t + u, sw*(fold*t' + j) + v)
// of channel c.
at::Tensor unpacked_weight_grad(const at::Tensor& g, const PackedStem& p, const Conv2dShape<int64_t>& s) {
  const SpaceToDepth& q = p.weight;
  const int64_t k = g.size(0), th = g.size(2), tw = g.size(3);
  return g.permute({0, 2, 3, 1})
      .view({k, th, tw, q.fold, q.sh, q.sw, q.cv})
      .permute({0, 6, 1, 4, 2, 3, 5})
      .reshape({k, q.cv, th * q.sh, tw * q.fold * q.sw})
      .narrow(1, 0, s.in.c)
      .narrow(2, 0, s.win.kh)
      .narrow(3, 0, s.win.kw);
}

// An activation (the input, or grad_output) and the shape as the kernels take
// them: channels_last, and C a whole number of vectors.
struct Operand {
  at::Tensor t;
  Conv2dShape<int64_t> s;
  at::Tensor with;  // prepare's `with`, channels_last, where it was changed with t
};

// Whether NCHW data goes to the engine through a layout change each way
// (relayout_cuda.h): grouped layers always; not pointwise layers whose NCHW
// route is a GEMM on the NCHW tensors in place (nchw_gemm_in_place); the
// gradients of every other layer. The forward where the layout changes (the
// input, the output and the weight, each read and written once) move less than
// half the elements that the NCHW route's column buffer holds (written by
// im2col, then read by the GEMM): on an H100 at N=32 the changes cost more
// than that rule of thumb suggests on 14x14 and 7x7 planes and on strided
// layers (ResNet-50's 1x1 stride-2 and 3x3 layers from 14x14 down, whose
// column route measured up to 1.8x faster), and less on 56x56 and 28x28 3x3
// layers (1.2-1.8x faster than the column route).
// Strided windows larger than 1x1 change layout on large planes, where the
// column route's buffer is the larger move: from 28x28 in float32 and from
// 56x56 in 16-bit. On an H200 at N=32 (ResNet-50's 3x3 stride-2 forwards, ms,
// column route / layout change, cuDNN NCHW): float32 128 channels from 56x56
// 0.132 / 0.093 (0.074), 256 from 28x28 0.094 / 0.062 (0.058), 512 from
// 14x14 0.060 / 0.073 (0.066); float16 0.070 / 0.051 (0.052), 0.039 / 0.049
// (0.043), 0.037 / 0.065 (0.047).
bool relayout_nchw(const Conv2dShape<int64_t>& s, bool forward, int64_t element_size) {
  if (s.groups > 1) return true;
  if (nchw_gemm_in_place(s)) return false;
  if (!forward) return true;
  const Window2d& w = s.win;
  if (w.kh * w.kw > 1 && (w.sh > 1 || w.sw > 1) && s.in.c >= 16 &&
      s.in.h * s.in.w >= (element_size >= 4 ? 28 * 28 : 56 * 56)) {
    return true;
  }
  const int64_t moved = s.in.n * s.in.c * s.in.h * s.in.w + s.in.n * s.k * s.oh * s.ow +
                        s.k * s.in.c * w.kh * w.kw;
  const int64_t columns = s.in.n * s.in.c * w.kh * w.kw * s.oh * s.ow;
  return 2 * moved < columns;
}

// `t` (N, C, ...) prepared for the kernels, or nullopt where the engine
// declines: channels_last, used in place, or, with `relayout`, a dense NCHW
// tensor copied into channels_last once the engine is known to take the case.
// With `pad` > 0 and fewer input channels than a vector, the channels are
// padded with zeros to a multiple of `pad` (the weight gradient of an RGB
// stem: 3 channels), in one small copy. Where t's layout changes, `with` (if
// defined: the pass's other NCHW operand) changes with it, in the same
// allocation and launch (relayout_cuda.h).
std::optional<Operand> prepare(const at::Tensor& t, const Conv2dShape<int64_t>& s, int64_t pad,
                               bool relayout, const at::Tensor& with = at::Tensor()) {
  if (!takes_dtype(t) || !s.in.batched || t.dim() != 4) return std::nullopt;
  const bool nchw = !t.is_contiguous(kChannelsLast);
  if (nchw && !(relayout && t.is_contiguous())) return std::nullopt;
  Operand op{t, s};
  const bool padded = pad > 0 && s.in.c < channel_multiple(t) && s.in.c % pad != 0;
  if (padded) op.s.in.c = (s.in.c + pad - 1) / pad * pad;
  if (!takes(t, op.s)) return std::nullopt;
  if (nchw && with.defined() && !padded) {
    std::tie(op.t, op.with) = to_channels_last_together(t, with);
  } else if (nchw) {
    op.t = to_memory_format(t, kChannelsLast);
  }
  if (padded) op.t = pad_channels(op.t, op.s.in.c);
  if (!aligned16(op.t)) return std::nullopt;
  return op;
}

// The weight (K, C/groups, kh, kw) of groups merged gs at a time, as the
// weight of groups/gs groups (block_diagonal_weight.h), stored channels_last.
at::Tensor block_diagonal(const at::Tensor& weight, int64_t groups, int64_t gs) {
  if (gs == 1) return weight;
  return block_diagonal_weight_cuda(weight, groups, gs);
}

at::Tensor in_format(const at::Tensor& t, const at::Tensor& input, const at::Tensor& weight) {
  return to_memory_format(t, conv2d_output_format(input, weight));
}

#ifdef CUSTOMCONV_WITH_SM90A
// The Hopper forward (fprop_sm90_f32, fprop_wgmma_f16/bf16) on an sm_90
// device where its plan takes the problem. Whether it launched (pr is left as
// it was).
bool fprop_sm90(const at::Tensor& input, const implicit_gemm::ConvProblem& problem, const at::Tensor& out) {
  if (!is_sm90(problem.device)) return false;
  const implicit_gemm::WgmmaPlan plan = implicit_gemm::wgmma_fprop_plan(problem, int(input.element_size()));
  if (!plan.take) return false;
  implicit_gemm::ConvProblem pr = problem;
  pr.split_k = plan.split;
  at::Tensor partial;  // the slices' float32 partial outputs, or the tail's meeting places
  if (pr.split_k > 1) {
    partial = at::empty({pr.split_k, out.numel()}, input.options().dtype(at::kFloat));
    pr.workspace = partial.mutable_data_ptr();
  } else if (plan.tail > 0) {
    partial = at::empty({implicit_gemm::tail_workspace_bytes(plan.tail, plan.cols, plan.rows)},
                        input.options().dtype(at::kByte));
    pr.workspace = partial.mutable_data_ptr();
  }
  switch (input.scalar_type()) {
    case at::kHalf:
      return implicit_gemm::fprop_wgmma_f16(pr);
    case at::kBFloat16:
      return implicit_gemm::fprop_wgmma_bf16(pr);
    default:
      return implicit_gemm::fprop_sm90_f32(pr);
  }
}

// CUTLASS 3's 16-bit Hopper forward (fprop_sm90_f16/bf16) on an sm_90 device
// where the sm80-style forward would split its reduction (`split` > 1: its
// tiles fill at most half the multiprocessors). On an H100, ResNet-50's
// 512-channel 3x3 layers at N=32, kernel alone (bench/tune's sweep, float16):
// 7x7 plane 22.1 us against 29.0 split in two (cuDNN 17.6), 14x14 stride 2
// 23.2 against 29.1; on larger planes it measured no faster or slower, and
// it has no epilogue for a bias or a fused activation. Whether it launched.
bool fprop_sm90_16bit(const at::Tensor& input, const implicit_gemm::ConvProblem& pr, int split) {
  if (split <= 1 || input.scalar_type() == at::kFloat || !is_sm90(pr.device)) return false;
  return input.scalar_type() == at::kHalf ? implicit_gemm::fprop_sm90_f16(pr)
                                          : implicit_gemm::fprop_sm90_bf16(pr);
}

// Groups merged for the Hopper forward (wgmma_fprop_plan): as many as make
// 32 channels, in float32, where each group has as many input as output
// channels, the merged groups divide the layer's and the plan takes the
// merged problem, read as packed channels_last (as prepare gives it), on the
// input's device; 0 otherwise.
int64_t hopper_groups_merged(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  const int64_t cg = s.in.c / s.groups, width = implicit_gemm::kGroupTile;
  if (input.scalar_type() != at::kFloat || !s.in.batched || cg != s.k / s.groups || width % cg != 0 ||
      s.groups % (width / cg) != 0) {
    return 0;
  }
  const int64_t gs = width / cg;
  implicit_gemm::ConvProblem pr = geometry(input, s);
  pr.groups = int(s.groups / gs);
  if (!is_sm90(pr.device) || !implicit_gemm::wgmma_fprop_plan(pr, int(input.element_size())).take) return 0;
  return gs;
}
#endif

// The forward on prepared operands (channels_last input, merged groups), the
// output channels_last. With `epilogue` (the fused forward): its residual
// added (read as NPQK: copied into channels_last where it is stored
// otherwise) and its activation applied, by the fused kernels, or by the
// split-K sum where the reduction is split.
std::optional<at::Tensor> fprop(const at::Tensor& input, const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias, const Conv2dShape<int64_t>& s,
                                const ConvEpilogue* epilogue = nullptr) {
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor w = to_memory_format(weight, kChannelsLast);  // (K, kh, kw, C) in memory
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  const bool has_residual = epilogue != nullptr && epilogue->has_residual();
  const at::Tensor r = has_residual ? to_memory_format(epilogue->residual, kChannelsLast) : at::Tensor();
  if (!aligned16(w) || (has_bias && !aligned16(b)) || (has_residual && !aligned16(r))) {
    return std::nullopt;
  }
  at::Tensor out = empty_channels_last(input, s.in.n, s.k, s.oh, s.ow);
  if (out.numel() == 0) return out;
  implicit_gemm::ConvProblem pr = geometry(input, s);
  pr.input = const_cast<void*>(input.const_data_ptr());
  set_input_strides(pr, input);
  pr.weight = const_cast<void*>(w.const_data_ptr());
  pr.output = out.mutable_data_ptr();
  pr.bias = has_bias ? b.const_data_ptr() : nullptr;
  if (epilogue != nullptr) {
    pr.residual = has_residual ? r.const_data_ptr() : nullptr;
    pr.activation = epilogue->activation;
  }
  if (s.groups > 1) {
    pr.groups = int(s.groups);
#ifdef CUSTOMCONV_WITH_SM90A
    if (fprop_sm90(input, pr, out)) return out;
#endif
  } else {
    const int split = fprop_split_k(s, pr.device);
#ifdef CUSTOMCONV_WITH_SM90A
    if (fprop_sm90(input, pr, out) || fprop_sm90_16bit(input, pr, split)) return out;
#endif
    pr.split_k = split;
  }
  at::Tensor partial;  // the slices' float32 partial outputs
  if (pr.split_k > 1) {
    partial = at::empty({pr.split_k, out.numel()}, input.options().dtype(at::kFloat));
    pr.workspace = partial.mutable_data_ptr();
  }
  // The split-K forward applies the epilogue in its sum; a single pass needs the fused kernels.
  const PassKernels& kernels = epilogue != nullptr && pr.split_k <= 1 ? kFpropFused : kFprop;
  if (!kernels(input, pr)) return std::nullopt;
  return out;
}

// The forward of one chunk of images (or the whole batch), unfused (epilogue
// null) or fused: the channels_last result.
std::optional<at::Tensor> forward_images(const at::Tensor& input, const at::Tensor& weight,
                                         const std::optional<at::Tensor>& bias,
                                         const Conv2dShape<int64_t>& s,
                                         const ConvEpilogue* epilogue, bool nchw_result) {
  if (const auto packed = packed_stem(input, s, nchw_result ? kMaxPackedReductionNchw : kMaxPackedReduction)) {
    return fprop(packed_input(input, *packed), packed_weight(weight, *packed), bias, packed->shape,
                 epilogue);
  }
  const auto x = prepare(input, s, 0, relayout_nchw(s, /*forward=*/true, input.element_size()),
                         s.groups == 1 ? weight : at::Tensor());
  if (!x) return std::nullopt;
  at::Tensor w = x->with.defined() ? x->with : weight;
  Conv2dShape<int64_t> merged = x->s;
  if (s.groups > 1) {
    int64_t gs = groups_merged(s);
#ifdef CUSTOMCONV_WITH_SM90A
    if (const int64_t hopper = hopper_groups_merged(x->t, x->s)) gs = hopper;
#endif
    w = block_diagonal(weight, s.groups, gs);
    merged.groups = s.groups / gs;
  }
  return fprop(x->t, w, bias, merged, epilogue);
}

// The forward, unfused (epilogue null) or fused. An NCHW input whose layout
// changes goes in chunks of images (relayout_chunk), each chunk's result
// written into the output's images.
std::optional<at::Tensor> forward(const at::Tensor& input, const at::Tensor& weight,
                                  const std::optional<at::Tensor>& bias,
                                  const Conv2dShape<int64_t>& s, const ConvEpilogue* epilogue) {
  // An NCHW input that keeps its layout (relayout_nchw) and is not a packed
  // stem is declined by every chunk's prepare(): decline it before the
  // chunks' views (NCHW pointwise layers in place come through here first).
  if (!input.is_contiguous(kChannelsLast) && s.in.c > kPackedChannels &&
      !(relayout_nchw(s, /*forward=*/true, input.element_size()) && input.is_contiguous())) {
    return std::nullopt;
  }
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  const bool nchw_result = format != kChannelsLast;
  return forward_by_image_chunks(
      input, s, epilogue, format,
      [&](const at::Tensor& x, const Conv2dShape<int64_t>& xs, const ConvEpilogue* e) {
        return forward_images(x, weight, bias, xs, e, nchw_result);
      });
}

// The sm80-style weight gradient's tile and reduction slices for x (prepared)
// and xs, the shape the kernels take.
struct WgradSlices {
  WgradTile tile;
  int split;
};
WgradSlices wgrad_slices(const at::Tensor& x, const Conv2dShape<int64_t>& xs,
                         int64_t min_slice = kMinSlicePositions) {
  const WgradTile tile = wgrad_tile(x, xs, false);
  return {tile, wgrad_split_k(x, xs, int(x.get_device()), tile, min_slice)};
}

// The weight gradient's problem on prepared operands (x and go channels_last,
// xs the shape the kernels take), its result pointer and tile left to set.
implicit_gemm::ConvProblem wgrad_problem(const at::Tensor& x, const at::Tensor& go,
                                         const Conv2dShape<int64_t>& xs) {
  implicit_gemm::ConvProblem pr = geometry(x, xs);
  pr.input = const_cast<void*>(x.const_data_ptr());
  set_input_strides(pr, x);
  pr.output = const_cast<void*>(go.const_data_ptr());
  return pr;
}

// The sm80-style weight gradient of prepared operands into `planes`: its
// slices' float32 (K, kh, kw, C) planes, sl.split of them from there on.
// Whether it launched.
bool wgrad_into_planes(const at::Tensor& x, const at::Tensor& go, const Conv2dShape<int64_t>& xs,
                       WgradSlices sl, float* planes) {
  implicit_gemm::ConvProblem pr = wgrad_problem(x, go, xs);
  pr.wgrad_tile = sl.tile;
  pr.split_k = sl.split;
  pr.weight = planes;
  return kWgrad(x, pr);
}

// The weight gradient on prepared operands (x and go channels_last, xs the
// shape the kernels take): (K, xs.in.c, kh, kw), stored channels_last, in the
// element type; nullopt where the kernels decline.
std::optional<at::Tensor> wgrad(const at::Tensor& x, const at::Tensor& go,
                                const Conv2dShape<int64_t>& xs) {
  if (!aligned16(x) || !aligned16(go)) return std::nullopt;
#ifdef CUSTOMCONV_WITH_SM90A
  // (The Hopper kernel reads packed NHWC only.)
  if (x.is_contiguous(kChannelsLast) &&
      wgrad_tile(x, xs, is_sm90(int(x.get_device()))) == WgradTile::kSm90) {
    implicit_gemm::ConvProblem pr = wgrad_problem(x, go, xs);
    pr.wgrad_tile = WgradTile::kSm90;
    // One pass, written in the element type: (K, kh, kw, C) in memory.
    const at::Tensor gw = at::empty({xs.k, xs.in.c, xs.win.kh, xs.win.kw},
                                    x.options().memory_format(kChannelsLast));
    pr.weight = gw.mutable_data_ptr();
    const bool launched = x.scalar_type() == at::kHalf ? implicit_gemm::wgrad_sm90_f16(pr)
                                                       : implicit_gemm::wgrad_sm90_bf16(pr);
    if (launched) return gw;
  }
#endif
  const WgradSlices sl = wgrad_slices(x, xs);
  // The slices' float32 (K, kh, kw, C) planes, summed in order and rounded once.
  const at::Tensor planes =
      at::empty({sl.split, xs.k, xs.win.kh, xs.win.kw, xs.in.c}, x.options().dtype(at::kFloat));
  if (!wgrad_into_planes(x, go, xs, sl, planes.mutable_data_ptr<float>())) return std::nullopt;
  // (K, kh, kw, C) in memory: the (K, C, kh, kw) gradient, channels_last.
  // One float32 slice is the gradient itself; else the slices are summed in
  // order and rounded once, in one launch (column_route.h).
  if (sl.split == 1 && x.scalar_type() == at::kFloat)
    return planes.select(0, 0).permute({0, 3, 1, 2});
  at::Tensor gw =
      at::empty({xs.k, xs.in.c, xs.win.kh, xs.win.kw}, x.options().memory_format(kChannelsLast));
  sum_slices_cuda(planes, gw);
  return gw;
}

// The weight gradient of `n` images in chunks of `chunk` (relayout_chunk):
// operands(n0, nc) gives the chunk's prepared input and grad_output
// (channels_last; nullopt where they cannot be), shape(nc) the kernels' shape
// for nc images. Each chunk's slices' float32 planes follow the previous
// chunks', all of them within chunk_partials_limit_bytes (at least
// a plane a chunk), summed in order and rounded once: (K, C, kh, kw) of the
// kernels' shape, stored channels_last, or nullopt where a chunk declines.
template <class Shape, class Operands>
std::optional<at::Tensor> wgrad_in_chunks(const at::Tensor& input, int64_t n, int64_t chunk,
                                          const Shape& shape, const Operands& operands) {
  const Conv2dShape<int64_t> xs = shape(chunk);
  const int64_t plane = xs.k * xs.win.kh * xs.win.kw * xs.in.c;
  const int64_t chunks = (n + chunk - 1) / chunk;
  const int64_t limit = chunk_partials_limit_bytes(input.device().type());
  const int64_t cap = std::max<int64_t>(1, limit / (plane * 4) / chunks);
  // A chunk's slices as short as the whole batch's would be in as many
  // slices (NCHW float32, N=32, two chunks, us of the kernels: 128 channels
  // 3x3 stride 2 from 56x56, 144.8 -> 126.3; 64 channels 3x3 at 56x56,
  // 112.6 -> 101.4).
  const int64_t min_slice = std::max<int64_t>(1, kMinSlicePositions * chunk / n);
  std::vector<WgradSlices> slices;
  int64_t total = 0;
  for (int64_t n0 = 0; n0 < n; n0 += chunk) {
    WgradSlices sl = wgrad_slices(input, shape(std::min(chunk, n - n0)), min_slice);
    sl.split = int(std::min<int64_t>(sl.split, cap));
    slices.push_back(sl);
    total += sl.split;
  }
  const at::Tensor planes =
      at::empty({total, xs.k, xs.win.kh, xs.win.kw, xs.in.c}, input.options().dtype(at::kFloat));
  float* at = planes.mutable_data_ptr<float>();
  for (int64_t n0 = 0, i = 0; n0 < n; n0 += chunk, ++i) {
    const int64_t nc = std::min(chunk, n - n0);
    const auto xg = operands(n0, nc);
    if (!xg || !aligned16(xg->first) || !aligned16(xg->second)) return std::nullopt;
    if (!wgrad_into_planes(xg->first, xg->second, shape(nc), slices[i], at)) return std::nullopt;
    at += slices[i].split * plane;
  }
  at::Tensor gw = at::empty({xs.k, xs.in.c, xs.win.kh, xs.win.kw},
                            input.options().memory_format(kChannelsLast));
  sum_slices_cuda(planes, gw);
  return gw;
}

}  // namespace

bool hopper_forward_takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
#ifdef CUSTOMCONV_WITH_SM90A
  if (s.groups != 1 || !takes_dtype(input) || !is_sm90(int(input.get_device()))) return false;
  implicit_gemm::ConvProblem pr = geometry(input, s);
  set_input_strides(pr, input);
  return implicit_gemm::wgmma_fprop_plan(pr, int(input.element_size())).take;
#else
  (void)input, (void)s;
  return false;
#endif
}

bool hopper_grouped_forward_first(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
#ifdef CUSTOMCONV_WITH_SM90A
  if (input.scalar_type() != at::kFloat || !takes_dtype(input) || s.groups <= 1) return false;
  const int64_t gs = hopper_groups_merged(input, s);
  if (gs == 0) return false;
  implicit_gemm::ConvProblem pr = geometry(input, s);
  pr.groups = int(s.groups / gs);
  return implicit_gemm::halo_shape(pr).take;
#else
  (void)input, (void)s;
  return false;
#endif
}

std::optional<at::Tensor> implicit_gemm_conv2d(const at::Tensor& input, const at::Tensor& weight,
                                               const std::optional<at::Tensor>& bias,
                                               const Conv2dShape<int64_t>& s) {
  return forward(input, weight, bias, s, nullptr);
}

std::optional<at::Tensor> implicit_gemm_conv2d_fused(const at::Tensor& input, const at::Tensor& weight,
                                                     const std::optional<at::Tensor>& bias,
                                                     const Conv2dShape<int64_t>& s,
                                                     const ConvEpilogue& epilogue) {
  // The merged groups' kernel has one source, which is the bias.
  if (s.groups > 1 && epilogue.has_residual()) return std::nullopt;
  return forward(input, weight, bias, s, &epilogue);
}

#ifdef CUSTOMCONV_WITH_SM90A
// The stride-1 input gradient as the forward of grad_output (go, prepared
// channels_last) with the rotated weight (rotated_weight.h), where that
// forward runs a Hopper kernel (fprop_sm90, fprop_sm90_16bit): our Hopper
// forward where its plan takes the transposed problem, and in 16-bit CUTLASS
// 3's where the sm80-style kernels' tiles would be few. On an H100 (N=32, CUDA
// graphs, us, input gradient / forward): ResNet-50's 512-channel 7x7 layer
// 65 / 34 in float32 and 31.5 / 19.4 in float16, its 256-channel 14x14
// layer 51 / 32 in float32. Rotating the weight with at::flip and
// permuted copies took 26 us there; rotated_weight_cuda's one kernel takes
// a few. nullopt where the route does not apply.
std::optional<at::Tensor> grad_input_as_hopper_forward(const at::Tensor& go,
                                                       const at::Tensor& input,
                                                       const at::Tensor& weight,
                                                       const Conv2dShape<int64_t>& s) {
  const Window2d& win = s.win;
  if (s.groups != 1 || !grad_input_as_forward(win) || !is_sm90(input.get_device()))
    return std::nullopt;
  Conv2dShape<int64_t> t = s;  // the transposed problem: grad_output in, the input's gradient out
  t.in.c = s.k, t.in.h = s.oh, t.in.w = s.ow;
  t.k = s.in.c, t.oh = s.in.h, t.ow = s.in.w;
  t.win.ph = win.dh * (win.kh - 1) - win.ph, t.win.pw = win.dw * (win.kw - 1) - win.pw;
  implicit_gemm::ConvProblem pr = geometry(go, t);
  set_input_strides(pr, go);
  const int element_size = int(input.element_size());
  const bool hopper = implicit_gemm::wgmma_fprop_plan(pr, element_size).take ||
                      (element_size == 2 && fprop_split_k(t, pr.device) > 1);
  if (!hopper) return std::nullopt;
  return fprop(go, rotated_weight_cuda(weight), std::nullopt, t);
}

// The strided input gradient by stride phases on the Hopper forward kernel
// (implicit_gemm.h's dgrad_phases_sm90_*), float32 as TF32, float16 and
// bfloat16, one launch after the phases' weight is written
// (phase_weight_cuda). On an H100 (N=32, us, CUTLASS's strided dgrad -> this,
// CUDA graphs / the L2 evicted before each call): ResNet-50's 512-channel
// stride-2 layer in float32 90.5 -> 53.2 / 93.2 -> 59.1 (cuDNN 40.2 / 42.8);
// 1024 channels at 14x14 242 -> 160 / 244 -> 166. In 16-bit, since the
// kernel's cold start was shortened, that layer's forward+backward goes
// 97.7 -> 89.6 (float16) and 97.8 -> 88.7 (bfloat16; cuDNN 68). With 128 and
// 256 output channels the one-tap phases' reductions are short and it
// measured slower in every type (16-bit: 108.7 -> 112.5 and 83.2 -> 86.9;
// bench/NOTES.md), so wgmma_dgrad_phases_take asks for 512. nullopt where
// the route does not apply. With groups > 1, `weight` is a grouped layer's
// and `s` the shape of the dense problem with its block-diagonal weight,
// whose phases' weight is written straight from the grouped one
// (phase_weight_cuda).
bool hopper_phases_take(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  return is_sm90(input.get_device()) && implicit_gemm::wgmma_dgrad_phases_take(geometry(input, s));
}

std::optional<at::Tensor> grad_input_by_hopper_phases(const at::Tensor& go, const at::Tensor& input,
                                                      const at::Tensor& weight,
                                                      const Conv2dShape<int64_t>& s,
                                                      int64_t groups = 1) {
  if (!go.is_contiguous(kChannelsLast) || !hopper_phases_take(input, s)) return std::nullopt;
  implicit_gemm::ConvProblem pr = geometry(input, s);
  const implicit_gemm::StridePhases sp = implicit_gemm::stride_phases(
      pr.h, pr.w, pr.c, pr.r, pr.s, pr.pad_h, pr.pad_w, pr.stride_h, pr.stride_w);
  if (sp.phases.empty()) return std::nullopt;
  const at::Tensor w = phase_weight_cuda(weight, sp.taps, groups);
  at::Tensor gi = empty_channels_last(input, s.in.n, s.in.c, s.in.h, s.in.w);
  pr.input = gi.mutable_data_ptr();
  pr.weight = const_cast<void*>(w.const_data_ptr());
  pr.output = const_cast<void*>(go.const_data_ptr());
  bool launched = false;
  switch (input.scalar_type()) {
    case at::kFloat:
      launched = implicit_gemm::dgrad_phases_sm90_f32(pr);
      break;
    case at::kHalf:
      launched = implicit_gemm::dgrad_phases_sm90_f16(pr);
      break;
    case at::kBFloat16:
      launched = implicit_gemm::dgrad_phases_sm90_bf16(pr);
      break;
    default:  // (the callers' takes_dtype admits no other)
      break;
  }
  if (!launched) return std::nullopt;
  return gi;
}
#endif

namespace {

// The input gradient of one chunk of images (or the whole batch), stored
// channels_last.
std::optional<at::Tensor> grad_input_images(const at::Tensor& grad_output, const at::Tensor& input,
                                            const at::Tensor& weight,
                                            const Conv2dShape<int64_t>& s) {
  const auto go = prepare(grad_output, s, 0,
                          relayout_nchw(s, /*forward=*/false, grad_output.element_size()), weight);
  if (!go) return std::nullopt;
#ifdef CUSTOMCONV_WITH_SM90A
  if (auto gi = grad_input_as_hopper_forward(go->t, input, weight, s)) return gi;
  if (auto gi = grad_input_by_hopper_phases(go->t, input, weight, s)) return gi;
#endif
  const at::Tensor w = go->with.defined() ? go->with : to_memory_format(weight, kChannelsLast);
  if (!aligned16(w)) return std::nullopt;
  at::Tensor gi = empty_channels_last(input, s.in.n, s.in.c, s.in.h, s.in.w);
  implicit_gemm::ConvProblem pr = geometry(input, s);
  pr.input = gi.mutable_data_ptr();
  pr.weight = const_cast<void*>(w.const_data_ptr());
  pr.output = const_cast<void*>(go->t.const_data_ptr());
  if (!kDgrad(input, pr)) return std::nullopt;
  return gi;
}

}  // namespace

std::optional<at::Tensor> implicit_gemm_conv2d_grad_input(const at::Tensor& grad_output,
                                                          const at::Tensor& input,
                                                          const at::Tensor& weight,
                                                          const Conv2dShape<int64_t>& s,
                                                          std::optional<at::MemoryFormat> format) {
  // Dilation is not the strided kernel's; groups are the forward's only.
  const Window2d& win = s.win;
  if (s.groups != 1) return std::nullopt;
  if ((win.sh != 1 || win.sw != 1) && (win.dh != 1 || win.dw != 1)) return std::nullopt;
  if (s.in.n * s.in.h * s.in.w == 0 || s.oh * s.ow == 0) return std::nullopt;
  if (s.in.c % channel_multiple(input) != 0) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  // An NCHW grad_output whose layout changes goes in chunks of images
  // (relayout_chunk), as the forward's input does.
  return grad_input_by_image_chunks(
      grad_output, input, s, format.value_or(conv2d_output_format(input, weight)),
      [&](const at::Tensor& go, const at::Tensor& x, const Conv2dShape<int64_t>& xs) {
        return grad_input_images(go, x, weight, xs);
      });
}

bool implicit_gemm_wgrad_on_hopper(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
#ifdef CUSTOMCONV_WITH_SM90A
  return input.is_cuda() && s.groups == 1 &&
         wgrad_tile(input, s, is_sm90(input.get_device())) == WgradTile::kSm90;
#else
  (void)input, (void)s;
  return false;
#endif
}

std::optional<at::Tensor> implicit_gemm_conv2d_grad_weight(const at::Tensor& grad_output,
                                                           const at::Tensor& input,
                                                           const at::Tensor& weight,
                                                           const Conv2dShape<int64_t>& s) {
  if (s.in.n * s.oh * s.ow == 0 || s.groups != 1) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  // NCHW operands whose layout changes go in chunks of images
  // (wgrad_in_chunks), except 1x1 windows', which the column route takes
  // then: their columns are the input itself or its strided positions, and
  // cuBLAS's GEMMs over a chunk's long reduction fill the device where a
  // chunk's slices do not. On an H200 at N=32 in float32 NCHW,
  // forward+backward, ms, chunked slices / column route: 256 -> 512 from
  // 56x56 stride 2, 0.687 / 0.505 (0.445 in one piece, with 159 MiB of
  // copies); 512 -> 1024 from 28x28 stride 2, 0.432 / 0.393; the 7x7 stem
  // 1.29 / 1.81; 64 -> 64 3x3 at 56x56 0.376 / 0.434.
  const bool nchw =
      !input.is_contiguous(kChannelsLast) || !grad_output.is_contiguous(kChannelsLast);
  const int64_t chunk = relayout_chunk(input, s, nchw);
  if (chunk < s.in.n && s.win.kh == 1 && s.win.kw == 1) return std::nullopt;
  const auto cl = [](const at::Tensor& t) { return to_memory_format(t, kChannelsLast); };
  if (const auto packed = packed_stem(input, s)) {
    std::optional<at::Tensor> gw;
    if (chunk >= s.in.n) {
      gw = wgrad(packed_input(input, *packed), cl(grad_output), packed->shape);
    } else {
      gw = wgrad_in_chunks(
          input, s.in.n, chunk, [&](int64_t nc) { return with_images(packed->shape, nc); },
          [&](int64_t n0, int64_t nc) {
            return std::optional(std::make_pair(packed_input(input.narrow(0, n0, nc), *packed),
                                                cl(grad_output.narrow(0, n0, nc))));
          });
    }
    if (!gw) return std::nullopt;
    return in_format(unpacked_weight_grad(*gw, *packed, s), input, weight);
  }
  const int64_t pad = channel_multiple(input);
  const bool relayout = relayout_nchw(s, /*forward=*/false, input.element_size());
  std::optional<at::Tensor> gw;
  int64_t kernel_c = s.in.c;  // the kernels' input channels (padded to a vector)
  if (chunk >= s.in.n) {
    const auto x = prepare(input, s, pad, relayout, grad_output);
    if (!x) return std::nullopt;
    kernel_c = x->s.in.c;
    gw = wgrad(x->t, x->with.defined() ? x->with : cl(grad_output), x->s);
  } else {
    const auto part = [&](int64_t n0, int64_t nc) {
      return prepare(input.narrow(0, n0, nc), with_images(s, nc), pad, relayout,
                     grad_output.narrow(0, n0, nc));
    };
    std::optional<Operand> first = part(0, chunk);  // moved into the first chunk's pass
    if (!first) return std::nullopt;
    kernel_c = first->s.in.c;
    gw = wgrad_in_chunks(
        input, s.in.n, chunk,
        [&](int64_t nc) {
          Conv2dShape<int64_t> xs = with_images(s, nc);
          xs.in.c = kernel_c;
          return xs;
        },
        [&](int64_t n0, int64_t nc) -> std::optional<std::pair<at::Tensor, at::Tensor>> {
          const std::optional<Operand> x = n0 == 0 ? std::move(first) : part(n0, nc);
          first.reset();
          if (!x) return std::nullopt;
          return std::make_pair(x->t,
                                x->with.defined() ? x->with : cl(grad_output.narrow(0, n0, nc)));
        });
  }
  if (!gw) return std::nullopt;
  // The padded channels' gradient dropped.
  return in_format(kernel_c == s.in.c ? *gw : gw->narrow(1, 0, s.in.c), input, weight);
}

// The gradients of grouped layers with at most kMaxDenseGroups groups, where
// the dense problem's weight stays within 48 MiB in float32: the dense
// problem over all K x C channel pairs with the block-diagonal weight (the
// groups' blocks, zeros between them), on the tensor cores. That is `groups`
// times the arithmetic of the grouped problem, and measured faster than the
// direct kernels on ResNeXt's and RegNet's layers (grouped_direct.h).
constexpr int64_t kMaxDenseGroups = 32;

bool dense_grouped(const Conv2dShape<int64_t>& s) {
  return s.groups > 1 && s.groups <= kMaxDenseGroups &&
         s.k * s.in.c * s.win.kh * s.win.kw * 4 <= (int64_t(48) << 20);
}

std::optional<at::Tensor> implicit_gemm_grouped_conv2d_grad_input(const at::Tensor& grad_output,
                                                                  const at::Tensor& input,
                                                                  const at::Tensor& weight,
                                                                  const Conv2dShape<int64_t>& s) {
  if (!dense_grouped(s) || !takes_dtype(input)) return std::nullopt;
  Conv2dShape<int64_t> dense = s;
  dense.groups = 1;
#ifdef CUSTOMCONV_WITH_SM90A
  // The strided layers by stride phases, without the dense weight; an NCHW
  // grad_output in chunks of images.
  if (s.in.c % channel_multiple(input) == 0 && s.in.n * s.in.h * s.in.w > 0 && s.oh * s.ow > 0 &&
      hopper_phases_take(input, dense)) {
    const c10::cuda::CUDAGuard guard(input.device());
    auto gi = grad_input_by_image_chunks(
        grad_output, input, dense, conv2d_output_format(input, weight),
        [&](const at::Tensor& go, const at::Tensor& x,
            const Conv2dShape<int64_t>& xs) -> std::optional<at::Tensor> {
          const at::Tensor g = to_memory_format(go, kChannelsLast);
          if (!aligned16(g)) return std::nullopt;
          return grad_input_by_hopper_phases(g, x, weight, xs, s.groups);
        });
    if (gi) return gi;
  }
#endif
  const at::Tensor full = block_diagonal(weight, s.groups, s.groups);  // (K, C, kh, kw)
  return implicit_gemm_conv2d_grad_input(grad_output, input, full, dense,
                                         conv2d_output_format(input, weight));
}

std::optional<at::Tensor> implicit_gemm_grouped_conv2d_grad_weight(const at::Tensor& grad_output,
                                                                   const at::Tensor& input,
                                                                   const at::Tensor& weight,
                                                                   const Conv2dShape<int64_t>& s) {
  if (!dense_grouped(s)) return std::nullopt;
  Conv2dShape<int64_t> dense = s;
  dense.groups = 1;
  const auto full = implicit_gemm_conv2d_grad_weight(grad_output, input, weight, dense);  // (K, C, kh, kw)
  if (!full) return std::nullopt;
  const int64_t g = s.groups, kg = s.k / g, cg = s.in.c / g, kh = s.win.kh, kw = s.win.kw;
  at::Tensor gw = at::empty({s.k, cg, kh, kw},
                            input.options().memory_format(conv2d_output_format(input, weight)));
  // Group j's block: rows j*kg.., columns j*cg.. of the dense gradient.
  gw.view({g, kg, cg, kh, kw})
      .copy_(full->view({g, kg, g, cg, kh, kw}).diagonal(0, 0, 2).permute({4, 0, 1, 2, 3}));
  return gw;
}

}  // namespace customconv
