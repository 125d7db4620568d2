// The grouped weight gradient on tensor cores (grouped_mma.h): one GEMM per
// group, gw[g] (K/g x 9 C/g) = sum over output positions of grad_output's
// group channels times the input's 3x3 patches, reduced over positions in
// slices whose float32 planes are summed in a fixed order.
#include "ops/conv2d/grouped_mma.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "ops/common/async_copy.cuh"
#include "ops/common/kernel_fit.h"
#include "ops/common/launch.h"
#include "ops/common/mma_sync.cuh"
#include "ops/common/relayout_cuda.h"
#include "ops/common/workspace.h"
#include "ops/conv2d/grouped_mma_gradients.cuh"
#include "ops/conv2d/weight_planes_sum.cuh"

namespace customconv {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTaps = 9;    // 3x3 windows

// One call's geometry, channels_last: input (n, h, w, c), grad_output
// (n, p, q, c) (as many output channels as input channels), positions =
// n * p * q, cut into slices of `slice_chunks` chunks (Stage::kChunk).
struct Geometry {
  int h, w, c, sh, sw, ph, pw, dh, dw;
  int positions, slice_chunks;
  at::cuda::detail::IntDivider<unsigned> plane, cols;  // by p * q and by q
};

// A block's stages: kStages of kChunk = 64 output positions each (4 mma
// steps), in flight kStages - 1 ahead of the one in use: three with 16
// channels a block, two otherwise. (On an H100, three stages took RegNet's
// 26 groups of 8 at 28x28 stride 2 from 12.4 to 10.7 us, but its 13 groups
// from 29.5 to 39.4, and four stages of 32 positions for 32 channels gained
// nothing.) In shared memory, in 16-bit elements: the
// input at the chunk's positions for each tap, (tap, position, channel),
// then grad_output's (position, channel), CB channels (the block's groups)
// every row `kPitch` elements apart. Rows of 16 or 32 channels are padded
// by 8 so that the eight rows an ldmatrix reads fall in distinct banks; rows
// of 8 (16 bytes) are already.
template <int CB>
struct Stage {
  static constexpr int kChunk = 64;
  static constexpr int kStages = CB == 16 ? 3 : 2;
  static constexpr int kPitch = CB == 8 ? 8 : CB + 8;
  static constexpr int kInput = kTaps * kChunk * kPitch;
  static constexpr int kElements = kInput + kChunk * kPitch;
  static constexpr int kBytes = 2 * kElements;
};

template <int CB>
constexpr int kSharedBytes = Stage<CB>::kStages * Stage<CB>::kBytes;

// Block (slice, y): the whole (CG x 9 CG) weight gradients of GPB
// neighbouring groups (CB = GPB * CG channels from y * CB on, so that a
// position's channels are read as one CB * 2-byte run: whole 32-byte
// sectors with 32 channels) over one slice of the output positions, written
// to plane `slice` of partial (slices, k, 3, 3, CG) in float32.
//
// The GEMM is D (taps * CG rows, CG columns) = A (rows x positions) * B
// (positions x CG): a row is a (tap, input channel) pair, a column an output
// channel. Each stage brings kChunk positions into shared memory with
// cp.async, kStages deep: for every tap the input vector its window reads
// there (zeros in the padding and past the slice's end), and grad_output's;
// both are stored position-major, and ldmatrix.trans turns them into mma's
// A and B fragments. Rows come in blocks of 8 (one tap, 8 channels), two to
// a 16-row tile; with 8 channels a group the 9 blocks leave a tenth, which
// reads block 0 again and is not stored. A column block (8 output channels)
// multiplies only the rows of its own group's input channels.
// Warp w takes the 8 output channels (w % (CB / 8)) * 8 onwards for every
// row tile, and the mma steps s of a stage with s % (4 / (CB / 8)) ==
// w / (CB / 8): with 32 channels a block each warp has its own columns and
// all the steps; with 16, two warps share each column block and split the
// steps; with 8, all four split them. Warps that split steps add their sums in
// shared memory in warp order before the store: the result repeats bit for
// bit.
template <typename T, int CG, int GPB>
__global__ void __launch_bounds__(kThreads)
    grouped_mma_grad_weight_kernel(const T* __restrict__ gout, const T* __restrict__ in,
                                   float* __restrict__ partial, Geometry g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  constexpr int CB = CG * GPB;
  using S = Stage<CB>;
  constexpr int kVectors = CB / 8;                // 16-byte vectors a position and tap
  constexpr int kOctets = CG / 8;                 // 8-channel runs of a group
  constexpr int kColumnBlocks = CB / 8;
  constexpr int kSplit = kWarps / kColumnBlocks;  // warps sharing a column block
  constexpr int kRowBlocks = kTaps * kOctets;
  constexpr int kRowTiles = (kRowBlocks + 1) / 2;
  constexpr int kChunk = S::kChunk, kStages = S::kStages, kSteps = kChunk / 16;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  T* shared = reinterpret_cast<T*>(shared_raw);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int column_block = warp % kColumnBlocks, part = warp / kColumnBlocks;
  const int octet0 = column_block * 8 / CG * kOctets;  // the column block's group's first octet in the block
  const int first = blockIdx.x * g.slice_chunks * kChunk;
  const int end = min(first + g.slice_chunks * kChunk, g.positions);
  const int chunks = (end - first + kChunk - 1) / kChunk;

  // Stage `stage` <- chunk `chunk`: thread i takes (position, vector) items
  // i, i + kThreads, ...; each item one grad_output vector and 9 input ones.
  const auto load = [&](int chunk, int stage) {
    T* xs = shared + stage * S::kElements;
    T* gs = xs + S::kInput;
    const int base = first + chunk * kChunk;
    for (int item = threadIdx.x; item < kChunk * kVectors; item += kThreads) {
      const int p = item / kVectors, v = item % kVectors;
      const int m = base + p;
      const bool ok = m < end;
      const auto image = g.plane.divmod(unsigned(ok ? m : 0));
      const auto yx = g.cols.divmod(image.mod);
      const int channel = int(blockIdx.y) * CB + v * 8;
      const T* gsrc = ok ? gout + (int64_t(m) * g.c + channel) : gout;
      copy_async_16(shared_address(gs + p * S::kPitch + v * 8), gsrc, ok ? 16 : 0);
      const int iy0 = int(yx.div) * g.sh - g.ph, ix0 = int(yx.mod) * g.sw - g.pw;
      const int64_t image_base = int64_t(image.div) * g.h;
#pragma unroll
      for (int t = 0; t < kTaps; ++t) {
        const int iy = iy0 + (t / 3) * g.dh, ix = ix0 + (t % 3) * g.dw;
        const bool inside = ok && unsigned(iy) < unsigned(g.h) && unsigned(ix) < unsigned(g.w);
        const T* src = inside ? in + (((image_base + iy) * g.w + ix) * g.c + channel) : in;
        copy_async_16_cached(shared_address(xs + (t * kChunk + p) * S::kPitch + v * 8), src, inside ? 16 : 0);
      }
    }
  };

  float acc[kRowTiles][4] = {};
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < chunks) load(stage, stage);
    copy_async_commit();
  }
  const int i8 = lane >> 3, r8 = lane & 7;  // the matrix and row this lane addresses
  for (int chunk = 0; chunk < chunks; ++chunk) {
    if (chunk + kStages - 1 < chunks) load(chunk + kStages - 1, (chunk + kStages - 1) % kStages);
    copy_async_commit();
    copy_async_wait<kStages - 1>();
    __syncthreads();
    const T* xs = shared + (chunk % kStages) * S::kElements;
    const T* gs = xs + S::kInput;
#pragma unroll
    for (int step = part; step < kSteps; step += kSplit) {
      const int k0 = step * 16;
      uint32_t b[2];
      load_matrix_x2_trans(b, shared_address(gs + (k0 + r8 + 8 * (i8 & 1)) * S::kPitch + column_block * 8));
#pragma unroll
      for (int tile = 0; tile < kRowTiles; ++tile) {
        int block = 2 * tile + (i8 & 1);
        if (block >= kRowBlocks) block = 0;
        const int tap = block / kOctets, c0 = (octet0 + block % kOctets) * 8;
        uint32_t a[4];
        load_matrix_x4_trans(a, shared_address(xs + (tap * kChunk + k0 + r8 + 8 * (i8 >> 1)) * S::kPitch + c0));
        mma_16x8<T>(acc[tile], a, b);
      }
    }
    __syncthreads();
  }
  copy_async_wait_all();

  if constexpr (kSplit > 1) {
    // Warps past the first of their column block hand their sums over.
    float* red = reinterpret_cast<float*>(shared_raw);
    if (part > 0) {
#pragma unroll
      for (int tile = 0; tile < kRowTiles; ++tile)
#pragma unroll
        for (int j = 0; j < 4; ++j) red[((warp * kRowTiles + tile) * 4 + j) * 32 + lane] = acc[tile][j];
    }
    __syncthreads();
    if (part > 0) return;
    for (int other = 1; other < kSplit; ++other) {
      const int w = other * kColumnBlocks + column_block;
#pragma unroll
      for (int tile = 0; tile < kRowTiles; ++tile)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[tile][j] += red[((w * kRowTiles + tile) * 4 + j) * 32 + lane];
    }
  }

  // Lane l holds rows l / 4 of both row blocks of a tile, output channels
  // 2 (l % 4) and + 1 of the warp's column block.
  const int out0 = int(blockIdx.y) * CB + column_block * 8 + 2 * (lane & 3);
  float* plane = partial + int64_t(blockIdx.x) * g.c * kTaps * CG;
