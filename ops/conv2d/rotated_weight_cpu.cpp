// rotated_weight.h on the CPU: a blocked transpose of (K, C) per tap over
// ATen's threads.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "ops/conv2d/rotated_weight.h"

namespace customconv {
namespace {

constexpr int64_t kBlock = 32;

// Block b = (tap t, block of kBlock input channels, block of kBlock output
// channels), output channels fastest: out[c][t][k] (channels_last memory of
// the (C, K, kh, kw) result) = w[k][c] at the rotated tap, taps - 1 - t. Both
// sides of a 32 x 32 block stay in the L1 cache, so neither the weight's
// reads (along c where it is channels_last, along the taps otherwise) nor
// the writes (along k) go through memory a line per element, as a copy of
// the permuted, flipped view does.
template <typename T>
void rotate_blocks(const T* w, T* out, int64_t k, int64_t c, int64_t kh, int64_t kw, int64_t sk,
                   int64_t sc, int64_t sh, int64_t sw, int64_t b0, int64_t b1) {
  const int64_t taps = kh * kw, kblocks = (k + kBlock - 1) / kBlock,
                cblocks = (c + kBlock - 1) / kBlock;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t k0 = b % kblocks * kBlock, c0 = b / kblocks % cblocks * kBlock;
    const int64_t t = b / (kblocks * cblocks), from = taps - 1 - t;
    const T* src = w + from / kw * sh + from % kw * sw;
    const int64_t k1 = std::min(k, k0 + kBlock), c1 = std::min(c, c0 + kBlock);
    for (int64_t cc = c0; cc < c1; ++cc) {
      T* dst = out + (cc * taps + t) * k;
      for (int64_t kk = k0; kk < k1; ++kk) dst[kk] = src[kk * sk + cc * sc];
    }
  }
}

}  // namespace

at::Tensor rotated_weight_cpu(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 4 && weight.device().is_cpu(),
              "rotated_weight_cpu: a 4-D CPU weight");
  const int64_t k = weight.size(0), c = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  at::Tensor out =
      at::empty({c, k, kh, kw}, weight.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (out.numel() == 0) return out;
  const int64_t blocks = kh * kw * ((c + kBlock - 1) / kBlock) * ((k + kBlock - 1) / kBlock);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, weight.scalar_type(), "rotated_weight_cpu", [&] {
        const scalar_t* w = weight.const_data_ptr<scalar_t>();
        scalar_t* o = out.mutable_data_ptr<scalar_t>();
        at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
          rotate_blocks(w, o, k, c, kh, kw, weight.stride(0), weight.stride(1), weight.stride(2),
                        weight.stride(3), b0, b1);
        });
      });
  return out;
}

}  // namespace customconv
