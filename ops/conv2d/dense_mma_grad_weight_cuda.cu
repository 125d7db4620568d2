// The weight gradient of ungrouped 3x3 layers on tensor cores
// (dense_mma.h): gw (K x 9 C) = sum over output positions of grad_output's
// channels times the input's 3x3 patches, reduced over positions in slices
// whose float32 planes are summed in a fixed order (weight_planes_sum.cuh).
#include "ops/conv2d/dense_mma.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "ops/common/async_copy.cuh"
#include "ops/common/kernel_fit.h"
#include "ops/common/launch.h"
#include "ops/common/mma_sync.cuh"
#include "ops/common/relayout_cuda.h"
#include "ops/conv2d/image_chunks.h"
#include "ops/conv2d/small_plane.h"
#include "ops/conv2d/weight_planes_sum.cuh"

namespace customconv {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowTaps = 3;  // a block takes one row of the 3x3 window
constexpr int kBlockC = 64;  // input channels a block
constexpr int kStages = 3;
// Shared-memory rows (one position's channels) padded by 8 elements: the
// eight 16-bit rows an ldmatrix reads fall in distinct banks, and so do the
// float32 values a warp's scalar loads read at 4 positions and 8 channels
// (pitches of 8 words modulo 32).
constexpr int kPitch = kBlockC + 8;

// Per dtype: positions a stage (kChunk) and an mma step (kStep), elements a
// 16-byte vector. 16-bit: 64 and 16 (m16n8k16); float32 as TF32: 32 and 8
// (m16n8k8), so that a stage takes as many bytes.
template <typename T>
struct Step {
  static constexpr int kVector = 16 / int(sizeof(T));
  static constexpr int kChunk = sizeof(T) == 2 ? 64 : 32;
  static constexpr int kStep = sizeof(T) == 2 ? 16 : 8;
  static constexpr int kInputElements = kRowTaps * kChunk * kPitch;
};

// A block's output channels: KB = 64, or 128 where they divide K (grad_output
// then read half as often; one block an SM instead of two).
template <typename T, int KB>
struct Tile {
  static constexpr int kPitchK = KB + 8;
  static constexpr int kStageElements = Step<T>::kInputElements + Step<T>::kChunk * kPitchK;
  static constexpr int kSharedBytes = kStages * kStageElements * int(sizeof(T));
  static constexpr int kColumnTiles = KB / 16;  // 8-column tiles a warp
  static constexpr int kMinBlocks = KB == 64 ? 2 : 1;
};

// One call's geometry, channels_last: input (n, h, w, c), grad_output
// (n, p, q, k), positions = n * p * q, cut into slices of `slice_chunks`
// chunks of kChunk.
struct Geometry {
  int h, w, c, k, sh, sw, ph, pw, dh, dw;
  int positions, slice_chunks;
  at::cuda::detail::IntDivider<unsigned> plane, cols;  // by p * q and by q
};

// Block (slice, row + 3 * channel block, output channel block): the
// gradient of window row `row` (taps 3 row .. 3 row + 2) for 64 input
// channels and KB output channels over one slice of the output positions,
// written to plane `slice` of partial (slices, k, 3, 3, c) in float32.
//
// The GEMM is D (192 rows, KB columns) = A (rows x positions) * B
// (positions x KB): a row is a (tap, input channel) pair, a column an output
// channel. Each stage brings kChunk positions into shared memory with
// cp.async, kStages deep: for each of the row's 3 taps the input vector its
// window reads there (zeros in the padding and past the slice's end), and
// grad_output's; both are stored position-major. In 16-bit, ldmatrix.trans
// turns them into mma's A and B fragments; in float32 each lane loads its
// fragments' values one by one and rounds them to TF32 (tf32_operand).
// Warp w takes rows 48 (w % 4) onwards (three 16-row tiles, each within one
// tap) and columns KB / 2 (w / 4) onwards (KB / 16 8-column tiles): per mma
// step 3 A and KB / 16 B fragments feed 3 KB / 16 mma. Each warp sums its own
// tile over all the slice's positions, so the result repeats bit for bit.
template <typename T, int KB>
__global__ void __launch_bounds__(kThreads, Tile<T, KB>::kMinBlocks)
    dense_mma_grad_weight_kernel(const T* __restrict__ gout, const T* __restrict__ in,
                                 float* __restrict__ partial, Geometry g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using S = Tile<T, KB>;
  constexpr int kChunk = Step<T>::kChunk, kVector = Step<T>::kVector;
  constexpr int kInputElements = Step<T>::kInputElements;
  constexpr int kSteps = kChunk / Step<T>::kStep, kColumnTiles = S::kColumnTiles;
  constexpr unsigned kBytes = sizeof(T);
  extern __shared__ __align__(16) unsigned char shared_raw[];
  T* shared = reinterpret_cast<T*>(shared_raw);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warp_row = warp % 4, warp_col = warp / 4;
  const int row = int(blockIdx.y) % kRowTaps;
  const int c_base = int(blockIdx.y) / kRowTaps * kBlockC, k_base = int(blockIdx.z) * KB;
  const int first = blockIdx.x * g.slice_chunks * kChunk;
  const int end = min(first + g.slice_chunks * kChunk, g.positions);
  const int chunks = (end - first + kChunk - 1) / kChunk;

  // Stage `stage` <- chunk `chunk`: thread i loads position i / kSpread of
  // the chunk, 2 kVector channels from 2 kVector (i % kSpread) onwards of
  // each 64 (two 16-byte vectors): for each of the row's 3 taps from the
  // input, and KB / 64 times from grad_output. One position decode a chunk
  // per thread.
  constexpr int kSpread = kThreads / kChunk;  // threads a position: 4 (16-bit) or 8
  static_assert(kSpread * 2 * kVector == kBlockC, "a position's 64 channels in two vectors a thread");
  const int lp = threadIdx.x / kSpread, lq = threadIdx.x % kSpread;
  const unsigned shared0 = shared_address(shared);
  const auto load = [&](int chunk, int stage) {
    const unsigned xs = shared0 + kBytes * unsigned(stage * S::kStageElements + lp * kPitch +
                                                    lq * 2 * kVector);
    const unsigned gs = xs + kBytes * unsigned(kInputElements + lp * (S::kPitchK - kPitch));
    const int m = first + chunk * kChunk + lp;
    const bool ok = m < end;
    const auto image = g.plane.divmod(unsigned(ok ? m : 0));
    const auto yx = g.cols.divmod(image.mod);
    const T* gsrc = gout + (int64_t(ok ? m : 0) * g.k + k_base + lq * 2 * kVector);
#pragma unroll
    for (int j = 0; j < KB / 32; ++j) {
      const int off = (j / 2) * 64 + (j % 2) * kVector;
      copy_async_16(gs + kBytes * off, gsrc + off, ok ? 16 : 0);
    }
    const int iy = int(yx.div) * g.sh - g.ph + row * g.dh, ix0 = int(yx.mod) * g.sw - g.pw;
    const bool row_inside = ok && unsigned(iy) < unsigned(g.h);
    const T* xrow = in + ((int64_t(image.div) * g.h + (row_inside ? iy : 0)) * g.w * g.c +
                          c_base + lq * 2 * kVector);
#pragma unroll
    for (int t = 0; t < kRowTaps; ++t) {
      const int ix = ix0 + t * g.dw;
      const bool inside = row_inside && unsigned(ix) < unsigned(g.w);
      const T* src = xrow + int64_t(inside ? ix : 0) * g.c;
      const unsigned dst = xs + kBytes * unsigned(t * kChunk * kPitch);
      copy_async_16_cached(dst, src, inside ? 16 : 0);
      copy_async_16_cached(dst + 16u, src + kVector, inside ? 16 : 0);
    }
  };

  float acc[3][kColumnTiles][4] = {};
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < chunks) load(stage, stage);
    copy_async_commit();
  }
  for (int chunk = 0; chunk < chunks; ++chunk) {
    if (chunk + kStages - 1 < chunks) load(chunk + kStages - 1, (chunk + kStages - 1) % kStages);
    copy_async_commit();
    copy_async_wait<kStages - 1>();
    __syncthreads();
    const T* xs = shared + (chunk % kStages) * S::kStageElements;
    const T* gs = xs + kInputElements;
    if constexpr (sizeof(T) == 2) {
      const int i8 = lane >> 3, r8 = lane & 7;  // the matrix and row this lane addresses
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        const int k0 = step * 16;
        // Columns KB / 2 warp_col + 16 j onwards: b[2 j] and b[2 j + 1] the
        // two 8-column tiles' fragments.
        uint32_t b[kColumnTiles][2];
#pragma unroll
        for (int j = 0; j < kColumnTiles / 2; ++j) {
          uint32_t m[4];
          load_matrix_x4_trans(m, shared_address(gs + (k0 + r8 + 8 * (i8 & 1)) * S::kPitchK +
                                                 warp_col * (KB / 2) + j * 16 + 8 * (i8 >> 1)));
          b[2 * j][0] = m[0], b[2 * j][1] = m[1], b[2 * j + 1][0] = m[2], b[2 * j + 1][1] = m[3];
        }
#pragma unroll
        for (int i = 0; i < 3; ++i) {
          const int r = warp_row * 48 + i * 16, tap = r / kBlockC, c0 = r % kBlockC;
          uint32_t a[4];
          load_matrix_x4_trans(
              a, shared_address(xs + (tap * kChunk + k0 + r8 + 8 * (i8 >> 1)) * kPitch + c0 +
                                8 * (i8 & 1)));
#pragma unroll
          for (int n = 0; n < kColumnTiles; ++n) mma_16x8<T>(acc[i][n], a, b[n]);
        }
      }
    } else {
      // Lane l: fragment row or column l / 4 at positions l % 4 and + 4 of
      // the step.
      const int gr = lane >> 2, gk = lane & 3;
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        const T* gk0 = gs + (step * 8 + gk) * S::kPitchK + warp_col * (KB / 2) + gr;
        uint32_t b[kColumnTiles][2];
#pragma unroll
        for (int n = 0; n < kColumnTiles; ++n) {
          b[n][0] = tf32_operand(gk0[n * 8]);
          b[n][1] = tf32_operand(gk0[4 * S::kPitchK + n * 8]);
        }
#pragma unroll
        for (int i = 0; i < 3; ++i) {
          const int r = warp_row * 48 + i * 16, tap = r / kBlockC, c0 = r % kBlockC;
          const T* x0 = xs + (tap * kChunk + step * 8 + gk) * kPitch + c0 + gr;
          const uint32_t a[4] = {tf32_operand(x0[0]), tf32_operand(x0[8]),
                                 tf32_operand(x0[4 * kPitch]), tf32_operand(x0[4 * kPitch + 8])};
#pragma unroll
          for (int n = 0; n < kColumnTiles; ++n) mma_16x8<T>(acc[i][n], a, b[n]);
        }
      }
    }
    __syncthreads();
  }
  copy_async_wait_all();

  // Lane l holds rows l / 4 and + 8 of each 16-row tile, output channels
  // 2 (l % 4) and + 1 of each 8-column tile.
  float* plane = partial + int64_t(blockIdx.x) * g.k * kPlaneTaps * g.c;
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const int r = warp_row * 48 + i * 16;
    const int tap = row * kRowTaps + r / kBlockC, c = c_base + r % kBlockC + (lane >> 2);