#pragma unroll
  for (int tile = 0; tile < kRowTiles; ++tile) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int block = 2 * tile + half;
      if (block >= kRowBlocks) continue;
      const int tap = block / kOctets, c = (block % kOctets) * 8 + (lane >> 2);
      plane[(int64_t(out0) * kTaps + tap) * CG + c] = acc[tile][2 * half];
      plane[(int64_t(out0 + 1) * kTaps + tap) * CG + c] = acc[tile][2 * half + 1];
    }
  }
#endif
}

template <typename T, int CG, int GPB>
const KernelFit& fit_on(int device) {
  static CachedKernelFit fit(reinterpret_cast<const void*>(&grouped_mma_grad_weight_kernel<T, CG, GPB>),
                             KernelNeeds{80, kThreads, size_t(kSharedBytes<CG * GPB>)});
  return fit.on(device);
}

}  // namespace

std::optional<at::Tensor> grouped_mma_conv2d_grad_weight(const at::Tensor& grad_output,
                                                         const at::Tensor& input,
                                                         const at::Tensor& weight,
                                                         const Conv2dShape<int64_t>& s,
                                                         bool unrounded) {
  namespace gm = grouped_mma_gradients;
  if (grad_output.dim() != 4 || !gm::takes(input, s)) return std::nullopt;
  const int64_t cg = s.in.c / s.groups;
  const int gpb = gm::groups_per_block(cg, s.groups);
  const int device = input.get_device();
  const KernelFit fit = gm::dispatch(input.scalar_type(), cg, gpb, [&](auto tag, auto width, auto per_block) {
    return fit_on<decltype(tag), decltype(width)::value, decltype(per_block)::value>(device);
  });
  if (!fit) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  at::Tensor go, x;
  std::tie(go, x) = to_channels_last_together(grad_output, input);  // NCHW by the transpose kernel
  // 16-byte vectors of 8 channels.
  if (reinterpret_cast<uintptr_t>(go.const_data_ptr()) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 16 != 0) {
    return std::nullopt;
  }
  at::Tensor out =
      at::empty({s.k, cg, 3, 3},
                x.options().dtype(unrounded ? at::kFloat : x.scalar_type()).memory_format(format));
  const int64_t positions = s.in.n * s.oh * s.ow;
  if (positions == 0) return out.zero_();
  // Slices: about four blocks an SM in all, each with at least 256
  // positions (128 with 8 or 16 channels a group) so that its planes cost
  // less to write than its positions to read. The count depends on the shape and the
  // device only, so that the sum's order, and the result, repeat.
  const int64_t chunk = Stage<16>::kChunk;
  const int64_t chunks = (positions + chunk - 1) / chunk;
  const int64_t min_chunks = (cg == 32 ? 256 : 128) / chunk;
  const int64_t blocks_y = s.groups / gpb;
  const int64_t want = (4 * int64_t(fit.sms) + blocks_y - 1) / blocks_y;
  const int64_t plane = s.k * kTaps * cg;
  // A chunk of images (unrounded) keeps its planes within
  // chunk_partials_limit_bytes.
  const int64_t by_memory = unrounded
                                ? chunk_partials_limit_bytes(c10::DeviceType::CUDA) / (plane * 4)
                                : int64_t(65535);
  int64_t slices = std::max<int64_t>(
      1, std::min({want, (chunks + min_chunks - 1) / min_chunks, by_memory, int64_t(65535)}));
  const int64_t slice_chunks = (chunks + slices - 1) / slices;
  slices = (chunks + slice_chunks - 1) / slice_chunks;
  at::Tensor partial = at::empty({slices, plane}, x.options().dtype(at::kFloat));
  const Window2d& win = s.win;
  const Geometry g{int(s.in.h), int(s.in.w), int(s.in.c), int(win.sh), int(win.sw), int(win.ph), int(win.pw),
                   int(win.dh), int(win.dw), int(positions), int(slice_chunks),
                   at::cuda::detail::IntDivider<unsigned>(unsigned(s.oh * s.ow)),
                   at::cuda::detail::IntDivider<unsigned>(unsigned(s.ow))};
  const auto stream = at::cuda::getCurrentCUDAStream();
  gm::dispatch(x.scalar_type(), cg, gpb, [&](auto tag, auto width, auto per_block) {
    using T = decltype(tag);
    constexpr int CG = decltype(width)::value, GPB = decltype(per_block)::value;
    grouped_mma_grad_weight_kernel<T, CG, GPB><<<dim3(unsigned(slices), unsigned(blocks_y)), kThreads,
                                                 kSharedBytes<CG * GPB>, stream>>>(
        go.const_data_ptr<T>(), x.const_data_ptr<T>(), partial.mutable_data_ptr<float>(), g);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    sum_weight_planes<T>(partial, out, slices, plane, cg, stream);
  });
  return out;
}

}  // namespace customconv
