#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "ops/common/launch.h"
#include "ops/common/relayout_cuda.h"
#include "ops/common/strided_view.h"
#include "ops/conv2d/batched_gemm.h"
#include "ops/conv2d/pointwise_gemm.h"
#include "ops/conv2d/strided_pointwise.h"

namespace customconv {
namespace {

constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast;
constexpr int kThreads = 256;

// Both kernels move bytes only: Chunk is 16 bytes (uint4) where a position's
// channels are contiguous and 16-byte aligned, else one element's raw bits
// (uint16_t, uint32_t or uint64_t); strides are in Chunks. Index is uint32_t
// where the chunks of the result fit it (the divisions that split a chunk's
// index are then 32-bit ones: with 64-bit ones the spread ran at about half
// of the device's bandwidth), else int64_t.

// Gathers input[:, :, ::sh, ::sw] (read through its strides) into a
// channels_last (N, C, Ho, Wo) tensor. Thread i of the grid-stride loop
// copies chunk i of the result: chunk c of output position (n, y, x), c
// fastest, so consecutive threads read and write consecutive chunks of a
// position (coalesced where the input's channels are contiguous).
template <typename Chunk, typename Index>
__global__ void gather_strided_positions_kernel(const Chunk* __restrict__ in,
                                                Chunk* __restrict__ out, Index total, Index chunks,
                                                Index ho, Index wo, int64_t step_n, int64_t step_c,
                                                int64_t step_y, int64_t step_x) {
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < total;
       i += Index(gridDim.x) * blockDim.x) {
    const Index c = i % chunks;
    Index p = i / chunks;
    const Index x = p % wo;
    p /= wo;
    const Index y = p % ho;
    const Index n = p / ho;
    out[i] = in[n * step_n + c * step_c + y * step_y + x * step_x];
  }
}

// Writes a channels_last (N, C, H, W) input gradient whole: at positions on
// the stride (y % sh == 0, x % sw == 0) the dense channels_last (N, C, Ho, Wo)
// gradient's row (n, y / sh, x / sw), zeros elsewhere. Thread i of the
// grid-stride loop writes chunk i of the result (chunk c of position
// (n, y, x), c fastest): every write coalesced, the reads of a position's
// row too.
template <typename Chunk, typename Index>
__global__ void spread_strided_positions_kernel(const Chunk* __restrict__ dense,
                                                Chunk* __restrict__ out, Index total, Index chunks,
                                                Index h, Index w, Index ho, Index wo, Index sh,
                                                Index sw) {
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < total;
       i += Index(gridDim.x) * blockDim.x) {
    const Index c = i % chunks;
    Index p = i / chunks;
    const Index x = p % w;
    p /= w;
    const Index y = p % h;
    const Index n = p / h;
    Chunk v{};
    if (y % sh == 0 && x % sw == 0) v = dense[((n * ho + y / sh) * wo + x / sw) * chunks + c];
    out[i] = v;
  }
}

// Calls f(Chunk{}) with the raw type of one element of t.
template <typename F>
void with_element_chunk(const at::Tensor& t, const F& f) {
  switch (t.element_size()) {
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
    default:
      TORCH_CHECK(false, "conv2d: unsupported element size ", t.element_size());
  }
}

// Calls f(Index{}): uint32_t where `total` chunks and the grid-stride loop's
// last step fit it, else int64_t.
template <typename F>
void with_index(int64_t total, const F& f) {
  if (total + int64_t(kThreads) * blocks_for(total, kThreads) < (int64_t(1) << 32)) {
    f(uint32_t{});
  } else {
    f(int64_t{});
  }
}

