// rotated_weight.h on CUDA: a tiled transpose of (K, C) per tap.
#include "ops/conv2d/rotated_weight.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "ops/common/launch.h"

namespace customconv {
namespace {

constexpr int kTile = 32;
constexpr int kRows = 8;  // threads a block: kTile x kRows
constexpr int kMaxSlots = 64;

// Which tap of the weight each output slot holds: `from[t]` (count slots),
// or, with count 0, the rotated window (slot t holds tap taps - 1 - t).
struct TapTable {
  int count = 0;
  uint8_t from[kMaxSlots];
};

// Block (c tile, k tile, slot): 32 x 32 (k, c) pairs of one output slot t.
// Thread (x, y) reads weight[k0 + y + 8 m][c0 + x] at the slot's tap into
// shared memory (along c: coalesced where the weight is channels_last), then
// writes out[c0 + y + 8 m][t][k0 + x] (along k: coalesced), m = 0..3. With
// groups (kGrouped; kg output and cg input channels each), a pair of
// different groups is a zero and the weight is read at the channel's place in
// its group. Without, no division per element: ResNet-50's 512-channel 3x3
// weight in float16 took 14 us with the grouped arithmetic on an H100.
template <typename T, bool kGrouped>
__global__ void transposed_taps_kernel(const T* __restrict__ w, T* __restrict__ out, int k, int c,
                                       int kg, int cg, int kw, int slots,
                                       const __grid_constant__ TapTable table, int64_t sk,
                                       int64_t sc, int64_t sh, int64_t sw) {
  __shared__ T tile[kTile][kTile + 1];
  const int c0 = blockIdx.x * kTile, k0 = blockIdx.y * kTile, slot = blockIdx.z;
  const int tap = table.count > 0 ? int(table.from[slot]) : slots - 1 - slot;
  const T* src = w + int64_t(tap / kw) * sh + int64_t(tap % kw) * sw;
  for (int m = threadIdx.y; m < kTile; m += kRows) {
    const int kk = k0 + m, cc = c0 + threadIdx.x;
    if (kk < k && cc < c) {
      if constexpr (kGrouped) {
        const int group = kk / kg;
        tile[m][threadIdx.x] = cc / cg == group ? src[kk * sk + (cc - group * cg) * sc] : T(0);
      } else {
        tile[m][threadIdx.x] = src[kk * sk + cc * sc];
      }
    }
  }
  __syncthreads();
  for (int m = threadIdx.y; m < kTile; m += kRows) {
    const int cc = c0 + m, kk = k0 + threadIdx.x;
    if (kk < k && cc < c) out[(int64_t(cc) * slots + slot) * k + kk] = tile[threadIdx.x][m];
  }
}

// out (C, slots, K in memory) from weight (groups of K / groups output and
// weight.size(1) input channels), slot t holding the tap `table` names.
void transposed_taps(const at::Tensor& weight, const at::Tensor& out, int64_t slots,
                     const TapTable& table, int64_t groups = 1) {
  const int64_t k = weight.size(0), cg = weight.size(1), c = groups * cg, kw = weight.size(3);
  if (out.numel() == 0) return;
  TORCH_CHECK((k + kTile - 1) / kTile <= 65535 && c < (int64_t(1) << 31) / kTile && slots <= 65535,
              "rotated_weight_cuda: weight too large");
  const c10::cuda::CUDAGuard guard(weight.device());
  const dim3 grid(unsigned((c + kTile - 1) / kTile), unsigned((k + kTile - 1) / kTile),
                  unsigned(slots));
  const dim3 block(kTile, kRows);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, weight.scalar_type(), "rotated_weight_cuda", [&] {
        const auto kernel = groups > 1 ? transposed_taps_kernel<scalar_t, true>
                                       : transposed_taps_kernel<scalar_t, false>;
        kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
            weight.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), int(k), int(c),
            int(k / groups), int(cg), int(kw), int(slots), table, weight.stride(0),
            weight.stride(1), weight.stride(2), weight.stride(3));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace

at::Tensor rotated_weight_cuda(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 4 && weight.is_cuda(), "rotated_weight_cuda: a 4-D CUDA weight");
  const int64_t k = weight.size(0), c = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  at::Tensor out =
      at::empty({c, k, kh, kw}, weight.options().memory_format(at::MemoryFormat::ChannelsLast));
  transposed_taps(weight, out, kh * kw, TapTable{});
  return out;
}

at::Tensor phase_weight_cuda(const at::Tensor& weight, const std::vector<int>& taps,
                             int64_t groups) {
  TORCH_CHECK(weight.dim() == 4 && weight.is_cuda(), "phase_weight_cuda: a 4-D CUDA weight");
  TORCH_CHECK(groups > 0 && weight.size(0) % groups == 0, "phase_weight_cuda: ", weight.size(0),
              " output channels in ", groups, " groups");
  const int64_t slots = int64_t(taps.size());
  TORCH_CHECK(slots > 0 && slots <= kMaxSlots, "phase_weight_cuda: 1 to ", kMaxSlots, " slots");
  TapTable table;
  table.count = int(slots);
  for (int64_t t = 0; t < slots; ++t) {
    TORCH_CHECK(taps[t] >= 0 && taps[t] < weight.size(2) * weight.size(3),
                "phase_weight_cuda: tap ", taps[t], " outside the window");
    table.from[t] = uint8_t(taps[t]);
  }
  at::Tensor out = at::empty({groups * weight.size(1), slots, weight.size(0)}, weight.options());
  transposed_taps(weight, out, slots, table, groups);
  return out;
}

}  // namespace customconv
