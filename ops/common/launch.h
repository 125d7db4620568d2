// Work-splitting arithmetic, batch views and channels_last helpers shared by the kernels.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>

namespace customconv {

// at::parallel_for grain size: enough items that a task holds about 32K units
// of work (at least one item).
inline int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, work_per_item));
}

// Blocks of `items_per_block` covering `work` items, at least 1 and at most
// 2^20; the kernels' grid-stride loops cover whatever lies beyond.
inline int64_t blocks_for(int64_t work, int64_t items_per_block) {
  const int64_t blocks = (work + items_per_block - 1) / items_per_block;
  return std::min<int64_t>(std::max<int64_t>(blocks, 1), int64_t{1} << 20);
}

// An image tensor (N, C, H, W), or an unbatched (C, H, W) one as a batch of
// one; contiguous either way.
inline at::Tensor as_batch(const at::Tensor& t, bool batched) {
  return (batched ? t : t.unsqueeze(0)).contiguous();
}

// The inverse of as_batch for a result.
inline at::Tensor unbatch(const at::Tensor& t, bool batched) { return batched ? t : t.squeeze(0); }

// Whether t's data starts on a 16-byte boundary (vector and TMA loads, cuBLASLt's algorithms).
inline bool aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
}

// A new (n, c, h, w) tensor like `like` (dtype, device), stored channels_last.
inline at::Tensor empty_channels_last(const at::Tensor& like, int64_t n, int64_t c, int64_t h,
                                      int64_t w) {
  return at::empty({n, c, h, w}, like.options().memory_format(at::MemoryFormat::ChannelsLast));
}

// A channels_last (N, C, H, W) tensor as the (N*H*W, C) matrix it is in
// memory, a view.
inline at::Tensor channels_last_rows(const at::Tensor& t) {
  return t.permute({0, 2, 3, 1}).view({t.size(0) * t.size(2) * t.size(3), t.size(1)});
}

}  // namespace customconv