at::Tensor gather_strided_positions(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  at::Tensor out = empty_channels_last(input, s.in.n, s.in.c, s.oh, s.ow);
  const int64_t es = input.element_size();
  const auto stream = at::cuda::getCurrentCUDAStream();
  const auto launch = [&](auto chunk, int64_t per_chunk) {
    using Chunk = decltype(chunk);
    const int64_t chunks = s.in.c / per_chunk;
    const int64_t total = s.in.n * s.oh * s.ow * chunks;
    with_index(total, [&](auto index) {
      using Index = decltype(index);
      gather_strided_positions_kernel<Chunk, Index>
          <<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
              static_cast<const Chunk*>(input.data_ptr()), static_cast<Chunk*>(out.data_ptr()),
              Index(total), Index(chunks), Index(s.oh), Index(s.ow), input.stride(0) / per_chunk,
              per_chunk == 1 ? input.stride(1) : 1, s.win.sh * input.stride(2) / per_chunk,
              s.win.sw * input.stride(3) / per_chunk);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  };
  const int64_t vec = 16 / es;
  const bool vectors = input.stride(1) == 1 && s.in.c % vec == 0 && input.stride(0) % vec == 0 &&
                       input.stride(2) % vec == 0 && input.stride(3) % vec == 0 && aligned16(input);
  if (vectors) {
    launch(uint4{}, vec);
  } else {
    with_element_chunk(input, [&](auto chunk) { launch(chunk, 1); });
  }
  return out;
}

at::Tensor spread_strided_positions(const at::Tensor& dense, const Conv2dShape<int64_t>& s) {
  at::Tensor out = empty_channels_last(dense, s.in.n, s.in.c, s.in.h, s.in.w);
  const int64_t es = dense.element_size();
  const auto stream = at::cuda::getCurrentCUDAStream();
  const auto launch = [&](auto chunk, int64_t per_chunk) {
    using Chunk = decltype(chunk);
    const int64_t chunks = s.in.c / per_chunk;
    const int64_t total = s.in.n * s.in.h * s.in.w * chunks;
    with_index(total, [&](auto index) {
      using Index = decltype(index);
      spread_strided_positions_kernel<Chunk, Index>
          <<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
              static_cast<const Chunk*>(dense.data_ptr()), static_cast<Chunk*>(out.data_ptr()),
              Index(total), Index(chunks), Index(s.in.h), Index(s.in.w), Index(s.oh), Index(s.ow),
              Index(s.win.sh), Index(s.win.sw));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  };
  const int64_t vec = 16 / es;
  if (s.in.c % vec == 0 && aligned16(dense) && aligned16(out)) {
    launch(uint4{}, vec);
  } else {
    with_element_chunk(dense, [&](auto chunk) { launch(chunk, 1); });
  }
  return out;
}

bool strided_pointwise(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  const Window2d& w = s.win;
  return input.is_cuda() && s.in.batched && s.groups == 1 && w.kh == 1 && w.kw == 1 && w.ph == 0 &&
         w.pw == 0 && (w.sh > 1 || w.sw > 1) && s.in.n * s.oh * s.ow > 0 && s.in.c > 0 && s.k > 0;
}

bool takes(const at::Tensor& input, const at::Tensor& weight, const Conv2dShape<int64_t>& s) {
  return strided_pointwise(input, s) && conv2d_output_format(input, weight) == kChannelsLast;
}

bool takes_nchw(const at::Tensor& input, const at::Tensor& weight, const Conv2dShape<int64_t>& s) {
  return strided_pointwise(input, s) && input.is_contiguous() &&
         conv2d_output_format(input, weight) == at::MemoryFormat::Contiguous;
}

// The pointwise layer on the gathered positions.
Conv2dShape<int64_t> subsampled(const Conv2dShape<int64_t>& s) {
  Conv2dShape<int64_t> p = s;
  p.in.h = s.oh;
  p.in.w = s.ow;
  p.win.sh = p.win.sw = 1;
  p.win.dh = p.win.dw = 1;
  return p;
}

}  // namespace

std::optional<at::Tensor> strided_pointwise_conv2d_cuda(const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const std::optional<at::Tensor>& bias,
                                                        const Conv2dShape<int64_t>& s) {
  if (!takes(input, weight, s)) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  return pointwise_conv2d(batched_gemm_cuda, gather_strided_positions(input, s), weight, bias,
                          subsampled(s));
}

std::optional<at::Tensor> strided_pointwise_conv2d_nchw_cuda(const at::Tensor& input,
                                                             const at::Tensor& weight,
                                                             const std::optional<at::Tensor>& bias,
                                                             const Conv2dShape<int64_t>& s,
                                                             bool through_channels_last) {
  if (!takes_nchw(input, weight, s)) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  if (through_channels_last) {
    const auto out = pointwise_conv2d(batched_gemm_cuda, gather_strided_positions(input, s), weight,
                                      bias, subsampled(s));
    if (!out) return std::nullopt;
    return to_memory_format(*out, at::MemoryFormat::Contiguous);
  }
  // The positions gathered into an NCHW tensor (one strided copy), then the
  // GEMMs of the stride-1 layer in place, one per image.
  at::Tensor gathered = at::empty({s.in.n, s.in.c, s.oh, s.ow}, input.options());
  gathered.copy_(strided_view(
      input, {s.in.n, s.in.c, s.oh, s.ow},
      {input.stride(0), input.stride(1), s.win.sh * input.stride(2), s.win.sw * input.stride(3)},
      input.storage_offset()));
  return pointwise_conv2d_nchw(batched_gemm_cuda, gathered, weight, bias, subsampled(s));
}

std::optional<at::Tensor> strided_pointwise_conv2d_grad_input_cuda(const at::Tensor& grad_output,
                                                                   const at::Tensor& input,
                                                                   const at::Tensor& weight,
                                                                   const Conv2dShape<int64_t>& s) {
  if (!takes(input, weight, s)) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  auto dense = pointwise_conv2d_grad_input(batched_gemm_cuda, grad_output, weight, subsampled(s));
  if (!dense) return std::nullopt;
  return spread_strided_positions(*dense, s);
}

std::optional<at::Tensor> strided_pointwise_conv2d_grad_weight_cuda(const at::Tensor& grad_output,
                                                                    const at::Tensor& input,
                                                                    const at::Tensor& weight,
                                                                    const Conv2dShape<int64_t>& s) {
  if (!takes(input, weight, s)) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  return pointwise_conv2d_grad_weight(batched_gemm_cuda, grad_output,
                                      gather_strided_positions(input, s), subsampled(s));
}

std::optional<at::Tensor> strided_pointwise_conv2d_grad_input_nchw_cuda(const at::Tensor& grad_output,
                                                                        const at::Tensor& input,
                                                                        const at::Tensor& weight,
                                                                        const Conv2dShape<int64_t>& s) {
  if (!takes_nchw(input, weight, s)) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  auto dense = pointwise_conv2d_grad_input(batched_gemm_cuda, to_memory_format(grad_output, kChannelsLast),
                                           weight, subsampled(s));
  if (!dense) return std::nullopt;
  return to_memory_format(spread_strided_positions(*dense, s), at::MemoryFormat::Contiguous);
}

std::optional<at::Tensor> strided_pointwise_conv2d_grad_weight_nchw_cuda(const at::Tensor& grad_output,
                                                                         const at::Tensor& input,
                                                                         const at::Tensor& weight,
                                                                         const Conv2dShape<int64_t>& s) {
  if (!takes_nchw(input, weight, s)) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  return pointwise_conv2d_grad_weight(batched_gemm_cuda, to_memory_format(grad_output, kChannelsLast),
                                      gather_strided_positions(input, s), subsampled(s));
}

}  // namespace customconv