#pragma unroll
    for (int n = 0; n < kColumnTiles; ++n) {
      const int k = k_base + warp_col * (KB / 2) + n * 8 + 2 * (lane & 3);
      float* o = plane + (int64_t(k) * kPlaneTaps + tap) * g.c + c;
      const int64_t next_k = int64_t(kPlaneTaps) * g.c;
      o[0] = acc[i][n][0];
      o[next_k] = acc[i][n][1];
      o[8] = acc[i][n][2];
      o[next_k + 8] = acc[i][n][3];
    }
  }
#endif
}

template <typename T, int KB>
const KernelFit& fit_on(int device) {
  static CachedKernelFit fit(reinterpret_cast<const void*>(&dense_mma_grad_weight_kernel<T, KB>),
                             KernelNeeds{80, kThreads, size_t(Tile<T, KB>::kSharedBytes)});
  return fit.on(device);
}

// Ungrouped batched CUDA layers with a 3x3 window, 64k input and output
// channels, float16 or bfloat16, or float32 where PyTorch's TF32 policy for
// convolutions allows TF32, positions and element offsets up to the channel
// within ints, on a device of compute capability 8.0 or newer.
bool takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  if (!input.is_cuda() || !s.in.batched || s.groups != 1) return false;
  if (s.in.c % kBlockC != 0 || s.k % 64 != 0 || s.in.c > 4096 || s.k > 4096) return false;
  const at::ScalarType dtype = input.scalar_type();
  if (dtype == at::kFloat) {
    if (!at::globalContext().allowTF32CuDNN(at::Float32Op::CONV)) return false;
    // float32 on large planes only: on an H200 at N=32, channels_last, us
    // here / on the implicit GEMM's sm80-style TF32 kernel / cuDNN,
    // ResNet-50's 64 -> 64 at 56x56 83.7 / 121.3 / 86.7, 128 -> 128 at
    // 28x28 67.5 / 77.8 / 60.1; on 14x14 planes 72.5 / 61.2 / 57.6 and at
    // 7x7 92.0 / 80.5 / 52.8, whose few positions leave this kernel too few
    // blocks.
    if (small_plane(s)) return false;
  } else if (dtype != at::kHalf && dtype != at::kBFloat16) {
    return false;
  }
  const Window2d& w = s.win;
  if (w.kh != 3 || w.kw != 3) return false;
  constexpr int64_t kLimit = (int64_t{1} << 30);
  for (int64_t v :
       {s.in.n * s.oh * s.ow, s.in.n * (s.in.h + w.sh), s.in.h + w.ph + 2 * w.dh + w.sh,
        s.in.w + w.pw + 2 * w.dw + w.sw, s.oh * w.sh + 2 * w.dh, s.ow * w.sw + 2 * w.dw}) {
    if (v > kLimit) return false;
  }
  return at::cuda::getDeviceProperties(input.get_device())->major >= 8;
}

// f(T{}, Int<KB>{}) for the call's dtype and output-channel block.
template <int V>
using Int = std::integral_constant<int, V>;

template <typename F>
auto dispatch(at::ScalarType dtype, int kb, F&& f) {
  const auto on = [&](auto tag) { return kb == 128 ? f(tag, Int<128>{}) : f(tag, Int<64>{}); };
  if (dtype == at::kFloat) return on(float{});
  return dtype == at::kHalf ? on(c10::Half{}) : on(c10::BFloat16{});
}

// The weight gradient of images x from their grad_output go (any layout;
// NCHW ones copied to channels_last): in the weight's dtype and `format`,
// or unrounded in float32 (the chunks of grad_weight_by_image_chunks).
std::optional<at::Tensor> weight_gradient(const at::Tensor& grad_output, const at::Tensor& input,
                                          const Conv2dShape<int64_t>& s, at::MemoryFormat format,
                                          bool unrounded, const KernelFit& fit, int kb) {
  at::Tensor go, x;
  std::tie(go, x) = to_channels_last_together(grad_output, input);  // NCHW by the transpose kernel
  // 16-byte vectors.
  if (reinterpret_cast<uintptr_t>(go.const_data_ptr()) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 16 != 0) {
    return std::nullopt;
  }
  at::Tensor out = at::empty(
      {s.k, s.in.c, 3, 3},
      x.options().dtype(unrounded ? at::kFloat : x.scalar_type()).memory_format(format));
  const int64_t positions = s.in.n * s.oh * s.ow;
  if (positions == 0) return out.zero_();
  // Slices: one wave of resident blocks in all, each slice at least 8
  // chunks so that its planes cost less to write than its positions to
  // read. The count depends on the shape and the device only, so that the
  // sum's order, and the result, repeat.
  const int64_t chunk_positions = x.scalar_type() == at::kFloat ? Step<float>::kChunk
                                                                : Step<c10::Half>::kChunk;
  const int64_t chunks = (positions + chunk_positions - 1) / chunk_positions;
  const int64_t blocks_y = kRowTaps * (s.in.c / kBlockC), blocks_z = s.k / kb;
  const int64_t want = std::max<int64_t>(1, fit.resident_blocks() / (blocks_y * blocks_z));
  // The planes stay within chunk_partials_limit_bytes.
  const int64_t plane = s.k * kPlaneTaps * s.in.c;
  const int64_t by_memory = chunk_partials_limit_bytes(c10::DeviceType::CUDA) / (plane * 4);
  int64_t slices =
      std::max<int64_t>(1, std::min({want, (chunks + 7) / 8, by_memory, int64_t(65535)}));
  const int64_t slice_chunks = (chunks + slices - 1) / slices;
  slices = (chunks + slice_chunks - 1) / slice_chunks;
  at::Tensor partial = at::empty({slices, plane}, x.options().dtype(at::kFloat));
  const Window2d& win = s.win;
  const Geometry g{int(s.in.h),
                   int(s.in.w),
                   int(s.in.c),
                   int(s.k),
                   int(win.sh),
                   int(win.sw),
                   int(win.ph),
                   int(win.pw),
                   int(win.dh),
                   int(win.dw),
                   int(positions),
                   int(slice_chunks),
                   at::cuda::detail::IntDivider<unsigned>(unsigned(s.oh * s.ow)),
                   at::cuda::detail::IntDivider<unsigned>(unsigned(s.ow))};
  const auto stream = at::cuda::getCurrentCUDAStream();
  dispatch(x.scalar_type(), kb, [&](auto tag, auto block) {
    using T = decltype(tag);
    constexpr int KB = decltype(block)::value;
    dense_mma_grad_weight_kernel<T, KB>
        <<<dim3(unsigned(slices), unsigned(blocks_y), unsigned(blocks_z)), kThreads,
           Tile<T, KB>::kSharedBytes, stream>>>(go.const_data_ptr<T>(), x.const_data_ptr<T>(),
                                                partial.mutable_data_ptr<float>(), g);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    sum_weight_planes<T>(partial, out, slices, plane, s.in.c, stream);
  });
  return out;
}

}  // namespace

std::optional<at::Tensor> dense_mma_conv2d_grad_weight(const at::Tensor& grad_output,
                                                       const at::Tensor& input,
                                                       const at::Tensor& weight,
                                                       const Conv2dShape<int64_t>& s) {
  if (grad_output.dim() != 4 || !takes(input, s)) return std::nullopt;
  const int device = input.get_device();
  const int kb = s.k % 128 == 0 ? 128 : 64;
  const KernelFit fit = dispatch(input.scalar_type(), kb, [&](auto tag, auto block) {
    return fit_on<decltype(tag), decltype(block)::value>(device);
  });
  if (!fit) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  // NCHW operands in chunks of images (image_chunks.h).
  return grad_weight_by_image_chunks(
      grad_output, input, weight, s, format,
      [&](const at::Tensor& go, const at::Tensor& x, const Conv2dShape<int64_t>& xs,
          bool unrounded) { return weight_gradient(go, x, xs, format, unrounded, fit, kb); });
}

}  // namespace customconv
